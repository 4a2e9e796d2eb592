"""Schedules: a collective algorithm as a list of network steps.

A :class:`Phase` is one step pattern (the flows that start together; the
step ends when all are delivered) repeated ``count`` times; ``latency_s``,
where given, is the time from a flow's last byte to its delivery in place
of its path latency (a protocol's per-step cost,
:mod:`distsim.sim.protocols`; a phase without flows is a plain wait of
that long). A collective algorithm produces a list of phases; consecutive
identical steps share one phase so that the network can fast-forward them
(:meth:`distsim.sim.network.Network.run_steps`).
"""
from __future__ import annotations

import math
from itertools import chain
from typing import Dict, Iterable, List, NamedTuple, Optional, Sequence, Tuple

FlowSpec = Tuple[int, int, float]


class Phase(NamedTuple):
    flows: Tuple[FlowSpec, ...]
    count: int
    latency_s: Optional[float] = None


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
        given = [c[0][2] for c in cursors if c[0][2] is not None]
        latency = max(given) if given else None
        if out and out[-1].flows == flows and out[-1].latency_s == latency:
            out[-1] = Phase(flows, out[-1].count + n, latency)
        else:
            out.append(Phase(flows, n, latency))
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
            last = out[-1] if out else None
            if last is not None and last.flows == phase.flows and \
                    last.latency_s == phase.latency_s:
                out[-1] = Phase(phase.flows, last.count + phase.count, phase.latency_s)
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
