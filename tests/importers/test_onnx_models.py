"""Whole models: the nine CNNs onnx ships for its backend tests (shapes and
FLOPs only: they carry no weights) and the committed tiny transformer
exports (numbers against onnx.reference)."""
import os
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx.reference import ReferenceEvaluator

from distsim.cost.flops import op_flops
from distsim.importers.onnx import import_onnx, onnx_input_arrays
from distsim.interp import execute
from distsim.ir import verify

LIGHT = Path(os.path.dirname(onnx.__file__)) / "backend" / "test" / "data" / "light"
MODELS = Path(__file__).resolve().parents[2] / "models"
CNNS = {  # name -> (output shape, published G multiply-accumulates at 224x224 or None)
    "light_bvlc_alexnet": ((1, 1000), None),
    "light_densenet121": ((1, 1000, 1, 1), 2.87),
    "light_inception_v1": ((1, 1000), 1.5),
    "light_inception_v2": ((1, 1000), 2.0),
    "light_resnet50": ((1, 1000), 4.1),
    "light_shufflenet": ((1, 1000), None),
    "light_squeezenet": ((1, 1000, 1, 1), 0.35),
    "light_vgg19": ((1, 1000), 19.6),
    "light_zfnet512": ((1, 1000), None),
}


def gmacs(f):
    """Forward multiply-accumulates in G: every op's FLOPs / 2 (FLOP = 2 x MAC)."""
    return sum(op_flops(op) for op in f.ops) / 2e9


@pytest.mark.parametrize("name", sorted(CNNS))
def test_cnn_imports_with_shapes_and_flops(name):
    f = verify(import_onnx(LIGHT / f"{name}.onnx"))
    shape, published = CNNS[name]
    assert [v.type.shape for v in f.outputs] == [shape]
    convs = [op for op in f.ops if op.op_type == "conv"]
    assert convs and all(op_flops(op) > 0 for op in convs)
    assert all(v.type.dtype.value == "f32" for v in f.values() if v.type.dtype.is_float)
    if published is not None:  # within 5% of the published multiply-accumulate count
        assert abs(gmacs(f) - published) / published < 0.05, gmacs(f)


def test_resnet50_forward_is_4_1_gmacs_and_25_6m_parameters():
    f = import_onnx(LIGHT / "light_resnet50.onnx")
    assert abs(gmacs(f) - 4.1) / 4.1 < 0.05
    params = sum(f.value_by_name(p).type.numel for p in f.meta["params"])
    assert params == 25_557_032  # weights, biases, BN scale/shift (running stats are constants)


def test_batch_override_rewrites_the_exported_batch():
    f = import_onnx(LIGHT / "light_resnet50.onnx", batch=8)
    assert f.outputs[0].type.shape == (8, 1000)
    assert abs(gmacs(f) / 8 - 4.1) / 4.1 < 0.05


TRANSFORMERS = ["gpt2-tiny", "bert-tiny", "llama-tiny"]


@pytest.mark.parametrize("name", TRANSFORMERS)
@pytest.mark.parametrize("batch,seq", [(2, 16), (3, 7)])
def test_transformer_export_matches_reference(name, batch, seq):
    """NumpyExecutor vs onnx.reference on the same random ids: rtol 1e-4, atol 1e-5 (float32)."""
    path = MODELS / f"{name}.onnx"
    f = verify(import_onnx(path, batch=batch, seq=seq))
    ids = np.random.default_rng(batch * 100 + seq).integers(0, 128, (batch, seq)).astype(np.int64)
    ours = execute(f, onnx_input_arrays(f, {"input_ids": ids}))[0]
    theirs = ReferenceEvaluator(str(path)).run(None, {"input_ids": ids})[0]
    assert ours.shape == theirs.shape == (batch, seq, 32 if name == "bert-tiny" else 128)
    assert np.std(ours) > 1e-3
    np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", TRANSFORMERS)
def test_transformer_export_is_small_and_folds_its_shape_graph(name):
    path = MODELS / f"{name}.onnx"
    assert path.stat().st_size < 1 << 20
    nodes = {n.op_type for n in onnx.load(str(path)).graph.node}
    assert {"Shape", "Range", "Concat", "Where"} <= nodes  # a shape graph and a mask to fold
    f = import_onnx(path, batch=2, seq=8)
    kinds = {op.op_type for op in f.ops}
    assert "matmul" in kinds and "softmax" in kinds
    # the importer's lowercase DistIR names of what would show an unfolded
    # shape or mask computation
    assert kinds.isdisjoint({"shape", "range", "equal", "where", "cast", "less", "trilu"}), kinds
    # no op left whose inputs are all known at import time: every op depends
    # on a graph input or a parameter
    roles = f.meta["roles"]
    known = {v for v in f.inputs if roles[v.name] == "const"}
    for op in f.ops:
        assert not all(v in known for v in op.inputs), f"{op.op_type} left unfolded"


def test_external_data_and_missing_weights(tmp_path):
    model = onnx.load(str(MODELS / "gpt2-tiny.onnx"))
    onnx.save(model, str(tmp_path / "ext.onnx"), save_as_external_data=True,
              all_tensors_to_one_file=True, location="ext.data", size_threshold=1024)
    f = import_onnx(tmp_path / "ext.onnx", batch=2, seq=4)
    assert f.outputs[0].type.shape == (2, 4, 128)
    assert "inner.lm_head.weight" not in f.meta["constants"]  # external weights are not read
    (tmp_path / "ext.data").unlink()  # weights gone: only shapes matter
    g = import_onnx(tmp_path / "ext.onnx", batch=2, seq=4)
    assert [v.type for v in g.outputs] == [v.type for v in f.outputs]


def test_dtype_recast():
    f = import_onnx(MODELS / "gpt2-tiny.onnx", batch=1, seq=4, dtype="f16")
    assert f.outputs[0].type.dtype.value == "f16"
