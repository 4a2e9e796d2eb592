"""Imported ONNX transformers (GPT-2, Llama, BERT exports) under tensor,
sequence and pipeline parallelism from the ``megatron`` plan, with
pipeline stages read off the nodes' scopes: the updated weights and the
loss equal the one-device AdamW step's (NumpyExecutor, float64, rtol 1e-9)."""
import importlib.util
from pathlib import Path

import numpy as np
import pytest

from distsim.cli import main
from distsim.interp import execute
from distsim.ir import verify
from distsim.models.onnx_family import build_onnx, import_forward, with_loss
from distsim.paths import models_dir
from distsim.transforms.parallelize import resolve_plan
from distsim.transforms.pipeline_layers import layers_from_scopes
from distsim.transforms.strategy import Strategy
from distsim.transforms.tensor_parallel import TensorParallel
from distsim.transforms.zero_numbers import global_updates


def _onnx_reference():
    path = Path(__file__).resolve().parents[1] / "importers" / "test_onnx_strategies.py"
    spec = importlib.util.spec_from_file_location("onnx_strategies", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ONNX = _onnx_reference()
MODELS = ["gpt2-tiny", "llama-tiny", "bert-tiny"]


@pytest.fixture(scope="module", params=MODELS)
def reference(request):
    return ONNX.Reference(models_dir() / f"{request.param}.onnx")


@pytest.mark.parametrize("strategy", [
    dict(dp=1, tp=2),
    dict(dp=1, tp=2, sp=True),
    dict(dp=1, pp=2, microbatches=2),
    dict(dp=2, tp=2, pp=2),
    dict(dp=2, tp=2, pp=2, zero=3, schedule="gpipe", microbatches=2),
    dict(dp=1, tp=2, pp=2, recompute="full", microbatches=2),
    dict(dp=2, tp=2, pp=2, zero=1, schedule="zb-h1", microbatches=2),
    dict(dp=1, pp=2, schedule="zb-h1", microbatches=4),
], ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items()))
def test_parallel_imports_match_the_single_device_step(reference, strategy):
    program = verify(build_onnx(reference.config, Strategy(**strategy), hyper=ONNX.HYPER))
    outs = execute(program, reference.inputs(program))
    io = program.meta["io"]
    losses = [o for v, o in zip(program.outputs, outs) if io[v.name]["role"] == "loss"]
    np.testing.assert_allclose(np.mean(losses), reference.loss, rtol=1e-9)
    updated = global_updates(program, outs)
    assert sorted(updated) == sorted(reference.updated)
    for name, expected in reference.updated.items():
        np.testing.assert_allclose(updated[name], expected, rtol=1e-9, atol=1e-12, err_msg=name)


def _template_collectives(model, sp=False):
    f = with_loss(import_forward({"path": str(models_dir() / f"{model}.onnx"), "batch": 2,
                                  "seq": 16}))
    assert layers_from_scopes(f) == 2
    template = TensorParallel(resolve_plan("megatron", f), 2, sp)(f)
    return [op.op_type for op in template.ops if op.op_type.startswith("spmd.")]


def test_llama_gets_megatrons_layout():
    """Vocabulary-parallel embedding, then per block attention (q, k, v
    column-wise, o row-wise) and the gated MLP (gate, up column-wise, down
    row-wise): one copy in and one all-reduce out each; with sequence
    parallelism all-gathers and reduce-scatters instead, the norms' weights
    entering through copies."""
    assert _template_collectives("llama-tiny") == \
        ["spmd.allreduce"] + ["spmd.copy", "spmd.allreduce"] * 4
    sp = _template_collectives("llama-tiny", sp=True)
    assert sp[0] == "spmd.reducescatter"
    assert sp.count("spmd.allgather") == sp.count("spmd.reducescatter") - 1 == 4


def test_cli_runs_an_import_on_a_3d_mesh(tmp_path):
    assert main(["simulate", "--model", "gpt2-tiny", "--train", "--batch", "8", "--seq", "16",
                 "--tp", "2", "--pp", "2", "--dp", "2", "--no-plots",
                 "--out", str(tmp_path)]) == 0


def test_forward_only_imports_refuse_model_parallelism(capsys, tmp_path):
    assert main(["simulate", "--model", "gpt2-tiny", "--batch", "8", "--seq", "16", "--tp",
                 "2", "--dp", "4", "--no-plots", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "--tp 2: the imported ONNX model 'gpt2-tiny' is forward-only here; add --train" \
        in err and err.count("\n") == 1
