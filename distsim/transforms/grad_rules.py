"""Gradient rules: for each op type, how to emit the gradients of its inputs
given the gradients of its outputs.

A rule is ``rule(b, op, grads) -> list[Value | None]`` where ``b`` is the
FunctionBuilder of the function being extended, ``op`` the forward op (its
operands are values of that function) and ``grads`` the output gradients
(None where an output has no gradient). It returns one entry per input.
Register with :func:`grad_rule`.
"""
from __future__ import annotations

from typing import Callable, Dict, List, Optional, Sequence

from ..errors import UnsupportedOpError
from ..ir.builder import FunctionBuilder
from ..ir.core import Op, Value

GradRule = Callable[[FunctionBuilder, Op, Sequence[Optional[Value]]], List[Optional[Value]]]
GRAD_RULES: Dict[str, GradRule] = {}
# Ops whose outputs carry no gradient (e.g. shape-like or constant ops).
NON_DIFFERENTIABLE = {"ones_like", "zeros_like"}


def grad_rule(*names: str):
    def deco(fn: GradRule) -> GradRule:
        for n in names:
            GRAD_RULES[n] = fn
        return fn
    return deco


def lookup_grad_rule(op: Op) -> GradRule:
    try:
        return GRAD_RULES[op.op_type]
    except KeyError:
        raise UnsupportedOpError(f"op %{op.name}: no gradient rule for '{op.op_type}'") from None


def _name(op: Op, i: int) -> str:
    return f"d_{op.inputs[i].name}"


def unbroadcast(b: FunctionBuilder, g: Value, shape: tuple, name: str) -> Value:
    """Sum ``g`` down to ``shape`` (undoing numpy broadcasting)."""
    gshape = g.type.shape
    if gshape == tuple(shape):
        return g
    lead = len(gshape) - len(shape)
    if lead:
        g = b.op("reduce_sum", [g], {"axes": list(range(lead))}, name=name)
    axes = [i for i, (gs, s) in enumerate(zip(g.type.shape, shape)) if s == 1 and gs != 1]
    if axes:
        g = b.op("reduce_sum", [g], {"axes": axes, "keepdims": True}, name=name)
    return g


@grad_rule("add")
def _add(b, op, grads):
    (g,) = grads
    return [unbroadcast(b, g, v.type.shape, _name(op, i)) for i, v in enumerate(op.inputs)]


@grad_rule("sub")
def _sub(b, op, grads):
    (g,) = grads
    neg = b.op("neg", [g], name=_name(op, 1))
    return [unbroadcast(b, g, op.inputs[0].type.shape, _name(op, 0)),
            unbroadcast(b, neg, op.inputs[1].type.shape, _name(op, 1))]


@grad_rule("mul")
def _mul(b, op, grads):
    (g,) = grads
    x, y = op.inputs
    return [unbroadcast(b, b.op("mul", [g, y], name=_name(op, 0)), x.type.shape, _name(op, 0)),
            unbroadcast(b, b.op("mul", [g, x], name=_name(op, 1)), y.type.shape, _name(op, 1))]


@grad_rule("matmul")
def _matmul(b, op, grads):
    """y = A' B' with A' = A or A^T, B' = B or B^T: dA' = g B'^T, dB' = A'^T g.

    A matrix operand (a weight) multiplied with a batch of matrices (a batch
    of sequences) gets its gradient from one GEMM summed over the batch
    dims (``sum_batch``), as frameworks compute it (the batch flattened
    into the contraction), not as a batch of per-sequence products summed
    afterwards: that would write and read the weight's size once per
    batch element, a cost and a temporary no real run has. With
    ``sum_batch`` on the op itself (a 2-D ``g``), the 2-D gradient
    broadcasts against the other operand's batch."""
    (g,) = grads
    a, bb = op.inputs
    ta, tb = bool(op.attrs.get("trans_a")), bool(op.attrs.get("trans_b"))

    def summed(x, other) -> dict:
        """``sum_batch`` for the gradient of matrix ``x`` from ``other``'s
        batch of matrices (and g's, the same batch)."""
        return ({"sum_batch": True} if x.type.rank == 2 and g.type.rank > 2
                and other.type.shape[:-2] == g.type.shape[:-2] else {})

    # dA first, then dB (the input's gradient before the weight's, as
    # Megatron orders them: the data gradient feeds the layer before and
    # its communication)
    whole = summed(a, bb)
    if not ta:
        da = b.op("matmul", [g, bb], {"trans_b": not tb, **whole}, name=_name(op, 0))
    else:
        da = b.op("matmul", [bb, g], {"trans_a": tb, "trans_b": True, **whole},
                  name=_name(op, 0))
    whole = summed(bb, a)
    if not tb:
        db = b.op("matmul", [a, g], {"trans_a": not ta, **whole}, name=_name(op, 1))
    else:
        db = b.op("matmul", [g, a], {"trans_a": True, "trans_b": ta, **whole}, name=_name(op, 1))
    return [unbroadcast(b, da, a.type.shape, _name(op, 0)),
            unbroadcast(b, db, bb.type.shape, _name(op, 1))]


@grad_rule("relu")
def _relu(b, op, grads):
    return [b.op("relu_grad", [grads[0], op.inputs[0]], name=_name(op, 0))]


@grad_rule("neg")
def _neg(b, op, grads):
    return [b.op("neg", [grads[0]], name=_name(op, 0))]


@grad_rule("identity")
def _identity(b, op, grads):
    return [grads[0]]


@grad_rule("scale")
def _scale(b, op, grads):
    return [b.op("scale", [grads[0]], {"factor": op.attrs["factor"]}, name=_name(op, 0))]


@grad_rule("exp")
def _exp(b, op, grads):
    return [b.op("mul", [grads[0], op.outputs[0]], name=_name(op, 0))]


@grad_rule("cast")
def _cast(b, op, grads):
    return [b.op("cast", [grads[0]], {"dtype": op.inputs[0].type.dtype.value}, name=_name(op, 0))]


@grad_rule("reshape")
def _reshape(b, op, grads):
    return [b.op("reshape", [grads[0]], {"shape": list(op.inputs[0].type.shape)},
                 name=_name(op, 0))]


@grad_rule("broadcast_to")
def _broadcast_to(b, op, grads):
    return [unbroadcast(b, grads[0], op.inputs[0].type.shape, _name(op, 0))]


def _expand_reduced(b, op, g):
    x = op.inputs[0]
    if not op.attrs.get("keepdims"):
        axes = op.attrs.get("axes") or list(range(x.type.rank))
        axes = sorted(a % x.type.rank for a in axes)
        kept = [1 if i in axes else d for i, d in enumerate(x.type.shape)]
        g = b.op("reshape", [g], {"shape": kept}, name=_name(op, 0))
    return b.op("broadcast_to", [g], {"shape": list(x.type.shape)}, name=_name(op, 0))


@grad_rule("reduce_sum")
def _reduce_sum(b, op, grads):
    return [_expand_reduced(b, op, grads[0])]


@grad_rule("reduce_mean")
def _reduce_mean(b, op, grads):
    x = op.inputs[0]
    full = _expand_reduced(b, op, grads[0])
    count = x.type.numel // max(1, op.outputs[0].type.numel)
    return [b.op("scale", [full], {"factor": 1.0 / count}, name=_name(op, 0))]


@grad_rule("mse_loss")
def _mse_loss(b, op, grads):
    y, t = op.inputs
    return [b.op("mse_loss_grad", [grads[0], y, t], name=_name(op, 0)), None]
