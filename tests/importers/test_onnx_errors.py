"""Bad input: one DistsimError naming the node and the reason; exit status 2
from ``distsim import``."""
import os
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from distsim.cli import main
from distsim.errors import ConfigError, ParseError, UnsupportedOpError, VerifyError
from distsim.importers.onnx import import_onnx

LIGHT = Path(os.path.dirname(onnx.__file__)) / "backend" / "test" / "data" / "light"
F = TensorProto.FLOAT


def graph_model(nodes, inputs, outputs, inits=()):
    g = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def vi(name, shape, elem=F):
    return helper.make_tensor_value_info(name, elem, shape)


def save(tmp_path, model, name="m.onnx"):
    path = tmp_path / name
    path.write_bytes(model.SerializeToString() if isinstance(model, onnx.ModelProto) else model)
    return path


def bad_models():
    relu = helper.make_node("Relu", ["x"], ["y"], name="act")
    cycle = graph_model([helper.make_node("Add", ["x", "b"], ["a"], name="first"),
                         helper.make_node("Relu", ["a"], ["b"], name="second")],
                        [vi("x", [2])], [vi("b", [2])])
    dangling = graph_model([helper.make_node("Add", ["x", "nowhere"], ["y"], name="adder")],
                           [vi("x", [2])], [vi("y", [2])])
    reshape = graph_model([helper.make_node("Reshape", ["x", "s"], ["y"], name="reshaper")],
                          [vi("x", [2, 3])], [vi("y", None)],
                          [numpy_helper.from_array(np.array([4, 2]), "s")])
    matmul = graph_model([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")],
                         [vi("x", [2, 3]), vi("w", [4, 5])], [vi("y", None)])
    declared = graph_model([relu], [vi("x", [2, 3])], [vi("y", [2, 4])])
    return {
        "cycle": (cycle, ParseError, "cycle through node"),
        "dangling": (dangling, ParseError, "node 'adder' (Add): input 'nowhere' is dangling"),
        "reshape": (reshape, VerifyError, "node 'reshaper' (Reshape): cannot reshape (2, 3)"),
        "matmul": (matmul, VerifyError, "node 'mm' (MatMul): contraction dims differ"),
        "declared": (declared, VerifyError, "node 'act' (Relu): 'y' is declared with shape (2, 4)"),
    }


@pytest.mark.parametrize("case", sorted(bad_models()))
def test_bad_graph(case, tmp_path):
    model, error, text = bad_models()[case]
    path = save(tmp_path, model)
    with pytest.raises(error) as info:
        import_onnx(path)
    assert text in str(info.value) and str(path) in str(info.value)


def test_not_onnx_and_truncated(tmp_path):
    with pytest.raises(ParseError, match="not an ONNX model"):
        import_onnx(save(tmp_path, b"name: not a model\n\x00\xff garbage"))
    data = (LIGHT / "light_squeezenet.onnx").read_bytes()
    with pytest.raises(ParseError, match="truncated"):
        import_onnx(save(tmp_path, data[: len(data) // 2], "cut.onnx"))
    with pytest.raises(ConfigError, match="file not found"):
        import_onnx(tmp_path / "absent.onnx")


def test_unsupported_ops_are_listed_with_counts(tmp_path):
    nodes = [helper.make_node("Relu", ["x"], ["a"]),
             helper.make_node("Hardmax", ["a"], ["b"]),
             helper.make_node("Hardmax", ["b"], ["c"]),
             helper.make_node("TopK", ["c", "k"], ["d", "i"]),
             helper.make_node("Custom", ["d"], ["y"], domain="com.example")]
    model = graph_model(nodes, [vi("x", [2, 3])], [vi("y", None)],
                        [numpy_helper.from_array(np.array([1]), "k")])
    with pytest.raises(UnsupportedOpError) as info:
        import_onnx(save(tmp_path, model))
    msg = str(info.value)
    assert "4 nodes of 3 unsupported op types" in msg
    assert "Hardmax (x2)" in msg and "TopK (x1)" in msg and "com.example.Custom (x1)" in msg


def test_symbolic_dims_need_sizes(tmp_path):
    model = graph_model([helper.make_node("Relu", ["x"], ["y"])], [vi("x", ["N", 4])],
                        [vi("y", None)])
    path = save(tmp_path, model)
    with pytest.raises(ConfigError, match="dimension 0 is symbolic"):
        import_onnx(path)
    assert import_onnx(path, batch=3).outputs[0].type.shape == (3, 4)
    assert import_onnx(path, input_shapes={"x": (5, 4)}).outputs[0].type.shape == (5, 4)
    with pytest.raises(ConfigError, match="names no graph input 'z'"):
        import_onnx(path, input_shapes={"z": (1, 4)})


def test_cli_import_exit_status(tmp_path, capsys):
    assert main(["import", str(LIGHT / "light_squeezenet.onnx")]) == 0
    out = capsys.readouterr().out
    assert "parameters" in out and "conv" in out
    assert main(["import", "onnx-backend:light_resnet50", "--json"]) == 0
    assert '"parameters": 25557032' in capsys.readouterr().out
    for case, (model, _, text) in bad_models().items():
        assert main(["import", str(save(tmp_path, model, f"{case}.onnx"))]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and text in err
    assert main(["import", str(save(tmp_path, b"\x08\x07garbage", "bad.onnx"))]) == 2
    assert main(["import", str(tmp_path / "nothing.onnx")]) == 2


MODELS = Path(__file__).resolve().parents[2] / "models"


@pytest.mark.parametrize("name,text", [
    ("bert-tiny", "node 'node_add_21' (Add): shapes (8, 128, 32) and (1, 64, 32) do not "
                  "broadcast: the sequence length 128 (input 'input_ids' 8x128) exceeds the "
                  "model's 64 positions (Slice 'node_slice_1' takes only 64 of "
                  "'inner.embeddings.position_ids' along axis 1)"),
    ("gpt2-tiny", "(Gather): index 127 is out of range for axis 0 (size 64) of "
                  "'inner.transformer.wpe.weight': the sequence length 128 (input 'input_ids' "
                  "8x128) exceeds the model's 64 positions"),
])
def test_sequence_longer_than_the_positions(name, text, capsys):
    """The exports have 64 positions: BERT slices its position ids (ONNX
    clamps the slice, a broadcast fails later), GPT-2 gathers rows 0..127
    of a 64-row table (it imported silently before)."""
    path = MODELS / f"{name}.onnx"
    with pytest.raises(VerifyError) as info:
        import_onnx(path, input_shapes={"input_ids": (8, 128)})
    assert text in str(info.value)
    assert import_onnx(path, input_shapes={"input_ids": (8, 64)}).outputs[0].type.shape[:2] == \
        (8, 64)
    assert main(["simulate", "--model", str(path), "--input-shape", "input_ids=8x128",
                 "--train", "--out", "/tmp/distsim-never-written"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "exceeds the model's 64 positions" in err


def test_shape_error_names_the_graph_inputs(tmp_path):
    model = graph_model([helper.make_node("Add", ["x", "b"], ["y"], name="adder")],
                        [vi("x", ["N", 3])], [vi("y", None)],
                        [numpy_helper.from_array(np.ones(4, np.float32), "b")])
    with pytest.raises(VerifyError) as info:
        import_onnx(save(tmp_path, model), batch=2)
    assert "node 'adder' (Add): shapes (2, 3) and (4,) do not broadcast (graph inputs: x 2x3)" \
        in str(info.value)


def test_missing_or_short_external_integer_data(tmp_path):
    """Integer initializers (shapes, indices) are read at import time: a
    missing external file is named (it was 'an input is computed at run
    time')."""
    model = onnx.load(str(MODELS / "gpt2-tiny.onnx"))
    onnx.save(model, str(tmp_path / "ext.onnx"), save_as_external_data=True,
              all_tensors_to_one_file=True, location="weights.bin", size_threshold=0)
    assert import_onnx(tmp_path / "ext.onnx", batch=2, seq=4).outputs[0].type.shape == (2, 4, 128)
    data = (tmp_path / "weights.bin").read_bytes()
    (tmp_path / "weights.bin").write_bytes(data[:16])
    with pytest.raises(ConfigError, match=r"the external file 'weights.bin' is shorter \(16 "
                                          r"bytes\)"):
        import_onnx(tmp_path / "ext.onnx", batch=2, seq=4)
    (tmp_path / "weights.bin").unlink()
    with pytest.raises(ConfigError) as info:
        import_onnx(tmp_path / "ext.onnx", batch=2, seq=4)
    msg = str(info.value)
    assert "is stored in the external file 'weights.bin', which is missing" in msg
    assert str(tmp_path / "weights.bin") in msg and "computed at run time" not in msg
    with pytest.raises(ConfigError, match="cannot be found for a model given as bytes"):
        import_onnx((tmp_path / "ext.onnx").read_bytes(), batch=2, seq=4)
