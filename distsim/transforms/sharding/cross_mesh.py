"""Moving a tensor between meshes: the cheapest of a few recipes.

Candidates, each costed by a dry run (bytes per device, summed over its
stages) and the cheapest emitted (the first listed wins a tie):

- ``p2p(mid_a -> mid_b)``: on the source mesh, the planner's steps to
  placements ``mid_a``; then every target device receives the parts of its
  ``mid_b`` piece from devices that hold them (cut with ``slice``, moved
  with ``comm.sendrecv``, joined with ``concat``) -- a part a device
  already holds, because its rank is in both meshes, does not move, and a
  part several devices hold is taken from the least busy sender; then the
  planner's steps on the target mesh to the wanted placements. ``mid_a``
  is the source placements (no partials), the source with partials reduced,
  all-replicated, or the target's placements; ``mid_b`` the target's (no
  partials) or the source's. With matching shards on both sides this is one
  send-recv per device.
- ``root``: the whole tensor on one root of the source mesh (a gather for
  a 1-D shard, a reduce for a 1-D partial, else the planner's steps to
  replicated), a send-recv to one root of the target mesh (none when a
  rank is in both meshes: it is both roots), then a scatter (1-D shard) or
  a broadcast and the planner's steps.

Bytes per device, as the collectives' bus bytes (the nccl-tests factors,
``S`` the whole tensor, ``p`` the team size): gather and scatter
``(p-1)/p * S``, broadcast and reduce ``S``, send-recv its message; the
planner's steps as in :mod:`.planner`. The send-recvs of one ``p2p`` run
at once: that stage costs the most any one rank sends or receives.
"""
from __future__ import annotations

from collections import defaultdict
from functools import lru_cache
from itertools import product
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from ...errors import DistsimError, PassPreconditionError
from ...ir.comm import CollectiveType
from ...ir.core import Value
from ...ir.mesh import (DeviceMesh, DTensorType, Partial, Placement, Replicate, Shard,
                        check_placements, shard_range)
from .local_builder import Coords, LocalBuilder, Locals, local_name, redistribute_on_mesh
from .planner import plan_redistribute

Recipe = Callable[[LocalBuilder, Locals, str], Tuple[Locals, float]]
Interval = Tuple[int, int]  # (start, length)


def _plan_bytes(src: DTensorType, dst: DTensorType) -> float:
    if src.placements == dst.placements:
        return 0.0
    return sum(s.bytes_per_device for s in
               plan_redistribute(src.shape, src.dtype, src.mesh, src.placements, dst.placements))


def _on_mesh(src: DTensorType, dst: DTensorType, lb: LocalBuilder, vals: Locals, hint: str
             ) -> Tuple[Locals, float]:
    if src.placements == dst.placements:
        return vals, 0.0
    return redistribute_on_mesh(lb, vals, src, dst, hint), _plan_bytes(src, dst)


def _blocks(t: DTensorType) -> Dict[Coords, Tuple[Interval, ...]]:
    return {c: tuple(shard_range(size, t.placements, t.mesh.shape, d, c)
                     for d, size in enumerate(t.shape))
            for c in t.mesh.all_coords()}


def _has_partial(t: DTensorType) -> bool:
    return any(isinstance(p, Partial) and n > 1 for p, n in zip(t.placements, t.mesh.shape))


# -- point to point ---------------------------------------------------------------
def point_to_point(lb: LocalBuilder, vals: Locals, ta: DTensorType, tb: DTensorType, hint: str
                   ) -> Tuple[Locals, float]:
    """Each device of ``tb``'s mesh assembles its piece from the pieces of
    ``ta`` (neither partial); returns its values and the stage's cost."""
    if _has_partial(ta) or _has_partial(tb):
        raise PassPreconditionError("point-to-point moves need placements without partials")
    a, b = ta.mesh, tb.mesh
    src_blocks = _blocks(ta)
    holders: Dict[Tuple[Interval, ...], List[Coords]] = defaultdict(list)
    for c, block in src_blocks.items():
        holders[block].append(c)
    cuts = [sorted({block[d] for block in src_blocks.values()}) for d in range(len(ta.shape))]
    sent: Dict[int, float] = defaultdict(float)
    recv: Dict[int, float] = defaultdict(float)
    pieces: Dict[Tuple[Coords, Tuple[Interval, ...]], Value] = {}
    out: Locals = {}
    for cb, want in _blocks(tb).items():
        rank_b = b.rank_at(cb)
        per_dim = []
        for d, (s, n) in enumerate(want):
            parts = []
            for start, length in cuts[d]:
                lo, hi = max(s, start), min(s + n, start + length)
                if lo < hi:
                    parts.append(((lo, hi - lo), (start, length)))
            per_dim.append(parts)
        grid: Dict[Tuple[int, ...], Value] = {}
        for idx in product(*(range(len(p)) for p in per_dim)):
            sub = tuple(per_dim[d][i][0] for d, i in enumerate(idx))
            block = tuple(per_dim[d][i][1] for d, i in enumerate(idx))
            cands = holders[block]
            same = [c for c in cands if a.rank_at(c) == rank_b]
            holder = same[0] if same else min(cands, key=lambda c: sent[a.rank_at(c)])
            piece = _cut(lb, vals, pieces, holder, block, sub, a.rank_at(holder), hint)
            r_from = a.rank_at(holder)
            if r_from != rank_b:
                nbytes = float(piece.type.size_bytes)
                piece = sendrecv(lb, piece, r_from, rank_b, hint + "_part")
                sent[r_from] += nbytes
                recv[rank_b] += nbytes
            grid[idx] = piece
        out[cb] = _join(lb, grid, [len(p) for p in per_dim], local_name(hint, rank_b))
    cost = max(list(sent.values()) + list(recv.values()) + [0.0])
    return out, cost


