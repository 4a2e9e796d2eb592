"""A graph output that is a graph input or an initializer (an Identity
graph, a pass-through) is the result of an ``identity`` op in the imported
function, never one of its arguments: ``distsim simulate`` on such a model
used to crash in the data-parallel lowering (KeyError, exit status 1)."""
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import distsim
from distsim.importers.onnx import import_onnx, onnx_input_arrays
from distsim.interp import execute

F = TensorProto.FLOAT


def _save(tmp_path, nodes, inputs, outputs, inits=()):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    path = tmp_path / "m.onnx"
    path.write_bytes(helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())
    return path


def _identity_model(tmp_path):
    return _save(tmp_path, [helper.make_node("Identity", ["x"], ["y"])],
                 [helper.make_tensor_value_info("x", F, [8, 4])],
                 [helper.make_tensor_value_info("y", F, [8, 4])])


def _initializer_output_model(tmp_path):
    w = numpy_helper.from_array(np.ones((8, 3), np.float32), "w")
    return _save(tmp_path, [], [], [helper.make_tensor_value_info("w", F, [8, 3])], [w])


def test_outputs_are_op_results(tmp_path):
    f = import_onnx(_identity_model(tmp_path))
    assert [op.op_type for op in f.ops] == ["identity"]
    assert f.outputs[0].name == "y" and f.outputs[0] is not f.inputs[0]
    x = np.arange(32, dtype=np.float32).reshape(8, 4)
    np.testing.assert_array_equal(execute(f, onnx_input_arrays(f, {"x": x}))[0], x)


@pytest.mark.parametrize("make, train", [(_identity_model, False),
                                         (_initializer_output_model, False),
                                         (_initializer_output_model, True)])
def test_pass_through_models_simulate(tmp_path, make, train):
    result = distsim.simulate(model=str(make(tmp_path)), topology="workstation-4gpu-pcie",
                              batch=8, train=train)
    assert result.step_time_s > 0
