"""Exact least-cost distances to a destination, shared across sources.

:meth:`Topology.route` needs, for a destination ``t``, the least cost
``d(v, t)`` of every node ``v`` next to the path it walks (to recognise
every equal-cost next hop). One graph search per (source, destination)
pair costs a whole-graph Dijkstra at 1024 GPUs (the cross-node radius
covers almost every node), so this module answers ``d(v, t)`` through a
*separator* set ``S`` (the inter-server network: switches that belong to
no server):

- for every separator ``s`` at once, ``d(v, s)`` for every ``v`` by a
  vectorised Bellman-Ford (numpy, integer costs; as many rounds as the
  longest least-cost path has hops), computed when first needed;
- for each destination ``t`` a small reverse Dijkstra from ``t`` that
  settles separators but does not expand them gives the *local* region
  ``L_t`` (the nodes that reach ``t`` without crossing ``S``: its server)
  with ``d_L(v, t)``, and ``e(s, t)``: the cost from separator ``s`` to
  ``t`` with every intermediate node in ``L_t``.

Then, exactly, ``d(v, t) = min(d_L(v, t), min_s d(v, s) + e(s, t))``: a
least-cost path either stays in ``L_t`` or has a last separator ``s``,
after which it runs inside ``L_t``. Where ``d_L(v, t)`` is at most
``min_s e(s, t)`` no path through a separator can be cheaper, so routes
inside a server never need the separator distances. Costs are integers,
so equalities are exact and the routes are the ones a per-pair search
finds.
"""
from __future__ import annotations

import heapq
from array import array
from typing import Dict, Iterable, List, Optional, Sequence, Set, Tuple, Union

import numpy as np

from .core_distances import (INF, Adjacency, SeparatorColumn, TwoLevel, edge_arrays,
                             settle_distances, two_level)

#: d(., s) for one separator s, indexable by node
Distances = Union[array, SeparatorColumn]


def reverse_dijkstra_all(radj: Adjacency, target: int) -> array:
    """``d(v, target)`` for every node index ``v`` (INF if it cannot reach)."""
    dist = array("q", [INF]) * len(radj)
    dist[target] = 0
    heap = [(0, target)]
    pop, push = heapq.heappop, heapq.heappush
    while heap:
        d, u = pop(heap)
        if d > dist[u]:
            continue
        for v, c in radj[u]:
            nd = d + c
            if nd < dist[v]:
                dist[v] = nd
                push(heap, (nd, v))
    return dist


def reverse_distances_batch(adj: Adjacency, targets: Sequence[int],
                            max_rounds: int = 64) -> Optional[np.ndarray]:
    """``d(v, targets[j])`` for every node ``v`` as a (nodes x targets)
    int64 array, by Bellman-Ford rounds over all targets at once: round k
    knows every least cost of a path with at most k hops. None if it has
    not settled after ``max_rounds`` rounds (a long chain; use Dijkstra)."""
    n, m = len(adj), len(targets)
    tails, heads, costs = edge_arrays(adj)
    dist = np.full((n, m), INF, dtype=np.int64)
    dist[np.asarray(targets, dtype=np.int64), np.arange(m)] = 0
    return dist if settle_distances(dist, tails, heads, costs, max_rounds) else None


class DistancesTo:
    """``d(v, t)`` for one destination ``t``, evaluated on demand.

    The local search from ``t`` (separators settled, not expanded) is
    resumable: without separators it is the whole graph, and it only runs
    as far as the farthest source asked for so far (:meth:`reach`)."""

    __slots__ = ("target", "oracle", "local", "best", "heap", "via", "floor", "memo", "arrays")

    def __init__(self, target: int, oracle: "SeparatorOracle") -> None:
        self.target = target
        self.oracle = oracle
        self.local: Dict[int, int] = {}     # settled d_L(v, t) (and e(s, t) for s in S)
        self.best: Dict[int, int] = {target: 0}
        self.heap: List[Tuple[int, int]] = [(0, target)]
        self.memo: Dict[int, int] = {}
        self.arrays: Optional[List[Tuple[Distances, int]]] = None
        if oracle.separators:
            self._settle(INF)
            self.via = [(s, e) for s, e in sorted(self.local.items()) if oracle.is_sep[s]]
            self.floor = min((e for _, e in self.via), default=INF)
        else:
            self.via = []
            self.floor = INF                # no path via S: d = d_L, exact once settled

    def _settle(self, radius: int, until: int = -1) -> None:
        """Settle every node of the local search with cost <= ``radius``
        (and ``until``, then every node no farther than it)."""
        local, best, heap = self.local, self.best, self.heap
        radj, stop, target = self.oracle.radj, self.oracle.is_sep, self.target
        pop, push = heapq.heappop, heapq.heappush
        while heap and heap[0][0] <= radius:
            d, u = pop(heap)
            if u in local:
                continue
            local[u] = d
            if u == until:
                radius = d
            if stop[u] and u != target:
                continue
            for v, c in radj[u]:
                nd = d + c
                if v not in local and nd < best.get(v, INF):
                    best[v] = nd
                    push(heap, (nd, v))

    def reach(self, source: int) -> int:
        """``d(source, t)``; afterwards every ``d(v, t)`` up to it is exact
        (larger ones may read as INF)."""
        if source not in self.local and self.heap:
            self._settle(INF, until=source)
        return self(source)

    def __call__(self, v: int) -> int:
        best = self.local.get(v, INF)
        if best <= self.floor:
            return best
        hit = self.memo.get(v)
        if hit is not None:
            return hit
        arrays = self.arrays
        if arrays is None:
            arrays = self.arrays = self.oracle.via_separators(self.via)
        for dist_s, e in arrays:
            x = dist_s[v] + e
            if x < best:
                best = x
        self.memo[v] = best
        return best

    def many(self, nodes: np.ndarray, position: Dict[int, int]) -> Optional[np.ndarray]:
        """``d(v, t)`` for every node of ``nodes`` (an int64 array; ``position``
        maps each to its index there) as an int64 array, in a few gathers
        instead of one call per node (a core switch has a thousand
        neighbours); None where the local search is not finished (no
        separators: it is resumed per source)."""
        if not self.oracle.separators:
            return None
        arrays = self.arrays
        if arrays is None:
            arrays = self.arrays = self.oracle.via_separators(self.via)
        best = np.full(len(nodes), INF, dtype=np.int64)
        for dist_s, e in arrays:
            column = dist_s.take(nodes) if isinstance(dist_s, SeparatorColumn) \
                else np.frombuffer(dist_s, dtype=np.int64)[nodes]
            np.minimum(best, column + e, out=best)
        # d(v, t) = min(d_L(v, t), via the separators) (see __call__)
        for v, d in self.local.items():
            i = position.get(v)
            if i is not None and d < best[i]:
                best[i] = d
        return best