def _cut(lb: LocalBuilder, vals: Locals, cache, holder: Coords, block, sub, rank: int, hint: str
         ) -> Value:
    key = (holder, sub)
    if key not in cache:
        v = vals[holder]
        for d, ((lo, n), (start, length)) in enumerate(zip(sub, block)):
            if (lo, n) != (start, length):
                v = lb.emit("slice", [v], {"axis": d, "start": lo - start, "stop": lo - start + n},
                            [local_name(hint + "_piece", rank)])[0]
        cache[key] = v
    return cache[key]


def _join(lb: LocalBuilder, grid: Dict[Tuple[int, ...], Value], counts: Sequence[int], name: str
          ) -> Value:
    """Concatenate a grid of parts (index per dim) innermost dim first."""
    current = dict(grid)
    for d in reversed(range(len(counts))):
        merged: Dict[Tuple[int, ...], Value] = {}
        groups: Dict[Tuple[int, ...], List[Value]] = defaultdict(list)
        for idx in sorted(current):
            groups[idx[:d]].append(current[idx])
        for key, parts in groups.items():
            if len(parts) == 1:
                merged[key] = parts[0]
            else:
                hint = name if d == 0 or all(c == 1 for c in counts[:d]) else name + "_join"
                merged[key] = lb.emit("concat", parts, {"axis": d}, [hint])[0]
        current = merged
    return current[()]


def sendrecv(lb: LocalBuilder, v: Value, r_from: int, r_to: int, hint: str) -> Value:
    return lb.emit(CollectiveType.SEND_RECV.op_type, [v], {"ranks": [r_from, r_to]},
                   [local_name(hint, r_to)], {"bytes_per_device": float(v.type.size_bytes)})[0]


# -- through a root -------------------------------------------------------------------
def _roots(a: DeviceMesh, b: DeviceMesh) -> Tuple[int, int]:
    shared = [r for r in a.devices if r in b.devices]
    if shared:
        return shared[0], shared[0]
    return a.devices[0], b.devices[0]


def through_root(lb: LocalBuilder, vals: Locals, src: DTensorType, dst: DTensorType, hint: str
                 ) -> Tuple[Locals, float]:
    a, b = src.mesh, dst.mesh
    root_a, root_b = _roots(a, b)
    size = float(src.size_bytes)
    pl = src.placements
    if a.ndim == 1 and a.size > 1 and isinstance(pl[0], (Shard, Partial)):
        ins = [vals[(i,)] for i in range(a.size)]
        team = {"ranks": list(a.devices), "root": root_a, "mesh": a.name, "axes": [a.axis_names[0]]}
        if isinstance(pl[0], Shard):
            kind, attrs = CollectiveType.GATHER, dict(team, dim=pl[0].dim)
            cost = (a.size - 1) / a.size * size
        else:
            kind, attrs, cost = CollectiveType.REDUCE, dict(team, reduce_op=pl[0].op), size
        whole = lb.emit(kind.op_type, ins, attrs, [local_name(hint, root_a)],
                        {"bytes_per_device": cost})[0]
    else:
        full = src.with_placements([Replicate()] * a.ndim)
        spread, cost = _on_mesh(src, full, lb, vals, hint)
        whole = spread[a.coords_of(root_a)]
    if root_a != root_b:
        whole = sendrecv(lb, whole, root_a, root_b, hint)
        cost += size
    if b.size == 1:
        return {(0,) * b.ndim: whole}, cost
    team = {"ranks": list(b.devices), "root": root_b, "mesh": b.name, "axes": list(b.axis_names)}
    if b.ndim == 1 and isinstance(dst.placements[0], Shard):
        step = (b.size - 1) / b.size * size
        outs = lb.emit(CollectiveType.SCATTER.op_type, [whole],
                       dict(team, dim=dst.placements[0].dim),
                       [local_name(hint, r) for r in b.devices], {"bytes_per_device": step})
        return {(i,): v for i, v in enumerate(outs)}, cost + step
    outs = lb.emit(CollectiveType.BROADCAST.op_type, [whole], team,
                   [local_name(hint, r) for r in b.devices], {"bytes_per_device": size})
    spread = {c: v for c, v in zip(b.all_coords(), outs)}
    replicated = dst.with_placements([Replicate()] * b.ndim)
    out, more = _on_mesh(replicated, dst, lb, spread, hint)
    return out, cost + size + more


