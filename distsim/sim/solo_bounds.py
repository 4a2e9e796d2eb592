"""Bounds on a schedule's time alone in the flow model, from its routes.

``auto`` takes the algorithm whose collective, run alone in the flow model,
is fastest (:func:`.solo_time.choose_algorithm`). Simulating every
candidate would cost far more than the choice is worth (a 256-rank double
tree takes ~0.3 s, and a sweep chooses for hundreds of teams and sizes), so
each candidate's time is first bracketed from its routes, and only those
whose lower bound reaches the smallest upper bound are simulated.

In a solo run every step starts on idle links and ends when its last flow
is delivered. For a step whose flows carry equal bytes ``b``, where link
``L`` of capacity ``c_L`` carries ``n_L`` of them:

- *lower*: no flow beats its route alone (``latency + b / bottleneck``,
  the analytical step), and a link needs ``n_L b / c_L`` to carry its
  flows, after which the last of them still has its path latency to go
  (at least the smallest of the flows crossing ``L``);
- *upper*: progressive filling fixes each flow's rate at a link it
  saturates, at a fair share of at least ``c_L / n_L`` there; with equal
  bytes no flow's rate changes before it ends (the flows that end first
  are the faster ones, and none of them crosses a link that limits a
  slower one). So each is delivered by its latency plus ``b n_L / c_L``
  for the most loaded link of its route.

A step of unequal flows gets the same bounds flow by flow (its links'
loads summed from its flows' bytes; each flow delivered by its latency
plus ``b max_L(n_L / c_L)`` over its own route: its max-min rate is at
least ``c_L / n_L`` at its bottleneck link, and the counts only fall as
flows end). The bounds hold in exact arithmetic; the
simulation's clock rounds and finishes flows due within ``1e-12`` of each
other together, so :func:`can_beat` compares them with that slack.
"""
from __future__ import annotations

import math
from collections import Counter
from itertools import chain
from operator import itemgetter
from typing import Dict, Sequence, Tuple

import numpy as np

from .collective_algos.schedule import Schedule
from .network import Network
from .route_table import route_table

_PAIR = itemgetter(0, 1)
_BYTES = itemgetter(2)

#: What the bounds need of a step's routes, each entry distinct: per link
#: (``n_L / c_L``, the smallest latency of a flow crossing it); per flow
#: (its latency, the largest ``n_L / c_L`` on its route); per flow (its
#: latency, its bottleneck bandwidth)
StepLoad = Tuple[Tuple[Tuple[float, float], ...], Tuple[Tuple[float, float], ...],
                 Tuple[Tuple[float, float], ...]]

#: relative slack for the clock's rounding
_REL = 1e-9
#: the network finishes flows due within this much of ``max(1, now)`` together
_EARLY = 1e-12


def step_load(pairs: Sequence[Tuple[int, int]], network: Network) -> StepLoad:
    """The :data:`StepLoad` of a step whose flows join ``pairs`` (one entry
    per flow); the same for every size, so it is kept per topology."""
    routes = [network.route(src, dst) for src, dst in pairs if src != dst]
    count = Counter(chain.from_iterable([route[0] for route in routes]))
    cap = network.link_capacity
    per_byte = {i: n / cap(i) for i, n in count.items()}
    least: Dict[int, float] = {}
    flows: Dict[Tuple[float, float], None] = {}
    for links, latency, _ in routes:
        flows[(latency, max(map(per_byte.__getitem__, links)))] = None
        for i in links:
            if latency < least.get(i, math.inf):
                least[i] = latency
    return (tuple(dict.fromkeys((per_byte[i], least[i]) for i in count)), tuple(flows),
            tuple(dict.fromkeys(route[1:] for route in routes)))


def schedule_bounds(network: Network, schedule: Schedule) -> Tuple[float, float, int]:
    """(lower, upper) bounds on ``schedule``'s time alone in the flow
    model, and its number of steps."""
    loads: Dict[tuple, StepLoad] = route_table(network.topology).step_loads
    lower = upper = 0.0
    steps = 0
    for flows, count, latency in schedule:
        if not flows:
            lower += count * (latency or 0.0)
            upper += count * (latency or 0.0)
            continue
        sizes = set(map(_BYTES, flows))
        if len(sizes) == 1:
            pairs = tuple(map(_PAIR, flows))
            load = loads.get(pairs)
            if load is None:
                load = loads[pairs] = step_load(pairs, network)
            nbytes = sizes.pop()
            per_link, per_flow, paths = load
            if latency is not None:             # the step's own latency for every flow
                per_link = [(t, latency) for t, _ in per_link]
                per_flow = [(latency, t) for _, t in per_flow]
                paths = [(latency, bottleneck) for _, bottleneck in paths]
            low = max(chain((lat + nbytes / bottleneck for lat, bottleneck in paths),
                            (nbytes * t + lat for t, lat in per_link)), default=0.0)
            high = max((lat + nbytes * t for lat, t in per_flow), default=0.0)
        else:
            low, high = _unequal_bounds(network, flows, latency)
        lower += count * low
        upper += count * high
        steps += count
    return lower, upper, steps


