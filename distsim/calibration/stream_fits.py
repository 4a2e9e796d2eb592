"""The device's memory-bound and element-wise figures from their
microbenchmarks: the bandwidth each kernel class reaches, the streaming
figure, the CUDA cores' arithmetic rate.

Each kernel's time is ``launch + bytes / (bandwidth * efficiency)`` in the
cost model, so its efficiency is ``bytes / ((time - launch) * bandwidth)``
(``bytes``: every input read and every output written once). A class's
figure is the median of its kernels; ``memory_efficiency`` (every op
without a class figure) the median of the streaming ones (copies and
element-wise kernels).
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from ..errors import ConfigError
from .measurements import MemoryRow, VectorRow

STREAMING = ("copy", "elementwise")


@dataclass
class MemoryFit:
    streaming: float
    by_class: Dict[str, float]
    rows: List[Tuple[MemoryRow, float]] = field(default_factory=list)   # (row, efficiency)


def fit_memory(rows: Sequence[MemoryRow], bandwidth: float, launch: float) -> MemoryFit:
    effs: List[Tuple[MemoryRow, float]] = []
    for r in rows:
        if r.seconds <= launch:
            raise ConfigError(f"{r.where}.median_s: {r.seconds:g} s is not longer than the "
                              f"launch overhead ({launch:g} s)")
        eff = r.bytes / ((r.seconds - launch) * bandwidth)
        if eff > 1.0:
            raise ConfigError(f"{r.where}: {r.bytes / (r.seconds - launch):.3g} B/s is above "
                              f"memory_bandwidth_Bps ({bandwidth:.3g}): efficiency {eff:.2f} > 1")
        effs.append((r, eff))
    by_class: Dict[str, List[float]] = {}
    for r, e in effs:
        by_class.setdefault(r.kernel_class, []).append(e)
    streaming = [e for r, e in effs if r.kernel_class in STREAMING] or [e for _, e in effs]
    return MemoryFit(statistics.median(streaming),
                     {c: statistics.median(v) for c, v in by_class.items()}, effs)


def fit_vector(rows: Sequence[VectorRow], peak_f32: Optional[float]) -> Optional[float]:
    """The best fp32 arithmetic rate over ``peak_f32`` (None without fp32 rows)."""
    f32 = [r for r in rows if r.dtype.value == "f32"]
    if not f32:
        return None
    if peak_f32 is None:
        raise ConfigError(f"{f32[0].where}: no peak_flops for f32")
    best = max(f32, key=lambda r: r.flops / r.seconds)
    eff = best.flops / best.seconds / peak_f32
    if eff > 1.0:
        raise ConfigError(f"{best.where}: {best.flops / best.seconds:.3g} FLOP/s is above "
                          f"peak_flops.f32 ({peak_f32:.3g}): efficiency {eff:.2f} > 1")
    return eff
