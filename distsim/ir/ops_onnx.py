"""Shape rules of the ops the ONNX importer needs beyond the core and NN
sets: indexing (gather, strided_slice, where), comparisons and logic, more
element-wise math, and the CNN ops (conv, pooling, batch
normalization, LRN) with the backward ops their gradients use.

Conventions follow ONNX where the op has an ONNX twin: NCHW layouts,
``pads`` as ``(top, left, bottom, right)`` (begins then ends), ``group`` for
grouped convolution. Every pooling/conv rule is for 2-D images.
"""
from __future__ import annotations

from typing import List, Sequence

from .ops import _axes, _binary, _same_device, broadcast_shapes
from .registry import REQUIRED, OpSpec, ShapeError, register
from .types import DType, TensorType


def _unary_float(types, attrs) -> List[TensorType]:
    (x,) = types
    if not x.dtype.is_float:
        raise ShapeError(f"expects a floating-point input, got {x.dtype}")
    return [x]


def _compare(types, attrs) -> List[TensorType]:
    a, b = types
    if a.dtype != b.dtype:
        raise ShapeError(f"dtypes differ: {a.dtype} and {b.dtype}")
    device = _same_device(types)
    return [TensorType(broadcast_shapes(a.shape, b.shape), DType.BOOL, device)]


def _logic(types, attrs) -> List[TensorType]:
    for t in types:
        if t.dtype != DType.BOOL:
            raise ShapeError(f"expects bool inputs, got {t.dtype}")
    if len(types) == 1:
        return [types[0]]
    return _binary(types, attrs)


def _isnan(types, attrs) -> List[TensorType]:
    return [_unary_float(types, attrs)[0].with_dtype(DType.BOOL)]


def _pow(types, attrs) -> List[TensorType]:
    a, b = types
    device = _same_device(types)
    return [TensorType(broadcast_shapes(a.shape, b.shape), a.dtype, device)]


def _where(types, attrs) -> List[TensorType]:
    c, x, y = types
    if c.dtype != DType.BOOL:
        raise ShapeError(f"condition must be bool, got {c.dtype}")
    if x.dtype != y.dtype:
        raise ShapeError(f"dtypes differ: {x.dtype} and {y.dtype}")
    device = _same_device(types)
    shape = broadcast_shapes(broadcast_shapes(c.shape, x.shape), y.shape)
    return [TensorType(shape, x.dtype, device)]


def _gather(types, attrs) -> List[TensorType]:
    data, idx = types
    if idx.dtype not in (DType.I32, DType.I64):
        raise ShapeError(f"indices must be integers, got {idx.dtype}")
    device = _same_device(types)
    axis = _axes(data.rank, [attrs["axis"]])[0] if data.rank else None
    if axis is None:
        raise ShapeError("cannot gather from a scalar")
    shape = data.shape[:axis] + idx.shape + data.shape[axis + 1:]
    return [TensorType(shape, data.dtype, device)]


def _gather_grad(types, attrs) -> List[TensorType]:
    dy, idx, like = types
    expected = _gather([like, idx], attrs)[0].shape
    if dy.shape != expected:
        raise ShapeError(f"gradient shape {dy.shape} differs from the gather result {expected}")
    return [like.with_dtype(dy.dtype)]


def slice_bounds(shape: Sequence[int], attrs) -> List[tuple]:
    """(start, stop, step) per dim after ONNX clamping (numpy slice terms)."""
    starts, ends = attrs["starts"], attrs["ends"]
    axes = attrs.get("axes") or tuple(range(len(starts)))
    steps = attrs.get("steps") or (1,) * len(starts)
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise ShapeError("starts, ends, axes and steps differ in length")
    out = [(0, d, 1) for d in shape]
    for s, e, ax, st in zip(starts, ends, _axes_list(len(shape), axes), steps):
        dim = shape[ax]
        if st == 0:
            raise ShapeError("slice step 0")
        s = s + dim if s < 0 else s
        e = e + dim if e < 0 else e
        if st > 0:
            s, e = min(max(s, 0), dim), min(max(e, 0), dim)
        else:
            s, e = min(max(s, 0), dim - 1), min(max(e, -1), dim - 1)
        out[ax] = (s, e, st)
    return out


def _axes_list(rank: int, axes) -> List[int]:
    out = []
    for ax in axes:
        if not -rank <= ax < rank:
            raise ShapeError(f"axis {ax} out of range for rank {rank}")
        out.append(ax % rank)
    if len(set(out)) != len(out):
        raise ShapeError(f"repeated axes {tuple(axes)}")
    return out


