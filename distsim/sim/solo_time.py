"""A collective's time when it runs alone, and ``auto``'s choice by it.

:func:`collective_time` is the one place that says how long a collective
takes when nothing else uses its links: :func:`run_alone` runs it from time
0 on a network of its own, in the mode asked for (max-min fair flows, or
analytical), and the answer is kept per topology. Whoever needs that time
asks here:

- solo replay (:mod:`.solo`): a collective that always runs alone is run
  once by :func:`run_alone` (keeping its link totals) and replayed;
- the sweep estimator's collective costs
  (:class:`distsim.estimate.costs.Collectives`);
- the estimator's pipeline transfers that share links at once
  (:func:`run_together`: several from their own starts on one network);
- ``auto`` (:func:`choose_algorithm`): the applicable algorithm whose
  :func:`collective_time` in the flow model is smallest (ties: the kind's
  table order), as NCCL's tuner picks by size and topology.

``auto`` chooses by the flow model in both network modes. The analytical
mode ignores link sharing inside a step, so a tree, whose parents feed two
children at once, comes out 2-4x faster there than it runs: choosing by
that time would pick trees exactly where they are slowest (8 A100s, 1 GB:
tree 1.9 ms analytical, 6.9 ms in flow; ring 5.9 ms in both). So both
modes run the same algorithm, and the analytical mode times it its way.
Most candidates are ruled out by bounds on their flow time
(:mod:`.solo_bounds`) without being simulated.
"""
from __future__ import annotations

from typing import Dict, Optional, Sequence, Tuple

import simpy

from ..ir.comm import CollectiveType
from .collective_algos import ALGORITHMS, Phase, Schedule
from .collective_plan import algorithm_schedule, moves_data, named_schedule, resolve_algorithm
from .network import Network
from .route_table import route_table
from .solo_bounds import can_beat, schedule_bounds

#: Times this close (relative) are a tie, which goes to the kind's first
#: algorithm: two algorithms that take the same time in exact arithmetic
#: (a 4-rank chain and tree) differ by the clock's rounding, and the
#: choice should not follow the last bit of a sum.
TIE = 1e-12


def collective_time(topology, mode: str, kind: CollectiveType, ranks: Sequence[int],
                    nbytes: float, root: Optional[int] = None, algorithm: str = "auto"
                    ) -> Tuple[float, str]:
    """(seconds, algorithm that ran) of one collective run alone on
    ``topology`` in network ``mode`` (see :func:`run_alone`); kept per
    topology. ``auto`` is timed under the name it chooses, so a choice and
    the named algorithm share one run."""
    ranks = tuple(ranks)
    key = (mode, kind, ranks, nbytes, root, algorithm)
    known = route_table(topology).solo_times
    try:
        hit = known.get(key)
    except TypeError:                  # an unhashable rank or root: the check names it
        return run_alone(topology, mode, kind, ranks, nbytes, root, algorithm)[1:]
    if hit is None:
        network = Network(simpy.Environment(), topology, mode=mode, link_stats=False)
        name, schedule = plan_collective(network, kind, ranks, nbytes, root, algorithm)
        # auto's choice, or the fallback of an algorithm that does not
        # apply, is the same run as asking for that algorithm by name
        named = key[:-1] + (name,)
        hit = known.get(named)
        if hit is None:
            hit = (run_schedule(network, schedule), name)
            if name != "none":
                known[named] = hit
        known[key] = hit
    return hit


def run_alone(topology, mode: str, kind: CollectiveType, ranks: Tuple[int, ...],
              nbytes: float, root: Optional[int] = None, algorithm: str = "auto",
              record_samples: bool = False) -> Tuple[Network, float, str]:
    """Run one collective from time 0 on a network of its own: (that
    network, with the link totals and, with ``record_samples``, the link
    samples of the run; seconds; algorithm that ran)."""
    network = Network(simpy.Environment(), topology, mode=mode, record_samples=record_samples)
    name, schedule = plan_collective(network, kind, ranks, nbytes, root, algorithm)
    return network, run_schedule(network, schedule), name


def run_schedule(network: Network, schedule) -> float:
    """Run ``schedule``'s steps from now on ``network`` until they end;
    the seconds they took (the network's clock must be idle)."""
    env = network.env
    start = env.now
    env.process(_steps(network, schedule))
    env.run()
    return float(env.now - start)


def _steps(network: Network, schedule):
    """A collective's steps (``schedule``: :func:`plan_collective`'s), one
    after another on ``network`` (a SimPy process body)."""
    for flows, count, latency in schedule:
        yield from network.run_steps(flows, count, 0, latency)


