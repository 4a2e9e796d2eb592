"""Live-memory accounting per device, computed after the run with numpy.

Each value occupies its bytes on its device from the moment the op
producing it starts (function inputs: from time 0) until the last op reading
it ends; a value nobody reads is freed when it is produced; returned values
and resident inputs (weights, optimizer state) stay live to the end. The
engine records, per value, when it was allocated and when it was freed;
:func:`memory_accounting` sorts those events per device into the curve, the
peak, and the bytes per category (weights, gradients, optimizer,
activations, temporaries) at the peak.

At equal times frees are applied before allocations: a kernel's inputs are
released when it ends, and the next kernel's outputs reuse that memory. The
peak is the first moment the largest live total is reached, checked after
each allocation; the categories are the live bytes at that moment.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from .trace import MemoryColumns


@dataclass
class MemoryAccounting:
    """The result: ``samples`` (live bytes per device over time, one per
    distinct time, when asked for; sorted by device, then time), ``peak``
    (bytes per device) and ``peak_by_category`` (category -> bytes live at
    that peak)."""

    samples: MemoryColumns = field(default_factory=MemoryColumns)
    peak: Dict[int, int] = field(default_factory=dict)
    peak_by_category: Dict[int, Dict[str, int]] = field(default_factory=dict)


def memory_accounting(device: np.ndarray, size: np.ndarray, category: np.ndarray,
                      alloc_s: np.ndarray, free_s: np.ndarray, categories: Sequence[str],
                      record_samples: bool = True) -> MemoryAccounting:
    """Memory per device from per-value arrays: ``device`` (rank), ``size``
    (bytes), ``category`` (index into ``categories``), ``alloc_s`` (when the
    value appears) and ``free_s`` (when it goes; ``inf``: never).

    The values are grouped by device once (a stable sort of small
    integers, a radix sort), then each device's events are sorted and
    summed on their own: arrays the size of one device's events, which the
    allocator reuses from one device to the next, where arrays of every
    event at once would each be fresh memory."""
    out = MemoryAccounting()
    n = len(device)
    if n == 0:
        return out
    small = (device.astype(np.int16) if 0 <= device.min() and device.max() < 1 << 15
             else device)
    by_device = np.argsort(small, kind="stable")
    ranks, counts = np.unique(device[by_device], return_counts=True)
    parts: List[MemoryColumns] = []
    start = 0
    for rank, count in zip(ranks.tolist(), counts.tolist()):
        values = by_device[start:start + count]     # this device's, in value order
        start += count
        live, time_s, peak_at, delta, cat = _device_events(
            size[values], category[values], alloc_s[values], free_s[values])
        if peak_at is not None:
            out.peak[rank] = int(live[peak_at])
            cats, deltas = cat[:peak_at + 1], delta[:peak_at + 1]
            by_cat = {}
            for c in np.unique(cats).tolist():
                b = int(deltas[cats == c].sum())
                if b:
                    by_cat[categories[c]] = b
            out.peak_by_category[rank] = by_cat
        if record_samples:
            # one sample per time at which bytes come or go (and the
            # first): the live bytes after its last event. Values of no
            # bytes (in-place updates) add none, so that two programs
            # placing them at different times draw the same curve
            last = np.ones(len(time_s), dtype=bool)
            last[:-1] = time_s[1:] != time_s[:-1]
            group = np.cumsum(np.r_[True, last[:-1]]) - 1
            changes = np.zeros(int(group[-1]) + 1, dtype=bool)
            changes[group[delta != 0]] = True
            changes[0] = True
            last &= changes[group]
            parts.append(MemoryColumns(np.full(int(last.sum()), rank, np.int64), time_s[last],
                                       live[last]))
    if parts:
        out.samples = MemoryColumns(np.concatenate([p.rank for p in parts]),
                                    np.concatenate([p.time_s for p in parts]),
                                    np.concatenate([p.live_bytes for p in parts]))
    return out


def _device_events(size: np.ndarray, category: np.ndarray, alloc_s: np.ndarray,
                   free_s: np.ndarray) -> Tuple[np.ndarray, np.ndarray, Optional[int],
                                                np.ndarray, np.ndarray]:
    """One device's events in order (time, frees before allocations, then
    value order): the live bytes after each, their times, the position of
    the first moment the peak is reached (checked after allocations; None
    without any), and each event's byte change and category."""
    freed = np.isfinite(free_s)
    m = int(freed.sum())
    # frees first, so that a stable sort by time puts them before the
    # allocations of the same time, ties in value order
    time_s = np.concatenate([free_s[freed], alloc_s])
    order = np.argsort(time_s, kind="stable")
    time_s = time_s[order]
    delta = np.concatenate([-size[freed], size]).astype(np.int64)[order]
    cat = np.concatenate([category[freed], category])[order]
    is_alloc = order >= m
    live = np.cumsum(delta)
    if not is_alloc.any():
        return live, time_s, None, delta, cat
    masked = np.where(is_alloc, live, np.iinfo(np.int64).min)
    return live, time_s, int(np.argmax(masked)), delta, cat


def copy_to_followers(samples: MemoryColumns, members: Dict[int, Tuple[int, ...]]
                      ) -> MemoryColumns:
    """Symmetry reduction: ``members`` maps each representative to every
    rank it stands for (itself first); each representative's samples are
    copied to the ranks that follow it. Sorted by rank, then time (a
    representative has one sample per time)."""
    positions, ranks = [np.arange(len(samples))], [samples.rank]
    for head, group in members.items():
        if len(group) < 2:
            continue
        rows = np.flatnonzero(samples.rank == head)
        for follower in group[1:]:
            positions.append(rows)
            ranks.append(np.full(len(rows), follower, np.int64))
    at, rank = np.concatenate(positions), np.concatenate(ranks)
    order = np.lexsort((samples.time_s[at], rank))
    at = at[order]
    return MemoryColumns(rank[order], samples.time_s[at], samples.live_bytes[at])
