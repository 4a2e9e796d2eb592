"""The ONNX op table: ONNX op type -> converter.

A converter is ``fn(cx, node) -> list`` with one entry per ONNX output: a
DistIR :class:`~distsim.ir.core.Value`, a numpy array (a value known at
import time, e.g. the result of ``Shape``) or a ``Const``. ``cx`` is the
:class:`~distsim.importers.onnx.OnnxImporter`: ``cx.value(name)`` gives the
DistIR value of an ONNX name, ``cx.const(name)`` its array when known,
``cx.op(node, op_type, inputs, attrs)`` appends an op. Opset differences
(attributes that became inputs: axes, split, pads...) are handled here.
"""
from __future__ import annotations

import ast

import math
from typing import Any, Callable, Dict, List, Optional

import numpy as np
from onnx import helper, numpy_helper

from ..errors import UnsupportedOpError, VerifyError
from ..ir.ops import broadcast_shapes
from ..ir.registry import ShapeError

Converter = Callable[[Any, "OnnxNode"], List[Any]]
CONVERTERS: Dict[str, Converter] = {}
# Checks of what the ONNX spec requires of a node, run before it is either
# folded or converted (``onnx.reference`` evaluates some malformed nodes).
CHECKS: Dict[str, Callable[[Any, "OnnxNode"], None]] = {}
# Ops never evaluated at import time even when their inputs are constant.
NO_FOLD = {"ConstantOfShape", "Constant", "Dropout", "Identity"}


class OnnxNode:
    """A NodeProto with its attributes decoded and the model's opset."""

    def __init__(self, proto, opset: int) -> None:
        self.proto = proto
        self.op_type = proto.op_type
        self.label = proto.name or (proto.output[0] if proto.output else proto.op_type)
        self.inputs = list(proto.input)
        self.outputs = list(proto.output)
        self.attrs = {a.name: helper.get_attribute_value(a) for a in proto.attribute}
        self.opset = opset

    @property
    def scope(self) -> str:
        """Where the node sits in the exported model: the innermost module
        of the PyTorch exporter's ``pkg.torch.onnx.name_scopes`` (such as
        ``inner.model.layers.0.self_attn.q_proj``), else the node's name
        (older exporters write ``/transformer/h.0/attn/MatMul``). Pipeline
        stages are read off it (:mod:`distsim.transforms.pipeline_layers`)."""
        for prop in self.proto.metadata_props:
            if prop.key == "pkg.torch.onnx.name_scopes":
                try:
                    scopes = ast.literal_eval(prop.value)
                except (ValueError, SyntaxError):
                    break
                if isinstance(scopes, list) and len(scopes) >= 2:
                    return str(scopes[-2])
                break
        return self.label

    def attr(self, name: str, default: Any = None) -> Any:
        value = self.attrs.get(name, default)
        return value.decode() if isinstance(value, bytes) else value

    def input(self, i: int) -> str:
        return self.inputs[i] if i < len(self.inputs) else ""


def converter(*names: str):
    def deco(fn: Converter) -> Converter:
        for n in names:
            CONVERTERS[n] = fn
        return fn
    return deco


def static(cx, node: OnnxNode, i: int, what: str) -> Optional[np.ndarray]:
    """The import-time value of input ``i`` (None if absent); raises when it
    is computed at run time."""
    name = node.input(i)
    if not name:
        return None
    arr = cx.const(name)
    if arr is None:
        raise UnsupportedOpError(f"{cx.where(node)}: its {what} ('{name}') is computed at run "
                                 "time; only shapes known at import time are supported")
    return arr


def _ints(arr) -> List[int]:
    return [int(v) for v in np.asarray(arr).reshape(-1)]


def _axes_arg(cx, node, attr_until: int, i: int = 1) -> Optional[List[int]]:
    """Axes from the attribute (opset < attr_until) or from input ``i``."""
    if node.opset < attr_until:
        axes = node.attr("axes")
        return None if axes is None else list(axes)
    arr = static(cx, node, i, "axes")
    return None if arr is None else _ints(arr)