def run_together(topology, mode: str, items: Sequence[tuple], algorithm: str = "auto"
                 ) -> Tuple[float, ...]:
    """The ends of collectives run on one network of their own, each from
    its own start: ``items`` are ``(start, kind, ranks, nbytes, root)``
    (seconds from the network's time 0; each item's ranks and bytes as
    :func:`collective_time` takes them). Where their routes share links
    they share them as the simulation's flows do (``mode: flow``): what
    :func:`collective_time` says of one, said of several at once; kept
    per topology."""
    items = tuple((float(start), kind, tuple(ranks), nbytes, root)
                  for start, kind, ranks, nbytes, root in items)
    key = (mode, items, algorithm)
    known = route_table(topology).together_times
    hit = known.get(key)
    if hit is None:
        hit = known[key] = _run_together(topology, mode, items, algorithm)
    return hit


def _run_together(topology, mode: str, items: Tuple[tuple, ...], algorithm: str
                  ) -> Tuple[float, ...]:
    """:func:`run_together`, run."""
    network = Network(simpy.Environment(), topology, mode=mode, link_stats=False)
    env = network.env
    ends = [0.0] * len(items)

    def one(i: int, start: float, schedule):
        if start > 0.0:
            yield env.timeout(start)
        yield from _steps(network, schedule)
        ends[i] = float(env.now)

    for i, (start, kind, ranks, nbytes, root) in enumerate(items):
        schedule = plan_collective(network, kind, ranks, nbytes, root, algorithm)[1]
        env.process(one(i, start, schedule))
    env.run()
    return tuple(ends)


def plan_collective(network: Network, kind: CollectiveType, ranks: Tuple[int, ...],
                    nbytes: float, root: Optional[int], algorithm: str
                    ) -> Tuple[str, Tuple[Phase, ...]]:
    """(algorithm name, schedule) of a checked collective: ``"none"`` and
    no steps where it moves no data, ``auto`` resolved by
    :func:`choose_algorithm`."""
    if not moves_data(network, kind, ranks, nbytes, root, algorithm):
        return "none", ()
    if resolve_algorithm(kind, algorithm) == "auto":
        name, schedule = choose_algorithm(network, kind, ranks, nbytes, root)
    else:
        name, schedule = named_schedule(network, kind, ranks, nbytes, root, algorithm)
    return name, tuple(schedule)


def choose_algorithm(network: Network, kind: CollectiveType, ranks: Tuple[int, ...],
                     nbytes: float, root: Optional[int]) -> Tuple[str, Schedule]:
    """``auto``: the applicable algorithm with the smallest
    :func:`collective_time` in the flow model (ties, within :data:`TIE`:
    table order), and its schedule on ``network``. Decisions are kept per topology
    (:attr:`Network.algorithm_choices`, shared by the networks over it)."""
    table = ALGORITHMS[kind]
    key = (kind, ranks, float(nbytes), root)
    cache = network.algorithm_choices
    name = cache.get(key)
    if name is not None:
        return name, algorithm_schedule(network, kind, name, ranks, nbytes, root)
    plans: Dict[str, Schedule] = {}
    for name in table:
        schedule = algorithm_schedule(network, kind, name, ranks, nbytes, root)
        if schedule is not None:
            plans[name] = schedule
    name = next(iter(plans))
    if len(plans) > 1:
        name = _fastest_alone(network, kind, ranks, nbytes, root, plans)
    cache[key] = name
    return name, plans[name]


def _fastest_alone(network: Network, kind: CollectiveType, ranks: Tuple[int, ...],
                   nbytes: float, root: Optional[int], plans: Dict[str, Schedule]) -> str:
    """The plan with the smallest flow time alone (the first in ``plans``
    of those within :data:`TIE` of it), simulating only those whose lower
    bound reaches the smallest upper bound (:mod:`.solo_bounds`): the
    others cannot be fastest."""
    bounds = {name: schedule_bounds(network, schedule) for name, schedule in plans.items()}
    best_upper = min(upper for _, upper, _ in bounds.values())
    contenders = [name for name, (lower, _, steps) in bounds.items()
                  if can_beat(lower, steps, best_upper)]
    if len(contenders) == 1:
        return contenders[0]
    times = [_flow_time(network.topology, kind, ranks, nbytes, root, name, plans[name])
             for name in contenders]
    tied = min(times) * (1 + TIE)
    return next(name for name, t in zip(contenders, times) if t <= tied)


def _flow_time(topology, kind: CollectiveType, ranks: Tuple[int, ...], nbytes: float,
               root: Optional[int], name: str, schedule: Schedule) -> float:
    """:func:`collective_time` in the flow model of the applicable algorithm
    ``name``, whose ``schedule`` the caller planned already (the same as
    planning it again by name: plans depend on the topology, not on the
    network's mode)."""
    key = ("flow", kind, ranks, nbytes, root, name)
    known = route_table(topology).solo_times
    hit = known.get(key)
    if hit is None:
        network = Network(simpy.Environment(), topology, mode="flow", link_stats=False)
        hit = known[key] = (run_schedule(network, tuple(schedule)), name)
    return hit[0]
