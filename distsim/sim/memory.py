"""Live-memory accounting per device during a simulation.

Each value occupies ``size_bytes`` on its device from the moment the op
producing it starts (function inputs: from time 0) until the last op reading
it finishes; function outputs stay live to the end. Bytes are counted per
category (weights, gradients, optimizer, activations, ...) so that the peak
can be explained.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Dict, List

from .trace import MemorySample


class MemoryTracker:
    """Live bytes per device and category, with the step curve and peaks."""

    def __init__(self, record_samples: bool = True) -> None:
        self.live: Dict[int, int] = defaultdict(int)
        self.by_category: Dict[int, Dict[str, int]] = defaultdict(lambda: defaultdict(int))
        self.peak: Dict[int, int] = defaultdict(int)
        self.peak_by_category: Dict[int, Dict[str, int]] = {}
        self.samples: List[MemorySample] = []
        self.record_samples = record_samples

    def allocate(self, rank: int, nbytes: int, category: str, time_s: float) -> None:
        self.live[rank] += nbytes
        self.by_category[rank][category] += nbytes
        if self.live[rank] > self.peak[rank] or rank not in self.peak_by_category:
            self.peak[rank] = self.live[rank]
            self.peak_by_category[rank] = dict(self.by_category[rank])
        self._sample(rank, time_s)

    def free(self, rank: int, nbytes: int, category: str, time_s: float) -> None:
        self.live[rank] -= nbytes
        self.by_category[rank][category] -= nbytes
        self._sample(rank, time_s)

    def _sample(self, rank: int, time_s: float) -> None:
        if not self.record_samples:
            return
        samples = self.samples
        if samples and samples[-1].rank == rank and samples[-1].time_s == time_s:
            samples[-1] = MemorySample(rank, time_s, self.live[rank])
        else:
            samples.append(MemorySample(rank, time_s, self.live[rank]))