def _unequal_bounds(network: Network, flows, latency) -> Tuple[float, float]:
    """(lower, upper) bounds on a step of unequal flows. Lower: no flow
    beats its route alone, and a link needs its flows' bytes over its
    capacity (then the least latency of its flows). Upper: each flow's
    max-min rate is at least ``c_L / n_L`` at the link of its route where
    that is least (it is the fastest at its bottleneck link, which it
    saturates), and the counts only fall as flows end; so each is
    delivered by its latency plus ``b max_L(n_L / c_L)``. ``latency``,
    where given, is every flow's.

    With numpy over the step's :class:`_FlowLoads` (kept per topology): the
    same floats as a loop over the flows (each link's bytes added in flow
    order by ``bincount``, which adds one after the other; the maxima are
    exact in any order)."""
    pairs = tuple(map(_PAIR, flows))
    known = route_table(network.topology).flow_loads
    loads = known.get(pairs)
    if loads is None:
        loads = known[pairs] = _FlowLoads(network, pairs)
    if not len(loads.moving):
        return 0.0, 0.0
    nbytes = np.fromiter(map(_BYTES, flows), float, len(flows))[loads.moving]
    lat = loads.latency if latency is None else latency
    least = loads.least if latency is None else latency
    carried = np.bincount(loads.entry_link, weights=nbytes[loads.entry_flow],
                          minlength=len(loads.capacity))
    low = max(0.0, float((lat + nbytes / loads.bottleneck).max()),
              float((carried / loads.capacity + least).max()) if len(carried) else 0.0)
    high = max(0.0, float((lat + nbytes * loads.per_byte).max()))
    return low, high


class _FlowLoads:
    """What :func:`_unequal_bounds` needs of a step's routes for any bytes,
    as arrays: the flows that leave their rank (``moving``, their indices),
    each one's path latency, bottleneck bandwidth and largest ``n_L / c_L``
    on its route; the links they cross (numbered in order of first use)
    with their capacities and the least latency of a flow crossing each;
    and per (flow, link of its route), in flow order, the link's number and
    the flow's position in ``moving``."""

    __slots__ = ("moving", "latency", "bottleneck", "per_byte", "capacity", "least",
                 "entry_link", "entry_flow")

    def __init__(self, network: Network, pairs: Sequence[Tuple[int, int]]) -> None:
        moving = [k for k, (src, dst) in enumerate(pairs) if src != dst]
        routes = [network.route(*pairs[k]) for k in moving]
        flat = list(chain.from_iterable([r[0] for r in routes]))
        number = {i: n for n, i in enumerate(dict.fromkeys(flat))}
        cap = network.link_capacity
        self.moving = np.array(moving, dtype=np.int64)
        self.latency = np.array([r[1] for r in routes], dtype=float)
        self.bottleneck = np.array([r[2] for r in routes], dtype=float)
        self.capacity = np.array([cap(i) for i in number], dtype=float)
        self.entry_link = np.fromiter(map(number.__getitem__, flat), np.int64, len(flat))
        lengths = np.fromiter(map(len, [r[0] for r in routes]), np.int64, len(routes))
        self.entry_flow = np.repeat(np.arange(len(routes)), lengths)
        # minima and maxima are exact in any order
        self.least = np.full(len(number), np.inf)
        np.minimum.at(self.least, self.entry_link, self.latency[self.entry_flow])
        per_link = np.bincount(self.entry_link, minlength=len(number)) / self.capacity
        self.per_byte = (np.maximum.reduceat(per_link[self.entry_link],
                                             np.cumsum(lengths) - lengths)
                         if len(flat) else np.zeros(len(routes)))


def can_beat(lower: float, steps: int, best_upper: float) -> bool:
    """Whether a schedule of ``steps`` steps and lower bound ``lower`` may
    be as fast as one whose time is at most ``best_upper`` (with the
    clock's slack on both sides)."""
    slack = _REL * max(lower, best_upper) + 2 * _EARLY * steps * max(1.0, best_upper)
    return lower - slack <= best_upper
