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
from typing import Dict, List, Sequence

import numpy as np

from .trace import MemorySample

_FREE, _ALLOC = 0, 1


@dataclass
class MemoryAccounting:
    """The result: ``samples`` (live bytes per device over time, one per
    distinct time, when asked for), ``peak`` (bytes per device) and
    ``peak_by_category`` (category -> bytes live at that peak)."""

    samples: List[MemorySample] = field(default_factory=list)
    peak: Dict[int, int] = field(default_factory=dict)
    peak_by_category: Dict[int, Dict[str, int]] = field(default_factory=dict)


def memory_accounting(device: np.ndarray, size: np.ndarray, category: np.ndarray,
                      alloc_s: np.ndarray, free_s: np.ndarray, categories: Sequence[str],
                      record_samples: bool = True) -> MemoryAccounting:
    """Memory per device from per-value arrays: ``device`` (rank), ``size``
    (bytes), ``category`` (index into ``categories``), ``alloc_s`` (when the
    value appears) and ``free_s`` (when it goes; ``inf``: never)."""
    out = MemoryAccounting()
    n = len(device)
    if n == 0:
        return out
    freed = np.isfinite(free_s)
    m = int(freed.sum())
    # frees first, so that two stable sorts (time, then device) give the
    # order of (device, time, frees before allocations), ties in value order
    dev = np.concatenate([device[freed], device])
    time_s = np.concatenate([free_s[freed], alloc_s])
    kind = np.concatenate([np.full(m, _FREE, np.int8), np.full(n, _ALLOC, np.int8)])
    delta = np.concatenate([-size[freed], size]).astype(np.int64)
    cat = np.concatenate([category[freed], category])
    order = np.argsort(time_s, kind="stable")
    # devices are small integers: a stable sort of int16 keys is a radix sort
    small = dev.astype(np.int16) if len(dev) and 0 <= dev.min() and dev.max() < 1 << 15 \
        else dev
    order = order[np.argsort(small[order], kind="stable")]
    dev, time_s, kind, delta, cat = dev[order], time_s[order], kind[order], delta[order], cat[order]
    total = np.cumsum(delta)
    bounds = np.flatnonzero(np.diff(dev)) + 1
    starts = np.concatenate([[0], bounds])
    ends = np.concatenate([bounds, [len(dev)]])
    live_parts = []
    for a, b in zip(starts.tolist(), ends.tolist()):
        rank = int(dev[a])
        base = int(total[a - 1]) if a else 0
        live = total[a:b] - base
        if record_samples:
            live_parts.append(live)
        allocs = kind[a:b] == _ALLOC
        if not allocs.any():
            continue
        masked = np.where(allocs, live, np.iinfo(np.int64).min)
        i = int(np.argmax(masked))  # the first moment the peak is reached
        out.peak[rank] = int(live[i])
        cats, deltas = cat[a:a + i + 1], delta[a:a + i + 1]
        by_cat = {}
        for c in np.unique(cats).tolist():
            b = int(deltas[cats == c].sum())
            if b:
                by_cat[categories[c]] = b
        out.peak_by_category[rank] = by_cat
    if record_samples:
        # one sample per (device, time): the live bytes after its last event
        keep = np.ones(len(dev), dtype=bool)
        keep[:-1] = (dev[1:] != dev[:-1]) | (time_s[1:] != time_s[:-1])
        live_all = np.concatenate(live_parts)
        make = tuple.__new__   # MemorySample(...) checks its arguments: slow by the million
        out.samples = [make(MemorySample, s) for s in
                       zip(dev[keep].tolist(), time_s[keep].tolist(), live_all[keep].tolist())]
    return out