class SeparatorOracle:
    """Distances to any destination through a separator set (see the module
    docstring). ``separators`` may be any set of node indices, or none (one
    resumable search per destination): the answers are exact for every
    choice; a good one only makes them cheap."""

    def __init__(self, radj: Adjacency, adj: Adjacency, separators: Iterable[int] = ()) -> None:
        self.radj = radj
        self.adj = adj
        self.separators = sorted(set(separators))
        self.is_sep = [False] * len(radj)
        for s in self.separators:
            self.is_sep[s] = True
        self._sep_dist: Dict[int, array] = {}
        self._to: Dict[int, DistancesTo] = {}
        #: the two-level distances (:mod:`.core_distances`): False until
        #: first needed, None where they do not apply
        self._levels: Union[TwoLevel, None, bool] = False

    def levels(self) -> Optional[TwoLevel]:
        """The two-level distances through the core (:mod:`.core_distances`),
        worked out on first use; None where they do not apply."""
        if self._levels is False:
            self._levels = two_level(self.adj, self.separators)
        return self._levels  # type: ignore[return-value]

    def via_separators(self, via: List[Tuple[int, int]]) -> List[Tuple[Distances, int]]:
        """``[(d(., s), e)]`` for the ``(separator s, e(s, t))`` of a
        destination: through the core, one column of ``min_s d(., s) + e``
        (one lookup per node instead of one per separator)."""
        levels = self.levels()
        if levels is not None:
            return [(levels.through(via), 0)]
        return [(self.separator_distances(s), e) for s, e in via]

    def separator_distances(self, s: int) -> array:
        """``d(., s)`` as an integer array over every node (all separators
        computed together): the general way, where the two levels do not
        apply."""
        dist = self._sep_dist.get(s)
        if dist is None:
            table = reverse_distances_batch(self.adj, self.separators)
            for j, sep in enumerate(self.separators):
                if table is None:
                    col = reverse_dijkstra_all(self.radj, sep)
                else:
                    col = array("q")
                    col.frombytes(np.ascontiguousarray(table[:, j]).tobytes())
                self._sep_dist[sep] = col
            dist = self._sep_dist[s]
        return dist

    def to(self, t: int) -> DistancesTo:
        out = self._to.get(t)
        if out is None:
            out = self._to[t] = DistancesTo(t, self)
        return out


def network_separators(kinds: Sequence[str], in_server: Sequence[bool],
                       adjacency: Adjacency, num_devices: int) -> Set[int]:
    """The separator set for a topology: the non-device nodes that belong
    to no server, where there are at most as many as devices and removing
    them leaves no region larger than half the graph; otherwise none
    (routing through them would not pay)."""
    seps = {i for i, (k, inside) in enumerate(zip(kinds, in_server))
            if k != "device" and not inside}
    n = len(kinds)
    if not seps or len(seps) > num_devices:
        return set()
    # undirected components of the graph without the separators
    parent = list(range(n))

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for u, hops in enumerate(adjacency):
        if u in seps:
            continue
        for v, _ in hops:
            if v not in seps:
                a, b = find(u), find(v)
                if a != b:
                    parent[a] = b
    sizes: Dict[int, int] = {}
    for u in range(n):
        if u not in seps:
            r = find(u)
            sizes[r] = sizes.get(r, 0) + 1
    if max(sizes.values(), default=0) > n // 2:
        return set()
    return seps
