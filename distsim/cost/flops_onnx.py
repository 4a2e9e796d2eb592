"""FLOP counts of the ops in :mod:`distsim.ir.ops_onnx`.

A multiply-accumulate counts 2 FLOPs: a convolution is
``2 * out_numel * Cin/group * kh * kw``, and so is each of its two backward
ops (same products, rearranged).
"""
from __future__ import annotations

from math import prod

from ..ir.core import Op
from .flops import FLOPS_PER_ELEMENT, flop_rule

FLOPS_PER_ELEMENT.update({
    "erf": 8, "abs": 1, "reciprocal": 1, "sin": 4, "cos": 4, "floor": 1, "ceil": 1,
    "minimum": 1, "pow": 1, "equal": 1, "less": 1, "greater": 1, "less_equal": 1,
    "greater_equal": 1, "not": 1, "and": 1, "or": 1, "xor": 1, "isnan": 1, "where": 1,
    "gather": 0, "strided_slice": 0, "strided_slice_grad": 0, "trilu": 1,
    "batchnorm": 2, "batchnorm_grad": 6,
})


def _numel(value) -> int:
    return prod(value.type.shape)


def _conv_macs(out_numel: int, weight_shape) -> float:
    """Each output element sums Cin/group * kh * kw products (the weight is
    (Cout, Cin/group, kh, kw))."""
    cin_per_group, kh, kw = weight_shape[1:]
    return float(out_numel) * cin_per_group * kh * kw


@flop_rule("conv")
def _conv(op: Op) -> float:
    return 2.0 * _conv_macs(_numel(op.outputs[0]), op.inputs[1].type.shape)


@flop_rule("conv_grad_input")
def _conv_grad_input(op: Op) -> float:
    return 2.0 * _conv_macs(_numel(op.inputs[0]), op.inputs[1].type.shape)


@flop_rule("conv_grad_weight")
def _conv_grad_weight(op: Op) -> float:
    return 2.0 * _conv_macs(_numel(op.inputs[0]), op.outputs[0].type.shape)


@flop_rule("maxpool", "averagepool")
def _pool(op: Op) -> float:
    kh, kw = op.attrs["kernel"]
    return float(_numel(op.outputs[0]) * kh * kw)


@flop_rule("maxpool_grad", "averagepool_grad")
def _pool_grad(op: Op) -> float:
    kh, kw = op.attrs["kernel"]
    return float(_numel(op.inputs[0]) * kh * kw)


@flop_rule("gather_grad")
def _gather_grad(op: Op) -> float:
    return float(_numel(op.inputs[0]))


@flop_rule("lrn", "lrn_grad")
def _lrn(op: Op) -> float:
    return float(_numel(op.outputs[0]) * (2 * op.attrs["size"] + 4))
