"""Gradient rules of the ops in :mod:`distsim.ir.ops_onnx` (the CNN ops,
indexing and element-wise math the ONNX importer emits).

Batch normalization is differentiated in its inference form (running mean
and variance are inputs, not batch statistics): the cost of the backward
pass is the same order, and the mean and variance get no gradient.
"""
from __future__ import annotations

import math

from .grad_rules import NON_DIFFERENTIABLE, grad_rule, unbroadcast

NON_DIFFERENTIABLE.update({"equal", "less", "greater", "less_equal", "greater_equal", "not",
                           "and", "or", "xor", "isnan", "floor", "ceil"})


def _name(op, i: int) -> str:
    return f"d_{op.inputs[i].name}"


@grad_rule("conv")
def _conv(b, op, grads):
    (g,) = grads
    x, w = op.inputs
    return [b.op("conv_grad_input", [g, w, x], op.attrs, name=_name(op, 0)),
            b.op("conv_grad_weight", [g, x, w], op.attrs, name=_name(op, 1))]


@grad_rule("maxpool", "averagepool")
def _pool(b, op, grads):
    return [b.op(f"{op.op_type}_grad", [grads[0], op.inputs[0]], op.attrs, name=_name(op, 0))]


@grad_rule("lrn")
def _lrn(b, op, grads):
    return [b.op("lrn_grad", [grads[0], op.inputs[0]], op.attrs, name=_name(op, 0))]


@grad_rule("batchnorm")
def _batchnorm(b, op, grads):
    x, scale, _, mean, var = op.inputs
    dx, dscale, dbias = b.op("batchnorm_grad", [grads[0], x, scale, mean, var], op.attrs,
                             name=[_name(op, 0), _name(op, 1), _name(op, 2)])
    return [dx, dscale, dbias, None, None]


@grad_rule("gather")
def _gather(b, op, grads):
    data, idx = op.inputs
    return [b.op("gather_grad", [grads[0], idx, data], op.attrs, name=_name(op, 0)), None]


@grad_rule("strided_slice")
def _slice(b, op, grads):
    return [b.op("strided_slice_grad", [grads[0], op.inputs[0]], op.attrs, name=_name(op, 0))]


@grad_rule("trilu")
def _trilu(b, op, grads):
    return [b.op("trilu", [grads[0]], op.attrs, name=_name(op, 0))]


def _select(b, op, cond, g, i, keep_true=True):
    """``g`` where ``cond`` (or where not), zero elsewhere, summed to input i's shape."""
    zero = b.op("zeros_like", [g], name=_name(op, i))
    picked = b.op("where", [cond, g, zero] if keep_true else [cond, zero, g], name=_name(op, i))
    return unbroadcast(b, picked, op.inputs[i].type.shape, _name(op, i))


@grad_rule("where")
def _where(b, op, grads):
    g = grads[0]
    cond = op.inputs[0]
    return [None, _select(b, op, cond, g, 1), _select(b, op, cond, g, 2, keep_true=False)]


@grad_rule("minimum")
def _minimum(b, op, grads):
    x, y = op.inputs
    cond = b.op("less_equal", [x, y], name=f"{op.outputs[0].name}_le")
    return [_select(b, op, cond, grads[0], 0), _select(b, op, cond, grads[0], 1, keep_true=False)]


@grad_rule("maximum")
def _maximum(b, op, grads):
    x, y = op.inputs
    cond = b.op("greater_equal", [x, y], name=f"{op.outputs[0].name}_ge")
    return [_select(b, op, cond, grads[0], 0), _select(b, op, cond, grads[0], 1, keep_true=False)]


@grad_rule("reduce_max")
def _reduce_max(b, op, grads):
    x, y = op.inputs[0], op.outputs[0]
    shape = list(x.type.shape)
    kept = [1 if i in _reduced_axes(op) else d for i, d in enumerate(shape)]
    gy = b.op("broadcast_to", [b.op("reshape", [grads[0]], {"shape": kept}, name=_name(op, 0))],
              {"shape": shape}, name=_name(op, 0))
    ymax = b.op("broadcast_to", [b.op("reshape", [y], {"shape": kept}, name=f"{y.name}_b")],
                {"shape": shape}, name=f"{y.name}_b")
    return [_select(b, op, b.op("equal", [x, ymax], name=f"{y.name}_at"), gy, 0)]


def _reduced_axes(op):
    rank = op.inputs[0].type.rank
    axes = op.attrs.get("axes") or range(rank)
    return {a % rank for a in axes}


def _times(b, op, g, factor, i=0):
    return unbroadcast(b, b.op("mul", [g, factor], name=_name(op, i)), op.inputs[i].type.shape,
                       _name(op, i))


@grad_rule("pow")
def _pow(b, op, grads):
    """d a = g * e * a^(e-1); d e = g * a^e * log(a)."""
    a, e = op.inputs
    g = grads[0]
    e_cast = e if e.type.dtype == a.type.dtype else b.op("cast", [e], {"dtype": a.type.dtype.value},
                                                        name=f"{e.name}_cast")
    em1 = b.op("sub", [e_cast, b.op("ones_like", [e_cast], name=f"{e.name}_one")],
               name=f"{e.name}_m1")
    da = _times(b, op, g, b.op("mul", [e_cast, b.op("pow", [a, em1], name=_name(op, 0))],
                               name=_name(op, 0)))
    if not e.type.dtype.is_float:
        return [da, None]
    de = _times(b, op, g, b.op("mul", [op.outputs[0], b.op("log", [a], name=_name(op, 1))],
                               name=_name(op, 1)), 1)
    return [da, de]


@grad_rule("erf")
def _erf(b, op, grads):
    x = op.inputs[0]
    sq = b.op("mul", [x, x], name=_name(op, 0))
    bump = b.op("scale", [b.op("exp", [b.op("neg", [sq], name=_name(op, 0))], name=_name(op, 0))],
                {"factor": 2.0 / math.sqrt(math.pi)}, name=_name(op, 0))
    return [b.op("mul", [grads[0], bump], name=_name(op, 0))]


@grad_rule("reciprocal")
def _reciprocal(b, op, grads):
    y = op.outputs[0]
    return [b.op("neg", [b.op("mul", [grads[0], b.op("mul", [y, y], name=_name(op, 0))],
                              name=_name(op, 0))], name=_name(op, 0))]


@grad_rule("sin")
def _sin(b, op, grads):
    return [b.op("mul", [grads[0], b.op("cos", [op.inputs[0]], name=_name(op, 0))],
                 name=_name(op, 0))]


@grad_rule("cos")
def _cos(b, op, grads):
    s = b.op("sin", [op.inputs[0]], name=_name(op, 0))
    return [b.op("neg", [b.op("mul", [grads[0], s], name=_name(op, 0))], name=_name(op, 0))]


@grad_rule("abs")
def _abs(b, op, grads):
    x = op.inputs[0]
    neg = b.op("less", [x, b.op("zeros_like", [x], name=_name(op, 0))], name=_name(op, 0))
    g = grads[0]
    return [b.op("where", [neg, b.op("neg", [g], name=_name(op, 0)), g], name=_name(op, 0))]
