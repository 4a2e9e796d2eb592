"""When each value of a run is allocated and freed, from the times of the
ops that make and read it (the input of :func:`.memory.memory_accounting`).

A value occupies its bytes from the start of the op (or collective) that
makes it (function inputs: from time 0) until the last op reading it ends;
a value nobody reads goes when it is made; returned and resident values
stay to the end (free time infinity); an in-place update keeps the bytes
of the value it updates (:func:`hold_updated`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Tuple

import numpy as np

from .program_index import NOT_SIMULATED, ProgramIndex
from .segment_bodies import SegmentTable
from .segment_lifetimes import SegmentLifetimes

__all__ = ["Lifetimes", "hold_updated", "value_lifetimes"]


@dataclass
class Lifetimes:
    """The input of :func:`.memory.memory_accounting`: per piece of memory
    (each value, then the parts and temporaries of fused segments), its
    ``device``, ``size`` (bytes), ``category`` (an index into
    ``categories``), ``alloc`` (NaN where no simulated op makes it) and
    ``free`` (``inf``: never)."""

    device: np.ndarray
    size: np.ndarray
    category: np.ndarray
    alloc: np.ndarray
    free: np.ndarray
    categories: List[str]


def value_lifetimes(ix: ProgramIndex, start_s: np.ndarray, end_s: np.ndarray,
                    coll_start: np.ndarray, coll_end: np.ndarray,
                    segments: Optional[SegmentTable] = None) -> Lifetimes:
    """When each value of ``ix`` is allocated and freed, given the start and
    end of every simulated compute op and of every collective (by
    collective number). ``segments``: the memory events inside the fused
    ops (:mod:`.segment_bodies`), placed where the full program has them
    (:mod:`.segment_lifetimes`); None: a fused op's values are allocated
    at its start and freed at its end, like any op's."""
    nv = len(ix.values)
    producer = ix.producer
    by_op = producer >= 0
    by_coll = (producer <= -2) & (producer != NOT_SIMULATED)
    alloc = np.full(nv, np.nan)
    ready = np.full(nv, np.nan)
    alloc[producer == -1] = 0.0
    ready[producer == -1] = 0.0
    alloc[by_op] = start_s[producer[by_op]]
    ready[by_op] = end_s[producer[by_op]]
    alloc[by_coll] = coll_start[-2 - producer[by_coll]]
    ready[by_coll] = coll_end[-2 - producer[by_coll]]
    read_s = np.repeat(end_s, ix.compute_read_counts)
    inside = None
    if segments is not None and not segments.empty:
        inside = SegmentLifetimes(ix, segments, start_s, end_s)
        inside.place_values(alloc, ready)
        read_s = inside.read_times(read_s)
    # a value goes when the last op reading it ends (or when it is made,
    # if nobody reads it); returned and resident values stay
    last_use = np.full(nv, -np.inf)
    if len(ix.compute_reads):
        np.maximum.at(last_use, ix.compute_reads, read_s)
    if len(ix.collective_reads):
        np.maximum.at(last_use, ix.collective_reads,
                      np.repeat(coll_end, ix.collective_read_counts))
    free = np.where(np.isneginf(last_use), ready, last_use)
    free[ix.kept] = np.inf
    if inside is None:
        hold_updated(free, ix.in_place)
        return Lifetimes(ix.device, ix.size, ix.category, alloc, free, ix.categories)
    unheld = free.copy()
    hold_updated(free, ix.in_place)
    return Lifetimes(*inside.lifetimes(alloc, free, unheld, last_use))


def hold_updated(free: np.ndarray, in_place: "np.ndarray | List[Tuple[int, int]]") -> None:
    """An in-place update (``new`` takes no bytes) keeps ``old``'s bytes for
    as long as ``new`` lives: each value of a chain old -> new -> newer...
    is freed at the latest free time down its chain. ``in_place``: (old,
    new) pairs, sorted. Pointer jumping over the chained values (log of the
    longest chain numpy passes) when each value is updated at most once and
    after it is made; otherwise one pair at a time, newest first."""
    pairs = np.asarray(in_place, dtype=np.int64).reshape(-1, 2)
    if not len(pairs):
        return
    old, new = pairs[:, 0], pairs[:, 1]
    if (new > old).all() and (old[1:] > old[:-1]).all():
        # the values in a chain, numbered 0..k-1 in value order
        chained = np.zeros(len(free), bool)
        chained[old] = chained[new] = True
        values = np.flatnonzero(chained)
        slot = np.empty(len(free), np.int64)
        slot[values] = np.arange(len(values))
        nxt = np.arange(len(values))
        nxt[slot[old]] = slot[new]
        latest = free[values]
        while True:
            latest = np.maximum(latest, latest[nxt])
            jumped = nxt[nxt]
            if (jumped == nxt).all():
                break
            nxt = jumped
        free[values] = latest
        return
    for a, b in reversed(pairs.tolist()):
        if free[b] > free[a]:
            free[a] = free[b]
