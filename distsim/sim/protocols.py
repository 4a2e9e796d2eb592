"""NCCL's protocols: what a collective's steps cost beyond bytes over links.

An algorithm (:mod:`.collective_algos`) says which bytes move between which
ranks in each step. On a topology with a ``collectives:`` block
(:class:`~distsim.topology.collective_spec.CollectiveSpec`) the steps run
under one of NCCL's protocols (LL, LL128, Simple; NVLS for the NVLink
SHARP all-reduce), which :func:`with_protocol` turns into the schedule the
network runs:

- *bandwidth*: a flow's bytes become its wire bytes, ``b / e`` with
  ``e = link_efficiency(transport) x protocol efficiency``, the transport
  being that of the flow's slowest link: alone, it moves at
  ``rate = e x bottleneck``. A rank's step is held to the protocol's
  ``max_busbw`` (and, for collectives that add, ``reduce_busbw``): where
  its flows would move its bytes faster, they carry more wire bytes;
- *per-step latency*: a flow is delivered its path latency plus the
  protocol's ``hop_latency`` for its kind of link after its last byte; a
  rank whose flows cross several kinds (the rings of a multi-server team,
  one per channel, cross the network at different steps) has their mean,
  weighted by bytes, as NCCL's model counts a ring's intra- and
  inter-server steps; the step's flows all get its slowest rank's;
- *pipeline fill and base latency*: once per collective, before the first
  step, the protocol's ``base_latency`` and the time a rank takes to send
  its bytes, up to ``pipeline`` (NCCL's pipeline fills before data
  streams at full rate).

For a ring all-reduce of S bytes over p ranks on one kind of link, each
rank sending ``B = 2(p-1)/p S`` at ``rate``, this is
``base + min(B / rate, pipeline) + 2(p-1) (path latency + hop) + B / rate``.

:func:`choose_protocol` takes, as NCCL's tuner does from its own cost
model, the protocol whose schedule is fastest alone in the analytical
model (each step its latency plus its longest transmission): the same
choice in both network modes. A topology without the block runs schedules as they are (links at
their full rate, no per-step cost).
"""
from __future__ import annotations

import math
from operator import itemgetter
from typing import Dict, List, Optional, Sequence, Tuple

from ..ir.comm import CollectiveType
from ..topology.collective_spec import CollectiveSpec, ProtocolSpec
from .collective_algos.schedule import Phase, Schedule
from .network import Network
from .route_table import route_table

_PAIR = itemgetter(0, 1)
_BYTES = itemgetter(2)

#: Collectives whose ranks add what they receive (held to ``reduce_busbw``).
REDUCING = frozenset({CollectiveType.ALL_REDUCE, CollectiveType.REDUCE_SCATTER,
                      CollectiveType.REDUCE})

#: Algorithms with a protocol of their own instead of NCCL's three.
OWN_PROTOCOL = {"nvls": "nvls"}


def flow_link(network: Network, src: int, dst: int) -> Tuple[str, float]:
    """(transport, bandwidth) of the slowest link from ``src`` to ``dst``
    (the first of equal ones; transport ``link`` where the topology does
    not say), kept per topology."""
    known = route_table(network.topology).flow_links
    hit = known.get((src, dst))
    if hit is None:
        topo = network.topology
        edges = topo.graph.edges
        route = topo.route(src, dst, 0)
        slowest = min(route, key=lambda e: edges[e]["bandwidth_Bps"])
        hit = known[(src, dst)] = (str(edges[slowest].get("transport", "link")),
                                   float(edges[slowest]["bandwidth_Bps"]))
    return hit


def protocols_for(spec: CollectiveSpec, algorithm: str) -> Tuple[ProtocolSpec, ...]:
    """The protocols ``algorithm`` can run with (NVLS its own)."""
    if OWN_PROTOCOL.get(algorithm) == "nvls":
        return (spec.nvls,) if spec.nvls is not None else ()
    return spec.protocols


