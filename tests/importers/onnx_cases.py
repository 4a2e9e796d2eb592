"""Small one-node ONNX models, one per entry of the importer's op table,
for comparing NumpyExecutor with onnx.reference.ReferenceEvaluator."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

F = TensorProto.FLOAT
I64 = TensorProto.INT64
B = TensorProto.BOOL


def model(op_type, inputs, attrs=None, consts=None, opset=17, n_out=1, out_type=None):
    """A model with one ``op_type`` node. ``inputs``: list of (name, elem,
    shape) graph inputs; ``consts``: name -> array initializers (appended
    to the node inputs in order); ``inputs`` entries may be '' (absent)."""
    consts = consts or {}
    node_inputs = [i[0] if i else "" for i in inputs] + list(consts)
    outs = [f"y{k}" for k in range(n_out)]
    node = helper.make_node(op_type, node_inputs, outs, **(attrs or {}))
    g_inputs = [helper.make_tensor_value_info(n, e, s) for n, e, s in (i for i in inputs if i)]
    inits = [numpy_helper.from_array(np.asarray(a), n) for n, a in consts.items()]
    g_outputs = [helper.make_tensor_value_info(o, out_type or 0, None) for o in outs]
    graph = helper.make_graph([node], op_type.lower(), g_inputs, g_outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def x(shape, name="x", elem=F):
    return (name, elem, list(shape))


CASES = {
    "Relu": model("Relu", [x((2, 3))]),
    "Neg": model("Neg", [x((2, 3))]),
    "Exp": model("Exp", [x((2, 3))]),
    "Tanh": model("Tanh", [x((2, 3))]),
    "Sqrt": model("Sqrt", [x((2, 3))]),
    "Sigmoid": model("Sigmoid", [x((2, 3))]),
    "Erf": model("Erf", [x((2, 3))]),
    "Log": model("Log", [x((2, 3))]),
    "Abs": model("Abs", [x((2, 3))]),
    "Reciprocal": model("Reciprocal", [x((2, 3))]),
    "Sin": model("Sin", [x((2, 3))]),
    "Cos": model("Cos", [x((2, 3))]),
    "Floor": model("Floor", [x((2, 3))]),
    "Ceil": model("Ceil", [x((2, 3))]),
    "Not": model("Not", [x((2, 3), elem=B)]),
    "IsNaN": model("IsNaN", [x((2, 3))]),
    "Identity": model("Identity", [x((2, 3))]),
    "Add": model("Add", [x((2, 3)), x((3,), "b")]),
    "Sub": model("Sub", [x((2, 3)), x((2, 1), "b")]),
    "Mul": model("Mul", [x((4, 2, 3)), x((2, 3), "b")]),
    "Div": model("Div", [x((2, 3)), x((3,), "b")]),
    "Pow": model("Pow", [x((2, 3))], consts={"e": np.array(3.0, np.float32)}),
    "Equal": model("Equal", [x((2, 3), elem=I64), x((3,), "b", I64)]),
    "Less": model("Less", [x((2, 3)), x((3,), "b")]),
    "Greater": model("Greater", [x((2, 3)), x((3,), "b")]),
    "LessOrEqual": model("LessOrEqual", [x((2, 3)), x((3,), "b")]),
    "GreaterOrEqual": model("GreaterOrEqual", [x((2, 3)), x((3,), "b")]),
    "And": model("And", [x((2, 3), elem=B), x((3,), "b", B)]),
    "Or": model("Or", [x((2, 3), elem=B), x((3,), "b", B)]),
    "Xor": model("Xor", [x((2, 3), elem=B), x((3,), "b", B)]),
    "Sum": model("Sum", [x((2, 3)), x((3,), "b"), x((2, 3), "c")]),
    "Max": model("Max", [x((2, 3)), x((3,), "b")]),
    "Min": model("Min", [x((2, 3)), x((3,), "b")]),
    "Mean": model("Mean", [x((2, 3)), x((2, 3), "b")]),
    "Where": model("Where", [x((2, 3), "c", B), x((2, 3)), x((3,), "b")]),
    "Cast": model("Cast", [x((2, 3))], {"to": TensorProto.INT64}),
    "CastLike": model("CastLike", [x((2, 3)), x((1,), "b", TensorProto.DOUBLE)]),
    "Gelu": model("Gelu", [x((2, 3))], opset=20),
    "Dropout": model("Dropout", [x((2, 3))]),
    "MatMul": model("MatMul", [x((2, 3, 4)), x((4, 5), "b")]),
    "Gemm": model("Gemm", [x((3, 4)), x((5, 4), "b"), x((5,), "c")],
                  {"transB": 1, "alpha": 0.5, "beta": 2.0}),
    "LayerNormalization": model("LayerNormalization", [x((2, 3, 4)), x((4,), "g"), x((4,), "b")],
                                {"epsilon": 1e-5}),
    "RMSNormalization": model("RMSNormalization", [x((2, 3, 4)), x((4,), "g")], opset=23),
    "Softmax": model("Softmax", [x((2, 3, 4))], {"axis": 1}),
    "LogSoftmax": model("LogSoftmax", [x((2, 3, 4))]),
    "BatchNormalization": model("BatchNormalization", [x((2, 3, 4, 4))],
                                consts={"s": np.array([1.0, 2.0, 0.5], np.float32),
                                        "bb": np.array([0.1, -0.2, 0.3], np.float32),
                                        "m": np.array([0.0, 0.5, -0.5], np.float32),
                                        "v": np.array([1.0, 2.0, 0.25], np.float32)}),
    # N == C: onnx.reference's LRN loops over range(N) where it means the
    # channels (onnx 1.23), which is right only when N == C.
    "LRN": model("LRN", [x((5, 5, 2, 3))], {"size": 3, "alpha": 0.1, "beta": 0.75, "bias": 2.0}),
    "Conv": model("Conv", [x((1, 4, 7, 7)), x((6, 2, 3, 3), "w"), x((6,), "b")],
                  {"strides": [2, 1], "pads": [1, 0, 1, 2], "group": 2, "dilations": [1, 2]}),
    "MaxPool": model("MaxPool", [x((1, 2, 7, 7))], {"kernel_shape": [3, 3], "strides": [2, 2],
                                                    "pads": [1, 1, 1, 1], "ceil_mode": 1}),
    "AveragePool": model("AveragePool", [x((1, 2, 6, 6))],
                         {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [0, 0, 1, 1]}),
    "GlobalAveragePool": model("GlobalAveragePool", [x((2, 3, 4, 5))]),
    "GlobalMaxPool": model("GlobalMaxPool", [x((2, 3, 4, 5))]),
    "ReduceMean": model("ReduceMean", [x((2, 3, 4))], {"axes": [1], "keepdims": 0}, opset=13),
    "ReduceSum": model("ReduceSum", [x((2, 3, 4))], consts={"axes": np.array([0, 2])}),
    "ReduceMax": model("ReduceMax", [x((2, 3, 4))], consts={"axes": np.array([-1])}, opset=18),
    "Shape": model("Shape", [x((2, 3, 4))], {"start": 1}),
    "Size": model("Size", [x((2, 3, 4))]),
    "Constant": model("Constant", [], {"value": numpy_helper.from_array(
        np.arange(6, dtype=np.float32).reshape(2, 3))}),
    "ConstantOfShape": model("ConstantOfShape", [], consts={"s": np.array([2, 3])}),
    "Reshape": model("Reshape", [x((2, 3, 4))], consts={"s": np.array([0, -1])}),
    "Flatten": model("Flatten", [x((2, 3, 4))], {"axis": 2}),
    "Squeeze": model("Squeeze", [x((2, 1, 4))], consts={"a": np.array([1])}),
    "Unsqueeze": model("Unsqueeze", [x((2, 4))], consts={"a": np.array([0, -1])}),
    "Expand": model("Expand", [x((3, 1))], consts={"s": np.array([2, 1, 4])}),
    "Transpose": model("Transpose", [x((2, 3, 4))], {"perm": [2, 0, 1]}),
    "Concat": model("Concat", [x((2, 3)), x((2, 2), "b")], {"axis": -1}),
    "Split": model("Split", [x((2, 6))], {"axis": 1}, consts={"s": np.array([2, 4])}, n_out=2),
    "Slice": model("Slice", [x((5, 6))], consts={"st": np.array([1, -1]), "en": np.array([4, 0]),
                                                 "ax": np.array([0, 1]),
                                                 "sp": np.array([2, -2])}),
    "Gather": model("Gather", [x((5, 4)), x((2, 3), "i", I64)], {"axis": 0}),
    "Trilu": model("Trilu", [x((2, 4, 4))], {"upper": 0}, consts={"k": np.array(1)}),
    "Range": model("Range", [], consts={"a": np.array(1), "l": np.array(10), "d": np.array(3)}),
    # Pad: widths per axis, a non-zero value, axes (opset 18), opset-9 attributes
    # (negative widths, which onnx.reference refuses: test_onnx_old_opsets.py)
    "Pad": model("Pad", [x((2, 5))], consts={"p": np.array([1, 0, 2, 3]),
                                             "v": np.array(1.5, np.float32)}, opset=13),
    "Pad_axes": model("Pad", [x((2, 3, 4))], consts={"p": np.array([2, 1]),
                                                     "v": np.array(0.0, np.float32),
                                                     "a": np.array([-1])}, opset=18),
    "Pad_opset9": model("Pad", [x((2, 3))], {"pads": [0, 2, 1, 0], "value": -2.0}, opset=9),
    "Clip": model("Clip", [x((2, 3))], consts={"lo": np.array(-0.5, np.float32),
                                               "hi": np.array(0.75, np.float32)}, opset=13),
    "Clip_min_only": model("Clip", [x((2, 3)), x((), "lo")], opset=13),
    "Clip_runtime_bounds": model("Clip", [x((2, 3)), x((), "lo"), x((), "hi")], opset=13),
    "Clip_opset9": model("Clip", [x((2, 3))], {"min": -0.2, "max": 0.3}, opset=9),
    # 1-D windows (NCL), lifted to 2-D
    "Conv_1d": model("Conv", [x((2, 4, 11)), x((6, 2, 3), "w"), x((6,), "b")],
                     {"strides": [2], "pads": [1, 2], "dilations": [2], "group": 2}),
    "Conv_1d_same": model("Conv", [x((1, 3, 10)), x((5, 3, 4), "w")],
                          {"strides": [3], "auto_pad": "SAME_UPPER"}),
    "MaxPool_1d": model("MaxPool", [x((2, 3, 9))], {"kernel_shape": [3], "strides": [2],
                                                    "pads": [1, 1], "ceil_mode": 1}),
    "AveragePool_1d": model("AveragePool", [x((2, 3, 9))],
                            {"kernel_shape": [4], "strides": [2], "pads": [1, 2],
                             "count_include_pad": 1}),
    # LayerNormalization over [axis, rank) for an axis other than the last
    "LayerNormalization_axis1": model("LayerNormalization",
                                      [x((2, 3, 4)), x((3, 4), "g"), x((3, 4), "b")],
                                      {"axis": 1, "epsilon": 1e-3}),
    "LayerNormalization_axis0_no_bias": model("LayerNormalization", [x((2, 3, 4)),
                                                                     x((2, 3, 4), "g")],
                                              {"axis": -3}),
}


def random_feeds(m: onnx.ModelProto, seed: int = 0):
    """Random arrays for the graph inputs (gather indices stay in range)."""
    rng = np.random.default_rng(seed)
    inits = {i.name for i in m.graph.initializer}
    feeds = {}
    for vi in m.graph.input:
        if vi.name in inits:
            continue
        tt = vi.type.tensor_type
        shape = [d.dim_value for d in tt.shape.dim]
        if tt.elem_type == B:
            feeds[vi.name] = rng.integers(0, 2, shape).astype(bool)
        elif tt.elem_type in (I64, TensorProto.INT32):
            feeds[vi.name] = rng.integers(0, 4, shape).astype(np.int64)
        else:
            dtype = onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type)
            feeds[vi.name] = (rng.uniform(0.1, 2.0, shape) * rng.choice([-1, 1], shape)
                              ).astype(dtype)
    return feeds
