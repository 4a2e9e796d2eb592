"""Live-memory accounting per device.

Each value occupies its bytes on its device from the moment the op
producing it starts (function inputs: from time 0) until the last op reading
it ends; returned values and resident inputs (weights, optimizer state) stay
live to the end. The simulator logs allocations and frees with their
simulated times as it schedules ops (possibly ahead of the simulation
clock); :meth:`MemoryLog.finish` sorts them into the per-device curve, the
peaks, and the bytes per category (weights, gradients, optimizer,
activations, temporaries) at each device's peak.

At equal times frees are applied before allocations: a kernel's inputs are
released when it ends, and the next kernel's outputs reuse that memory.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Dict, List, Tuple

from .trace import MemorySample

_FREE, _ALLOC = 0, 1


class MemoryLog:
    """Allocation and free events; turned into curves and peaks at the end."""

    def __init__(self, record_samples: bool = True) -> None:
        self.events: List[Tuple[float, int, int, int, int, str]] = []
        self.record_samples = record_samples
        self.samples: List[MemorySample] = []
        self.peak: Dict[int, int] = {}
        self.peak_by_category: Dict[int, Dict[str, int]] = {}

    def allocate(self, rank: int, nbytes: int, category: str, time_s: float) -> None:
        self.events.append((time_s, _ALLOC, len(self.events), rank, nbytes, category))

    def free(self, rank: int, nbytes: int, category: str, time_s: float) -> None:
        self.events.append((time_s, _FREE, len(self.events), rank, nbytes, category))

    def finish(self) -> None:
        """Sort the events and compute samples, peaks and peak categories."""
        live: Dict[int, int] = defaultdict(int)
        by_cat: Dict[int, Dict[str, int]] = defaultdict(lambda: defaultdict(int))
        peak: Dict[int, int] = {}
        peak_cat: Dict[int, Dict[str, int]] = {}
        samples: List[MemorySample] = []
        last_index: Dict[int, int] = {}
        for time_s, kind, _, rank, nbytes, cat in sorted(self.events):
            delta = nbytes if kind == _ALLOC else -nbytes
            live[rank] += delta
            by_cat[rank][cat] += delta
            now = live[rank]
            if kind == _ALLOC and (rank not in peak or now > peak[rank]):
                peak[rank] = now
                peak_cat[rank] = {c: b for c, b in by_cat[rank].items() if b}
            if self.record_samples:
                i = last_index.get(rank)
                if i is not None and samples[i].time_s == time_s:
                    samples[i] = MemorySample(rank, time_s, now)
                else:
                    last_index[rank] = len(samples)
                    samples.append(MemorySample(rank, time_s, now))
        self.samples = samples
        self.peak = peak
        self.peak_by_category = peak_cat
