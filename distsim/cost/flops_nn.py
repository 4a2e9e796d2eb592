"""FLOP counts of the neural-network ops (:mod:`distsim.ir.ops_nn`).

Counts are per element of the main tensor, the usual estimates of fused
kernels (a softmax reads max, subtracts, exponentiates, sums and divides:
5 per element). Data movement (transpose, concat, split, slice, pad,
embedding lookup) counts no arithmetic: those ops are memory-bound and the
roofline charges them their bytes.
"""
from __future__ import annotations

import math
from math import prod
from typing import Tuple

from ..ir.core import Op
from .flops import FLOPS_PER_ELEMENT, flop_rule

FLOPS_PER_ELEMENT.update({
    "transpose": 0, "concat": 0, "split": 0, "chunk_cat": 0, "chunk_split": 0, "slice": 0, "pad": 0,
    "embedding": 0,
    "stop_gradient": 0, "depend": 0, "softmax": 5, "log_softmax": 5, "softmax_grad": 4,
    "log_softmax_grad": 4, "layernorm": 8, "rmsnorm": 5, "silu": 5, "silu_grad": 8,
    "gelu_grad": 16, "log": 1, "causal_mask": 1, "select_label": 1,
    "spmd.allreduce": 0, "spmd.copy": 0, "spmd.allgather": 0, "spmd.reducescatter": 0,
    "spmd.alltoall": 0,
})


def _numel(value) -> int:
    return prod(getattr(value.type, "shape", ()))


@flop_rule("layernorm_grad")
def _layernorm_grad(op: Op) -> float:
    return 14.0 * _numel(op.inputs[1])


@flop_rule("rmsnorm_grad")
def _rmsnorm_grad(op: Op) -> float:
    return 10.0 * _numel(op.inputs[1])


@flop_rule("cross_entropy", "cross_entropy_grad")
def _cross_entropy(op: Op) -> float:
    logits = op.inputs[0] if op.op_type == "cross_entropy" else op.inputs[1]
    return 6.0 * _numel(logits)


@flop_rule("embedding_grad", "reduce_max")
def _per_input_element(op: Op) -> float:
    return float(_numel(op.inputs[0]))


@flop_rule("select_label_grad")
def _select_label_grad(op: Op) -> float:
    return float(_numel(op.inputs[0]))


@flop_rule("dropout", "dropout_grad")
def _dropout(op: Op) -> float:
    return 2.0 * _numel(op.outputs[0])


def causal_fraction(sq: int, sk: int) -> float:
    """The share of the ``sq x sk`` score matrix a causal attention kernel
    computes: the area under the mask's diagonal (query i sees keys
    ``j <= i + sk - sq``), each row counted to the middle of its last
    visible key, so exactly 1/2 for a square matrix. That is the convention
    of FlashAttention-2's benchmarks (``benchmarks/benchmark_flash_attention.py``
    in Dao-AILab/flash-attention: causal FLOPs = full / 2), whose kernel skips
    the blocks above the diagonal."""
    if sq <= 0 or sk <= 0:
        return 0.0
    if sq == sk:
        return 0.5
    # row i sees min(max(i + c, 0), sk) keys, c = sk - sq + 1/2
    c = sk - sq + 0.5
    lo = min(sq, max(0, math.floor(-c) + 1))     # first row with i + c > 0
    hi = min(sq, max(lo, math.ceil(sk - c)))     # first row with i + c >= sk
    ramp = (hi - lo) * c + (hi - lo) * (lo + hi - 1) / 2.0
    return (ramp + (sq - hi) * sk) / (sq * sk)


def attention_pairs(op: Op) -> Tuple[float, int, int]:
    """(query-key pairs computed, d, d_v) of a ``fused_attention`` or
    ``fused_attention_grad`` op: batch x heads x s_q x s_k, times the
    visible share when causal (:func:`causal_fraction`)."""
    first = 0 if op.op_type == "fused_attention" else 1   # the grad's dout comes first
    q, k, v = (x.type for x in op.inputs[first:first + 3])
    sq, sk = q.shape[-2], k.shape[-2]
    frac = causal_fraction(sq, sk) if op.attrs.get("causal", True) else 1.0
    return prod(q.shape[:-2]) * sq * sk * frac, q.shape[-1], v.shape[-1]


@flop_rule("fused_attention")
def _fused_attention(op: Op) -> float:
    # Two matmuls: S = q k^T (2 s_q s_k d per head) and O = P v (2 s_q s_k d_v):
    # 4 b h s^2 d for d_v = d, halved when causal. As FlashAttention-2 counts
    # it (Dao 2023, arXiv:2307.08691, Sec. 4.1; its benchmark script): the
    # softmax's exponentials and the rescaling are not counted.
    pairs, d, dv = attention_pairs(op)
    return 2.0 * pairs * (d + dv)


@flop_rule("fused_attention_grad")
def _fused_attention_grad(op: Op) -> float:
    # Five matmuls: the recomputed S = q k^T (d), dV = P^T dO (d_v),
    # dP = dO v^T (d_v), dQ = dS k (d), dK = dS^T q (d): 2 s_q s_k (3 d + 2 d_v)
    # per head, 2.5 x the forward for d_v = d, FlashAttention-2's "backward =
    # 2.5 x forward" (Dao 2023, Sec. 4.1 and Algorithm 2).
    pairs, d, dv = attention_pairs(op)
    return 2.0 * pairs * (3 * d + 2 * dv)


@flop_rule("adamw")
def _adamw(op: Op) -> float:
    return 12.0 * _numel(op.inputs[0])
