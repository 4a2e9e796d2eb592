"""Lowering: a propagated global-view module -> one local-view function.

Every DTensor value becomes one local value per device of its mesh (named
``<value>_r<rank>``, typed with that device's shard); every op becomes one
op per device; every ``redistribute`` becomes the planner's steps as
explicit ``comm.*`` ops whose teams (mesh + axes, kept as the ``mesh`` and
``axes`` attributes) are resolved to ranks; calls are inlined. The result
verifies with :func:`distsim.ir.verify` and runs in the NumpyExecutor and
the simulator.

``function.meta["sharding"]`` maps each global value name of the entry
function to ``(DTensorType, [local value names in mesh order])``, which is
how ``distsim check`` compares the two programs value by value.
"""
from __future__ import annotations

from math import prod
from typing import Callable, Dict, List, Sequence, Tuple

from ...errors import PassPreconditionError, VerifyError
from ...ir.builder import NameScope
from ...ir.comm import CollectiveType
from ...ir.core import Function, Module, Op, Value
from ...ir.mesh import DeviceMesh, DTensorType, Partial, Replicate, Shard
from ...ir.ops_call import callee_of, is_call
from ...ir.registry import ShapeError, infer_types, with_defaults
from .planner import Step, plan_redistribute, step_bytes
from .propagate import REDISTRIBUTE

Coords = Tuple[int, ...]
Locals = Dict[Coords, Value]


def local_name(name: str, rank: int) -> str:
    return f"{name}_r{rank}"


class LocalBuilder:
    """Appends local-view ops, inferring their types."""

    def __init__(self, name: str) -> None:
        self.function = Function(name)
        self.names = NameScope()

    def input(self, hint: str, t) -> Value:
        v = Value(self.names.fresh(hint), t)
        self.function.inputs.append(v)
        return v

    def emit(self, op_type: str, inputs: Sequence[Value], attrs, hints: Sequence[str],
             meta=None) -> List[Value]:
        try:
            attrs = with_defaults(op_type, dict(attrs or {}))
            types = infer_types(op_type, [v.type for v in inputs], attrs)
        except ShapeError as e:
            raise VerifyError(f"lowering op %{hints[0]} ({op_type}): {e}") from None
        outs = [Value(self.names.fresh(h), t) for h, t in zip(hints, types)]
        self.function.ops.append(Op(op_type, inputs, outs, attrs, meta=meta))
        return outs


# -- redistribution ------------------------------------------------------------
def _groups(mesh: DeviceMesh, axis: int) -> List[List[Coords]]:
    groups: Dict[Coords, List[Coords]] = {}
    for c in mesh.all_coords():
        groups.setdefault(c[:axis] + c[axis + 1:], []).append(c)
    return list(groups.values())


def apply_step(lb: LocalBuilder, vals: Locals, t: DTensorType, step: Step, hint: str) -> Locals:
    """Emit one per-axis step on the local values of ``t`` (``t`` has the
    placements before the step)."""
    mesh, axis = t.mesh, step.axis
    n = mesh.shape[axis]
    out: Locals = {}
    if step.kind == "noop":
        return dict(vals)
    if step.kind == "slice":
        for c, v in vals.items():
            out[c] = lb.emit("shard_slice", [v], {"dim": step.dst.dim, "index": c[axis], "parts": n},
                             [local_name(hint, mesh.rank_at(c))])[0]
        return out
    if step.kind == "partial":
        op = step.dst.op
        for c, v in vals.items():
            if c[axis] == 0 or op in ("max", "min", "avg"):
                out[c] = v
            else:
                fill = "ones_like" if op == "prod" else "zeros_like"
                out[c] = lb.emit(fill, [v], {}, [local_name(hint, mesh.rank_at(c))])[0]
        return out
    kind = CollectiveType(step.kind)
    for group in _groups(mesh, axis):
        ranks = [mesh.rank_at(c) for c in group]
        attrs = {"ranks": ranks, "mesh": mesh.name, "axes": [mesh.axis_names[axis]]}
        if kind in (CollectiveType.ALL_GATHER, CollectiveType.REDUCE_SCATTER):
            attrs["dim"] = (step.src if kind is CollectiveType.ALL_GATHER else step.dst).dim
        if kind is CollectiveType.ALL_TO_ALL:
            attrs["split_dim"], attrs["concat_dim"] = step.dst.dim, step.src.dim
        if kind in (CollectiveType.ALL_REDUCE, CollectiveType.REDUCE_SCATTER):
            attrs["reduce_op"] = step.src.op
        ins = [vals[c] for c in group]
        group_bytes = sum(v.type.size_bytes for v in ins) if kind is CollectiveType.ALL_GATHER \
            else ins[0].type.size_bytes * (n if kind is CollectiveType.ALL_TO_ALL else 1)
        meta = {"bytes_per_device": step_bytes(kind.value, n, group_bytes)}
        outs = lb.emit(kind.op_type, ins, attrs, [local_name(hint, r) for r in ranks], meta)
        out.update(zip(group, outs))
    return {c: out[c] for c in mesh.all_coords()}  # mesh order


