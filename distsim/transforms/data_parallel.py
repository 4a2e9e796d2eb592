"""DataParallel: one device's training step -> the same step on n devices.

Every op is replicated on each rank; the batch inputs (``meta["batch_inputs"]``,
split along dim 0) become one shard per rank, parameters are replicated,
and every gradient (``meta["grads"]``) is averaged across the ranks with an
all-reduce placed right after the gradient is produced, so that the
communication stream can overlap it with the rest of the backward pass.

Names: the copy of value ``v`` on rank ``r`` is ``v_r{r}``.

The pass numbers the values it makes as it goes (inputs first, then each
op's results) and writes the program's columns into its
:class:`~distsim.ir.build_log.BuildLog`: the simulator then reads none of
the ops and values back.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence

from ..errors import PassPreconditionError
from ..ir.build_log import BuildLog
from ..ir.builder import NameScope
from ..ir.comm import CollectiveType
from ..ir.core import Function, Op, Value, gc_paused, normalize_attr
from ..ir.registry import infer_types, with_defaults
from ..ir.types import TensorType


def replica_name(name: str, rank: int) -> str:
    return f"{name}_r{rank}"


class DataParallel:
    """The pass. ``ranks`` default to ``0..n-1``."""

    def __init__(self, n: int, ranks: Optional[Sequence[int]] = None,
                 reduce_op: str = "avg") -> None:
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise PassPreconditionError(f"DataParallel: degree must be a positive integer, "
                                        f"got {n!r}")
        self.ranks = list(ranks) if ranks is not None else list(range(n))
        if len(self.ranks) != n:
            raise PassPreconditionError(f"DataParallel: {n} ranks expected, got {self.ranks}")
        self.n = n
        self.reduce_op = reduce_op

    def __call__(self, function: Function) -> Function:
        # a replicated step is hundreds of thousands of objects without a
        # cycle: the garbage collector's passes over them would cost about
        # a third of the time (see gc_paused)
        with gc_paused():
            return self._replicate(function)

    def _replicate(self, function: Function) -> Function:
        batch_inputs = set(function.meta.get("batch_inputs", ()))
        grads = function.meta.get("grads", {})
        if not batch_inputs:
            raise PassPreconditionError(f"DataParallel: function '{function.name}' names no "
                                        "batch inputs (meta['batch_inputs'])")
        for v in function.inputs:
            if v.name in batch_inputs:
                size = v.type.shape[0] if v.type.shape else 0
                if size % self.n:
                    raise PassPreconditionError(
                        f"DataParallel: batch size {size} of input %{v.name} is not divisible "
                        f"by the data-parallel degree {self.n}")
        names = NameScope()
        out = Function(function.name)
        # values are numbered as made; the copies of one template op are one
        # kind of op (see BuildLog)
        log = out.build_log = BuildLog(out, numbered=True)
        values = log.values                      # number -> value
        # each replica: template value -> the number of its copy (of a
        # gradient: its average, once made)
        copies: List[Dict[Value, int]] = [dict() for _ in self.ranks]
        # each replica: template name -> its copy's number, before gradients
        # are averaged (what the meta tables below name)
        made: List[Dict[str, int]] = [dict() for _ in self.ranks]
        in_place: Dict[int, int] = {}            # a gradient -> its average (same buffer)

        # one type object per (shape, dtype, rank): equal types shared keep
        # the program small and let the shape-rule cache hit per replica
        placed: Dict[tuple, TensorType] = {}

        for v in function.inputs:
            for i, rank in enumerate(self.ranks):
                t = v.type
                shape = ((t.shape[0] // self.n,) + tuple(t.shape[1:]) if v.name in batch_inputs
                         else t.shape)
                key = (shape, t.dtype, rank)
                new_t = placed.get(key)
                if new_t is None:
                    new_t = placed[key] = TensorType(*key)
                nv = Value(names.fresh(replica_name(v.name, rank)), new_t)
                out.inputs.append(nv)
                copies[i][v] = made[i][v.name] = log.add_input(nv)
        grad_names = set(grads.values())
        fresh = names.fresh
        append_op = out.ops.append
        add_numbered = log.add_numbered
        for op in function.ops:
            # attributes normalized once per template op, one dict the copies share
            attrs = {k: normalize_attr(a) for k, a in op.attrs.items()}
            op_type, subs, meta, outputs = op.op_type, op.subfunctions, op.meta, op.outputs
            for i, rank in enumerate(self.ranks):
                copies_i, made_i = copies[i], made[i]
                reads = [copies_i[v] for v in op.inputs]
                ins = tuple([values[k] for k in reads])
                types = infer_types(op_type, [v.type for v in ins], attrs)
                first = len(values)
                outs = []
                for k, (v, t) in enumerate(zip(outputs, types)):
                    outs.append(Value(fresh(replica_name(v.name, rank)), t))
                    copies_i[v] = made_i[v.name] = first + k
                new_op = Op.trusted(op_type, ins, tuple(outs), attrs, subs, dict(meta))
                append_op(new_op)
                add_numbered(new_op, reads, op)
            for v in outputs:
                if v.name in grad_names and self.n > 1:
                    self._all_reduce(out, log, names, v, copies, in_place)
        log.outputs = [copies[i][v] for v in function.outputs for i in range(self.n)]
        out.outputs = list(map(values.__getitem__, log.outputs))
        out.meta = dict(function.meta)
        # roles, gradients and in-place updates name template values; the
        # new tables name each replica's copies instead, so that the
        # simulator finds every replica's weights (resident), gradients and
        # updated weights (in place). Only live names: the template's own
        # names used to stay in the tables, and one that is also the name of
        # a copy (a template input "h_r0" next to an input "h" without a
        # role) labelled that copy: rank 0's copy of "h" was counted as
        # resident weights, rank 1's as activations. An entry whose value
        # the template does not have says nothing of the replicas: dropped
        # (a lookup by name found nothing for it either). Per table entry,
        # not per op: no cost on the ops.
        for key in ("roles", "grads", "updates"):
            table = function.meta.get(key)
            if not isinstance(table, dict):
                continue
            live: Dict[str, str] = {}
            for made_i in made:
                for k, v in table.items():
                    number = made_i.get(k)
                    if number is None:
                        continue
                    if key == "roles":
                        live[values[number].name] = v
                    elif v in made_i:
                        live[values[number].name] = values[made_i[v]].name
            out.meta[key] = live
        # NCCL all-reduces in place: the averaged gradient takes no new bytes
        if self.n > 1:
            out.meta["updates"] = dict(out.meta.get("updates", {}),
                                       **{values[a].name: values[b].name
                                          for a, b in in_place.items()})
        out.meta["dp"] = self.n
        out.meta["dp_ranks"] = list(self.ranks)
        self._log_tables(log, function, made, in_place, names)
        return out

    def _log_tables(self, log: BuildLog, function: Function, made: List[Dict[str, int]],
                    in_place: Dict[int, int], names: NameScope) -> None:
        """The gradients and in-place updates of the meta tables above, as
        value numbers (what the simulator would find by name). Left out
        when a template name in those tables is also a name of the new
        program: then only a lookup by name says which value it names."""
        grads = function.meta.get("grads")
        updates = function.meta.get("updates")
        grads = grads if isinstance(grads, dict) else {}
        updates = updates if isinstance(updates, dict) else {}
        if any(name in names for table in (grads, updates) for pair in table.items()
               for name in pair):
            return
        log.gradients = [m[g] for m in made for p, g in grads.items()
                         if p in m and g in m and m[g] >= log.n_inputs]
        pairs = {m[k]: m.get(v, -1) for m in made for k, v in updates.items() if k in m}
        pairs.update(in_place)
        log.in_place = pairs

    def _all_reduce(self, out: Function, log: BuildLog, names: NameScope, grad: Value,
                    copies: List[Dict[Value, int]], in_place: Dict[int, int]) -> None:
        values = log.values
        attrs = with_defaults(CollectiveType.ALL_REDUCE.op_type,
                              {"ranks": self.ranks, "reduce_op": self.reduce_op})
        reads = [copies[i][grad] for i in range(self.n)]
        ins = [values[k] for k in reads]
        types = infer_types(CollectiveType.ALL_REDUCE.op_type, [v.type for v in ins], attrs)
        outs = [Value(names.fresh(f"{grad.name}_avg_r{r}"), t) for r, t in zip(self.ranks, types)]
        op = Op(CollectiveType.ALL_REDUCE.op_type, ins, outs, attrs, meta={"role": "grad_sync"})
        out.ops.append(op)
        first = log.add_numbered(op, reads, self)   # every gradient's all-reduce is one kind
        for i in range(self.n):
            copies[i][grad] = first + i
            in_place[reads[i]] = first + i
