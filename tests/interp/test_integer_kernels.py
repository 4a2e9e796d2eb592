"""Integer arithmetic of the numpy kernels as ONNX defines it.

``div`` of integers truncates toward zero in the integer dtype (it used to
return float64 true division, another type than the op declares); ``pow``
of an integer base by a floating exponent is taken in floating point (it
used to cast the exponent to the base's type: 9 ** 0.5 gave 1).
"""
import numpy as np
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from distsim.importers.onnx import import_onnx, onnx_input_arrays
from distsim.interp import execute

I64 = TensorProto.INT64


def _binary(op_type, b_elem, inits=()):
    inputs = [helper.make_tensor_value_info("a", I64, [8])]
    if not inits:
        inputs.append(helper.make_tensor_value_info("b", b_elem, [8]))
    graph = helper.make_graph([helper.make_node(op_type, ["a", "b"], ["y"])], "g", inputs,
                              [helper.make_tensor_value_info("y", I64, [8])], list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _compare(model, feeds):
    f = import_onnx(model)
    ours = execute(f, onnx_input_arrays(f, feeds))[0]
    theirs = ReferenceEvaluator(model).run(None, feeds)[0]
    assert ours.dtype == np.int64
    np.testing.assert_array_equal(ours, theirs)
    return ours


def test_integer_div_truncates_toward_zero():
    feeds = {"a": np.array([7, -7, 7, -7, 6, -6, 0, 2**40 + 1], np.int64),
             "b": np.array([2, 2, -2, -2, 3, 4, 5, 3], np.int64)}
    ours = _compare(_binary("Div", I64), feeds)
    np.testing.assert_array_equal(ours, [3, -3, -3, 3, 2, -1, 0, (2**40 + 1) // 3])


def test_integer_base_to_a_float_power():
    half = numpy_helper.from_array(np.array(0.5, np.float32), "b")
    ours = _compare(_binary("Pow", None, [half]),
                    {"a": np.array([4, 9, 16, 2, 0, 1, 100, 25], np.int64)})
    np.testing.assert_array_equal(ours, [2, 3, 4, 1, 0, 1, 10, 5])
