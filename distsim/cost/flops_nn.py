"""FLOP counts of the neural-network ops (:mod:`distsim.ir.ops_nn`).

Counts are per element of the main tensor, the usual estimates of fused
kernels (a softmax reads max, subtracts, exponentiates, sums and divides:
5 per element). Data movement (transpose, concat, split, slice, pad,
embedding lookup) counts no arithmetic: those ops are memory-bound and the
roofline charges them their bytes.
"""
from __future__ import annotations

from math import prod

from ..ir.core import Op
from .flops import FLOPS_PER_ELEMENT, flop_rule

FLOPS_PER_ELEMENT.update({
    "transpose": 0, "concat": 0, "split": 0, "slice": 0, "pad": 0, "embedding": 0,
    "stop_gradient": 0, "depend": 0, "softmax": 5, "log_softmax": 5, "softmax_grad": 4,
    "log_softmax_grad": 4, "layernorm": 8, "rmsnorm": 5, "silu": 5, "silu_grad": 8,
    "gelu_grad": 16, "log": 1, "causal_mask": 1, "select_label": 1,
    "spmd.allreduce": 0, "spmd.copy": 0, "spmd.allgather": 0, "spmd.reducescatter": 0,
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


@flop_rule("adamw")
def _adamw(op: Op) -> float:
    return 12.0 * _numel(op.inputs[0])