class _Shape:
    """What a step's pairs of ranks need for any size: per flow that leaves
    its rank (index, bottleneck bandwidth, transport, path latency), those
    flows' indices grouped by sending rank, and per protocol
    (:meth:`terms`) the flows' rates and latencies. Kept per topology (a
    training step plans the same steps at many sizes)."""

    __slots__ = ("links", "groups", "by_protocol")

    def __init__(self, network: Network, pairs: Sequence[Tuple[int, int]]) -> None:
        links = []
        groups: Dict[int, List[int]] = {}
        known = route_table(network.topology).flow_links      # flow_link's, looked up once
        route = network.route
        for i, pair in enumerate(pairs):
            src, dst = pair
            if src == dst:
                continue
            transport, bandwidth = known.get(pair) or flow_link(network, src, dst)
            links.append((i, bandwidth, transport, route(src, dst)[1]))
            groups.setdefault(src, []).append(i)
        self.links = tuple(links)
        self.groups = tuple(tuple(g) for g in groups.values())
        self.by_protocol: Dict[tuple, tuple] = {}

    def terms(self, spec: CollectiveSpec, protocol: ProtocolSpec, cap: float, n: int):
        """Under ``protocol``: (each flow's rate alone, its latency, and the
        step's figures when its flows carry equal bytes ``b``: the flows'
        rates with every rank held to ``cap``, the step's latency, its
        longest transmission / b, the most bytes a rank sends / b, the
        least rate at which a rank sends them). 0 for a flow that stays on
        its rank."""
        key = (id(protocol), cap)      # the topology's own spec: alive as long as this
        hit = self.by_protocol.get(key)
        if hit is None:
            rates = [0.0] * n
            hops = [0.0] * n
            # per transport: (link efficiency, protocol efficiency, hop latency)
            per: Dict[str, Tuple[float, float, float]] = {}
            for i, bandwidth, transport, path in self.links:
                e = per.get(transport)
                if e is None:
                    e = per[transport] = (spec.efficiency(transport), protocol.efficiency,
                                          protocol.hop_latency(transport))
                rates[i] = bandwidth * e[0] * e[1]
                hops[i] = path + e[2]
            hit = self.by_protocol[key] = (rates, hops, _equal_step(self.groups, rates, hops, cap))
        return hit


def _equal_step(groups, base: List[float], hops: List[float], cap: float):
    """:meth:`_Shape.terms`' figures of a step of equal flows (1 byte each)."""
    rates = list(base)
    latency = longest = most = 0.0
    slowest = math.inf
    for members in groups:
        m = len(members)
        if m == 1:                             # the loop's sums and maxima of one flow
            i = members[0]
            seconds = _held(rates, members, 1, cap, 1.0 / rates[i])
            hop = hops[i]
            if hop > latency:
                latency = hop
        else:
            # the longest 1-byte transmission and the summed latencies, in one
            # pass (the same floats as max() and sum() over the members)
            seconds = -math.inf
            hop = 0
            for i in members:
                t = 1.0 / rates[i]
                if t > seconds:
                    seconds = t
                hop += hops[i]
            seconds = _held(rates, members, m, cap, seconds)
            latency = max(latency, hop / m)
        longest = max(longest, seconds)
        most = max(most, m)
        slowest = min(slowest, m / seconds)
    return rates, latency, longest, float(most), slowest


def _held(rates: List[float], members: Sequence[int], amount: float, cap: float,
          seconds: float) -> float:
    """A rank's step sending ``amount`` over its flows ``members`` in
    ``seconds``: where that is faster than the protocol's ``cap`` moves a
    rank's bytes, its flows' ``rates`` are slowed to it; the step's
    seconds."""
    if amount > cap * seconds:
        stretch = amount / (cap * seconds)
        for i in members:
            rates[i] /= stretch
        seconds *= stretch
    return seconds


def _shapes(network: Network, schedule: Schedule) -> List[Optional[Tuple[_Shape, Optional[float]]]]:
    """Per phase of ``schedule``: (its step's :class:`_Shape`, kept per
    topology; :func:`_same_bytes` of its flows), None for a phase without
    flows. Worked out once per schedule, for every protocol it is priced
    under."""
    known = route_table(network.topology).step_shapes
    out: List[Optional[Tuple[_Shape, Optional[float]]]] = []
    for phase in schedule:
        flows = phase.flows
        if not flows:
            out.append(None)
            continue
        pairs = tuple(map(_PAIR, flows))
        shape = known.get(pairs)
        if shape is None:
            shape = known[pairs] = _Shape(network, pairs)
        out.append((shape, _same_bytes(flows)))
    return out


def _caps(spec: CollectiveSpec, kind: CollectiveType, protocol: ProtocolSpec) -> float:
    """The most a rank's step moves per second under ``protocol``."""
    return min(protocol.max_busbw_Bps, spec.reduce_busbw_Bps if kind in REDUCING else math.inf)


def estimates_s(network: Network, kind: CollectiveType, schedule: Schedule,
                protocols: Sequence[ProtocolSpec], shapes=None) -> List[float]:
    """Each protocol's time for ``schedule`` alone in the analytical model
    (what :func:`with_protocol` returns, without building the schedules;
    one pass over the steps for all of them). ``shapes``: the schedule's
    :func:`_shapes`, where the caller has them."""
    spec = network.topology.collectives
    caps = [_caps(spec, kind, p) for p in protocols]
    pricing = tuple(zip(protocols, caps))
    totals = [0.0] * len(protocols)
    sent = [0.0] * len(protocols)
    slowest = [math.inf] * len(protocols)
    for phase, step in zip(schedule, shapes or _shapes(network, schedule)):
        count = phase.count
        if step is None:
            for k in range(len(protocols)):
                totals[k] += count * (phase.latency_s or 0.0)
            continue
        shape, same = step
        flows = phase.flows
        for k, (protocol, cap) in enumerate(pricing):
            terms = shape.terms(spec, protocol, cap, len(flows))
            if same is not None:       # _step's figures of equal flows, inline
                _, latency, longest, most, rate = terms[2]
                longest, most = same * longest, same * most
            else:
                _, latency, longest, most, rate = _step(shape, flows, terms, cap, None)
            totals[k] += count * (latency + longest)
            sent[k] += count * most
            if rate < slowest[k]:
                slowest[k] = rate
    return [t + p.base_latency_s + (min(b / r, p.pipeline_s) if b > 0 else 0.0)
            for t, p, b, r in zip(totals, protocols, sent, slowest)]


