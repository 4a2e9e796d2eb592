"""Schedules: a collective algorithm as a list of network steps.

A :class:`Phase` is one step pattern (the flows that start together; the
step ends when all are delivered) repeated ``count`` times. A collective
algorithm produces a list of phases; consecutive identical steps share one
phase so that the network can fast-forward them
(:meth:`distsim.sim.network.Network.run_steps`).
"""
from __future__ import annotations

import math
from collections import Counter
from itertools import chain
from typing import Dict, Iterable, List, NamedTuple, Sequence, Tuple

FlowSpec = Tuple[int, int, float]


class Phase(NamedTuple):
    flows: Tuple[FlowSpec, ...]
    count: int


Schedule = List[Phase]


def compress(steps: Iterable[Sequence[FlowSpec]]) -> Schedule:
    """Turn a sequence of steps into phases, merging identical neighbours
    and dropping empty steps."""
    out: Schedule = []
    for step in steps:
        flows = tuple(step)
        if not flows:
            continue
        if out and out[-1].flows == flows:
            out[-1] = Phase(flows, out[-1].count + 1)
        else:
            out.append(Phase(flows, 1))
    return out


def parallel(schedules: Sequence[Schedule]) -> Schedule:
    """Run several schedules side by side, step for step (step k of the
    result holds step k of each input): e.g. one ring per rail."""
    cursors = [[list(p) for p in s] for s in schedules if s]
    out: Schedule = []
    while cursors:
        n = min(c[0][1] for c in cursors)
        flows = tuple(chain.from_iterable([c[0][0] for c in cursors]))
        if out and out[-1].flows == flows:
            out[-1] = Phase(flows, out[-1].count + n)
        else:
            out.append(Phase(flows, n))
        for c in cursors:
            c[0][1] -= n
            if c[0][1] == 0:
                c.pop(0)
        cursors = [c for c in cursors if c]
    return out


def sequential(*schedules: Schedule) -> Schedule:
    out: Schedule = []
    for s in schedules:
        for phase in s:
            if out and out[-1].flows == phase.flows:
                out[-1] = Phase(phase.flows, out[-1].count + phase.count)
            else:
                out.append(phase)
    return out


def total_bytes(schedule: Schedule) -> float:
    """Bytes put on the network by the whole schedule."""
    return sum(p.count * sum(b for s, d, b in p.flows if s != d) for p in schedule)


def pipeline_chunks(p: int, nbytes: float, alpha_s: float, bandwidth_Bps: float,
                    min_chunk_bytes: float = 64 * 1024, max_chunks: int = 1024) -> int:
    """Chunks for a pipeline of depth ``p - 1`` hops minimising
    ``(c + p - 2) * (alpha + S / (c B))``: ``c = sqrt((p - 2) S / (alpha B))``,
    kept within ``[1, max_chunks]`` and chunks of at least ``min_chunk_bytes``."""
    if p <= 2 or nbytes <= min_chunk_bytes:
        return 1
    ideal = math.sqrt((p - 2) * nbytes / max(alpha_s * bandwidth_Bps, 1e-30))
    cap = max(1, min(max_chunks, int(nbytes // min_chunk_bytes)))
    return max(1, min(cap, round(ideal)))


def step_time_estimate(flows: Sequence[FlowSpec], route_info) -> float:
    """Lower-bound time of one step on an idle network: the busiest link's
    bytes over its bandwidth plus the longest path latency.
    ``route_info(src, dst) -> (links, latency_s, capacities)``."""
    load: Dict[object, float] = {}
    cap: Dict[object, float] = {}
    latency = 0.0
    for src, dst, nbytes in flows:
        if src == dst:
            continue
        links, lat, caps = route_info(src, dst)
        latency = max(latency, lat)
        for link, c in zip(links, caps):
            load[link] = load.get(link, 0.0) + nbytes
            cap[link] = c
    return latency + max((load[k] / cap[k] for k in load), default=0.0)


StepShape = Tuple[float, Tuple[Tuple[int, float], ...]]


def step_shape(pairs: Sequence[Tuple[int, int]], route_info) -> StepShape:
    """What :func:`step_time_estimate` needs of a step whose flows all carry
    the same bytes: the longest path latency and, per link, (how many of
    the flows cross it, its capacity), each distinct pair once. The same
    for every size, so a collective timed at many sizes routes its steps
    once (:func:`shape_time`)."""
    infos = [route_info(src, dst) for src, dst in pairs if src != dst]
    if not infos:
        return 0.0, ()
    # counted in C (a 256-rank tree step has ~1000 flows of ~6 links):
    # each link in first-use order, as a flow-by-flow loop would number them
    links = [info[0] for info in infos]
    count = Counter(chain.from_iterable(links))
    cap = dict(zip(chain.from_iterable(links), chain.from_iterable(info[2] for info in infos)))
    latency = max(info[1] for info in infos)
    return latency, tuple(dict.fromkeys(zip(count.values(), map(cap.__getitem__, count))))


def shape_time(shape: StepShape, nbytes: float) -> float:
    """:func:`step_time_estimate` of a step of :func:`step_shape` whose
    flows carry ``nbytes`` each, to the last bit: a link's load is summed
    flow by flow there, so here too (``n`` additions, not ``n * nbytes``)."""
    latency, groups = shape
    worst = 0.0
    first = True
    for n, c in groups:
        load = 0.0
        for _ in range(n):
            load += nbytes
        t = load / c
        if first or t > worst:
            worst, first = t, False
    return latency + worst


def pipelined(groups: Sequence[Tuple[int, Sequence[FlowSpec]]], chunks: int) -> Schedule:
    """A pipeline of ``chunks`` chunks: each group of flows carries chunk
    ``j - offset`` in step j, i.e. it is active in steps
    ``offset .. offset + chunks - 1``. Steps between two changes of the
    active set form one phase, so the cost is O(groups), not O(steps)."""
    if not groups:
        return []
    # the groups of each offset, in group order: a step's active groups are
    # those of the offsets in (lo - chunks, lo], put back in group order
    # (a few offsets against thousands of groups for a large team's tree)
    by_offset: Dict[int, List[int]] = {}
    for i, (o, _) in enumerate(groups):
        by_offset.setdefault(o, []).append(i)
    bounds = sorted(set(by_offset) | {o + chunks for o in by_offset})
    out: Schedule = []
    for lo, hi in zip(bounds, bounds[1:]):
        active = sorted(chain.from_iterable(
            [members for o, members in by_offset.items() if lo - chunks < o <= lo]))
        flows = tuple(chain.from_iterable([groups[i][1] for i in active]))
        if flows:
            out = sequential(out, [Phase(flows, hi - lo)])
    return out