def _fail(cx, node, reason: str):
    raise UnsupportedOpError(f"{cx.where(node)}: {reason}")


def axis_of(cx, node, axis: Any, rank: int, what: str = "axis",
            holder: str = "an input") -> int:
    """``axis`` normalised to ``[0, rank)``. ONNX allows ``[-rank, rank)``;
    anything else is a malformed node, refused by name rather than wrapped
    around by ``%`` (which would import a model that computes something else)."""
    if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)):
        raise VerifyError(f"{cx.where(node)}: {what} {axis!r} is not an integer")
    if not -rank <= axis < rank:
        raise VerifyError(f"{cx.where(node)}: {what} {int(axis)} is out of range for {holder} "
                          f"of rank {rank} (allowed: {-rank} .. {rank - 1})")
    return int(axis) % rank


# ----- element-wise -------------------------------------------------------------
_UNARY = {"Relu": "relu", "Neg": "neg", "Exp": "exp", "Tanh": "tanh", "Sqrt": "sqrt",
          "Sigmoid": "sigmoid", "Erf": "erf", "Log": "log", "Abs": "abs",
          "Reciprocal": "reciprocal", "Sin": "sin", "Cos": "cos", "Floor": "floor", "Ceil": "ceil",
          "Not": "not", "IsNaN": "isnan"}
_BINARY = {"Add": "add", "Sub": "sub", "Mul": "mul", "Div": "div", "Pow": "pow",
           "Equal": "equal", "Less": "less", "Greater": "greater", "LessOrEqual": "less_equal",
           "GreaterOrEqual": "greater_equal", "And": "and", "Or": "or", "Xor": "xor"}
_VARIADIC = {"Sum": "add", "Max": "maximum", "Min": "minimum", "Mean": "add"}


@converter(*_UNARY)
def _unary(cx, node):
    return [cx.op(node, _UNARY[node.op_type], [cx.value(node.inputs[0])])]


@converter(*_BINARY)
def _binary(cx, node):
    a, b = (cx.value(n) for n in node.inputs[:2])
    return [cx.op(node, _BINARY[node.op_type], [a, b])]


@converter(*_VARIADIC)
def _variadic(cx, node):
    vals = [cx.value(n) for n in node.inputs if n]
    op_type = _VARIADIC[node.op_type]
    last = len(vals) - 1 + (node.op_type == "Mean")
    acc = vals[0]
    for k, v in enumerate(vals[1:], start=1):
        acc = cx.op(node, op_type, [acc, v], out=0 if k == last else None)
    if node.op_type == "Mean":
        acc = cx.op(node, "scale", [acc], {"factor": 1.0 / len(vals)})
    elif len(vals) == 1:
        acc = cx.op(node, "identity", [acc])
    return [acc]


@converter("Identity")
def _identity(cx, node):
    name = node.inputs[0]
    return [cx.values[name] if name in cx.values else cx.consts[name]]


@converter("Dropout")
def _dropout(cx, node):
    """Inference mode: the identity (and an all-true mask)."""
    first = _identity(cx, node)[0]
    mask = np.broadcast_to(np.array(True), cx.type_of(node.inputs[0]).shape)
    return [first, mask]


@converter("Where")
def _where(cx, node):
    return [cx.op(node, "where", [cx.value(n) for n in node.inputs[:3]])]


@converter("Cast", "CastLike")
def _cast(cx, node):
    x = cx.value(node.inputs[0])
    if node.op_type == "Cast":
        to = cx.dtype(node.attr("to"), cx.where(node))
    else:
        to = cx.type_of(node.inputs[1]).dtype
    if to == x.type.dtype:
        return [x]
    return [cx.op(node, "cast", [x], {"dtype": to.value})]


