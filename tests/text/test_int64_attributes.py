"""Integer attributes are int64: both ends of the range round-trip.

ONNX exports of a reversed slice (``x[::-1]``) end at INT64_MIN; the
parser used to refuse it (it bounded ``abs(value)`` by 2^63 - 1), so an
imported model printed a text that could not be read back.
"""
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from distsim.errors import ParseError
from distsim.importers.onnx import import_onnx, onnx_input_arrays
from distsim.interp import execute
from distsim.ir import verify
from distsim.text import parse_function, print_function

INT64_MIN, INT64_MAX = -2 ** 63, 2 ** 63 - 1


def _reversed_slice_model():
    consts = {"s": [-1], "e": [INT64_MIN], "a": [0], "st": [-1]}
    graph = helper.make_graph(
        [helper.make_node("Slice", ["x", "s", "e", "a", "st"], ["y"])], "rev",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 3])],
        [numpy_helper.from_array(np.array(v, np.int64), k) for k, v in consts.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_reversed_onnx_slice_round_trips():
    f = import_onnx(_reversed_slice_model())
    text = print_function(f)
    assert str(INT64_MIN) in text
    g = verify(parse_function(text))
    assert print_function(g) == text
    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    np.testing.assert_array_equal(execute(g, onnx_input_arrays(f, {"x": x}))[0], x[::-1])


@pytest.mark.parametrize("value", [INT64_MIN - 1, INT64_MAX + 1])
def test_integers_outside_int64_are_refused(value):
    text = ("func @f(%x: f32[4]@0) -> (f32[4]@0) {\n"
            f"  %y = strided_slice(%x) {{starts = [0], ends = [{value}]}} : f32[4]@0\n"
            "  return %y\n}\n")
    with pytest.raises(ParseError, match="out of range"):
        parse_function(text)
