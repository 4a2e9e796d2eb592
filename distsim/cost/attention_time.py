"""FlashAttention time: the fused kernel's measured efficiency, its
per-block overhead and its waves of query blocks.

A FlashAttention kernel (``fused_attention`` and its backward) gives each
thread block ``block_q`` query rows of one (batch, head) and walks the
keys those rows see. Its time is

    flops / (peak * efficiency[direction]) * (keys + key_overhead) / keys * W / w

    keys = s_k * visible share (1/2 for a square causal mask)
    w = batch * heads * ceil(s_q / block_q) / sms,  W = w + q (ceil(w) - w)

``efficiency`` is the fraction of the dtype's peak the kernel reaches
over long sequences, one figure for the forward and one for the backward
(five matmuls with more dependencies: slower); ``key_overhead`` is each
block's fixed work (loading its queries, writing its output and the
log-sum-exp), in keys, so that short sequences reach less of it; the
waves use the device's GEMM ``sms`` and ``wave_quantization`` when it has
a GEMM model (none otherwise). FLOPs are counted as FlashAttention's
benchmarks do (:mod:`distsim.cost.flops_nn`).

A device's figures are those of its default kernel (FlashAttention-2 on
the calibrated devices); ``kernels`` holds other implementations' figures
(cuDNN's fused attention, ...) by name, the same formula with their own
efficiencies and overhead. An op names its kernel in its ``kernel``
attribute (the model's ``attention_kernel``); none is the default. A
device with an attention block but no figures for the op's kernel is an
error naming ``attention_kernel``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from math import prod
from typing import Optional, Tuple

from ..errors import ConfigError
from ..ir.core import Op
from .flops_nn import attention_pairs

#: query rows per thread block of FlashAttention-2/3 at head dims 64-128
#: (Dao 2023, arXiv:2307.08691, Sec. 3.3; flash-attention's kernel traits)
DEFAULT_BLOCK_Q = 128


@dataclass(frozen=True)
class AttentionModel:
    """The fused attention kernels' figures of one device (module docstring)."""

    fwd_efficiency: float
    bwd_efficiency: float
    key_overhead: float = 0.0
    block_q: int = DEFAULT_BLOCK_Q
    source: str = ""
    kernels: Tuple[Tuple[str, "AttentionModel"], ...] = ()

    def for_kernel(self, name: Optional[str]) -> Optional["AttentionModel"]:
        """The figures of kernel ``name`` (None: the default); None when
        the device has none for it."""
        return self if name is None else dict(self.kernels).get(name)

    def efficiency_of(self, op_type: str) -> float:
        return self.bwd_efficiency if op_type == "fused_attention_grad" else self.fwd_efficiency

    def time(self, op: Op, flops: float, peak_flops: float, sms: Optional[int] = None,
             wave_quantization: float = 1.0, efficiency: Optional[float] = None) -> float:
        """Seconds of ``op`` (``flops`` its FLOPs) at ``peak_flops``;
        ``efficiency`` overrides the direction's figure (calibration)."""
        if flops <= 0:
            return 0.0
        eff = self.efficiency_of(op.op_type) if efficiency is None else efficiency
        q = op.inputs[0 if op.op_type == "fused_attention" else 1].type.shape
        heads, sq = prod(q[:-2]), q[-2]
        keys = attention_pairs(op)[0] / (heads * sq) if heads * sq else 0.0
        return attention_seconds(flops / (peak_flops * eff), heads, sq, keys, self.key_overhead,
                                 self.block_q, sms, wave_quantization)


def attention_seconds(flop_time: float, heads: int, seq_q: int, keys: float,
                      key_overhead: float, block_q: int, sms: Optional[int],
                      wave_quantization: float) -> float:
    """``flop_time`` (FLOPs over the achieved rate) stretched by the blocks'
    overhead (``keys`` visited per query row) and the idle tail of the
    last wave of ``heads * ceil(seq_q / block_q)`` blocks on ``sms``."""
    t = flop_time
    if keys > 0:
        t *= (keys + key_overhead) / keys
    if sms:
        w = heads * -(-seq_q // block_q) / sms
        if w > 0:
            t *= (w + wave_quantization * (math.ceil(w) - w)) / w
    return t


def kernel_figures(attention: Optional[AttentionModel], op: Op,
                   device: str) -> Optional[AttentionModel]:
    """The figures timing ``op`` on a device whose attention block is
    ``attention``: its kernel's, the default's when it names none. A device
    without the block has no figures of any kernel (it times every fused
    kernel by its flat share of the matmul rate): None."""
    kernel = op.attrs.get("kernel")
    if kernel is None or attention is None:
        return attention
    found = attention.for_kernel(kernel)
    if found is None:
        raise ConfigError(f"attention_kernel: {kernel}: device {device} has no figures for it "
                          f"(its attention.kernels block; `distsim calibrate` writes it from "
                          f"attention rows with kernel: {kernel})")
    return found