@converter("Gelu")
def _gelu(cx, node):
    x = cx.value(node.inputs[0])
    if node.attr("approximate", "none") == "tanh":
        return [cx.op(node, "gelu", [x])]
    # 0.5 x (1 + erf(x / sqrt 2))
    e = cx.op(node, "erf", [cx.op(node, "scale", [x], {"factor": 1 / math.sqrt(2.0)}, out=None)],
              out=None)
    one = cx.constant_value(np.ones((), dtype=x.type.dtype.numpy_name), node.outputs[0])
    half_x = cx.op(node, "scale", [x], {"factor": 0.5}, out=None)
    return [cx.op(node, "mul", [half_x, cx.op(node, "add", [e, one], out=None)])]


# ----- linear algebra and normalization ------------------------------------------
@converter("MatMul")
def _matmul(cx, node):
    a, b = (cx.value(n) for n in node.inputs[:2])
    if a.type.rank >= 2 and b.type.rank >= 2:
        return [cx.op(node, "matmul", [a, b])]
    if a.type.rank == 0 or b.type.rank == 0:
        raise VerifyError(f"{cx.where(node)}: MatMul needs operands of rank >= 1, got shapes "
                          f"{a.type.shape} and {b.type.shape}")
    a2 = a if a.type.rank >= 2 else cx.op(node, "reshape", [a], {"shape": (1,) + a.type.shape},
                                          out=None)
    b2 = b if b.type.rank >= 2 else cx.op(node, "reshape", [b], {"shape": b.type.shape + (1,)},
                                          out=None)
    y = cx.op(node, "matmul", [a2, b2], out=None)
    shape = y.type.shape
    if a.type.rank < 2:
        shape = shape[:-2] + shape[-1:]
    if b.type.rank < 2:
        shape = shape[:-1]
    return [cx.op(node, "reshape", [y], {"shape": shape})]


def _check_gemm(cx, node):
    """ONNX's Gemm multiplies matrices: A and B must be 2-D (a batch of
    matrices is MatMul's job)."""
    for k, label in enumerate(("A", "B")):
        name = node.input(k)
        if not name:
            raise VerifyError(f"{cx.where(node)}: Gemm needs inputs A and B, {label} is missing")
        try:
            shape = cx.type_of(name).shape
        except KeyError:  # an unused output of another node: the converter says so
            return
        if len(shape) != 2:
            raise VerifyError(f"{cx.where(node)}: Gemm needs 2-D inputs A and B, got {label} "
                              f"'{name}' of shape {shape} (rank {len(shape)}); use MatMul for "
                              "other ranks")


CHECKS["Gemm"] = _check_gemm


@converter("Gemm")
def _gemm(cx, node):
    a, b = cx.value(node.inputs[0]), cx.value(node.inputs[1])
    alpha, beta = node.attr("alpha", 1.0), node.attr("beta", 1.0)
    has_c = bool(node.input(2)) and beta != 0
    y = cx.op(node, "matmul", [a, b], {"trans_a": bool(node.attr("transA", 0)),
                                       "trans_b": bool(node.attr("transB", 0))},
              out=None if (has_c or alpha != 1.0) else 0)
    if alpha != 1.0:
        y = cx.op(node, "scale", [y], {"factor": alpha}, out=None if has_c else 0)
    if has_c:
        c = cx.value(node.input(2))
        if beta != 1.0:
            c = cx.op(node, "scale", [c], {"factor": beta}, out=None)
        y = cx.op(node, "add", [y, c])
    return [y]


