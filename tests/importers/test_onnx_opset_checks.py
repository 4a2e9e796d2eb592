"""A model whose ai.onnx opset is newer than the importer was checked against
imports with one warning naming both opsets (it used to import silently);
it is not refused, as ops rarely change between opsets.

``NEWEST_OPSET`` is the newest opset the op table was checked against; the
last test fails when an installed onnx changes one of the table's ops past
it, so that the change is reviewed before the number moves.
"""
import warnings

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from distsim.importers.onnx import import_onnx, onnx_input_arrays
from distsim.importers.onnx_model import NEWEST_OPSET, OnnxOpsetWarning, newest_checked_opset
from distsim.importers.onnx_ops import CONVERTERS
from distsim.interp import execute


def _model(opset):
    """relu(x) + Range(0, 3, 1): a converted op and a folded one."""
    ints = [numpy_helper.from_array(np.array(v, np.int64), n)
            for n, v in (("s", 0), ("l", 3), ("d", 1))]
    nodes = [helper.make_node("Range", ["s", "l", "d"], ["r"]),
             helper.make_node("Cast", ["r"], ["rf"], to=TensorProto.FLOAT),
             helper.make_node("Relu", ["x"], ["h"]),
             helper.make_node("Add", ["h", "rf"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                         [2, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
                              ints)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _imports(model):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        f = import_onnx(model)
    return f, [w for w in caught if issubclass(w.category, OnnxOpsetWarning)]


def test_a_newer_opset_warns_once_naming_both_opsets():
    model = _model(99)
    f, caught = _imports(model)
    assert len(caught) == 1
    text = str(caught[0].message)
    assert "opset 99" in text and f"({newest_checked_opset()})" in text
    assert "\n" not in text
    x = np.arange(-3, 3, dtype=np.float32).reshape(2, 3)
    ours = execute(f, onnx_input_arrays(f, {"x": x}))[0]
    np.testing.assert_array_equal(ours, ReferenceEvaluator(model).run(None, {"x": x})[0])


def test_the_warning_points_at_the_caller():
    with pytest.warns(OnnxOpsetWarning) as caught:
        import_onnx(_model(99))
    assert caught[0].filename == __file__


@pytest.mark.parametrize("opset", [13, 17, newest_checked_opset()])
def test_a_checked_opset_does_not_warn(opset):
    _, caught = _imports(_model(opset))
    assert caught == []


def test_no_op_of_the_table_changed_past_the_newest_checked_opset():
    installed = onnx.defs.onnx_opset_version()
    changed = sorted(f"{s.name} (opset {s.since_version})"
                     for s in onnx.defs.get_all_schemas_with_history()
                     if s.domain == "" and s.name in CONVERTERS
                     and NEWEST_OPSET < s.since_version <= installed)
    assert not changed, ("these ops of the table changed past NEWEST_OPSET: review their "
                         f"converters, then raise NEWEST_OPSET: {', '.join(changed)}")


def test_the_cli_prints_the_warning_as_one_line(tmp_path, capsys):
    """On the command line the warning is one `distsim: warning:` line, like
    the errors, not Python's two lines with the source of the call."""
    from distsim.cli import main
    path = tmp_path / "new_opset.onnx"
    path.write_bytes(_model(99).SerializeToString())
    assert main(["import", str(path)]) == 0
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and err[0].startswith("distsim: warning: ")
    assert "opset 99" in err[0]
