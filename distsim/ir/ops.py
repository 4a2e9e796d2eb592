"""Shape rules of the compute ops, registered in the op registry.

Each rule takes the input tensor types and the attributes (defaults filled)
and returns the output types, raising :class:`ShapeError` with a short
reason when the inputs do not fit. Compute ops keep their outputs on their
inputs' device.
"""
from __future__ import annotations

from typing import List, Sequence

from .registry import REQUIRED, OpSpec, ShapeError, register
from .types import DType, TensorType


def _same_device(types: Sequence[TensorType]):
    devices = {t.device for t in types}
    if len(devices) > 1:
        raise ShapeError(f"inputs on different devices {sorted(devices, key=str)}")
    return types[0].device if types else None


def broadcast_shapes(a: Sequence[int], b: Sequence[int]) -> tuple:
    """numpy broadcasting of two shapes."""
    out = []
    for i in range(1, max(len(a), len(b)) + 1):
        da = a[-i] if i <= len(a) else 1
        db = b[-i] if i <= len(b) else 1
        if da != db and da != 1 and db != 1:
            raise ShapeError(f"shapes {tuple(a)} and {tuple(b)} do not broadcast")
        out.append(max(da, db) if 1 in (da, db) else da)
    return tuple(reversed(out))


def _unary(types, attrs) -> List[TensorType]:
    return [types[0]]


def _binary(types, attrs) -> List[TensorType]:
    a, b = types
    if a.dtype != b.dtype:
        raise ShapeError(f"dtypes differ: {a.dtype} and {b.dtype}")
    device = _same_device(types)
    return [TensorType(broadcast_shapes(a.shape, b.shape), a.dtype, device)]


def _like_first(types, attrs) -> List[TensorType]:
    _same_device(types)
    return [types[0]]


def _grad_like_second(types, attrs) -> List[TensorType]:
    """(dy, x) -> dx of x's type (dy must have x's shape)."""
    dy, x = types
    _same_device(types)
    if dy.shape != x.shape:
        raise ShapeError(f"gradient shape {dy.shape} differs from input shape {x.shape}")
    return [x]


def _matmul(types, attrs) -> List[TensorType]:
    a, b = types
    if a.rank < 2 or b.rank < 2:
        raise ShapeError(f"matmul needs rank >= 2 operands, got {a.shape} and {b.shape}")
    if a.dtype != b.dtype:
        raise ShapeError(f"dtypes differ: {a.dtype} and {b.dtype}")
    device = _same_device(types)
    m, ka = (a.shape[-1], a.shape[-2]) if attrs["trans_a"] else (a.shape[-2], a.shape[-1])
    kb, n = (b.shape[-1], b.shape[-2]) if attrs["trans_b"] else (b.shape[-2], b.shape[-1])
    if ka != kb:
        raise ShapeError(f"contraction dims differ: {a.shape} x {b.shape} "
                         f"(trans_a={attrs['trans_a']}, trans_b={attrs['trans_b']})")
    batch = broadcast_shapes(a.shape[:-2], b.shape[:-2])
    if attrs.get("sum_batch"):
        if a.shape[:-2] != b.shape[:-2] or not batch:
            raise ShapeError(f"sum_batch needs the same batch dims on both operands, got "
                             f"{a.shape} and {b.shape}")
        return [TensorType((m, n), a.dtype, device)]
    return [TensorType(batch + (m, n), a.dtype, device)]


def _axes(rank: int, axes) -> tuple:
    if axes is None or axes == ():
        return tuple(range(rank))
    out = []
    for ax in axes:
        if not -rank <= ax < rank:
            raise ShapeError(f"axis {ax} out of range for rank {rank}")
        out.append(ax % rank)
    return tuple(sorted(set(out)))


def _reduce(types, attrs) -> List[TensorType]:
    (x,) = types
    axes = _axes(x.rank, attrs.get("axes"))
    if attrs["keepdims"]:
        shape = tuple(1 if i in axes else d for i, d in enumerate(x.shape))
    else:
        shape = tuple(d for i, d in enumerate(x.shape) if i not in axes)
    return [x.with_shape(shape)]