# -- the candidates --------------------------------------------------------------------
def _without_partials(pl: Sequence[Placement]) -> Tuple[Placement, ...]:
    return tuple(Replicate() if isinstance(p, Partial) else p for p in pl)


def _fits(t: DTensorType, pl: Sequence[Placement]) -> bool:
    try:
        check_placements(t.shape, t.mesh, pl, "cross-mesh step")
    except DistsimError:
        return False
    return True


def candidates(src: DTensorType, dst: DTensorType) -> List[Tuple[str, Recipe]]:
    """The recipes worth trying, in order of preference on a tie."""
    a, b = src.mesh, dst.mesh
    mids_a = [tuple(src.placements), _without_partials(src.placements), (Replicate(),) * a.ndim]
    mids_b = [_without_partials(dst.placements)]
    if a.ndim == b.ndim:
        mids_a.append(_without_partials(dst.placements))
        mids_b.append(_without_partials(src.placements))
    mids_a = [m for i, m in enumerate(mids_a) if m not in mids_a[:i]]
    mids_b = [m for i, m in enumerate(mids_b) if m not in mids_b[:i]]
    found: List[Tuple[str, Recipe]] = []
    for ma in mids_a:
        ta = src.with_placements(ma)
        if _has_partial(ta) or not _fits(ta, ma):
            continue
        for mb in mids_b:
            tb = DTensorType(dst.shape, dst.dtype, b, mb)
            if not _fits(tb, mb):
                continue
            found.append((f"p2p({_text(ma)} -> {_text(mb)})", _p2p_recipe(src, ta, tb, dst)))
    found.append(("root", lambda lb, vals, hint: through_root(lb, vals, src, dst, hint)))
    return found


def _text(pl: Sequence[Placement]) -> str:
    return "[" + ", ".join(p.print_text() for p in pl) + "]"


def _p2p_recipe(src: DTensorType, ta: DTensorType, tb: DTensorType, dst: DTensorType) -> Recipe:
    def run(lb: LocalBuilder, vals: Locals, hint: str) -> Tuple[Locals, float]:
        vals, c1 = _on_mesh(src, ta, lb, vals, hint)
        vals, c2 = point_to_point(lb, vals, ta, tb, hint)
        vals, c3 = _on_mesh(tb, dst, lb, vals, hint)
        return vals, c1 + c2 + c3
    return run


def _dry_run(src: DTensorType, recipe: Recipe) -> Optional[float]:
    lb = LocalBuilder("cross_mesh")
    vals = {c: lb.input(local_name("x", src.mesh.rank_at(c)), src.local_type(c))
            for c in src.mesh.all_coords()}
    try:
        _, cost = recipe(lb, vals, "x")
    except DistsimError:
        return None
    return cost


@lru_cache(maxsize=1024)
def recipe_costs(src: DTensorType, dst: DTensorType) -> Tuple[Tuple[str, float], ...]:
    """Each valid candidate's name and bytes per device, in candidate order."""
    out = []
    for name, recipe in candidates(src, dst):
        cost = _dry_run(src, recipe)
        if cost is not None:
            out.append((name, cost))
    return tuple(out)


def cross_mesh_cost(src: DTensorType, dst: DTensorType) -> float:
    costs = recipe_costs(src, dst)
    return min(c for _, c in costs) if costs else float("inf")


def cross_mesh(lb: LocalBuilder, vals: Locals, src: DTensorType, dst: DTensorType,
               hint: str) -> Locals:
    """Emit the cheapest recipe moving ``src``'s local values to ``dst``."""
    costs = dict(recipe_costs(src, dst))
    best = min(costs, key=lambda name: costs[name]) if costs else None
    for name, recipe in candidates(src, dst):
        if name == best:
            return recipe(lb, vals, hint)[0]
    raise PassPreconditionError(f"no way to move {src} to mesh @{dst.mesh.name} as {dst}")
