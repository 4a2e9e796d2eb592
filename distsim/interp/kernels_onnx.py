"""numpy kernels of the ops in :mod:`distsim.ir.ops_onnx` (indexing,
comparisons, more element-wise math, conv, pooling, batch norm, LRN and
their backward ops).

Convolution and pooling work on windows: ``_windows`` views the padded
input as ``(N, C, OH, OW, kh, kw)`` without copying; the backward ops add
each kernel tap's contribution back with one strided slice per tap.
"""
from __future__ import annotations

import math

import numpy as np
from numpy.lib.stride_tricks import as_strided

from ..ir.ops_onnx import slice_bounds, window_output
from .kernels import kernel

_UNARY = {"abs": np.abs, "reciprocal": np.reciprocal, "sin": np.sin,
          "cos": np.cos, "floor": np.floor, "ceil": np.ceil, "not": np.logical_not,
          "isnan": np.isnan}
_BINARY = {"minimum": np.minimum, "equal": np.equal, "less": np.less, "greater": np.greater,
           "less_equal": np.less_equal, "greater_equal": np.greater_equal,
           "and": np.logical_and, "or": np.logical_or, "xor": np.logical_xor}


def _register_table(table, arity):
    for name, fn in table.items():
        if arity == 1:
            kernel(name)(lambda attrs, x, fn=fn: np.asarray(fn(x)))
        else:
            kernel(name)(lambda attrs, a, b, fn=fn: np.asarray(fn(a, b)))


_register_table(_UNARY, 1)
_register_table(_BINARY, 2)
_erf = np.vectorize(math.erf, otypes=[np.float64])


@kernel("erf")
def _erf_kernel(attrs, x):
    return _erf(x).astype(x.dtype) if x.size else x.copy()


@kernel("pow")
def _pow(attrs, a, b):
    """The result has the base's dtype (ONNX Pow). An integer base with a
    floating exponent is raised in floating point, then truncated: casting
    the exponent to the base's integer type first would turn 9 ** 0.5 into
    9 ** 0 = 1 instead of 3."""
    if a.dtype.kind in "iu" and b.dtype.kind == "f":
        return np.power(a.astype(np.float64), b.astype(np.float64)).astype(a.dtype)
    return np.power(a, b.astype(a.dtype)).astype(a.dtype)


@kernel("where")
def _where(attrs, c, x, y):
    return np.where(c, x, y)


@kernel("gather")
def _gather(attrs, data, idx):
    axis = attrs.get("axis", 0) % data.ndim
    idx = np.where(idx < 0, idx + data.shape[axis], idx)
    return np.take(data, idx, axis=axis)


@kernel("gather_grad")
def _gather_grad(attrs, dy, idx, like):
    axis = attrs.get("axis", 0) % like.ndim
    idx = np.where(idx < 0, idx + like.shape[axis], idx)
    out = np.zeros(like.shape, dtype=dy.dtype)
    moved = np.moveaxis(out, axis, 0)
    g = np.moveaxis(dy.reshape(like.shape[:axis] + (idx.size,) + like.shape[axis + 1:]), axis, 0)
    np.add.at(moved, idx.reshape(-1), g)
    return out


def _slices(shape, attrs):
    return tuple(slice(s, None if e < 0 else e, st) for s, e, st in slice_bounds(shape, attrs))


@kernel("strided_slice")
def _slice(attrs, x):
    return x[_slices(x.shape, attrs)].copy()


@kernel("strided_slice_grad")
def _slice_grad(attrs, dy, like):
    out = np.zeros(like.shape, dtype=dy.dtype)
    out[_slices(like.shape, attrs)] = dy
    return out


@kernel("trilu")
def _trilu(attrs, x):
    k = attrs.get("k", 0)
    return np.triu(x, k) if attrs.get("upper", True) else np.tril(x, k)


def _pad(x, attrs, value=0.0, extra=(0, 0)):
    top, left, bottom, right = attrs.get("pads", (0, 0, 0, 0))
    return np.pad(x, ((0, 0), (0, 0), (top, bottom + extra[0]), (left, right + extra[1])),
                  constant_values=value)


def _windows(xp, kh, kw, out_hw, strides, dil=(1, 1)):
    """(N, C, OH, OW, kh, kw) view of the padded input ``xp``."""
    n, c, _, _ = xp.shape
    sn, sc, sh, sw = xp.strides
    shape = (n, c, out_hw[0], out_hw[1], kh, kw)
    st = (sn, sc, sh * strides[0], sw * strides[1], sh * dil[0], sw * dil[1])
    return as_strided(xp, shape, st, writeable=False)


