"""Pipeline transfers that share links at once, under the flow network.

The timeline (:mod:`.engine`) times each pipeline send/receive by its solo
time (:func:`distsim.sim.solo_time.collective_time`). Under ``network_mode:
flow`` the simulation's transfers share the links their routes have in
common (max-min fair flows): a stage's rank sending its forward output to
the next stage while its input gradient goes to the one before sends both
through its one NIC (on a DGX, GPU -> PCIe -> NIC -> leaf), and a rank
receiving from both neighbours at once takes both through it. Every tensor-
parallel rank of a stage does the same on its own rail, so stage 0's rank
stands for them (the routes are its ranks').

:class:`SharedLinks` keeps the transfers placed so far; a new one that
starts while transfers sharing a link with it are still sending is timed
together with them by :func:`~distsim.sim.solo_time.run_together` (the
network's own flows, each from its start): the new one ends where that run
ends it, and those placed before end no earlier than it says (their queue,
spans and arrival moved with them). Items are settled in program order, so
an arrival already read by its receiving task is not moved back: that task
started on the solo time (one of the estimate's approximations).
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

import simpy

from ..ir.comm import CollectiveType
from ..sim.network import Network
from ..sim.solo_time import run_together

#: one placed transfer: [start, end, bytes, stage pair, index in the two
#: stages' span lists, the receiving task's key]
Placed = List[Any]
#: how many of each pair's last transfers are kept: items are settled in
#: program order, not in time, so a transfer placed later may start before
#: the last few of a neighbouring queue (a pair's queue runs one at a time)
KEPT = 8


class SharedLinks:
    """The placed pipeline transfers of one walk, on ``topology`` (each
    stage's transfers from or to ``ranks[stage]``), timed together where
    their routes share links (``algorithm``: the collective algorithm
    asked for)."""

    def __init__(self, topology: Any, algorithm: str, ranks: Sequence[int]) -> None:
        self.topology = topology
        self.algorithm = algorithm
        self.ranks = tuple(ranks)
        self._network = Network(simpy.Environment(), topology, mode="flow", link_stats=False)
        #: per stage pair, the links of its route, and the pairs placed so
        #: far whose routes share a link with it
        self._routes: Dict[Tuple[int, int], frozenset] = {}
        self._sharing: Dict[Tuple[int, int], Tuple[Tuple[int, int], ...]] = {}
        #: per stage pair, its transfers still sending when last asked
        self.placed: Dict[Tuple[int, int], List[Placed]] = {}
        #: the walk's arrivals (receiving task -> when its inputs are in)
        self.recv: Dict[Any, float] = {}

    def copy(self) -> "SharedLinks":
        """An independent copy (a walk continued from a shared prefix);
        its :attr:`recv` is rebound by the walk."""
        c = SharedLinks.__new__(SharedLinks)
        c.__dict__.update(self.__dict__)
        c.placed = {pair: [list(p) for p in v] for pair, v in self.placed.items()}
        return c

    def _links(self, pair: Tuple[int, int]) -> frozenset:
        hit = self._routes.get(pair)
        if hit is None:
            route = self._network.route(self.ranks[pair[0]], self.ranks[pair[1]])[0]
            hit = self._routes[pair] = frozenset(route)
        return hit

    def _add_pair(self, pair: Tuple[int, int]) -> None:
        """A pair's first transfer: the pairs placed so far that share a
        link with it, and it with them."""
        mine = self._links(pair)
        sharing = self._sharing = dict(self._sharing)     # a copy's is its own
        found = []
        for other in self.placed:
            if mine & self._links(other):
                found.append(other)
                sharing[other] = sharing[other] + (pair,)
        sharing[pair] = tuple(found)
        self.placed[pair] = []

    def place(self, tl: Any, a: int, b: int, start: float, time_s: float, nbytes: float,
              key: Any) -> float:
        """Place a transfer from stage ``a`` to ``b`` starting at ``start``
        (``time_s`` alone, ``nbytes``; ``key``: the receiving task) on
        timeline ``tl``, before its spans are listed; returns its end."""
        pair = (a, b)
        if pair not in self.placed:
            self._add_pair(pair)
        end = start + time_s
        overlapping = [p for other in self._sharing[pair] for p in self.placed[other]
                       if p[1] > start and p[0] < end]
        if overlapping:
            end = self._together(tl, overlapping, start, nbytes, pair, end)
        mine = self.placed[pair]
        mine.append([start, end, nbytes, pair, (len(tl.p2p_ends[a]), len(tl.p2p_ends[b])), key])
        if len(mine) > KEPT:
            del mine[0]
        return end

    def _together(self, tl: Any, overlapping: List[Placed], start: float, nbytes: float,
                  pair: Tuple[int, int], solo_end: float) -> float:
        """Run the new transfer with the ``overlapping`` ones; move their
        ends to the run's where later; the new one's end."""
        t0 = min(start, min(p[0] for p in overlapping))
        items = tuple((p[0] - t0, CollectiveType.SEND_RECV,
                       (self.ranks[p[3][0]], self.ranks[p[3][1]]), p[2], self.ranks[p[3][0]])
                      for p in overlapping)
        mine = (start - t0, CollectiveType.SEND_RECV, (self.ranks[pair[0]], self.ranks[pair[1]]),
                nbytes, self.ranks[pair[0]])
        ends = run_together(self.topology, "flow", items + (mine,), self.algorithm)
        for p, e in zip(overlapping, ends):
            later = t0 + e
            if later > p[1]:
                self._move(tl, p, later)
        return max(solo_end, t0 + ends[-1])

    def _move(self, tl: Any, p: Placed, end: float) -> None:
        """A placed transfer ends at ``end`` (later): its spans, its queue
        (if it is the queue's last), its arrival, the step's end."""
        old = p[1]
        p[1] = end
        (a, b), (ia, ib) = p[3], p[4]
        tl.p2p_ends[a][ia] = end
        tl.p2p_ends[b][ib] = end
        if tl.p2p_free.get((a, b)) == old:
            tl.p2p_free[(a, b)] = end
        if end > tl.end:
            tl.end = end
        arrived: Optional[float] = self.recv.get(p[5])
        if arrived is not None and arrived < end:
            self.recv[p[5]] = end