def redistribute_locals(lb: LocalBuilder, vals: Locals, src: DTensorType, dst: DTensorType,
                        hint: str) -> Locals:
    """Local values of ``src`` turned into those of ``dst`` (same mesh:
    the planner's steps; across meshes: see :func:`cross_mesh`)."""
    if src.mesh != dst.mesh:
        return cross_mesh(lb, vals, src, dst, hint)
    t = src
    for step in plan_redistribute(src.shape, src.dtype, src.mesh, src.placements, dst.placements):
        vals = apply_step(lb, vals, t, step, hint)
        pl = list(t.placements)
        pl[step.axis] = step.dst
        t = t.with_placements(pl)
    return vals


def cross_mesh(lb: LocalBuilder, vals: Locals, src: DTensorType, dst: DTensorType, hint: str
               ) -> Locals:
    """Move a tensor to another mesh.

    Meshes of the same shape: one send-recv per device (placements kept),
    then the target mesh's plan. Otherwise the whole tensor is brought to
    the first device of the source mesh (a gather or reduce when the source
    is one sharded or partial axis, else the source plan to replicated),
    sent to the first device of the target mesh, and spread there (a
    scatter for one sharded axis, else a broadcast and the target plan).
    """
    a, b = src.mesh, dst.mesh
    if a.shape == b.shape:
        moved: Locals = {}
        for c, v in vals.items():
            r_from, r_to = a.rank_at(c), b.rank_at(c)
            moved[c] = v if r_from == r_to else _sendrecv(lb, v, r_from, r_to, hint)
        here = DTensorType(src.shape, src.dtype, b, src.placements)
        return redistribute_locals(lb, moved, here, dst, hint)
    root_a, root_b = a.devices[0], b.devices[0]
    zero_a, zero_b = (0,) * a.ndim, (0,) * b.ndim
    pl = src.placements
    if a.ndim == 1 and isinstance(pl[0], (Shard, Partial)) and a.size > 1:
        ins = [vals[(i,)] for i in range(a.size)]
        if isinstance(pl[0], Shard):
            attrs = {"ranks": list(a.devices), "root": root_a, "dim": pl[0].dim}
            kind = CollectiveType.GATHER
        else:
            attrs = {"ranks": list(a.devices), "root": root_a, "reduce_op": pl[0].op}
            kind = CollectiveType.REDUCE
        attrs.update(mesh=a.name, axes=[a.axis_names[0]])
        whole = lb.emit(kind.op_type, ins, attrs, [local_name(hint, root_a)],
                        {"bytes_per_device": src.size_bytes / a.size})[0]
    else:
        full = src.with_placements([Replicate()] * a.ndim)
        whole = redistribute_locals(lb, vals, src, full, hint)[zero_a]
    if root_a != root_b:
        whole = _sendrecv(lb, whole, root_a, root_b, hint)
    if b.size == 1:
        return {zero_b: whole}
    team = {"ranks": list(b.devices), "root": root_b, "mesh": b.name, "axes": list(b.axis_names)}
    if b.ndim == 1 and isinstance(dst.placements[0], Shard):
        outs = lb.emit(CollectiveType.SCATTER.op_type, [whole], dict(team, dim=dst.placements[0].dim),
                       [local_name(hint, r) for r in b.devices],
                       {"bytes_per_device": dst.size_bytes / b.size})
        return {(i,): v for i, v in enumerate(outs)}
    outs = lb.emit(CollectiveType.BROADCAST.op_type, [whole], team,
                   [local_name(hint, r) for r in b.devices], {"bytes_per_device": dst.size_bytes})
    spread = {c: v for c, v in zip(b.all_coords(), outs)}
    return redistribute_locals(lb, spread, dst.with_placements([Replicate()] * b.ndim), dst, hint)


def _sendrecv(lb: LocalBuilder, v: Value, r_from: int, r_to: int, hint: str) -> Value:
    return lb.emit(CollectiveType.SEND_RECV.op_type, [v], {"ranks": [r_from, r_to]},
                   [local_name(hint, r_to)], {"bytes_per_device": v.type.size_bytes})[0]


# -- per-device forms of compute ops --------------------------------------------
LocalRule = Callable[[LocalBuilder, Op, Coords, List[Value], List[str]], List[Value]]
LOCAL_RULES: Dict[str, LocalRule] = {}


def local_rule(*names: str):
    def deco(fn: LocalRule) -> LocalRule:
        for n in names:
            LOCAL_RULES[n] = fn
        return fn
    return deco


