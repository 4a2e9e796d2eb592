"""The CNN part of the ONNX op table: batch normalization, LRN, Conv,
MaxPool / AveragePool (1-D and 2-D windows), the global pools, Pad and Clip.

1-D windows (``NCL`` inputs: audio, Conv1d) are lifted to 2-D ones with a
height of 1 (kernel ``(1, k)``, pads ``(0, b, 0, e)``) and reshaped back,
so the FLOPs, the kernels and the gradients are those of the 2-D ops.
Registered in :data:`~distsim.importers.onnx_ops.CONVERTERS` on import.
"""
from __future__ import annotations

from typing import Any, Dict, List, Tuple

import numpy as np

from ..errors import VerifyError
from .onnx_ops import _fail, _ints, axis_of, converter, static


@converter("BatchNormalization")
def _batchnorm(cx, node):
    if node.attr("training_mode", 0) or any(node.outputs[1:]):
        _fail(cx, node, "training-mode batch normalization (running-statistics outputs)")
    for name in node.inputs[3:5]:
        cx.mark_role(name, "const")
    ins = [cx.value(n) for n in node.inputs[:5]]
    return [cx.op(node, "batchnorm", ins, {"eps": node.attr("epsilon", 1e-5)})]


@converter("LRN")
def _lrn(cx, node):
    x = cx.value(node.inputs[0])
    return [cx.op(node, "lrn", [x], {"size": node.attr("size"), "alpha": node.attr("alpha", 1e-4),
                                     "beta": node.attr("beta", 0.75),
                                     "bias": node.attr("bias", 1.0)})]


