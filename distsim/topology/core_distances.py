"""Distances to separators without an all-nodes x all-separators table.

:class:`~distsim.topology.routing.SeparatorOracle` needs ``d(v, s)``: the
least cost from any node ``v`` to a separator ``s`` (a switch of the
inter-server network). The general way is one table over every node and
every separator (vectorised Bellman-Ford), whose work grows with
nodes x separators x edges: at 8192 GPUs (23k nodes, 513 switches) that is
seconds and hundreds of MB, for routes that read a few hundred entries
each.

In a cluster a least-cost path does not pass *through* a server to get
from one switch to another: the switches' own network (the *core*) is
cheaper. Where that holds it gives the distances in two levels, exactly:

- ``D(a, b)`` between separators over core links only (a table of
  separators x separators, small);
- for a node ``v`` inside a server (a *region*: a component of the graph
  without the separators), its cost to leave the region at each of the
  region's exits ``b`` without crossing another separator, ``x(v, b)``;

and ``d(v, s) = D(v, s)`` for a separator ``v``, ``min_b x(v, b) + D(b, s)``
otherwise. It holds when every way through a region between two different
separators costs more than the core path between them: then any path that
crosses a region is beaten by one that does not (replace each crossing by
its core path), so least-cost paths from a separator stay in the core, and
from inside a region leave it once. :func:`two_level` checks that with a
lower bound per region (cheapest way in + cheapest way out + the cheapest
link inside, unless one node touches two separators) and returns None
where it does not hold (or the tables would be large): the caller keeps
the general table. Costs are integers, so the check is strict and the
distances equal the general ones exactly.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

INF = 1 << 60
Adjacency = List[List[Tuple[int, int]]]      # node index -> [(neighbour index, cost)]

#: above this many separators the separators x separators table is not built
MAX_SEPARATORS = 4096
#: rounds of the vectorised searches (longest least-cost path, in hops)
MAX_ROUNDS = 64


def edge_arrays(adj: Adjacency) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The links of ``adj`` as (tails, heads, costs) int64 arrays, in
    adjacency order (so tails are sorted)."""
    tails = np.fromiter((u for u, hops in enumerate(adj) for _ in hops), dtype=np.int64)
    heads = np.fromiter((w for hops in adj for w, _ in hops), dtype=np.int64)
    costs = np.fromiter((c for hops in adj for _, c in hops), dtype=np.int64)
    return tails, heads, costs


def settle_distances(dist: np.ndarray, tails: np.ndarray, heads: np.ndarray,
                     costs: np.ndarray, max_rounds: int = MAX_ROUNDS) -> bool:
    """Relax ``dist[tail] <- dist[head] + cost`` over the edges (rows of
    ``dist`` are nodes, columns targets) until nothing changes, in place
    (Bellman-Ford rounds over all targets at once); False if that takes
    more than ``max_rounds`` rounds."""
    if not len(tails):
        return True
    order = np.argsort(tails, kind="stable")
    tails, heads, costs = tails[order], heads[order], costs[order][:, None]
    starts = np.flatnonzero(np.r_[True, tails[1:] != tails[:-1]])
    rows = tails[starts]
    for _ in range(max_rounds):
        current = dist[rows]
        best = np.minimum(current, np.minimum.reduceat(dist[heads] + costs, starts, axis=0))
        if np.array_equal(best, current):
            return True
        dist[rows] = best
    return False


class TwoLevel:
    """``d(v, s)`` through the core (see the module docstring); made by
    :func:`two_level`."""

    def __init__(self, position: np.ndarray, core: np.ndarray, region: np.ndarray,
                 exits: np.ndarray, leave: np.ndarray) -> None:
        self.position = position      # node -> its index among the separators, or -1
        self.core = core              # separators x separators, core links only
        self.region = region          # node -> region index (separators: -1)
        self.exits = exits            # region -> its exit separators' positions (-1 pads)
        self.leave = leave            # node -> cost to leave by each exit of its region
        self._ways: Dict[int, List[Tuple[int, int]]] = {}

    def through(self, via: Sequence[Tuple[int, int]]) -> "SeparatorColumn":
        """``min over (s, e) in via of d(., s) + e``, evaluated per node on
        demand: the distance to a destination reached from the separators
        ``s`` at cost ``e`` (both sides of the minimum share the exits);
        ``through([(s, 0)])`` is ``d(., s)``."""
        best = np.full(len(self.core), INF, dtype=np.int64)
        for s, e in via:
            np.minimum(best, self.core[:, self.position[s]] + e, out=best)
        return SeparatorColumn(self, best)

    def ways_out(self, v: int) -> List[Tuple[int, int]]:
        """(exit position, cost to leave by it) of a node inside a region."""
        found = self._ways.get(v)
        if found is None:
            exits = self.exits[self.region[v]]
            found = self._ways[v] = [(int(b), int(c)) for b, c in zip(exits, self.leave[v])
                                     if b >= 0 and c < INF]
        return found


class SeparatorColumn:
    """``d(v, s)`` for one separator ``s``: indexable by node like an array."""

    __slots__ = ("levels", "to_s", "to_s_array")

    def __init__(self, levels: TwoLevel, to_s: np.ndarray) -> None:
        self.levels = levels
        self.to_s_array = to_s          # D(b, s) for every separator position b
        self.to_s: List[int] = to_s.tolist()     # the same, for per-node lookups

    def __getitem__(self, v: int) -> int:
        levels, to_s = self.levels, self.to_s
        p = levels.position[v]
        if p >= 0:
            return to_s[p]
        best = INF
        for b, c in levels.ways_out(v):
            x = c + to_s[b]
            if x < best:
                best = x
        return best

    def take(self, nodes: np.ndarray) -> np.ndarray:
        """``d(v, s)`` for every node of ``nodes`` (an int64 array), as an
        array: separators in one gather, the others one by one."""
        positions = self.levels.position[nodes]
        out = self.to_s_array[np.maximum(positions, 0)]
        for i in np.flatnonzero(positions < 0).tolist():
            out[i] = self[int(nodes[i])]
        return out


