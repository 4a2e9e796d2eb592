"""Emitting local-view ops: the builder, and one redistribution step on a
mesh as explicit ``comm.*`` ops (or local slices) per axis group.

Shared by the lowering (:mod:`.lower`) and the cross-mesh planner
(:mod:`.cross_mesh`).
"""
from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

from ...errors import VerifyError
from ...ir.builder import NameScope
from ...ir.comm import CollectiveType
from ...ir.core import Function, Op, Value
from ...ir.mesh import DeviceMesh, DTensorType
from ...ir.registry import ShapeError, infer_types, with_defaults
from .planner import Step, plan_redistribute, step_bytes

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
            out[c] = lb.emit("shard_slice", [v],
                             {"dim": step.dst.dim, "index": c[axis], "parts": n},
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


def redistribute_on_mesh(lb: LocalBuilder, vals: Locals, src: DTensorType, dst: DTensorType,
                         hint: str) -> Locals:
    """Local values of ``src`` turned into those of ``dst`` on the same
    mesh: the planner's steps, one after the other."""
    t = src
    for step in plan_redistribute(src.shape, src.dtype, src.mesh, src.placements, dst.placements):
        vals = apply_step(lb, vals, t, step, hint)
        pl = list(t.placements)
        pl[step.axis] = step.dst
        t = t.with_placements(pl)
    return vals
