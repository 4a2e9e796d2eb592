"""Collectives on the simulated network.

:func:`run_collective` decomposes one collective into network steps by an
algorithm from :mod:`.collective_algos` and runs them with
:meth:`Network.run_steps`. ``algorithm="auto"`` takes the algorithm that
is fastest when the collective runs alone (:func:`.solo_time.choose_algorithm`);
the name used is the process's return value, so the trace can show it.
Each network keeps the schedule of every collective it has run (a training
step repeats the same few thousand times). Names, checks and named
schedules are :mod:`.collective_plan`'s, re-exported here.
"""
from __future__ import annotations

from typing import Dict, Optional, Sequence, Tuple

import simpy

from ..ir.comm import CollectiveType
from .collective_algos import ALGORITHMS, Phase
from .collective_plan import (KNOWN_ALGORITHMS, ROOTED, algorithms_for, check_algorithm_name,
                              check_team, resolve_algorithm)
from .network import Network
from .solo_time import choose_algorithm, plan_collective

__all__ = ["ALGORITHMS", "KNOWN_ALGORITHMS", "ROOTED", "algorithms_for", "bytes_sent_by",
           "bytes_sent_per_rank", "check_algorithm_name", "check_team", "choose_algorithm",
           "planned_schedule", "resolve_algorithm", "run_collective"]


def run_collective(env: simpy.Environment, network: Network, kind: CollectiveType,
                   ranks: Tuple[int, ...], nbytes: float, root: Optional[int] = None,
                   algorithm: str = "auto"):
    """A SimPy process generator running one collective from now, once
    every team member has reached it; returns the algorithm name used.

    ``nbytes`` is the tensor size S for all-reduce, broadcast, reduce and
    send/recv; the full (gathered) size for all-gather, reduce-scatter,
    gather and scatter; each rank's input for all-to-all (S/p to each peer).
    One rank or zero bytes take no time.
    """
    name, schedule = planned_schedule(network, kind, ranks, nbytes, root, algorithm)
    for phase in schedule:
        yield from network.run_steps(phase.flows, phase.count, 0, phase.latency_s)
    return name


def planned_schedule(network: Network, kind: CollectiveType, ranks: Sequence[int],
                     nbytes: float, root: Optional[int] = None, algorithm: str = "auto"
                     ) -> Tuple[str, Tuple[Phase, ...]]:
    """(algorithm name, schedule) of a collective on ``network``, checked
    and planned once per (kind, team, bytes, root, algorithm)
    (:func:`.solo_time.plan_collective`)."""
    ranks = tuple(ranks)
    key = (kind, ranks, nbytes, root, algorithm)
    try:
        hit = network.schedules.get(key)
    except TypeError:                  # an unhashable rank or root: the check names it
        hit = plan_collective(network, kind, ranks, nbytes, root, algorithm)
    if hit is None:
        hit = network.schedules[key] = plan_collective(network, kind, ranks, nbytes, root,
                                                       algorithm)
    return hit


def bytes_sent_per_rank(kind: CollectiveType, p: int, nbytes: float,
                        algorithm: str = "auto") -> float:
    """Bytes the team puts on the network, divided by its size p (the same
    for every bandwidth-optimal algorithm of a kind)."""
    if p < 2 or nbytes <= 0:
        return 0.0
    if kind is CollectiveType.ALL_REDUCE:
        return 2.0 * (p - 1) / p * nbytes
    if kind in (CollectiveType.ALL_GATHER, CollectiveType.REDUCE_SCATTER,
                CollectiveType.ALL_TO_ALL, CollectiveType.BROADCAST, CollectiveType.REDUCE):
        return (p - 1) / p * nbytes
    if kind in (CollectiveType.GATHER, CollectiveType.SCATTER):
        return (p - 1) / p * nbytes / p
    return nbytes / p


def bytes_sent_by(kind: CollectiveType, ranks: Sequence[int], nbytes: float,
                  root: Optional[int], algorithm: str = "auto") -> Dict[int, float]:
    """Bytes each rank of the team puts on the network. Exact where it does
    not depend on the algorithm: a send/recv's sender sends all, its
    receiver nothing; a gather's members each send their piece and its
    root nothing; a scatter's root sends every other piece. For the other
    kinds, every rank is given the team's average (:func:`bytes_sent_per_rank`,
    exact for the ring algorithms)."""
    p = len(ranks)
    if p < 2 or nbytes <= 0:
        return {r: 0.0 for r in ranks}
    if kind is CollectiveType.SEND_RECV:
        return {r: (float(nbytes) if r == ranks[0] else 0.0) for r in ranks}
    if kind is CollectiveType.GATHER:
        return {r: (0.0 if r == root else nbytes / p) for r in ranks}
    if kind is CollectiveType.SCATTER:
        return {r: ((p - 1) / p * nbytes if r == root else 0.0) for r in ranks}
    avg = float(bytes_sent_per_rank(kind, p, nbytes, algorithm))
    return {r: avg for r in ranks}
