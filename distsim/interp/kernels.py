"""numpy kernels of the compute ops, keyed by op type.

Each kernel is ``fn(attrs, *arrays) -> array | tuple of arrays``. Add a
kernel with :func:`kernel`; the executor looks them up by op type.
"""
from __future__ import annotations

import math
from typing import Callable, Dict

import numpy as np

from ..ir.types import DType

Kernel = Callable[..., object]
KERNELS: Dict[str, Kernel] = {}


def kernel(*names: str):
    def deco(fn: Kernel) -> Kernel:
        for name in names:
            if name in KERNELS:
                raise ValueError(f"kernel for '{name}' registered twice")
            KERNELS[name] = fn
        return fn
    return deco


def _axes(attrs, x):
    axes = attrs.get("axes")
    return None if axes is None or axes == () else tuple(axes)


@kernel("relu")
def _relu(attrs, x):
    return np.maximum(x, 0).astype(x.dtype)


@kernel("relu_grad")
def _relu_grad(attrs, dy, x):
    return (dy * (x > 0)).astype(dy.dtype)


@kernel("neg")
def _neg(attrs, x):
    return -x


@kernel("exp")
def _exp(attrs, x):
    return np.exp(x)


@kernel("tanh")
def _tanh(attrs, x):
    return np.tanh(x)


@kernel("sqrt")
def _sqrt(attrs, x):
    return np.sqrt(x)


@kernel("sigmoid")
def _sigmoid(attrs, x):
    return (1.0 / (1.0 + np.exp(-x))).astype(x.dtype)


@kernel("gelu")
def _gelu(attrs, x):
    # tanh approximation, as in GPT-2 and Megatron
    c = math.sqrt(2.0 / math.pi)
    return (0.5 * x * (1.0 + np.tanh(c * (x + 0.044715 * x ** 3)))).astype(x.dtype)


@kernel("identity")
def _identity(attrs, x):
    return x.copy()


@kernel("ones_like")
def _ones_like(attrs, x):
    return np.ones_like(x)


@kernel("zeros_like")
def _zeros_like(attrs, x):
    return np.zeros_like(x)


@kernel("scale")
def _scale(attrs, x):
    return (x * attrs["factor"]).astype(x.dtype)


@kernel("add")
def _add(attrs, a, b):
    return a + b


@kernel("sub")
def _sub(attrs, a, b):
    return a - b


@kernel("mul")
def _mul(attrs, a, b):
    return a * b


@kernel("div")
def _div(attrs, a, b):
    if a.dtype.kind in "iu" and b.dtype.kind in "iu":
        return _int_div(a, b)
    return a / b


def _int_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Integer division as ONNX (and C) define it: truncated toward zero,
    in the integer dtype (``a / b`` would give float64, another type than
    the op's). A zero divisor gives 0, as numpy's floor division does,
    without its warning."""
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.floor_divide(a, b)
        r = np.remainder(a, b)
    q = q + ((r != 0) & ((a < 0) != (b < 0))).astype(q.dtype)
    return q.astype(np.result_type(a, b), copy=False)


@kernel("maximum")
def _maximum(attrs, a, b):
    return np.maximum(a, b)


@kernel("matmul")
def _matmul(attrs, a, b):
    if attrs.get("trans_a"):
        a = np.swapaxes(a, -1, -2)
    if attrs.get("trans_b"):
        b = np.swapaxes(b, -1, -2)
    if attrs.get("sum_batch"):
        # one GEMM over the flattened batch: (m, batch*k) @ (batch*k, n)
        a2 = np.moveaxis(a, -2, 0).reshape(a.shape[-2], -1)
        b2 = np.moveaxis(b, -1, 0).reshape(b.shape[-1], -1).T
        return a2 @ b2
    return a @ b


@kernel("reduce_sum")
def _reduce_sum(attrs, x):
    return np.asarray(np.sum(x, axis=_axes(attrs, x), keepdims=attrs.get("keepdims", False)),
                      dtype=x.dtype)


@kernel("reduce_mean")
def _reduce_mean(attrs, x):
    return np.asarray(np.mean(x, axis=_axes(attrs, x), keepdims=attrs.get("keepdims", False)),
                      dtype=x.dtype)


@kernel("mse_loss")
def _mse_loss(attrs, y, t):
    return np.asarray(np.mean((y - t) ** 2), dtype=y.dtype)


@kernel("mse_loss_grad")
def _mse_loss_grad(attrs, dl, y, t):
    return (dl * 2.0 * (y - t) / y.size).astype(y.dtype)


@kernel("sgd")
def _sgd(attrs, w, g):
    return (w - attrs["lr"] * g).astype(w.dtype)


@kernel("cast")
def _cast(attrs, x):
    return x.astype(DType.parse(str(attrs["dtype"])).numpy_name)


@kernel("reshape")
def _reshape(attrs, x):
    return np.reshape(x, tuple(attrs["shape"]))


@kernel("broadcast_to")
def _broadcast_to(attrs, x):
    return np.broadcast_to(x, tuple(attrs["shape"])).copy()


@kernel("pack")
def _pack(attrs, *parts):
    """A bundle at run time: the tensors themselves, unchanged, in a 1-D
    object array (the reference computes bf16 in float32, so their bytes
    are not the type's)."""
    bundle = np.empty(len(parts), dtype=object)
    for i, part in enumerate(parts):
        bundle[i] = part
    return bundle


@kernel("unpack")
def _unpack(attrs, bundle):
    if bundle.dtype != object or len(bundle) != len(attrs["shapes"]):
        raise ValueError(f"unpack: expected a bundle of {len(attrs['shapes'])} tensors")
    return tuple(bundle)