def _reshape(types, attrs) -> List[TensorType]:
    (x,) = types
    shape = [int(d) for d in attrs["shape"]]
    if shape.count(-1) > 1:
        raise ShapeError(f"reshape shape {tuple(shape)} has more than one -1")
    known = 1
    for d in shape:
        if d != -1:
            if d < 0:
                raise ShapeError(f"reshape shape {tuple(shape)} has a negative dimension")
            known *= d
    if -1 in shape:
        if known == 0 or x.numel % known:
            raise ShapeError(f"cannot reshape {x.shape} to {tuple(shape)}")
        shape[shape.index(-1)] = x.numel // known
    elif known != x.numel:
        raise ShapeError(f"cannot reshape {x.shape} ({x.numel} elements) to {tuple(shape)}")
    return [x.with_shape(tuple(shape))]


def _broadcast_to(types, attrs) -> List[TensorType]:
    (x,) = types
    shape = tuple(int(d) for d in attrs["shape"])
    if broadcast_shapes(x.shape, shape) != shape:
        raise ShapeError(f"cannot broadcast {x.shape} to {shape}")
    return [x.with_shape(shape)]


def _loss(types, attrs) -> List[TensorType]:
    y, t = types
    _same_device(types)
    if y.shape != t.shape:
        raise ShapeError(f"prediction shape {y.shape} differs from target shape {t.shape}")
    return [TensorType((), y.dtype, y.device)]


def _loss_grad(types, attrs) -> List[TensorType]:
    dl, y, t = types
    _same_device(types)
    if dl.shape != ():
        raise ShapeError(f"loss gradient must be a scalar, got shape {dl.shape}")
    if y.shape != t.shape:
        raise ShapeError(f"prediction shape {y.shape} differs from target shape {t.shape}")
    return [y]


def _optimizer_step(types, attrs) -> List[TensorType]:
    w, g = types
    _same_device(types)
    if w.shape != g.shape:
        raise ShapeError(f"weight shape {w.shape} differs from gradient shape {g.shape}")
    return [w]


def _cast(types, attrs) -> List[TensorType]:
    return [types[0].with_dtype(DType.parse(str(attrs["dtype"])))]


for _name in ("relu", "neg", "exp", "tanh", "sqrt", "sigmoid", "gelu", "identity",
              "ones_like", "zeros_like"):
    register(OpSpec(_name, 1, _unary, elementwise=True))
register(OpSpec("scale", 1, _unary, {"factor": REQUIRED}, elementwise=True,
                doc="x * factor"))
register(OpSpec("cast", 1, _cast, {"dtype": REQUIRED}, elementwise=True))
for _name in ("add", "sub", "mul", "div", "maximum"):
    register(OpSpec(_name, 2, _binary, elementwise=True))
register(OpSpec("relu_grad", 2, _grad_like_second, elementwise=True, doc="dy * (x > 0)"))
register(OpSpec("matmul", 2, _matmul, {"trans_a": False, "trans_b": False, "sum_batch": None},
                doc="a @ b over the last two dims, optionally transposing either; "
                    "sum_batch: summed over the batch dims too, one GEMM whose "
                    "contraction spans them (a weight's gradient from a batch of "
                    "sequences, as frameworks compute it)"))
register(OpSpec("reduce_sum", 1, _reduce, {"axes": None, "keepdims": False}))
register(OpSpec("reduce_mean", 1, _reduce, {"axes": None, "keepdims": False}))
register(OpSpec("reshape", 1, _reshape, {"shape": REQUIRED}))
register(OpSpec("broadcast_to", 1, _broadcast_to, {"shape": REQUIRED}))
register(OpSpec("mse_loss", 2, _loss, doc="mean((y - t)^2)"))
register(OpSpec("mse_loss_grad", 3, _loss_grad, doc="dl * 2 (y - t) / numel"))
register(OpSpec("sgd", 2, _optimizer_step, {"lr": REQUIRED}, doc="w - lr * g"))