def _same(lb: LocalBuilder, op: Op, c: Coords, ins: List[Value], hints: List[str]) -> List[Value]:
    return lb.emit(op.op_type, ins, op.attrs, hints)


@local_rule("reshape", "broadcast_to")
def _target_shape(lb, op, c, ins, hints):
    return lb.emit(op.op_type, ins, dict(op.attrs, shape=list(op.outputs[0].type.local_shape(c))), hints)


def _rescaled(lb: LocalBuilder, op: Op, ins: List[Value], hints: List[str], factor: float
              ) -> List[Value]:
    """The op, then its result times ``factor`` (when not 1)."""
    if factor == 1.0:
        return lb.emit(op.op_type, ins, op.attrs, hints)
    out = lb.emit(op.op_type, ins, op.attrs, [hints[0] + "_local"])[0]
    return lb.emit("scale", [out], {"factor": factor}, hints)


@local_rule("reduce_mean", "mse_loss", "cross_entropy")
def _mean(lb, op, c, ins, hints):
    """A mean over sharded elements: the local mean rescaled to count the
    whole, so that the terms sum (``P(sum)``) to the global mean."""
    x, y = op.inputs[0].type, op.outputs[0].type
    local = prod(x.local_shape(c)) / max(prod(y.local_shape(c)), 1)
    whole = prod(x.shape) / max(prod(y.shape), 1)
    return _rescaled(lb, op, ins, hints, local / whole if whole else 1.0)


@local_rule("mse_loss_grad", "cross_entropy_grad")
def _mean_grad(lb, op, c, ins, hints):
    y = op.inputs[1].type
    return _rescaled(lb, op, ins, hints, prod(y.local_shape(c)) / max(prod(y.shape), 1))


# -- the function ------------------------------------------------------------------
class Lowering:
    def __init__(self, module: Module, entry: str = "main") -> None:
        self.module = module
        self.entry = module.functions[entry]
        self.lb = LocalBuilder(entry)
        self.record: Dict[str, Tuple[DTensorType, List[str]]] = {}

    def run(self) -> Function:
        f = self.entry
        env: Dict[Value, Locals] = {}
        for v in f.inputs:
            t = _dtensor(v, f)
            env[v] = {c: self.lb.input(local_name(v.name, t.mesh.rank_at(c)), t.local_type(c))
                      for c in t.mesh.all_coords()}
            self._note(v, env[v])
        self._lower_ops(f, env, prefix="")
        out = self.lb.function
        out.outputs = [x for v in f.outputs for x in env[v].values()]
        out.meta = {"sharding": self.record, "outputs": [(v.name, v.type) for v in f.outputs]}
        return out

    def _note(self, v: Value, vals: Locals) -> None:
        self.record[v.name] = (v.type, [x.name for x in vals.values()])

    def _lower_ops(self, f: Function, env: Dict[Value, Locals], prefix: str) -> None:
        """Lower ``f``'s ops; an inlined callee's values are named ``<prefix><name>``."""
        top = not prefix
        for op in f.ops:
            for v in op.inputs + op.outputs:
                _dtensor(v, f)
            if is_call(op):
                callee = callee_of(op)
                sub = {p: env[a] for p, a in zip(callee.inputs, op.inputs)}
                self._lower_ops(callee, sub, f"{prefix}{callee.name}.")
                for v, r in zip(op.outputs, callee.outputs):
                    env[v] = sub[r]
            elif op.op_type == REDISTRIBUTE:
                x, y = op.inputs[0], op.outputs[0]
                env[y] = redistribute_locals(self.lb, env[x], x.type, y.type, prefix + y.name)
            else:
                mesh = op.outputs[0].type.mesh if op.outputs else op.inputs[0].type.mesh
                for v in op.inputs:
                    if v.type.mesh != mesh:
                        raise PassPreconditionError(f"lowering: op %{op.name} ({op.op_type}) reads "
                                                    f"%{v.name} on another mesh; propagate first")
                results: List[Locals] = [{} for _ in op.outputs]
                rule = LOCAL_RULES.get(op.op_type, _same)
                for c in mesh.all_coords():
                    rank = mesh.rank_at(c)
                    outs = rule(self.lb, op, c, [env[v][c] for v in op.inputs],
                                [local_name(prefix + v.name, rank) for v in op.outputs])
                    for i, v in enumerate(outs):
                        results[i][c] = v
                for v, vals in zip(op.outputs, results):
                    env[v] = vals
            if top:
                for v in op.outputs:
                    self._note(v, env[v])


def _dtensor(v: Value, f: Function) -> DTensorType:
    if not isinstance(v.type, DTensorType):
        raise PassPreconditionError(f"lowering: value %{v.name} of @{f.name} has no placement "
                                    f"({v.type}); propagate shardings first")
    return v.type


def lower(module: Module, entry: str = "main") -> Function:
    """The local-view function of a propagated module's entry function."""
    return Lowering(module, entry).run()
