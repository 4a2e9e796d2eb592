"""Costs of changing placements, in bytes sent per device.

- :func:`axis_cost`: one mesh axis, by the planner's table on the tensor as
  the axis group sees it; what propagation ranks per-axis strategies by.
- :func:`convert_cost`: a whole type, by the redistribution planner itself
  (the bytes of its cheapest plan, see :mod:`.planner`); what a conflict is
  resolved by (:mod:`.conflicts`).
- :func:`convert_charge`: the same plan as the planner weighs it, each
  collective's latency counted too; what whole programs are compared by
  (:mod:`.entry_inputs`).

Both add ``_CHANGE`` per change so that, among equal byte counts, keeping
placements as they are wins (a local slice costs no bytes but is a change).
"""
from __future__ import annotations

from functools import lru_cache
from typing import Sequence, Tuple

from ...errors import PassPreconditionError
from ...ir.mesh import BlockShard, DeviceMesh, DTensorType, Partial, Placement, Replicate, Shard
from ...ir.types import DType, TensorType
from .cross_mesh import cross_mesh_cost
from .planner import COLLECTIVE_BYTES, plan_redistribute

_CHANGE = 1e-3  # a tie-break: among equal costs, keep placements as they are


def axis_cost(t: TensorType, mesh: DeviceMesh, placements: Sequence[Placement], axis: int,
              src: Placement, dst: Placement) -> float:
    """Bytes per device to change ``src`` into ``dst`` on one axis (the
    planner's table, on the tensor as the axis group sees it)."""
    if src == dst:
        return 0.0
    if isinstance(src, BlockShard) or isinstance(dst, BlockShard):
        return float("inf")     # never redistributed (see the planner)
    n = mesh.shape[axis]
    other = 1
    for i, p in enumerate(placements):
        if i != axis and isinstance(p, Shard):
            other *= mesh.shape[i]
    group = t.size_bytes / other
    if isinstance(dst, Partial) and isinstance(src, Replicate):
        return _CHANGE
    if isinstance(src, Replicate):
        return _CHANGE
    if isinstance(src, Shard):
        if isinstance(dst, Shard):
            return (n - 1) / n ** 2 * group + _CHANGE
        return (n - 1) / n * group + _CHANGE * (2 if isinstance(dst, Partial) else 1)
    if isinstance(dst, Shard):
        return (n - 1) / n * group + _CHANGE
    return 2 * (n - 1) / n * group + _CHANGE


def type_cost(src: DTensorType, dst: DTensorType) -> float:
    if src.mesh != dst.mesh:
        return float(src.size_bytes) + 1.0
    return sum(axis_cost(src, src.mesh, src.placements, i, a, b)
               for i, (a, b) in enumerate(zip(src.placements, dst.placements)))


@lru_cache(maxsize=4096)
def _plan_cost(shape: Tuple[int, ...], dtype: DType, mesh: DeviceMesh, src: Tuple[Placement, ...],
               dst: Tuple[Placement, ...]) -> float:
    try:
        steps = plan_redistribute(shape, dtype, mesh, src, dst)
    except PassPreconditionError:
        return float("inf")
    return sum(s.bytes_per_device for s in steps) + _CHANGE * len(steps)


def convert_cost(src: DTensorType, dst: DTensorType) -> float:
    """Bytes per device of the planner's cheapest redistribution from
    ``src`` to ``dst`` (plus ``_CHANGE`` per step); across meshes the
    cheapest recipe of :mod:`.cross_mesh`."""
    if src == dst:
        return 0.0
    if src.mesh != dst.mesh:
        return cross_mesh_cost(src, dst) + _CHANGE
    return _plan_cost(tuple(src.shape), src.dtype, src.mesh, tuple(src.placements),
                      tuple(dst.placements))


@lru_cache(maxsize=4096)
def _plan_charge(shape: Tuple[int, ...], dtype: DType, mesh: DeviceMesh,
                 src: Tuple[Placement, ...], dst: Tuple[Placement, ...]) -> float:
    try:
        steps = plan_redistribute(shape, dtype, mesh, src, dst)
    except PassPreconditionError:
        return float("inf")
    return sum(s.bytes_per_device + (COLLECTIVE_BYTES if s.collective is not None else 0.0)
               + _CHANGE for s in steps)


def convert_charge(src: DTensorType, dst: DTensorType) -> float:
    """What the planner minimises to redistribute ``src`` as ``dst``: bytes
    per device plus :data:`.planner.COLLECTIVE_BYTES` per collective (and
    ``_CHANGE`` per step); across meshes, the cheapest recipe's bytes plus
    one collective."""
    if src == dst:
        return 0.0
    if src.mesh != dst.mesh:
        return cross_mesh_cost(src, dst) + COLLECTIVE_BYTES + _CHANGE
    return _plan_charge(tuple(src.shape), src.dtype, src.mesh, tuple(src.placements),
                        tuple(dst.placements))
