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
  ``min(its bytes, pipeline)`` (NCCL's buffers fill before data streams
  at full rate; the slowest rank's).

For a ring all-reduce of S bytes over p ranks on one kind of link, each
rank sending ``B = 2(p-1)/p S`` at ``rate``, this is
``base + min(B, pipeline) / rate + 2(p-1) (path latency + hop) + B / rate``.

:func:`choose_protocol` takes, as NCCL's tuner does from its own cost
model, the protocol whose schedule is fastest in the analytical model (its
steps' slowest flows plus their delays): the same choice in both network
modes. A topology without the block runs schedules as they are (links at
their full rate, no per-step cost).
"""
from __future__ import annotations

import math
from typing import Dict, List, Optional, Sequence, Tuple

from ..ir.comm import CollectiveType
from ..topology.collective_spec import CollectiveSpec, ProtocolSpec
from .collective_algos.schedule import Phase, Schedule
from .network import Network
from .route_table import route_table

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


def with_protocol(network: Network, kind: CollectiveType, schedule: Schedule,
                  protocol: ProtocolSpec) -> Schedule:
    """``schedule`` as it runs under ``protocol`` on ``network``'s topology
    (see the module docstring): wire bytes, per-step delays, and a first
    wait of the base latency and the pipeline's fill."""
    spec = network.topology.collectives
    cap = min(protocol.max_busbw_Bps,
              spec.reduce_busbw_Bps if kind in REDUCING else math.inf)
    steps: List[Phase] = []
    sent: Dict[int, float] = {}        # per rank: bytes over the whole schedule
    busy: Dict[int, float] = {}        # and the time its flows take to send them
    for phase in schedule:
        if not phase.flows:
            steps.append(phase)
            continue
        flows, latency, ranks = _step(network, spec, protocol, cap, phase.flows)
        steps.append(Phase(flows, phase.count, latency))
        for rank, (nbytes, seconds) in ranks.items():
            sent[rank] = sent.get(rank, 0.0) + phase.count * nbytes
            busy[rank] = busy.get(rank, 0.0) + phase.count * seconds
    fill = max((min(nbytes, protocol.pipeline_bytes) * busy[rank] / nbytes
                for rank, nbytes in sent.items() if nbytes > 0), default=0.0)
    first = protocol.base_latency_s + fill
    return ([Phase((), 1, first)] if first > 0 else []) + steps


def _step(network: Network, spec: CollectiveSpec, protocol: ProtocolSpec, cap: float,
          flows: Sequence[Tuple[int, int, float]]
          ) -> Tuple[Tuple[Tuple[int, int, float], ...], float, Dict[int, Tuple[float, float]]]:
    """One step's flows in wire bytes, its latency (from a flow's last byte
    to its delivery), and per sending rank (its bytes, the time its flows
    take to send them alone)."""
    rates: List[float] = []
    hops: List[float] = []
    per_rank: Dict[int, List[int]] = {}
    for i, (src, dst, nbytes) in enumerate(flows):
        if src == dst or nbytes <= 0:
            rates.append(0.0)
            hops.append(0.0)
            continue
        transport, bandwidth = flow_link(network, src, dst)
        rates.append(bandwidth * spec.efficiency(transport) * protocol.efficiency)
        hops.append(network.route(src, dst)[1] + protocol.hop_latency(transport))
        per_rank.setdefault(src, []).append(i)
    latency = 0.0
    ranks: Dict[int, Tuple[float, float]] = {}
    for rank, members in per_rank.items():
        sent = sum(flows[i][2] for i in members)
        busiest = max(flows[i][2] / rates[i] for i in members)
        if sent > cap * busiest:            # faster than the protocol moves a rank's bytes
            stretch = sent / (cap * busiest)
            for i in members:
                rates[i] /= stretch
            busiest *= stretch
        ranks[rank] = (sent, busiest)
        latency = max(latency, sum(flows[i][2] * hops[i] for i in members) / sent)
    wire = []
    for (src, dst, nbytes), rate in zip(flows, rates):
        if rate > 0:
            nbytes *= flow_link(network, src, dst)[1] / rate
        wire.append((src, dst, nbytes))
    return tuple(wire), latency, ranks


def estimate_s(network: Network, schedule: Schedule) -> float:
    """A schedule's time alone in the analytical model: each step its
    slowest flow (latency + bytes / bottleneck) plus its delay."""
    return sum(p.count * (network.analytical_step_s(p.flows, 0, p.latency_s) if p.flows
                          else p.latency_s or 0.0) for p in schedule)


def choose_protocol(network: Network, kind: CollectiveType, algorithm: str,
                    schedule: Schedule) -> Tuple[Optional[str], Schedule]:
    """(protocol name, schedule under it) of the protocol with the least
    :func:`estimate_s` (ties: the first listed); (None, ``schedule``) on a
    topology without a ``collectives:`` block."""
    spec = network.topology.collectives
    if spec is None or not schedule:
        return None, schedule
    best: Optional[Tuple[float, str, Schedule]] = None
    for protocol in protocols_for(spec, algorithm):
        timed = with_protocol(network, kind, schedule, protocol)
        t = estimate_s(network, timed)
        if best is None or t < best[0]:
            best = (t, protocol.name, timed)
    if best is None:
        return None, schedule
    return best[1], best[2]