def _slice(types, attrs) -> List[TensorType]:
    (x,) = types
    shape = tuple(len(range(s, e, st)) for s, e, st in slice_bounds(x.shape, attrs))
    return [x.with_shape(shape)]


def _slice_grad(types, attrs) -> List[TensorType]:
    dy, like = types
    expected = _slice([like], attrs)[0].shape
    if dy.shape != expected:
        raise ShapeError(f"gradient shape {dy.shape} differs from the slice {expected}")
    return [like.with_dtype(dy.dtype)]


def _trilu(types, attrs) -> List[TensorType]:
    (x,) = types
    if x.rank < 2:
        raise ShapeError(f"trilu needs rank >= 2, got {x.shape}")
    return [x]


def _pair(name: str, value, n: int) -> tuple:
    value = tuple(int(v) for v in value)
    if len(value) != n:
        raise ShapeError(f"{name} {value} must have {n} entries")
    return value


def window_output(size: int, kernel: int, stride: int, pad_begin: int, pad_end: int,
                  dilation: int = 1, ceil_mode: bool = False) -> int:
    """Output length of a sliding window (ONNX/PyTorch convention)."""
    span = dilation * (kernel - 1) + 1
    room = size + pad_begin + pad_end - span
    if room < 0:
        raise ShapeError(f"window {kernel} (dilation {dilation}) does not fit size {size} "
                         f"with pads {pad_begin},{pad_end}")
    n = -(-room // stride) if ceil_mode else room // stride
    if ceil_mode and n * stride >= size + pad_begin:  # last window must start inside
        n -= 1
    return n + 1


def _spatial(x: TensorType, kernel, attrs, ceil_mode=False) -> tuple:
    if x.rank != 4:
        raise ShapeError(f"expects an NCHW input of rank 4, got {x.shape}")
    strides = _pair("strides", attrs["strides"], 2)
    pads = _pair("pads", attrs["pads"], 4)
    dil = _pair("dilations", attrs.get("dilations", (1, 1)), 2)
    if min(strides) < 1 or min(dil) < 1 or min(pads) < 0:
        raise ShapeError(f"strides {strides}, dilations {dil} must be positive, pads {pads} >= 0")
    return tuple(window_output(x.shape[2 + i], kernel[i], strides[i], pads[i], pads[2 + i],
                               dil[i], ceil_mode) for i in range(2))


def _conv(types, attrs) -> List[TensorType]:
    x, w = types
    device = _same_device(types)
    if w.rank != 4:
        raise ShapeError(f"weight must be (Cout, Cin/group, kh, kw), got {w.shape}")
    if x.dtype != w.dtype:
        raise ShapeError(f"dtypes differ: {x.dtype} and {w.dtype}")
    g = attrs["group"]
    if x.rank != 4 or g < 1 or x.shape[1] != w.shape[1] * g or w.shape[0] % g:
        raise ShapeError(f"input {x.shape} and weight {w.shape} disagree on channels "
                         f"(group {g})")
    oh, ow = _spatial(x, w.shape[2:], attrs)
    return [TensorType((x.shape[0], w.shape[0], oh, ow), x.dtype, device)]


def _conv_grad_input(types, attrs) -> List[TensorType]:
    dy, w, like = types
    expected = _conv([like, w], attrs)[0]
    if dy.shape != expected.shape:
        raise ShapeError(f"gradient shape {dy.shape} differs from the conv result {expected.shape}")
    return [like]


def _conv_grad_weight(types, attrs) -> List[TensorType]:
    dy, x, like = types
    expected = _conv([x, like], attrs)[0]
    if dy.shape != expected.shape:
        raise ShapeError(f"gradient shape {dy.shape} differs from the conv result {expected.shape}")
    return [like]


def _pool(types, attrs) -> List[TensorType]:
    (x,) = types
    kernel = _pair("kernel", attrs["kernel"], 2)
    oh, ow = _spatial(x, kernel, attrs, bool(attrs["ceil_mode"]))
    return [x.with_shape(x.shape[:2] + (oh, ow))]


def _pool_grad(types, attrs) -> List[TensorType]:
    dy, x = types
    expected = _pool([x], attrs)[0]
    if dy.shape != expected.shape:
        raise ShapeError(f"gradient shape {dy.shape} differs from the pool result {expected.shape}")
    return [x]


def _channel_params(x: TensorType, params: Sequence[TensorType]) -> None:
    if x.rank < 2:
        raise ShapeError(f"expects (N, C, ...) input, got {x.shape}")
    for p in params:
        if p.shape != (x.shape[1],):
            raise ShapeError(f"per-channel parameter of shape {p.shape}, expected ({x.shape[1]},)")


def _batchnorm(types, attrs) -> List[TensorType]:
    x, *params = types
    _same_device(types)
    _channel_params(x, params)
    return [x]


def _batchnorm_grad(types, attrs) -> List[TensorType]:
    dy, x, scale, mean, var = types
    _same_device(types)
    _channel_params(x, [scale, mean, var])
    if dy.shape != x.shape:
        raise ShapeError(f"gradient shape {dy.shape} differs from input shape {x.shape}")
    return [x, scale, scale]


def _lrn(types, attrs) -> List[TensorType]:
    (x,) = types
    if x.rank < 3:
        raise ShapeError(f"expects (N, C, ...) input, got {x.shape}")
    return [x]


def _lrn_grad(types, attrs) -> List[TensorType]:
    dy, x = types
    if dy.shape != x.shape:
        raise ShapeError(f"gradient shape {dy.shape} differs from input shape {x.shape}")
    return [x]


ELEMENTWISE_UNARY = ("erf", "abs", "reciprocal", "sin", "cos", "floor", "ceil")
for _name in ELEMENTWISE_UNARY:
    register(OpSpec(_name, 1, _unary_float, elementwise=True))
register(OpSpec("minimum", 2, _binary, elementwise=True))
register(OpSpec("pow", 2, _pow, elementwise=True, doc="a ** b (b broadcast, any numeric dtype)"))
for _name in ("equal", "less", "greater", "less_equal", "greater_equal"):
    register(OpSpec(_name, 2, _compare, elementwise=True, doc="comparison; bool result"))
register(OpSpec("not", 1, _logic, elementwise=True))
for _name in ("and", "or", "xor"):
    register(OpSpec(_name, 2, _logic, elementwise=True))
register(OpSpec("isnan", 1, _isnan, elementwise=True))
register(OpSpec("where", 3, _where, elementwise=True, doc="cond ? x : y, broadcast"))
register(OpSpec("gather", 2, _gather, {"axis": 0},
                doc="ONNX Gather: take along axis; indices may be negative"))
register(OpSpec("gather_grad", 3, _gather_grad, {"axis": 0},
                doc="(dy, indices, like) -> scatter-add of dy into zeros shaped like"))
register(OpSpec("strided_slice", 1, _slice, {"starts": REQUIRED, "ends": REQUIRED, "axes": None,
                                      "steps": None}, doc="ONNX Slice with static bounds"))
register(OpSpec("strided_slice_grad", 2, _slice_grad, {"starts": REQUIRED, "ends": REQUIRED,
                                                "axes": None, "steps": None},
                doc="(dy, like) -> dy placed into zeros shaped like"))
register(OpSpec("trilu", 1, _trilu, {"upper": True, "k": 0},
                doc="keep the upper (or lower) triangle of the last two dims"))
_CONV = {"strides": (1, 1), "pads": (0, 0, 0, 0), "dilations": (1, 1), "group": 1}
register(OpSpec("conv", 2, _conv, dict(_CONV), doc="2-D convolution, NCHW, weight OIHW"))
register(OpSpec("conv_grad_input", 3, _conv_grad_input, dict(_CONV),
                doc="(dy, w, like_x) -> dx: the transposed convolution"))
register(OpSpec("conv_grad_weight", 3, _conv_grad_weight, dict(_CONV),
                doc="(dy, x, like_w) -> dw"))
_POOL = {"kernel": REQUIRED, "strides": (1, 1), "pads": (0, 0, 0, 0), "ceil_mode": False}
_AVG = dict(_POOL, count_include_pad=False)
register(OpSpec("maxpool", 1, _pool, dict(_POOL, dilations=(1, 1))))
register(OpSpec("maxpool_grad", 2, _pool_grad, dict(_POOL, dilations=(1, 1)),
                doc="(dy, x) -> dx routed to each window's maximum"))
register(OpSpec("averagepool", 1, _pool, dict(_AVG)))
register(OpSpec("averagepool_grad", 2, _pool_grad, dict(_AVG), doc="(dy, x) -> dx"))
register(OpSpec("batchnorm", 5, _batchnorm, {"eps": 1e-5},
                doc="(x, scale, bias, mean, var): inference-form batch normalization over C"))
register(OpSpec("batchnorm_grad", 5, _batchnorm_grad, {"eps": 1e-5},
                doc="(dy, x, scale, mean, var) -> (dx, dscale, dbias)"))
_LRN = {"size": REQUIRED, "alpha": 1e-4, "beta": 0.75, "bias": 1.0}
register(OpSpec("lrn", 1, _lrn, dict(_LRN), doc="local response normalization across channels"))
register(OpSpec("lrn_grad", 2, _lrn_grad, dict(_LRN), doc="(dy, x) -> dx"))