@converter("LayerNormalization")
def _layernorm(cx, node):
    """Normalizes over the dims ``[axis, rank)`` together; another axis than
    the last runs as a layernorm of the 2-D view (lead, prod(shape[axis:]))
    with the scale and bias flattened, then reshaped back."""
    x = cx.value(node.inputs[0])
    rank = x.type.rank
    axis = axis_of(cx, node, node.attr("axis", -1), rank)
    if any(node.outputs[1:]):
        _fail(cx, node, "its Mean / InvStdDev outputs are not supported")
    gamma = cx.value(node.inputs[1])
    if node.input(2):
        beta = cx.value(node.input(2))
    else:
        beta = cx.constant_value(np.zeros(gamma.type.shape, gamma.type.dtype.numpy_name),
                                 node.outputs[0] + "_beta")
    attrs = {"axis": -1, "eps": node.attr("epsilon", 1e-5)}
    if axis == rank - 1:
        return [cx.op(node, "layernorm", [x, gamma, beta], attrs)]
    inner_shape = tuple(x.type.shape[axis:])
    inner = int(np.prod(inner_shape))
    flat = []
    for v in (gamma, beta):
        if v.type.shape != inner_shape:  # unidirectionally broadcastable
            v = cx.op(node, "broadcast_to", [v], {"shape": inner_shape}, out=None)
        flat.append(cx.op(node, "reshape", [v], {"shape": (inner,)}, out=None))
    x2 = cx.op(node, "reshape", [x], {"shape": (int(np.prod(x.type.shape[:axis])), inner)},
               out=None)
    y = cx.op(node, "layernorm", [x2] + flat, attrs, out=None)
    return [cx.op(node, "reshape", [y], {"shape": x.type.shape})]


@converter("RMSNormalization")
def _rmsnorm(cx, node):
    x = cx.value(node.inputs[0])
    if axis_of(cx, node, node.attr("axis", -1), x.type.rank) != x.type.rank - 1:
        _fail(cx, node, "normalization over other than the last axis")
    return [cx.op(node, "rmsnorm", [x, cx.value(node.inputs[1])],
                  {"eps": node.attr("epsilon", 1e-5)})]


@converter("Softmax", "LogSoftmax")
def _softmax(cx, node):
    x = cx.value(node.inputs[0])
    op_type = "softmax" if node.op_type == "Softmax" else "log_softmax"
    rank = x.type.rank
    axis = axis_of(cx, node, node.attr("axis", -1 if node.opset >= 13 else 1), max(rank, 1))
    if node.opset >= 13 or axis == rank - 1:
        return [cx.op(node, op_type, [x], {"axis": axis})]
    # before opset 13: softmax over the flattened trailing dims [axis, rank)
    lead = int(np.prod(x.type.shape[:axis]))
    flat = cx.op(node, "reshape", [x], {"shape": (lead, -1)}, out=None)
    y = cx.op(node, op_type, [flat], {"axis": 1}, out=None)
    return [cx.op(node, "reshape", [y], {"shape": x.type.shape})]


# ----- reductions ----------------------------------------------------------------
_REDUCE = {"ReduceMean": ("reduce_mean", 18), "ReduceSum": ("reduce_sum", 13),
           "ReduceMax": ("reduce_max", 18)}


@converter(*_REDUCE)
def _reduce(cx, node):
    op_type, attr_until = _REDUCE[node.op_type]
    x = cx.value(node.inputs[0])
    axes = _axes_arg(cx, node, attr_until)
    if not axes:
        if node.attr("noop_with_empty_axes", 0):
            return [x]
        axes = list(range(x.type.rank))
    return [cx.op(node, op_type, [x], {"axes": tuple(axes),
                                       "keepdims": bool(node.attr("keepdims", 1))})]


# ----- shapes --------------------------------------------------------------------
@converter("Shape")
def _shape(cx, node):
    shape = cx.type_of(node.inputs[0]).shape
    start, end = node.attr("start", 0), node.attr("end", None)
    return [np.array(shape[start:end], dtype=np.int64)]


@converter("Size")
def _size(cx, node):
    return [np.array(int(np.prod(cx.type_of(node.inputs[0]).shape)), dtype=np.int64)]


@converter("Constant")
def _constant(cx, node):
    for key, value in node.attrs.items():
        if key == "value":
            return [numpy_helper.to_array(value)]
        if key in ("value_float", "value_int", "value_floats", "value_ints"):
            dtype = np.float32 if "float" in key else np.int64
            return [np.array(value, dtype=dtype)]
    _fail(cx, node, f"constant attributes {sorted(node.attrs)} are not supported")


