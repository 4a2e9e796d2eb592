"""DataParallel: one device's training step -> the same step on n devices.

Every op is replicated on each rank; the batch inputs (``meta["batch_inputs"]``,
split along dim 0) become one shard per rank, parameters are replicated,
and every gradient (``meta["grads"]``) is averaged across the ranks with an
all-reduce placed right after the gradient is produced, so that the
communication stream can overlap it with the rest of the backward pass.

Names: the copy of value ``v`` on rank ``r`` is ``v_r{r}``.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence

from ..errors import PassPreconditionError
from ..ir.builder import NameScope
from ..ir.op_kinds import KindLog
from ..ir.comm import CollectiveType
from ..ir.core import Function, Op, Value
from ..ir.registry import infer_types, with_defaults
from ..ir.types import TensorType


def replica_name(name: str, rank: int) -> str:
    return f"{name}_r{rank}"


class DataParallel:
    """The pass. ``ranks`` default to ``0..n-1``."""

    def __init__(self, n: int, ranks: Optional[Sequence[int]] = None,
                 reduce_op: str = "avg") -> None:
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise PassPreconditionError(f"DataParallel: degree must be a positive integer, got {n!r}")
        self.ranks = list(ranks) if ranks is not None else list(range(n))
        if len(self.ranks) != n:
            raise PassPreconditionError(f"DataParallel: {n} ranks expected, got {self.ranks}")
        self.n = n
        self.reduce_op = reduce_op

    def __call__(self, function: Function) -> Function:
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
        # the copies of one template op are one kind (the simulator reads
        # the facts they share once)
        log = out.kinds = KindLog(out)
        self._in_place: Dict[str, str] = {}   # gradient -> its average (same buffer)
        copies: List[Dict[Value, Value]] = [dict() for _ in self.ranks]
        # template name -> each replica's name (before gradients are averaged)
        renamed: List[Dict[str, str]] = [dict() for _ in self.ranks]

        # one type object per (shape, dtype, rank): equal types shared keep
        # the program small and let the shape-rule cache hit per replica
        placed: Dict[tuple, TensorType] = {}

        def local(v: Value, i: int, shape=None) -> Value:
            t = v.type
            key = (shape or t.shape, t.dtype, self.ranks[i])
            new_t = placed.get(key)
            if new_t is None:
                new_t = placed[key] = TensorType(*key)
            nv = Value(names.fresh(replica_name(v.name, self.ranks[i])), new_t)
            copies[i][v] = nv
            renamed[i][v.name] = nv.name
            return nv

        for v in function.inputs:
            for i in range(self.n):
                shape = None
                if v.name in batch_inputs:
                    shape = (v.type.shape[0] // self.n,) + tuple(v.type.shape[1:])
                out.inputs.append(local(v, i, shape))
        grad_names = set(grads.values())
        for op in function.ops:
            for i in range(self.n):
                ins = [copies[i][v] for v in op.inputs]
                types = infer_types(op.op_type, [v.type for v in ins], op.attrs)
                outs = []
                for v, t in zip(op.outputs, types):
                    nv = Value(names.fresh(replica_name(v.name, self.ranks[i])), t)
                    copies[i][v] = nv
                    renamed[i][v.name] = nv.name
                    outs.append(nv)
                out.ops.append(Op(op.op_type, ins, outs, op.attrs, op.subfunctions, op.meta))
                log.add(out.ops[-1], op)
            for v in op.outputs:
                if v.name in grad_names and self.n > 1:
                    self._all_reduce(out, log, names, v, copies)
        out.outputs = [copies[i][v] for v in function.outputs for i in range(self.n)]
        out.meta = dict(function.meta)
        # roles, gradients and in-place updates name template values; add
        # each replica's names, so that the simulator finds every replica's
        # weights (resident), gradients and updated weights (in place)
        for key in ("roles", "grads", "updates"):
            table = function.meta.get(key)
            if not isinstance(table, dict):
                continue
            extended = dict(table)
            for names_i in renamed:
                for k, v in table.items():
                    if k in names_i:
                        extended[names_i[k]] = names_i.get(v, v) if key != "roles" else v
            out.meta[key] = extended
        # NCCL all-reduces in place: the averaged gradient takes no new bytes
        if self.n > 1:
            out.meta["updates"] = dict(out.meta.get("updates", {}), **self._in_place)
        out.meta["dp"] = self.n
        out.meta["dp_ranks"] = list(self.ranks)
        return out

    def _all_reduce(self, out: Function, log: KindLog, names: NameScope, grad: Value,
                    copies: List[Dict[Value, Value]]) -> None:
        attrs = with_defaults(CollectiveType.ALL_REDUCE.op_type,
                              {"ranks": self.ranks, "reduce_op": self.reduce_op})
        ins = [copies[i][grad] for i in range(self.n)]
        types = infer_types(CollectiveType.ALL_REDUCE.op_type, [v.type for v in ins], attrs)
        outs = [Value(names.fresh(f"{grad.name}_avg_r{r}"), t) for r, t in zip(self.ranks, types)]
        out.ops.append(Op(CollectiveType.ALL_REDUCE.op_type, ins, outs, attrs,
                          meta={"role": "grad_sync"}))
        log.add(out.ops[-1], self)   # every gradient's all-reduce is one kind
        for i, nv in enumerate(outs):
            copies[i][grad] = nv
            self._in_place[ins[i].name] = nv.name
