"""Fitting FlashAttention's figures (:mod:`distsim.cost.attention_time`)
to measured attention times: forward, backward, or both in one call.

A row's time is ``kernels * launch + sum over its directions of
flops[dir] / (peak * eff[dir]) * stretch`` (the blocks' key overhead and
waves). For each ``key_overhead`` of a grid, ``1 / eff`` per direction is
the linear least-squares solution in relative error; the best grid point
wins. A forward and a backward are told apart only by rows that time one
of them alone.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List, Mapping, Optional, Sequence, Tuple

import numpy as np

from ..cost.attention_time import DEFAULT_BLOCK_Q, AttentionModel, attention_seconds
from ..cost.flops_nn import causal_fraction
from ..errors import ConfigError
from .measurements import AttentionRow

KEY_OVERHEAD_GRID = tuple(range(0, 1025, 16))
#: FLOPs of the backward over the forward's (FlashAttention's five matmuls for two)
BWD_FLOPS = 2.5


@dataclass
class AttentionFit:
    model: AttentionModel
    rows: List[Tuple[AttentionRow, float]]          # (row, modelled seconds)

    def rms(self) -> float:
        errs = [math.log(t / r.seconds) for r, t in self.rows]
        return math.sqrt(sum(e * e for e in errs) / len(errs)) if errs else 0.0


def forward_flops(r: AttentionRow) -> float:
    frac = causal_fraction(r.seq_q, r.seq_k) if r.causal else 1.0
    return 4.0 * r.batch * r.heads * r.seq_q * r.seq_k * frac * r.head_dim


def _columns(r: AttentionRow, peak: float, key_overhead: float, sms: Optional[int],
             q: float) -> Tuple[float, float]:
    """Seconds of the row's forward and backward at efficiency 1."""
    frac = causal_fraction(r.seq_q, r.seq_k) if r.causal else 1.0
    heads = r.batch * r.heads
    stretch = attention_seconds(1.0, heads, r.seq_q, r.seq_k * frac, key_overhead,
                                DEFAULT_BLOCK_Q, sms, q)
    fwd = forward_flops(r) / peak * stretch
    return (fwd if r.direction != "bwd" else 0.0,
            BWD_FLOPS * fwd if r.direction != "fwd" else 0.0)


def fit_attention(rows: Sequence[AttentionRow], *, peak: Mapping[str, float], launch: float,
                  sms: Optional[int], wave_quantization: float, source: str = "") -> AttentionFit:
    directions = {r.direction for r in rows}
    if directions == {"fwd+bwd"}:
        raise ConfigError("attention: every row times forward and backward together: add a "
                          "forward (or backward) alone to tell their efficiencies apart")
    if "bwd" not in directions and "fwd+bwd" not in directions:
        raise ConfigError("attention: no backward measured (direction bwd or fwd+bwd)")
    if "fwd" not in directions and "fwd+bwd" not in directions:
        raise ConfigError("attention: no forward measured (direction fwd or fwd+bwd)")
    for r in rows:
        if r.dtype.value not in peak:
            raise ConfigError(f"{r.where}: no peak_flops for {r.dtype.value}")
    kernels = np.array([2.0 if r.direction == "fwd+bwd" else 1.0 for r in rows])
    measured = np.array([r.seconds for r in rows])
    target = measured - kernels * launch
    if np.any(target <= 0):
        bad = rows[int(np.argmax(target <= 0))]
        raise ConfigError(f"{bad.where}.median_s: shorter than the launch overhead")
    best = None
    for k0 in KEY_OVERHEAD_GRID:
        a = np.array([_columns(r, peak[r.dtype.value], k0, sms, wave_quantization)
                      for r in rows])
        u = np.linalg.lstsq(a / measured[:, None], target / measured, rcond=None)[0]
        if np.any(u < 1.0):             # an efficiency above 1
            continue
        resid = np.log((a @ u + kernels * launch) / measured)
        sse = float(resid @ resid)
        if best is None or sse < best[0] - 1e-12:
            best = (sse, k0, u, a)
    if best is None:
        raise ConfigError("attention: the measured times need an efficiency above 1: check "
                          "the times, the shapes or the peak")
    _, k0, u, a = best
    model = AttentionModel(fwd_efficiency=float(1 / u[0]), bwd_efficiency=float(1 / u[1]),
                           key_overhead=float(k0), source=source)
    modelled = a @ u + kernels * launch
    return AttentionFit(model, list(zip(rows, modelled.tolist())))