def with_protocol(network: Network, kind: CollectiveType, schedule: Schedule,
                  protocol: ProtocolSpec, shapes=None) -> Schedule:
    """``schedule`` as it runs under ``protocol`` on ``network``'s topology:
    wire bytes, step latencies, and a first wait of the base latency and
    the pipeline's fill (see the module docstring). The fill is that of a
    rank sending the most bytes of every step at the least rate of any
    (exact where the ranks are alike: a ring, NVLS). ``shapes``: the
    schedule's :func:`_shapes`, where the caller has them."""
    spec = network.topology.collectives
    cap = _caps(spec, kind, protocol)
    steps: List[Phase] = []
    sent = 0.0
    slowest = math.inf                 # the least rate at which a rank sends a step
    for phase, step in zip(schedule, shapes or _shapes(network, schedule)):
        if step is None:
            steps.append(phase)
            continue
        flows = phase.flows
        shape, same = step
        rates, latency, _, most, rate = _step(
            shape, flows, shape.terms(spec, protocol, cap, len(flows)), cap, same)
        sent += phase.count * most
        slowest = min(slowest, rate)
        wire = list(flows)
        for i, bandwidth, _, _ in shape.links:
            src, dst, nbytes = flows[i]
            wire[i] = (src, dst, nbytes * bandwidth / rates[i])
        steps.append(Phase(tuple(wire), phase.count, latency))
    first = protocol.base_latency_s + (min(sent / slowest, protocol.pipeline_s)
                                       if sent > 0 else 0.0)
    return ([Phase((), 1, first)] if first > 0 else []) + steps


def _same_bytes(flows: Sequence[Tuple[int, int, float]]) -> Optional[float]:
    """The bytes of every flow of a step, where they are all the same; else
    None."""
    sizes = set(map(_BYTES, flows))
    return sizes.pop() if len(sizes) == 1 else None


def _step(shape: _Shape, flows: Sequence[Tuple[int, int, float]], terms, cap: float,
          same: Optional[float]) -> Tuple[List[float], float, float, float, float]:
    """One step under a protocol: each flow's rate alone (0 for one that
    stays on its rank), the step's latency (from a flow's last byte to its
    delivery), its longest transmission, the most bytes a rank sends and
    the least rate at which a rank sends them. ``same``: every flow's bytes
    (:func:`_same_bytes`)."""
    base, hops, equal = terms
    if same is not None:
        nbytes = same
        rates, latency, longest, most, slowest = equal
        return rates, latency, nbytes * longest, nbytes * most, slowest
    rates = list(base)
    latency = longest = most = 0.0
    slowest = math.inf
    for members in shape.groups:
        if len(members) == 1:                  # the sums and maxima below, of one flow
            i = members[0]
            nbytes = flows[i][2]
            if nbytes <= 0:
                continue
            seconds = _held(rates, members, nbytes, cap, nbytes / rates[i])
            spread = nbytes * hops[i] / nbytes
            if spread > latency:
                latency = spread
        else:
            # the rank's bytes, its longest transmission and its bytes'
            # latencies in one pass (the same floats as sum() and max())
            nbytes = spread = 0
            seconds = -math.inf
            for i in members:
                b = flows[i][2]
                nbytes += b
                t = b / rates[i]
                if t > seconds:
                    seconds = t
                spread += b * hops[i]
            if nbytes <= 0:
                continue
            seconds = _held(rates, members, nbytes, cap, seconds)
            latency = max(latency, spread / nbytes)
        longest = max(longest, seconds)
        most = max(most, nbytes)
        slowest = min(slowest, nbytes / seconds)
    return rates, latency, longest, most, slowest


def choose_protocol(network: Network, kind: CollectiveType, algorithm: str,
                    schedule: Schedule, known: Optional[str] = None
                    ) -> Tuple[Optional[str], Schedule]:
    """(protocol name, schedule under it) of the protocol whose schedule
    is fastest alone in the analytical model (ties: the first listed), or
    of the one named ``known`` (chosen so before); (None, ``schedule``) on
    a topology without a ``collectives:`` block."""
    spec = network.topology.collectives
    if spec is None or not schedule:
        return None, schedule
    options = protocols_for(spec, algorithm)
    if not options:
        return None, schedule
    best = next((p for p in options if p.name == known), options[0])
    shapes = _shapes(network, schedule)
    if len(options) > 1 and best.name != known:
        times = estimates_s(network, kind, schedule, options, shapes)
        best = options[times.index(min(times))]
    return best.name, with_protocol(network, kind, schedule, best, shapes)
