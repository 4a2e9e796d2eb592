"""Malformed nodes, axes and declarations in ONNX files are refused by name, not
imported as another model.

An axis outside ONNX's ``[-rank, rank)`` used to be wrapped around with
``%`` (Softmax axis 5 on a rank-2 input ran over axis 1), a negative
Flatten axis split at the wrong point, a graph input or initializer
declared twice silently became two inputs (one of them dead), and
``--dtype i32`` turned every weight into an integer constant.
"""
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from distsim.errors import ConfigError, ParseError, VerifyError
from distsim.importers.onnx import import_onnx, onnx_input_arrays
from distsim.interp import execute

F = TensorProto.FLOAT


def _model(node, inputs, inits=(), opset=17):
    graph = helper.make_graph([node], "g", inputs,
                              [helper.make_tensor_value_info(o, 0, None) for o in node.output],
                              list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _x(shape, name="x"):
    return helper.make_tensor_value_info(name, F, list(shape))


def _ints(values, name):
    return numpy_helper.from_array(np.array(values, np.int64), name)


BAD_AXES = {
    "Softmax": (helper.make_node("Softmax", ["x"], ["y"], axis=5), [], "axis 5"),
    "LogSoftmax": (helper.make_node("LogSoftmax", ["x"], ["y"], axis=-3), [], "axis -3"),
    "Flatten": (helper.make_node("Flatten", ["x"], ["y"], axis=9), [], "axis 9"),
    "Split": (helper.make_node("Split", ["x"], ["a", "b"], axis=2), [], "axis 2"),
    "Squeeze": (helper.make_node("Squeeze", ["x", "ax"], ["y"]), [_ints([7], "ax")],
                "axes entry 7"),
    "Unsqueeze": (helper.make_node("Unsqueeze", ["x", "ax"], ["y"]), [_ints([7], "ax")],
                  "axes entry 7"),
    "LayerNormalization": (helper.make_node("LayerNormalization", ["x", "g"], ["y"], axis=4),
                           [numpy_helper.from_array(np.ones(3, np.float32), "g")], "axis 4"),
}


@pytest.mark.parametrize("op_type", sorted(BAD_AXES))
def test_an_axis_out_of_range_is_refused(op_type):
    node, inits, text = BAD_AXES[op_type]
    with pytest.raises(VerifyError) as e:
        import_onnx(_model(node, [_x((2, 3))], inits))
    message = str(e.value)
    assert f"({op_type})" in message and text in message and "out of range" in message
    assert "\n" not in message


@pytest.mark.parametrize("axis", [-1, -2, -3, 0, 3])
def test_flatten_negative_axis_matches_the_reference(axis):
    model = _model(helper.make_node("Flatten", ["x"], ["y"], axis=axis), [_x((2, 3, 4))])
    x = np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)
    f = import_onnx(model)
    ours = execute(f, onnx_input_arrays(f, {"x": x}))[0]
    theirs = ReferenceEvaluator(model).run(None, {"x": x})[0]
    assert ours.shape == theirs.shape
    np.testing.assert_array_equal(ours, theirs)


def test_a_graph_input_declared_twice_is_refused():
    model = _model(helper.make_node("Relu", ["x"], ["y"]), [_x((2,)), _x((2,))])
    with pytest.raises(ParseError, match="graph input 'x' is declared 2 times"):
        import_onnx(model)


def test_an_initializer_declared_twice_is_refused():
    inits = [numpy_helper.from_array(np.ones(2, np.float32), "w"),
             numpy_helper.from_array(np.ones(3, np.float32), "w")]
    model = _model(helper.make_node("Relu", ["w"], ["y"]), [], inits)
    with pytest.raises(ParseError, match="initializer 'w' is declared 2 times"):
        import_onnx(model)


def test_a_zero_dimension_is_not_called_symbolic():
    model = _model(helper.make_node("Relu", ["x"], ["y"]), [_x((0, 3))])
    with pytest.raises(ConfigError) as e:
        import_onnx(model)
    assert "dimension 0 is 0" in str(e.value) and "symbolic" not in str(e.value)
    assert import_onnx(model, batch=2).inputs[0].type.shape == (2, 3)


@pytest.mark.parametrize("dtype", ["i32", "int8", "bool"])
def test_dtype_must_be_floating_point(dtype):
    model = _model(helper.make_node("Relu", ["x"], ["y"]), [_x((2,))])
    with pytest.raises(ConfigError, match=f"--dtype: '{dtype}' is not a floating-point type"):
        import_onnx(model, dtype=dtype)
    assert str(import_onnx(model, dtype="fp16").outputs[0].type.dtype) == "f16"


def test_matmul_of_a_scalar_names_the_shapes():
    w = numpy_helper.from_array(np.ones((4, 3), np.float32), "w")
    model = _model(helper.make_node("MatMul", ["x", "w"], ["y"]), [_x(())], [w])
    with pytest.raises(VerifyError, match=r"rank >= 1, got shapes \(\) and \(4, 3\)"):
        import_onnx(model)


def test_a_pool_without_kernel_shape_says_so():
    model = _model(helper.make_node("MaxPool", ["x"], ["y"]), [_x((1, 3, 4, 4))])
    with pytest.raises(VerifyError, match="kernel_shape attribute is required"):
        import_onnx(model)