# ----- convolution and pooling ---------------------------------------------------
def _window(cx, node, x_shape: Tuple[int, ...], kernel: Tuple[int, ...]
            ) -> Tuple[bool, Tuple[int, int], Tuple[int, int], Dict[str, Any]]:
    """(lifted from 1-D, 2-D kernel, 2-D dilations, {strides, pads}) of a
    window op on ``x_shape``; auto_pad resolved on the 2-D shape."""
    nd = len(kernel)
    if not ((nd == 2 and len(x_shape) == 4) or (nd == 1 and len(x_shape) == 3)):
        _fail(cx, node, f"only 1-D and 2-D windows on NCL / NCHW inputs are supported (kernel "
                        f"{tuple(kernel)} on an input of rank {len(x_shape)})")
    strides = tuple(node.attr("strides", (1,) * nd))
    dilations = tuple(node.attr("dilations", (1,) * nd))
    pads = tuple(node.attr("pads", (0,) * (2 * nd)))
    lifted = nd == 1
    if lifted:
        kernel, strides, dilations = (1,) + tuple(kernel), (1,) + strides, (1,) + dilations
        pads = (0, pads[0], 0, pads[1])
        x_shape = tuple(x_shape[:2]) + (1,) + tuple(x_shape[2:])
    auto = node.attr("auto_pad", "NOTSET")
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        pads_b, pads_e = [], []
        for i in range(2):
            out = -(-x_shape[2 + i] // strides[i])
            total = max(0, (out - 1) * strides[i] + dilations[i] * (kernel[i] - 1) + 1
                        - x_shape[2 + i])
            small, big = total // 2, total - total // 2
            pads_b.append(small if auto == "SAME_UPPER" else big)
            pads_e.append(big if auto == "SAME_UPPER" else small)
        pads = tuple(pads_b + pads_e)
    elif auto == "VALID":
        pads = (0, 0, 0, 0)
    return lifted, tuple(kernel), dilations, {"strides": strides, "pads": pads}


def _lift(cx, node, v):
    """(N, C, L) -> (N, C, 1, L)."""
    n, c, length = v.type.shape
    return cx.op(node, "reshape", [v], {"shape": (n, c, 1, length)}, out=None)


def _drop(cx, node, y, out):
    """(N, C, 1, L) -> (N, C, L)."""
    n, c, _, length = y.type.shape
    return cx.op(node, "reshape", [y], {"shape": (n, c, length)}, out=out)


@converter("Conv")
def _conv(cx, node):
    x, w = cx.value(node.inputs[0]), cx.value(node.inputs[1])
    kernel = tuple(node.attr("kernel_shape", w.type.shape[2:]))
    lifted, kernel, dil, attrs = _window(cx, node, x.type.shape, kernel)
    attrs.update(dilations=dil, group=node.attr("group", 1))
    if lifted:
        m, cg, k = w.type.shape
        x, w = _lift(cx, node, x), cx.op(node, "reshape", [w], {"shape": (m, cg, 1, k)}, out=None)
    has_bias = bool(node.input(2))
    last = 0 if not has_bias else None
    y = cx.op(node, "conv", [x, w], attrs, out=None if lifted else last)
    if lifted:
        y = _drop(cx, node, y, last)
    if has_bias:
        shape = (w.type.shape[0],) + (1,) * (y.type.rank - 2)
        bias = cx.op(node, "reshape", [cx.value(node.input(2))], {"shape": shape}, out=None)
        y = cx.op(node, "add", [y, bias])
    return [y]


@converter("MaxPool", "AveragePool")
def _pool(cx, node):
    x = cx.value(node.inputs[0])
    if len(node.outputs) > 1 and node.outputs[1]:
        _fail(cx, node, "the Indices output of MaxPool is not supported")
    if node.attr("kernel_shape") is None:
        raise VerifyError(f"{cx.where(node)}: the kernel_shape attribute is required")
    lifted, kernel, dil, attrs = _window(cx, node, x.type.shape, tuple(node.attr("kernel_shape")))
    attrs.update(kernel=kernel, ceil_mode=bool(node.attr("ceil_mode", 0)))
    if lifted:
        x = _lift(cx, node, x)
    out = None if lifted else 0
    if node.op_type == "MaxPool":
        attrs["dilations"] = dil
        y = cx.op(node, "maxpool", [x], attrs, out=out)
    else:
        attrs["count_include_pad"] = bool(node.attr("count_include_pad", 0))
        y = cx.op(node, "averagepool", [x], attrs, out=out)
    return [_drop(cx, node, y, 0) if lifted else y]


@converter("GlobalAveragePool", "GlobalMaxPool")
def _global_pool(cx, node):
    x = cx.value(node.inputs[0])
    op_type = "reduce_mean" if node.op_type == "GlobalAveragePool" else "reduce_max"
    return [cx.op(node, op_type, [x], {"axes": tuple(range(2, x.type.rank)), "keepdims": True})]


# ----- Pad and Clip ------------------------------------------------------------------
def _scalar(cx, node, value, like, hint: str):
    return cx.constant_value(np.array(value, dtype=like.type.dtype.numpy_name),
                             f"{node.outputs[0]}_{hint}")


@converter("Pad")
def _pad(cx, node):
    """Constant padding, axis by axis: ``pad`` for positive widths, ``slice``
    for negative ones (cropping); a non-zero value as ``pad(x - v) + v``."""
    x = cx.value(node.inputs[0])
    rank = x.type.rank
    mode = node.attr("mode", "constant")
    if mode != "constant":
        _fail(cx, node, f"mode '{mode}' (only constant padding is supported)")
    if node.opset < 11:
        pads, value, axes = list(node.attr("pads")), float(node.attr("value", 0.0)), None
    else:
        pads = _ints(static(cx, node, 1, "pads"))
        v = static(cx, node, 2, "constant value")
        value = 0 if v is None or v.size == 0 else v.reshape(-1)[0].item()
        a = static(cx, node, 3, "axes") if node.opset >= 18 else None
        axes = None if a is None else [int(i) for i in np.asarray(a).reshape(-1)]
    axes = list(range(rank)) if axes is None else [axis_of(cx, node, a, rank, "axes entry")
                                                   for a in axes]
    if len(pads) != 2 * len(axes):
        _fail(cx, node, f"{len(pads)} pads for {len(axes)} axes")
    widths: List[Tuple[int, int, int]] = [(a, b, e) for a, b, e in
                                          zip(axes, pads[:len(axes)], pads[len(axes):])
                                          if b or e]
    if not widths:
        return [x]
    y = x
    shift = value != 0 and any(b > 0 or e > 0 for _, b, e in widths)
    if shift:
        y = cx.op(node, "sub", [y, _scalar(cx, node, value, x, "value")], out=None)
    for axis, before, after in widths:
        if before < 0 or after < 0:
            dim = y.type.shape[axis]
            y = cx.op(node, "slice", [y], {"axis": axis, "start": max(-before, 0),
                                           "stop": dim - max(-after, 0)}, out=None)
        if before > 0 or after > 0:
            y = cx.op(node, "pad", [y], {"axis": axis, "before": max(before, 0),
                                         "after": max(after, 0)}, out=None)
    if shift:
        y = cx.op(node, "add", [y, _scalar(cx, node, value, x, "value")])
    return [y]


@converter("Clip")
def _clip(cx, node):
    """``minimum(maximum(x, min), max)``; bounds from attributes before
    opset 11, from inputs (constants or run-time values) after."""
    x = cx.value(node.inputs[0])
    if node.opset < 11:
        lo, hi = node.attr("min"), node.attr("max")
        lo = None if lo is None else _scalar(cx, node, lo, x, "min")
        hi = None if hi is None else _scalar(cx, node, hi, x, "max")
    else:
        lo = cx.value(node.input(1)) if node.input(1) else None
        hi = cx.value(node.input(2)) if node.input(2) else None
    y = x
    if lo is not None:
        y = cx.op(node, "maximum", [y, lo], out=None if hi is not None else 0)
    if hi is not None:
        y = cx.op(node, "minimum", [y, hi])
    if y is x:
        y = cx.op(node, "identity", [x])
    return [y]
