"""Collectives on the simulated network.

:func:`run_collective` decomposes one collective into network steps by an
algorithm from :mod:`.collective_algos` and runs them with
:meth:`Network.run_steps`. ``algorithm="auto"`` estimates every algorithm
the kind has on this topology and team (a per-step alpha-beta bound with
link sharing inside the step) and takes the fastest, as NCCL's tuner does;
the name used is the process's return value, so the trace can show it.
Each network keeps the schedule of every collective it has run (a training
step repeats the same few thousand times).
"""
from __future__ import annotations

from typing import Dict, Optional, Sequence, Tuple

import simpy

from ..errors import ConfigError, TopologyError
from ..ir.comm import CollectiveType
from .collective_algos import ALGORITHMS, Phase, Schedule
from .network import Network

ROOTED = (CollectiveType.BROADCAST, CollectiveType.REDUCE, CollectiveType.GATHER,
          CollectiveType.SCATTER)


def algorithms_for(kind: CollectiveType) -> Tuple[str, ...]:
    """The algorithm names ``kind`` accepts (besides ``auto``)."""
    return tuple(ALGORITHMS[kind])


#: Every algorithm name some collective kind knows, and ``auto``.
KNOWN_ALGORITHMS: Tuple[str, ...] = tuple(sorted(
    {"auto"} | {name for table in ALGORITHMS.values() for name in table}))


def check_algorithm_name(name: object, where: str = "--collective-algo") -> str:
    """``name`` when it is ``auto`` or an algorithm of at least one kind;
    else a ConfigError naming ``where`` (checked once, before a run)."""
    if not isinstance(name, str) or name not in KNOWN_ALGORITHMS:
        raise ConfigError(f"{where}: unknown algorithm {name!r} "
                          f"(known: {', '.join(KNOWN_ALGORITHMS)})")
    return name


def resolve_algorithm(kind: CollectiveType, requested: str, per_run: bool = False) -> str:
    """The algorithm a ``kind`` collective runs when ``requested`` is asked.

    An op's own algorithm (``per_run=False``) is strict: a name ``kind``
    lacks is a ConfigError. The run's default (``--collective-algo``,
    ``per_run=True``) applies to every collective of a program, so a name
    valid for some kind but not this one (``ring`` for a send/recv, ``tree``
    for an all-gather) means ``auto`` here; the trace records the algorithm
    actually used. A name no kind knows is an error either way."""
    table = ALGORITHMS[kind]
    if requested == "auto" or requested in table:
        return requested
    if per_run and requested in KNOWN_ALGORITHMS:
        return "auto"
    raise ConfigError(f"{kind.value}: unknown algorithm {requested!r} "
                      f"(known: auto, {', '.join(table)})")


def check_team(network: Network, kind: CollectiveType, ranks: Sequence[int],
               root: Optional[int]) -> None:
    """One-line errors for a team the topology cannot run; a team found
    good is remembered per topology (:attr:`Network.team_plans`), only with
    plain int ranks (a bool rank equals and hashes as an int, and an
    unhashable one is for the check to name)."""
    plain = all(type(r) is int for r in ranks) and (root is None or type(root) is int)
    key = ("checked", kind, tuple(ranks), root)
    if plain and key in network.team_plans:
        return
    _check_team(network.topology, kind, ranks, root)
    if plain:
        network.team_plans[key] = True


def _check_team(topo, kind: CollectiveType, ranks: Sequence[int], root: Optional[int]) -> None:
    for r in ranks:
        if isinstance(r, bool) or not isinstance(r, int) or not 0 <= r < topo.num_devices:
            raise TopologyError(f"{kind.value}: team rank {r!r} is not a device of topology "
                                f"'{topo.name}' (ranks 0..{topo.num_devices - 1})")
    if len(set(ranks)) != len(ranks):
        raise ConfigError(f"{kind.value}: team {tuple(ranks)} names a rank twice")
    if kind in ROOTED and root not in ranks:
        raise ConfigError(f"{kind.value}: root {root!r} is not in the team {tuple(ranks)}")
    if kind is CollectiveType.SEND_RECV and len(ranks) != 2:
        raise ConfigError(f"sendrecv: the team must be (sender, receiver), got {tuple(ranks)}")