@converter("ConstantOfShape")
def _constant_of_shape(cx, node):
    shape = tuple(_ints(static(cx, node, 0, "shape")))
    value = node.attr("value")
    fill = numpy_helper.to_array(value).reshape(-1)[0] if value is not None else np.float32(0)
    array = np.broadcast_to(np.asarray(fill), shape)
    from_weights = node.inputs[0] in cx.graph_initializers and np.asarray(fill).dtype.kind == "f"
    if from_weights and array.size > 1:
        return [cx.make_const(array, cx.where(node), role="param")]
    return [array]


def _reshape_target(cx, node, x_shape, target, allowzero: bool):
    target = list(target)
    if not allowzero:
        target = [x_shape[i] if d == 0 and i < len(x_shape) else d for i, d in enumerate(target)]
    change = cx.batch_change
    numel = int(np.prod(x_shape))
    if (change and target and -1 not in target and target[0] == change[0]
            and x_shape and x_shape[0] == change[1] and int(np.prod(target)) * change[1]
            == numel * change[0]):
        target[0] = change[1]  # a batch size the exporter hard-coded
    return tuple(target)


@converter("Reshape")
def _reshape(cx, node):
    x = cx.value(node.inputs[0])
    if node.opset < 5:
        target = node.attr("shape")
    else:
        target = _ints(static(cx, node, 1, "target shape"))
    shape = _reshape_target(cx, node, x.type.shape, target, bool(node.attr("allowzero", 0)))
    return [cx.op(node, "reshape", [x], {"shape": shape})]


@converter("Flatten")
def _flatten(cx, node):
    x = cx.value(node.inputs[0])
    # the split point between the two dims: ONNX allows [-rank, rank], a
    # negative one counting from the end (-1: before the last dim)
    rank, axis = x.type.rank, node.attr("axis", 1)
    if isinstance(axis, bool) or not isinstance(axis, int) or not -rank <= axis <= rank:
        raise VerifyError(f"{cx.where(node)}: axis {axis!r} is out of range for an input of "
                          f"rank {rank} (allowed: {-rank} .. {rank})")
    axis = axis + rank if axis < 0 else axis
    lead = int(np.prod(x.type.shape[:axis]))
    return [cx.op(node, "reshape", [x], {"shape": (lead, int(np.prod(x.type.shape[axis:])))})]


@converter("Squeeze")
def _squeeze(cx, node):
    x = cx.value(node.inputs[0])
    axes = _axes_arg(cx, node, 13)
    rank = x.type.rank
    drop = ({axis_of(cx, node, a, rank, "axes entry") for a in axes} if axes
            else {i for i, d in enumerate(x.type.shape) if d == 1})
    for a in drop:
        if x.type.shape[a] != 1:
            raise VerifyError(f"{cx.where(node)}: cannot squeeze axis {a} of size "
                              f"{x.type.shape[a]} (shape {x.type.shape})")
    shape = tuple(d for i, d in enumerate(x.type.shape) if i not in drop)
    return [cx.op(node, "reshape", [x], {"shape": shape})]


@converter("Unsqueeze")
def _unsqueeze(cx, node):
    x = cx.value(node.inputs[0])
    axes = _axes_arg(cx, node, 13) or []
    rank = x.type.rank + len(axes)
    shape = list(x.type.shape)
    for a in sorted(axis_of(cx, node, a, rank, "axes entry", "the output") for a in axes):
        shape.insert(a, 1)
    return [cx.op(node, "reshape", [x], {"shape": tuple(shape)})]


@converter("Expand")
def _expand(cx, node):
    x = cx.value(node.inputs[0])
    target = _ints(static(cx, node, 1, "shape"))
    try:
        shape = broadcast_shapes(x.type.shape, target)
    except ShapeError as e:
        raise cx.shape_error(node, e) from None
    if shape == x.type.shape:
        return [x]
    return [cx.op(node, "broadcast_to", [x], {"shape": shape})]


