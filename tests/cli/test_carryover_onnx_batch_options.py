"""Batch options on an imported ONNX model get the lines a GPT gets.

``--batch`` against ``--global-batch`` is the one shared check
(:func:`distsim.models.registry.check_batch_options`, run by the CLI and
:func:`distsim.build_program` before any family builds); the ONNX family
kept a check of its own, which named a ``--batch`` the user never gave when
the batch came from the model file, and its split messages named ``batch``
(or ``--batch`` for a ``--global-batch``) where the GPT names the flag.
"""
from __future__ import annotations

import pytest

import distsim
from distsim.cli import main
from distsim.paths import models_dir

GPT2 = models_dir() / "gpt2-tiny.onnx"
ONNX = ["--model", str(GPT2), "--seq", "8", "--train"]
GPT = ["--model", "tiny"]


def _error(capsys, model, options):
    code = main(["print", "--topology", "dgx-a100", *model, *options])
    return code, capsys.readouterr().err


@pytest.mark.parametrize("options, line", [
    (["--batch", "16", "--global-batch", "32"],
     "--batch 16 and --global-batch 32 differ (both are the global batch: give one)"),
    (["--global-batch", "16", "--dp", "8", "--microbatches", "2", "--micro-batch", "2"],
     "--global-batch 16 differs from dp x microbatches x micro-batch = 8 x 2 x 2 = 32 "
     "(give two of global batch, microbatches and micro-batch)"),
    (["--global-batch", "16", "--dp", "8", "--micro-batch", "3"],
     "--global-batch 16 is not a multiple of dp x micro-batch = 8 x 3"),
])
def test_same_bad_options_same_line_for_onnx_and_gpt(capsys, options, line):
    """Exit status 2 and one identical line for both families."""
    assert _error(capsys, ONNX, options) == (2, f"distsim: error: {line}\n")
    assert _error(capsys, GPT, options) == (2, f"distsim: error: {line}\n")


@pytest.mark.parametrize("options, line", [
    (["--global-batch", "6", "--dp", "8"], "--global-batch 6 is not divisible by --dp 8"),
    (["--batch", "6", "--dp", "8"], "--batch 6 is not divisible by --dp 8"),
    (["--input-shape", "input_ids=6x8", "--dp", "8"],
     "batch 6 (dim 0 of the inputs) is not divisible by --dp 8"),
    (["--global-batch", "8", "--dp", "8", "--microbatches", "3"],
     "--global-batch 8 is not divisible by dp x microbatches = 8 x 3"),
])
def test_onnx_split_errors_name_where_the_batch_came_from(capsys, options, line):
    """A --global-batch was reported as --batch, an input's dim 0 too."""
    assert _error(capsys, ONNX, options) == (2, f"distsim: error: {line}\n")


def _model_file(tmp_path, family_fields):
    path = tmp_path / "model.yaml"
    path.write_text("".join(f"{k}: {v}\n" for k, v in family_fields.items()))
    return str(path)


def test_global_batch_overrides_the_model_files_batch_as_for_a_gpt(tmp_path, capsys):
    """A model file's batch is overridden by --global-batch, as a GPT file's
    global_batch is; the ONNX family refused the pair naming --batch, which
    the user had not given."""
    onnx_file = _model_file(tmp_path, {"family": "onnx", "path": GPT2, "seq": 8,
                                       "train": "true", "batch": 16})
    program, _, _ = distsim.build_program(onnx_file, "dgx-a100", dp=8, global_batch=32)
    assert program.meta["model"]["batch"] == 32 and program.meta["model"]["micro_batch"] == 4
    assert main(["print", "--topology", "dgx-a100", "--model", onnx_file, "--dp", "8",
                 "--global-batch", "32"]) == 0
    assert capsys.readouterr().err == ""
    gpt_file = tmp_path / "gpt.yaml"
    gpt_file.write_text((models_dir() / "tiny.yaml").read_text()
                        .replace("global_batch: 8", "global_batch: 16"))
    _, config, _ = distsim.build_program(str(gpt_file), "dgx-a100", dp=8, global_batch=32)
    assert config["global_batch"] == 32