def _regions(n: int, is_sep: np.ndarray, tails: np.ndarray, heads: np.ndarray
             ) -> Optional[np.ndarray]:
    """Region index of every non-separator node (separators -1): the
    components of the graph without the separators, by label propagation
    (as many rounds as a region is wide); None past MAX_ROUNDS rounds."""
    label = np.arange(n, dtype=np.int64)
    inside = ~is_sep[tails] & ~is_sep[heads]
    a, b = tails[inside], heads[inside]
    for _ in range(MAX_ROUNDS):
        new = label.copy()
        np.minimum.at(new, a, label[b])
        np.minimum.at(new, b, label[a])
        if np.array_equal(new, label):
            # number the regions from 0 (a region's label is its least node)
            out = np.full(n, -1, dtype=np.int64)
            keep = ~is_sep
            out[keep] = np.unique(label[keep], return_inverse=True)[1].reshape(-1)
            return out
        label = new
    return None


def two_level(adj: Adjacency, separators: Sequence[int]) -> Optional[TwoLevel]:
    """The two-level distances for ``adj`` (node -> [(next node, cost)])
    with the given separators, or None where they would not be exact or
    not pay (see the module docstring)."""
    n, seps = len(adj), np.asarray(sorted(set(separators)), dtype=np.int64)
    S = len(seps)
    if S == 0 or S > MAX_SEPARATORS:
        return None
    tails, heads, costs = edge_arrays(adj)
    is_sep = np.zeros(n, dtype=bool)
    is_sep[seps] = True
    position = np.full(n, -1, dtype=np.int64)
    position[seps] = np.arange(S)
    sep_tail, sep_head = is_sep[tails], is_sep[heads]

    # separators to separators over core links
    core = np.full((S, S), INF, dtype=np.int64)
    core[np.arange(S), np.arange(S)] = 0
    both = sep_tail & sep_head
    if not settle_distances(core, position[tails[both]], position[heads[both]], costs[both]):
        return None

    region = _regions(n, is_sep, tails, heads)
    if region is None:
        return None
    R = int(region.max()) + 1 if (region >= 0).any() else 0

    # each region's exits (separators it has a link to) and entries
    out_edge = ~sep_tail & sep_head
    in_edge = sep_tail & ~sep_head
    inner = ~sep_tail & ~sep_head
    out_region, out_sep = region[tails[out_edge]], position[heads[out_edge]]
    in_region, in_sep = region[heads[in_edge]], position[tails[in_edge]]
    exits_of: List[List[int]] = [[] for _ in range(R)]
    for r, b in sorted(set(zip(out_region.tolist(), out_sep.tolist()))):
        exits_of[r].append(b)
    entries_of: List[List[int]] = [[] for _ in range(R)]
    for r, b in sorted(set(zip(in_region.tolist(), in_sep.tolist()))):
        entries_of[r].append(b)

    # the check: every crossing of a region costs more than the core path
    def least(where: np.ndarray, values: np.ndarray) -> np.ndarray:
        out = np.full(R, INF, dtype=np.int64)
        np.minimum.at(out, where, values)
        return out

    cheapest_out = least(out_region, costs[out_edge])
    cheapest_in = least(in_region, costs[in_edge])
    cheapest_inside = least(region[tails[inner]], costs[inner])
    touching: Dict[int, set] = {}
    for v, b in zip(np.r_[tails[out_edge], heads[in_edge]].tolist(),
                    np.r_[out_sep, in_sep].tolist()):
        touching.setdefault(v, set()).add(b)
    two_touching = np.zeros(R, dtype=bool)
    for v, bs in touching.items():
        if len(bs) > 1:
            two_touching[region[v]] = True
    bound = cheapest_in + cheapest_out + np.where(two_touching, 0, cheapest_inside)
    for r in range(R):
        ins, outs = entries_of[r], exits_of[r]
        if not ins or not outs:
            continue
        pairs = core[np.ix_(ins, outs)]
        distinct = np.asarray(ins)[:, None] != np.asarray(outs)[None, :]
        if distinct.any() and not bound[r] > pairs[distinct].max():
            return None

    # each node's cost to leave its region by each of the region's exits
    width = max((len(e) for e in exits_of), default=0)
    if width == 0 or n * width > 20_000_000:
        return None
    exits = np.full((R, width), -1, dtype=np.int64)
    slot: Dict[Tuple[int, int], int] = {}
    for r, bs in enumerate(exits_of):
        exits[r, :len(bs)] = bs
        for k, b in enumerate(bs):
            slot[(r, b)] = k
    leave = np.full((n, width), INF, dtype=np.int64)
    ks = np.fromiter((slot[(r, b)] for r, b in zip(out_region.tolist(), out_sep.tolist())),
                     dtype=np.int64, count=len(out_region))
    np.minimum.at(leave, (tails[out_edge], ks), costs[out_edge])
    if not settle_distances(leave, tails[inner], heads[inner], costs[inner]):
        return None
    return TwoLevel(position, core, region, exits, leave)