def _scatter_windows(cols, shape_p, kh, kw, strides, dil=(1, 1)):
    """Adjoint of ``_windows``: add (N, C, OH, OW, kh, kw) back into zeros
    of the padded shape."""
    out = np.zeros(shape_p, dtype=cols.dtype)
    oh, ow = cols.shape[2:4]
    for i in range(kh):
        for j in range(kw):
            hs, ws = i * dil[0], j * dil[1]
            out[:, :, hs:hs + strides[0] * (oh - 1) + 1:strides[0],
                ws:ws + strides[1] * (ow - 1) + 1:strides[1]] += cols[:, :, :, :, i, j]
    return out


def _conv_cols(x, w_shape, out_hw, attrs):
    kh, kw = w_shape[2:]
    return _windows(_pad(x, attrs), kh, kw, out_hw, attrs.get("strides", (1, 1)),
                    attrs.get("dilations", (1, 1)))


def _grouped(a, g, axis):
    """Split ``axis`` of ``a`` into (g, size/g)."""
    shape = a.shape[:axis] + (g, a.shape[axis] // g) + a.shape[axis + 1:]
    return a.reshape(shape)


def _out_hw(shape, kernel_hw, attrs, ceil_mode=False):
    strides = attrs.get("strides", (1, 1))
    pads = attrs.get("pads", (0, 0, 0, 0))
    dil = attrs.get("dilations", (1, 1))
    return tuple(window_output(shape[2 + i], kernel_hw[i], strides[i], pads[i], pads[2 + i],
                               dil[i], ceil_mode) for i in range(2))


@kernel("conv")
def _conv(attrs, x, w):
    g = attrs.get("group", 1)
    out_hw = _out_hw(x.shape, w.shape[2:], attrs)
    cols = _grouped(_conv_cols(x, w.shape, out_hw, attrs), g, 1)  # N g c OH OW kh kw
    wg = _grouped(w, g, 0)  # g o c kh kw
    y = np.einsum("ngchwij,gocij->ngohw", cols, wg, optimize=True)
    return y.reshape(x.shape[0], w.shape[0], *out_hw).astype(x.dtype)


@kernel("conv_grad_input")
def _conv_grad_input(attrs, dy, w, like):
    g = attrs.get("group", 1)
    dyg = _grouped(dy, g, 1)  # N g o OH OW
    wg = _grouped(w, g, 0)  # g o c kh kw
    cols = np.einsum("ngohw,gocij->ngchwij", dyg, wg, optimize=True)
    cols = cols.reshape(dy.shape[0], like.shape[1], *cols.shape[3:])
    return _from_windows(cols, like, attrs, w.shape[2:])


def _from_windows(cols, like, attrs, kernel_hw):
    """Sum window contributions back into an array shaped like ``like``."""
    top, left, bottom, right = attrs.get("pads", (0, 0, 0, 0))
    oh, ow = cols.shape[2:4]
    strides = attrs.get("strides", (1, 1))
    # room for windows that run past the end padding (ceil_mode pooling)
    shape_p = like.shape[:2] + (
        max(like.shape[2] + top + bottom, (oh - 1) * strides[0] + kernel_hw[0]),
        max(like.shape[3] + left + right, (ow - 1) * strides[1] + kernel_hw[1]))
    xp = _scatter_windows(cols, shape_p, kernel_hw[0], kernel_hw[1], strides,
                          attrs.get("dilations", (1, 1)))
    inner = xp[:, :, top:top + like.shape[2], left:left + like.shape[3]]
    return np.ascontiguousarray(inner).astype(like.dtype)


@kernel("conv_grad_weight")
def _conv_grad_weight(attrs, dy, x, like):
    g = attrs.get("group", 1)
    cols = _grouped(_conv_cols(x, like.shape, dy.shape[2:], attrs), g, 1)  # N g c OH OW kh kw
    dyg = _grouped(dy, g, 1)  # N g o OH OW
    dw = np.einsum("ngohw,ngchwij->gocij", dyg, cols, optimize=True)
    return dw.reshape(like.shape).astype(like.dtype)


def _pool_windows(x, attrs, value):
    """(windows, out_hw, padded input) for pooling ``x`` with pad ``value``."""
    kh, kw = attrs["kernel"]
    strides = attrs.get("strides", (1, 1))
    dil = attrs.get("dilations", (1, 1))
    out_hw = _out_hw(x.shape, (kh, kw), attrs, bool(attrs.get("ceil_mode")))
    need = [(out_hw[i] - 1) * strides[i] + dil[i] * ((kh, kw)[i] - 1) + 1 for i in range(2)]
    pads = attrs.get("pads", (0, 0, 0, 0))
    extra = tuple(max(0, need[i] - (x.shape[2 + i] + pads[i] + pads[2 + i])) for i in range(2))
    xp = _pad(x, attrs, value, extra)
    return _windows(xp, kh, kw, out_hw, strides, dil), out_hw, extra


@kernel("maxpool")
def _maxpool(attrs, x):
    win, _, _ = _pool_windows(x, attrs, -np.inf)
    return win.max(axis=(4, 5)).astype(x.dtype)


@kernel("maxpool_grad")
def _maxpool_grad(attrs, dy, x):
    win, _, _ = _pool_windows(x, attrs, -np.inf)
    n, c, oh, ow, kh, kw = win.shape
    flat = win.reshape(n, c, oh, ow, kh * kw)
    first = flat.argmax(axis=4)  # ties go to the first maximum, as in PyTorch
    cols = np.zeros(flat.shape, dtype=dy.dtype)
    np.put_along_axis(cols, first[..., None], dy[..., None], axis=4)
    return _from_windows(cols.reshape(win.shape), x, attrs, (kh, kw))


def _avg_counts(x, attrs):
    """Divisor of each window: its size, or its number of unpadded cells."""
    ones = np.ones((1, 1) + x.shape[2:], dtype=x.dtype)
    if attrs.get("count_include_pad"):
        top, left, bottom, right = attrs.get("pads", (0, 0, 0, 0))
        ones = np.ones((1, 1, x.shape[2] + top + bottom, x.shape[3] + left + right),
                       dtype=x.dtype)
        attrs = dict(attrs, pads=(0, 0, 0, 0))
        win, _, _ = _pool_windows(ones, attrs, 0.0)
        return win.sum(axis=(4, 5))
    win, _, _ = _pool_windows(ones, attrs, 0.0)
    return win.sum(axis=(4, 5))


@kernel("averagepool")
def _averagepool(attrs, x):
    win, _, _ = _pool_windows(x, attrs, 0.0)
    return (win.sum(axis=(4, 5)) / _avg_counts(x, attrs)).astype(x.dtype)


@kernel("averagepool_grad")
def _averagepool_grad(attrs, dy, x):
    kh, kw = attrs["kernel"]
    share = dy / _avg_counts(x, attrs)
    cols = np.broadcast_to(share[..., None, None], share.shape + (kh, kw))
    return _from_windows(cols, x, attrs, (kh, kw))


def _per_channel(p, x):
    return p.reshape((1, -1) + (1,) * (x.ndim - 2))


@kernel("batchnorm")
def _batchnorm(attrs, x, scale, bias, mean, var):
    inv = 1.0 / np.sqrt(var + attrs.get("eps", 1e-5))
    y = (x - _per_channel(mean, x)) * _per_channel(scale * inv, x) + _per_channel(bias, x)
    return y.astype(x.dtype)


@kernel("batchnorm_grad")
def _batchnorm_grad(attrs, dy, x, scale, mean, var):
    inv = 1.0 / np.sqrt(var + attrs.get("eps", 1e-5))
    axes = (0,) + tuple(range(2, x.ndim))
    xhat = (x - _per_channel(mean, x)) * _per_channel(inv, x)
    dx = dy * _per_channel(scale * inv, x)
    return (dx.astype(x.dtype), (dy * xhat).sum(axis=axes).astype(scale.dtype),
            dy.sum(axis=axes).astype(scale.dtype))


def _lrn_parts(attrs, x):
    size = attrs["size"]
    sq = np.pad(x * x, ((0, 0), ((size - 1) // 2, size // 2)) + ((0, 0),) * (x.ndim - 2))
    sums = sum(sq[:, i:i + x.shape[1]] for i in range(size))
    base = attrs.get("bias", 1.0) + attrs.get("alpha", 1e-4) / size * sums
    return base, size


@kernel("lrn")
def _lrn(attrs, x):
    base, _ = _lrn_parts(attrs, x)
    return (x * base ** -attrs.get("beta", 0.75)).astype(x.dtype)


@kernel("lrn_grad")
def _lrn_grad(attrs, dy, x):
    base, size = _lrn_parts(attrs, x)
    beta, alpha = attrs.get("beta", 0.75), attrs.get("alpha", 1e-4)
    direct = dy * base ** -beta
    # d y_c / d x_j = -2 beta alpha/size x_c x_j base_c^(-beta-1) for c whose window holds j
    t = dy * x * base ** (-beta - 1)
    tp = np.pad(t, ((0, 0), (size // 2, (size - 1) // 2)) + ((0, 0),) * (x.ndim - 2))
    window = sum(tp[:, i:i + x.shape[1]] for i in range(size))
    return (direct - 2.0 * beta * alpha / size * x * window).astype(x.dtype)
