"""FLOP counts per op type.

``op_flops(op)`` is the arithmetic an op does (a multiply-add counts 2).
Element-wise ops count ``FLOPS_PER_ELEMENT`` per output element. Ops not in
either table count one FLOP per output element, so new ops get a sensible
memory-bound cost until they are given a formula here.
"""
from __future__ import annotations

from math import prod
from typing import Callable, Dict

from ..ir.core import Op
from ..ir.ops_bundle import BOOKKEEPING_OPS

FlopRule = Callable[[Op], float]
FLOP_RULES: Dict[str, FlopRule] = {}

# Arithmetic per output element of element-wise ops (tanh-GELU ~ 8 ops:
# 0.5 x (1 + tanh(0.79788 (x + 0.044715 x^3))), the 8 ONNX ops an exporter
# writes for it). Reshape and broadcast move data, no arithmetic (the
# roofline charges them their bytes).
FLOPS_PER_ELEMENT: Dict[str, float] = {
    "relu": 1, "neg": 1, "exp": 1, "tanh": 1, "sqrt": 1, "sigmoid": 4, "gelu": 8,
    "identity": 0, "ones_like": 0, "zeros_like": 0, "scale": 1, "cast": 0,
    "reshape": 0, "broadcast_to": 0,
    "add": 1, "sub": 1, "mul": 1, "div": 1, "maximum": 1, "relu_grad": 1, "sgd": 2,
    "pack": 0, "unpack": 0,   # bookkeeping (distsim.ir.ops_bundle)
}


def flop_rule(*names: str):
    def deco(fn: FlopRule) -> FlopRule:
        for n in names:
            FLOP_RULES[n] = fn
        return fn
    return deco


def _numel(value) -> int:
    return prod(getattr(value.type, "shape", ()))


@flop_rule("matmul")
def _matmul(op: Op) -> float:
    a = op.inputs[0].type
    k = a.shape[-2] if op.attrs.get("trans_a") else a.shape[-1]
    if op.attrs.get("sum_batch"):       # the batch dims are contracted too
        k *= prod(a.shape[:-2])
    return 2.0 * _numel(op.outputs[0]) * k


@flop_rule("reduce_sum", "reduce_mean")
def _reduce(op: Op) -> float:
    return float(_numel(op.inputs[0]))


@flop_rule("mse_loss")
def _mse(op: Op) -> float:
    return 3.0 * _numel(op.inputs[0])


@flop_rule("mse_loss_grad")
def _mse_grad(op: Op) -> float:
    return 3.0 * _numel(op.inputs[1])


def op_flops(op: Op) -> float:
    rule = FLOP_RULES.get(op.op_type)
    if rule is not None:
        return float(rule(op))
    per = FLOPS_PER_ELEMENT.get(op.op_type, 1.0)
    return float(per * sum(_numel(v) for v in op.outputs))


def op_memory_bytes(op: Op) -> float:
    """Bytes read and written: every input and output once (none for the
    bookkeeping ops that only regroup values)."""
    if op.op_type in BOOKKEEPING_OPS:
        return 0.0
    return float(sum(v.type.size_bytes for v in op.inputs) +
                 sum(v.type.size_bytes for v in op.outputs))
