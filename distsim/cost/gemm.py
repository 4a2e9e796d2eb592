"""GEMM time from its shape: thread-block tiles run in waves over the SMs.

A GEMM ``C[M, N] = A[M, K] @ B[K, N]`` (``batch`` of them) is split into
output tiles of ``tm x tn``, one thread block (CTA) each, and the SMs run
the tiles in waves. cuBLAS picks, per shape, the fastest of a few tile
shapes, and splits K into ``s`` slices (split-K) when the tiles alone leave
SMs idle. For each candidate (tile, s) the model charges

    W * 2 tm tn (ceil(K / s) + k_overhead) / (peak / sms * efficiency * e(tile))
      + (s > 1) * 8 s M N batch / bandwidth

    w = batch * ceil(M / tm) * ceil(N / tn) * s / sms      (waves of tiles)
    W = w + wave_quantization * (ceil(w) - w)              (the idle tail of the last wave)
    e(tile) = min(1, I(tile) / tile_intensity)             (small tiles starve the tensor cores)
    I(tile) = 2 tm tn / ((tm + tn) * itemsize)             (FLOP per operand byte a tile loads)

and the GEMM takes the fastest candidate. The parameters, each one
physical quantity:

- ``sms``: streaming multiprocessors (the datasheet's count);
- ``tiles``: the CTA tile shapes the library chooses among;
- ``efficiency`` (per dtype): the fraction of ``peak_flops`` a full wave of
  the largest tile reaches over a long K: the kernel's main loop at the
  clock the card holds (a power-capped card runs dense GEMMs below its
  boost clock);
- ``k_overhead``: each tile's fixed cost (pipeline fill, epilogue writing
  C), in K elements at the main loop's rate: why short-K GEMMs run slower;
- ``tile_intensity``: the operand intensity a tile needs to keep its SM
  at the ceiling (0: every tile does);
- ``wave_quantization``: 1 when tiles run in strict waves (a partly
  filled last wave costs a whole wave), 0 when the work is perfectly
  balanced over the SMs (stream-K, persistent kernels).

The split-K term writes and reads back ``s`` fp32 partial products of C.
:class:`~distsim.cost.model.CostModel` adds the memory floor (the
operands' bytes at the device's bandwidth) and the launch overhead.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from math import prod
from typing import Dict, List, Mapping, NamedTuple, Optional, Tuple

from ..ir.core import Op
from ..ir.types import DType

#: K slices of a split-K candidate hold at least this many K elements
MIN_SPLIT_K = 256
#: bytes one split-K partial product element costs: an fp32 written and read back
SPLIT_K_BYTES = 8.0

#: The CTA tile shapes cuBLAS uses for 16-bit tensor-core GEMMs, largest
#: first: NVIDIA, "Matrix Multiplication Background User's Guide"
#: (docs.nvidia.com/deeplearning/performance, DU-09799-001, Sec. 2.3
#: "Typical Tile Dimensions in cuBLAS and Performance": 256x128, 128x256,
#: 128x128, 64x128, 128x64, 64x64).
DEFAULT_TILES: Tuple[Tuple[int, int], ...] = ((256, 128), (128, 256), (128, 128), (128, 64),
                                              (64, 128), (64, 64))

#: the other 16-bit type whose figures stand in when a dtype has none
_SIXTEEN_BIT = {"bf16": "f16", "f16": "bf16"}


class GemmShape(NamedTuple):
    """``batch`` GEMMs of ``[m, k] @ [k, n]``."""

    batch: int
    m: int
    n: int
    k: int


class Candidate(NamedTuple):
    """One way to run a GEMM: a tile, its K slices and what they cost."""

    tm: int
    tn: int
    waves: float            # w: tiles x slices / sms
    full_waves: int         # ceil(w)
    k_slice: int            # ceil(K / s)
    reduce_bytes: float     # split-K partial products moved (0 without split-K)


def tile_intensity_of(tm: int, tn: int, itemsize: int) -> float:
    """FLOP per byte of operands a ``tm x tn`` tile loads per K step."""
    return 2.0 * tm * tn / ((tm + tn) * itemsize)


def candidates(shape: GemmShape, sms: int, tiles) -> List[Candidate]:
    """Every (tile, split-K) way :class:`GemmModel` considers for ``shape``:
    each tile without split-K, and with K split in 2, 4, ... slices while
    the tiles times the slices still fit in one wave and a slice keeps
    :data:`MIN_SPLIT_K` elements."""
    b, m, n, k = shape
    out: List[Candidate] = []
    for tm, tn in tiles:
        count = b * -(-m // tm) * -(-n // tn)
        s = 1
        while True:
            w = count * s / sms
            out.append(Candidate(tm, tn, w, math.ceil(w), -(-k // s),
                                 SPLIT_K_BYTES * s * b * m * n if s > 1 else 0.0))
            s *= 2
            if count * s > sms or k / s < MIN_SPLIT_K:
                break
    return out


@dataclass(frozen=True)
class GemmModel:
    """The tile/wave GEMM model's figures of one device (module docstring)."""

    sms: int
    efficiency: Mapping[str, float]
    tiles: Tuple[Tuple[int, int], ...] = DEFAULT_TILES
    k_overhead: float = 0.0
    tile_intensity: float = 0.0
    wave_quantization: float = 1.0
    source: str = ""
    _cache: Dict[tuple, float] = field(default_factory=dict, compare=False, repr=False)

    def efficiency_for(self, dtype: DType) -> Optional[float]:
        """The ceiling for ``dtype``; bf16 and f16 stand in for each other
        (the same tensor-core rate); None when neither is given (the cost
        model then keeps its flat roofline for that dtype)."""
        eff = self.efficiency.get(dtype.value)
        if eff is None:
            eff = self.efficiency.get(_SIXTEEN_BIT.get(dtype.value, ""))
        return eff

    def time(self, shape: GemmShape, dtype: DType, peak_flops: float, bandwidth_Bps: float,
             efficiency: Optional[float] = None) -> float:
        """Seconds of compute (no launch overhead, no memory floor) for
        ``shape`` in ``dtype``, kept per shape. ``efficiency`` overrides the
        dtype's ceiling (calibration)."""
        key = (shape, dtype, peak_flops, bandwidth_Bps, efficiency)
        hit = self._cache.get(key)
        if hit is None:
            eff = self.efficiency_for(dtype) if efficiency is None else efficiency
            if eff is None:
                raise KeyError(dtype.value)
            hit = self._cache[key] = self._time(shape, dtype.itemsize, peak_flops * eff,
                                                bandwidth_Bps)
        return hit

    def _time(self, shape: GemmShape, itemsize: int, rate: float, bandwidth_Bps: float) -> float:
        if shape.batch * shape.m * shape.n * shape.k == 0:
            return 0.0
        rate_sm = rate / self.sms
        q, k0, need = self.wave_quantization, self.k_overhead, self.tile_intensity
        best = math.inf
        for c in candidates(shape, self.sms, self.tiles):
            e = 1.0 if need <= 0 else min(1.0, tile_intensity_of(c.tm, c.tn, itemsize) / need)
            waves = c.waves + q * (c.full_waves - c.waves)
            t = waves * 2.0 * c.tm * c.tn * (c.k_slice + k0) / (rate_sm * e)
            if c.reduce_bytes:
                t += c.reduce_bytes / bandwidth_Bps
            best = min(best, t)
        return best


def gemm_shape(op: Op) -> GemmShape:
    """The GEMM a ``matmul`` op runs. A weight without batch dims (a linear
    layer, ``x[b, s, h] @ w[h, n]``) folds the batch into M, as frameworks
    call one GEMM for it; ``sum_batch`` (a weight's gradient) contracts the
    batch into K; batch dims on both operands make a batched GEMM."""
    a, b = op.inputs[0].type.shape, op.inputs[1].type.shape
    attrs = op.attrs
    m, k = (a[-1], a[-2]) if attrs.get("trans_a") else (a[-2], a[-1])
    n = b[-2] if attrs.get("trans_b") else b[-1]
    batch_a, batch_b = prod(a[:-2]), prod(b[:-2])
    if attrs.get("sum_batch"):
        return GemmShape(1, m, n, k * batch_a)
    if batch_b == 1 and not attrs.get("trans_a"):
        return GemmShape(1, batch_a * m, n, k)
    out = op.outputs[0].type.shape
    return GemmShape(prod(out[:-2]), m, n, k)