def build_schedule(network: Network, kind: CollectiveType, ranks: Tuple[int, ...],
                   nbytes: float, root: Optional[int], algorithm: str) -> Tuple[str, Schedule]:
    """(algorithm name used, schedule) for one collective. An algorithm
    that does not apply to the team falls back to the kind's first one."""
    table = ALGORITHMS[kind]
    if resolve_algorithm(kind, algorithm) == "auto":
        return choose_algorithm(network, kind, ranks, nbytes, root)
    schedule = table[algorithm](ranks, nbytes, root, network)
    if schedule is None:
        algorithm = next(iter(table))
        schedule = table[algorithm](ranks, nbytes, root, network)
    return algorithm, schedule


def estimate_time_s(network: Network, schedule: Schedule) -> float:
    """An uncontended estimate of a schedule's time (see
    :func:`step_time_estimate`)."""
    return sum(phase.count * network.step_time_estimate(phase.flows) for phase in schedule)


def choose_algorithm(network: Network, kind: CollectiveType, ranks: Tuple[int, ...],
                     nbytes: float, root: Optional[int]) -> Tuple[str, Schedule]:
    """``auto``: the applicable algorithm with the smallest estimated time
    on this topology and team (ties: table order), as NCCL's tuner picks by
    size and topology. The estimates need one route per flow of a step
    (O(p) routes for ring and hierarchical, O(p) distinct ones for the
    trees), all cached; decisions are cached per topology (shared by the
    networks over it)."""
    table = ALGORITHMS[kind]
    key = (kind, ranks, float(nbytes), root)
    cache = network.algorithm_choices
    name = cache.get(key)
    if name is not None:
        return name, table[name](ranks, nbytes, root, network)
    best = None
    for name, algo in table.items():
        schedule = algo(ranks, nbytes, root, network)
        if schedule is None:
            continue
        t = estimate_time_s(network, schedule) if len(table) > 1 else 0.0
        if best is None or t < best[0]:
            best = (t, name, schedule)
    cache[key] = best[1]
    return best[1], best[2]


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
        yield from network.run_steps(phase.flows, phase.count)
    return name


def planned_schedule(network: Network, kind: CollectiveType, ranks: Sequence[int],
                     nbytes: float, root: Optional[int] = None, algorithm: str = "auto"
                     ) -> Tuple[str, Tuple[Phase, ...]]:
    """(algorithm name, schedule) of a collective on ``network``, checked
    and planned once per (kind, team, bytes, root, algorithm)."""
    ranks = tuple(ranks)
    key = (kind, ranks, nbytes, root, algorithm)
    try:
        hit = network.schedules.get(key)
    except TypeError:                  # an unhashable rank or root: _plan names it
        hit = _plan(network, kind, ranks, nbytes, root, algorithm)
    if hit is None:
        hit = network.schedules[key] = _plan(network, kind, ranks, nbytes, root, algorithm)
    return hit


def _plan(network: Network, kind: CollectiveType, ranks: Tuple[int, ...], nbytes: float,
          root: Optional[int], algorithm: str) -> Tuple[str, Tuple[Phase, ...]]:
    """(algorithm name, schedule) of a checked collective; the same call
    gets the same answer, so :func:`run_collective` keeps it per network."""
    check_team(network, kind, ranks, root)
    if nbytes < 0:
        raise ConfigError(f"{kind.value}: bytes must be >= 0, got {nbytes!r}")
    if len(ranks) < 2 or nbytes == 0:
        resolve_algorithm(kind, algorithm)      # a bad name is an error even here
        return "none", ()
    name, schedule = build_schedule(network, kind, ranks, nbytes, root, algorithm)
    return name, tuple(schedule)


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