@converter("Transpose")
def _transpose(cx, node):
    x = cx.value(node.inputs[0])
    perm = node.attr("perm") or list(reversed(range(x.type.rank)))
    return [cx.op(node, "transpose", [x], {"perm": tuple(perm)})]


@converter("Concat")
def _concat(cx, node):
    vals = [cx.value(n) for n in node.inputs if n]
    return [cx.op(node, "concat", vals, {"axis": node.attr("axis")})]


@converter("Split")
def _split(cx, node):
    x = cx.value(node.inputs[0])
    axis = axis_of(cx, node, node.attr("axis", 0), x.type.rank)
    n = len(node.outputs)
    if node.opset < 13:
        sizes = node.attr("split")
    else:
        arr = static(cx, node, 1, "split sizes")
        sizes = None if arr is None else _ints(arr)
    if not sizes:
        dim = x.type.shape[axis]
        part = -(-dim // n)
        sizes = [min(part, dim - k * part) for k in range(n)]
    names = [n_ or f"{node.outputs[0]}_unused{k}" for k, n_ in enumerate(node.outputs)]
    outs = cx.op(node, "split", [x], {"axis": axis, "sizes": tuple(sizes)}, names=names)
    return list(outs) if isinstance(outs, tuple) else [outs]


@converter("Slice")
def _slice(cx, node):
    x = cx.value(node.inputs[0])
    if node.opset < 10:
        starts, ends = node.attr("starts"), node.attr("ends")
        axes, steps = node.attr("axes"), None
    else:
        starts = _ints(static(cx, node, 1, "starts"))
        ends = _ints(static(cx, node, 2, "ends"))
        axes_arr, steps_arr = static(cx, node, 3, "axes"), static(cx, node, 4, "steps")
        axes = None if axes_arr is None else _ints(axes_arr)
        steps = None if steps_arr is None else _ints(steps_arr)
    attrs = {"starts": tuple(starts), "ends": tuple(ends)}
    if axes is not None:
        attrs["axes"] = tuple(axes)
    if steps is not None:
        attrs["steps"] = tuple(steps)
    return [cx.op(node, "strided_slice", [x], attrs)]


@converter("Gather")
def _gather(cx, node):
    data, idx = cx.value(node.inputs[0]), cx.value(node.inputs[1])
    axis = node.attr("axis", 0)
    indices = cx.const(node.inputs[1])
    if indices is not None and indices.size and data.type.rank:
        size = data.type.shape[axis_of(cx, node, axis, data.type.rank)]
        high, low = int(indices.max()), int(indices.min())
        if high >= size or low < -size:
            bad = high if high >= size else low
            hint = cx.sequence_hint(bad + 1, size) if bad >= size else None
            raise VerifyError(f"{cx.where(node)}: index {bad} is out of range for axis {axis} "
                              f"(size {size}) of '{node.inputs[0]}'" +
                              (f": {hint}" if hint else ""))
    return [cx.op(node, "gather", [data, idx], {"axis": axis})]


@converter("Trilu")
def _trilu(cx, node):
    k = static(cx, node, 1, "k")
    return [cx.op(node, "trilu", [cx.value(node.inputs[0])],
                  {"upper": bool(node.attr("upper", 1)), "k": 0 if k is None else _ints(k)[0]})]


# Ops supported only on inputs known at import time (folded by onnx_fold):
# what exporters use to build position ids and attention masks.
FOLD_ONLY = ("Range", "CumSum", "GatherND", "GatherElements", "NonZero", "Tile", "ScatterND",
             "OneHot", "Mod", "EyeLike")


@converter(*FOLD_ONLY)
def _fold_only(cx, node):
    _fail(cx, node, "supported only on inputs known at import time (shapes, masks, position "
                    "ids); here an input is computed at run time")


# The CNN ops (convolution, pooling, batch norm, LRN, Pad, Clip) register
# themselves in CONVERTERS from their own module.
from . import onnx_ops_cnn  # noqa: E402,F401
