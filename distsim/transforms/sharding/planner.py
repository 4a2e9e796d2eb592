"""The redistribution planner: any placements to any placements on an N-D
mesh, as a sequence of per-axis steps, the cheapest valid sequence first.

Per-axis steps (n = axis size, S = bytes of the tensor as the axis group
sees it, i.e. with every other axis's sharding applied):

=================  ================  =====================
from -> to         step              bytes sent per device
=================  ================  =====================
R -> S(d)          local slice       0
S(d) -> R          all-gather        (n-1)/n * S
S(d) -> S(e)       all-to-all        (n-1)/n^2 * S
P -> R             all-reduce        2(n-1)/n * S
P -> S(d)          reduce-scatter    (n-1)/n * S
R -> P             local (zeros)     0
=================  ================  =====================

Validity under the nested-sharding convention (mesh-axis order is the
split order, see :mod:`distsim.ir.mesh`): a step may only add or remove
the *innermost* axis sharding a dim, so ``[S(0), S(0)] -> [R, R]`` gathers
the inner axis first. An all-to-all also needs even pieces. The search is
Dijkstra over placement tuples with cost (bytes + a fixed
:data:`COLLECTIVE_BYTES` per collective, steps): a collective costs its
latency as well as its bytes, so a plan does not add collectives to save a
few bytes (on uneven shards, re-slicing can make later gathers smaller:
an 8-step plan saved 4 bytes of 480 over a 5-step one).
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass
from itertools import count
from math import prod
from typing import Dict, List, Optional, Sequence, Tuple

from ...errors import PassPreconditionError, VerifyError
from ...ir.comm import CollectiveType
from ...ir.mesh import (BlockShard, DeviceMesh, Partial, Placement, Replicate, Shard,
                        check_placements, local_shape)
from ...ir.types import DType

Placements = Tuple[Placement, ...]

#: What the planner charges a collective step beyond its bytes: its latency
#: in bytes at link speed (~10 us at ~100 GB/s, NCCL's order of magnitude).
#: Local steps (slices, zeros) are free. Reported bytes are unaffected.
COLLECTIVE_BYTES = 1 << 20


@dataclass(frozen=True)
class Step:
    """One per-axis change ``src -> dst`` on mesh axis ``axis``."""

    kind: str  # "slice", "partial", "noop" (an axis of size 1), or a CollectiveType value
    axis: int
    src: Placement
    dst: Placement
    bytes_per_device: float

    @property
    def collective(self) -> Optional[CollectiveType]:
        try:
            return CollectiveType(self.kind)
        except ValueError:
            return None

    def __str__(self) -> str:
        return (f"axis {self.axis}: {self.src.print_text()} -> {self.dst.print_text()} "
                f"({self.kind}, {self.bytes_per_device:g} B/device)")


def step_bytes(kind: str, n: int, group_bytes: float) -> float:
    """The table above: bytes sent per device for ``kind`` on an axis of
    ``n`` devices, the group seeing ``group_bytes``."""
    if kind == CollectiveType.ALL_GATHER.value or kind == CollectiveType.REDUCE_SCATTER.value:
        return (n - 1) / n * group_bytes
    if kind == CollectiveType.ALL_TO_ALL.value:
        return (n - 1) / (n * n) * group_bytes
    if kind == CollectiveType.ALL_REDUCE.value:
        return 2 * (n - 1) / n * group_bytes
    return 0.0


def _innermost(pl: Placements, axis: int, dim: int) -> bool:
    """No axis after ``axis`` shards ``dim``."""
    return not any(isinstance(p, Shard) and p.dim == dim for p in pl[axis + 1:])


def group_shapes(shape: Sequence[int], mesh: DeviceMesh, pl: Placements, axis: int
                 ) -> List[Tuple[int, ...]]:
    """The tensor's shape as each device's ``axis`` group sees it."""
    seen = list(pl)
    seen[axis] = Replicate()
    return [local_shape(shape, mesh, seen, c) for c in mesh.all_coords()]


def _transitions(shape, dtype: DType, mesh: DeviceMesh, pl: Placements, reduce_ops: Sequence[str]):
    rank = len(shape)
    for axis, cur in enumerate(pl):
        n = mesh.shape[axis]
        if n == 1:
            targets = ([Replicate()] + [Shard(d) for d in range(rank)]
                       + [Partial(o) for o in reduce_ops])
            for t in targets:
                if t != cur:
                    yield Step("noop", axis, cur, t, 0.0)
            continue
        gshapes = group_shapes(shape, mesh, pl, axis)
        group_bytes = max(prod(s) for s in gshapes) * dtype.itemsize
        moves = []
        if isinstance(cur, Replicate):
            moves += [("slice", Shard(d)) for d in range(rank) if _innermost(pl, axis, d)]
            moves += [("partial", Partial(o)) for o in reduce_ops]
        elif isinstance(cur, Shard):
            if _innermost(pl, axis, cur.dim):
                moves.append((CollectiveType.ALL_GATHER.value, Replicate()))
                if all(s[cur.dim] % n == 0 for s in gshapes):
                    moves += [(CollectiveType.ALL_TO_ALL.value, Shard(e)) for e in range(rank)
                              if e != cur.dim and _innermost(pl, axis, e)
                              and all(s[e] % n == 0 for s in gshapes)]
        elif isinstance(cur, Partial):
            moves.append((CollectiveType.ALL_REDUCE.value, Replicate()))
            moves += [(CollectiveType.REDUCE_SCATTER.value, Shard(d)) for d in range(rank)
                      if _innermost(pl, axis, d)]
        for kind, t in moves:
            yield Step(kind, axis, cur, t, step_bytes(kind, n, group_bytes))


def plan_redistribute(shape: Sequence[int], dtype: DType, mesh: DeviceMesh,
                      src: Sequence[Placement], dst: Sequence[Placement]) -> List[Step]:
    """The cheapest valid sequence of per-axis steps from ``src`` to ``dst``
    (bytes, each collective charged :data:`COLLECTIVE_BYTES` more, then
    fewest steps). PassPreconditionError when none."""
    src, dst = tuple(src), tuple(dst)
    check_placements(shape, mesh, src, "redistribute source")
    check_placements(shape, mesh, dst, "redistribute target")
    if src == dst:
        return []
    blocked = [p for p in src + dst if isinstance(p, BlockShard)]
    if blocked:
        raise PassPreconditionError(f"redistribute: a blocked shard ({blocked[0].print_text()}) is "
                                    "not redistributed; split the value into its blocks first")
    ops = sorted({p.op for p in src + dst if isinstance(p, Partial)})
    tie = count()
    frontier = [(0.0, 0, next(tie), src, [])]
    best: Dict[Placements, Tuple[float, int]] = {src: (0.0, 0)}
    while frontier:
        cost, nsteps, _, pl, steps = heapq.heappop(frontier)
        if pl == dst:
            return steps
        if best.get(pl, (float("inf"), 0)) < (cost, nsteps):
            continue
        for step in _transitions(shape, dtype, mesh, pl, ops):
            if isinstance(step.dst, Partial) and dst[step.axis] != step.dst:
                continue  # making a partial is only a way to reach a partial target
            nxt = pl[:step.axis] + (step.dst,) + pl[step.axis + 1:]
            try:
                check_placements(shape, mesh, nxt, "step")
            except VerifyError:
                continue
            extra = COLLECTIVE_BYTES if step.collective is not None else 0.0
            key = (cost + step.bytes_per_device + extra, nsteps + 1)
            if key < best.get(nxt, (float("inf"), 0)):
                best[nxt] = key
                heapq.heappush(frontier, (key[0], key[1], next(tie), nxt, steps + [step]))
    raise PassPreconditionError(
        f"no redistribution of {dtype.value}{list(shape)} on mesh @{mesh.name} from "
        f"[{', '.join(p.print_text() for p in src)}] to [{', '.join(p.print_text() for p in dst)}]")


def plan_cost(steps: Sequence[Step]) -> float:
    return sum(s.bytes_per_device for s in steps)


def redistribute_cost(shape: Sequence[int], dtype: DType, mesh: DeviceMesh,
                      src: Sequence[Placement], dst: Sequence[Placement]) -> float:
    try:
        return plan_cost(plan_redistribute(shape, dtype, mesh, src, dst))
    except PassPreconditionError:
        return float("inf")


def cross_mesh_bytes(shape: Sequence[int], dtype: DType) -> float:
    """A rough cost of moving a tensor between meshes: its whole size."""
    return float(prod(shape) * dtype.itemsize)
