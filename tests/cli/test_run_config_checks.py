"""What a run's configuration may hold, and what its summary says about it:
non-finite numbers are refused before anything is simulated (and a summary
that holds one anyway is still written, as ``null``), a failed write leaves
no partial output folder, the summary names the optimizer the step really
uses, ``batch`` and ``global_batch`` must agree in the Python API as on the
command line, and an ``--input-shape`` given twice is refused."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

import distsim
from distsim.cli import main
from distsim.cli.options import input_shapes_option
from distsim.errors import ConfigError

MODELS = Path(__file__).resolve().parents[2] / "models"
ONNX = str(MODELS / "bert-tiny.onnx")
SMALL_MLP = dict(layers=1, hidden=16, batch=16, dp=2, network_mode="analytical")


# -- 1. non-finite numbers ----------------------------------------------------------

@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_non_finite_model_number_is_refused_before_simulating(value):
    """An ONNX model's ``lr`` was not range-checked: the step simulated, and
    only writing summary.json failed (ValueError: not JSON compliant)."""
    model = {"family": "onnx", "path": ONNX, "train": True, "batch": 8, "seq": 16, "lr": value}
    with pytest.raises(ConfigError) as err:
        distsim.simulate(model=model, topology="dgx-a100")
    assert str(err.value) == f"model 'onnx': lr: must be a finite number, got {value!r}"


def test_non_finite_model_file_number_exits_2_without_an_output_folder(tmp_path, capsys):
    model = tmp_path / "nan.yaml"
    model.write_text(f"family: onnx\npath: {ONNX}\ntrain: true\nbatch: 8\nseq: 16\nlr: .nan\n")
    out = tmp_path / "out"
    assert main(["simulate", "--model", str(model), "--no-plots", "--out", str(out)]) == 2
    assert capsys.readouterr().err == ("distsim: error: model 'nan': lr: must be a finite "
                                       "number, got nan\n")
    assert not out.exists()


def test_a_summary_holding_nan_is_still_written_as_strict_json(tmp_path):
    """The safety net below the up-front checks: summary.json (and
    ``simulate --json``) write a non-finite number as null and a value JSON
    has no type for as its text, in the summary's own field order."""
    from distsim.report.summary import summary_json
    result = distsim.simulate(**SMALL_MLP)
    result.config["note"] = math.nan
    result.config["where"] = Path("some/file")
    paths = result.write_outputs(tmp_path / "out", plots=False)
    summary = json.loads(paths["summary"].read_text())
    assert summary["config"]["note"] is None and summary["config"]["where"] == "some/file"
    assert list(summary) == list(result.summary())
    assert json.loads(summary_json(result.summary())) == summary


def test_a_failed_write_removes_the_parent_folders_it_made_and_no_others(tmp_path, monkeypatch):
    result = distsim.simulate(**SMALL_MLP)

    def fail(*args, **kwargs):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(result, "write_trace", fail)
    (tmp_path / "kept").mkdir()          # there before: stays, with what it holds
    (tmp_path / "kept" / "mine.txt").write_text("x")
    with pytest.raises(OSError):
        result.write_outputs(tmp_path / "kept" / "new" / "deep" / "out", plots=False)
    assert sorted(p.name for p in (tmp_path / "kept").iterdir()) == ["mine.txt"]
    monkeypatch.chdir(tmp_path)          # a relative path: the same
    with pytest.raises(OSError):
        result.write_outputs(Path("a") / "b" / "out", plots=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept"]


def test_a_failed_write_leaves_no_output_folder(tmp_path, monkeypatch):
    result = distsim.simulate(**SMALL_MLP)

    def fail(*args, **kwargs):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(result, "write_trace", fail)
    out = tmp_path / "out"
    with pytest.raises(OSError):
        result.write_outputs(out, plots=False)
    assert not out.exists()          # not an empty folder, not a lone summary.json
    out.mkdir()                      # a folder that was there before is left as it was
    (out / "mine.txt").write_text("x")
    with pytest.raises(OSError):
        result.write_outputs(out, plots=False)
    assert (out / "mine.txt").exists()


# -- 2. the optimizer the summary names ---------------------------------------------

def test_mlp_summary_names_sgd_the_optimizer_it_uses():
    result = distsim.simulate(**SMALL_MLP)
    assert result.program.meta["optimizer"] == "sgd"
    assert result.config["optimizer"] == "sgd"
    assert result.summary()["config"]["optimizer"] == "sgd"
    assert distsim.simulate(optimizer="sgd", **SMALL_MLP).config["optimizer"] == "sgd"


def test_mlp_refuses_an_explicit_adamw(tmp_path, capsys):
    with pytest.raises(ConfigError, match=r"^--optimizer adamw: not supported by model 'mlp' "
                                          r"\(its step updates the parameters with sgd\)$"):
        distsim.simulate(optimizer="adamw", **SMALL_MLP)
    out = tmp_path / "out"
    assert main(["simulate", "--layers", "1", "--hidden", "16", "--batch", "16",
                 "--optimizer", "adamw", "--no-plots", "--out", str(out)]) == 2
    assert capsys.readouterr().err.count("\n") == 1 and not out.exists()


def test_gpt_summary_still_names_its_optimizer():
    for optimizer in ("adamw", "sgd"):
        _, config, _ = distsim.build_program("tiny", "dgx-a100", dp=8, optimizer=optimizer)
        assert config["optimizer"] == optimizer
    _, config, _ = distsim.build_program("tiny", "dgx-a100", dp=8)
    assert config["optimizer"] == "adamw"


def test_a_forward_pass_names_no_optimizer():
    """An ONNX model without ``train`` updates nothing: no optimizer in its
    config, and an explicit one is refused rather than ignored."""
    _, config, _ = distsim.build_program(ONNX, "dgx-a100", batch=8, seq=16)
    assert config["optimizer"] is None
    with pytest.raises(ConfigError, match=r"^--optimizer sgd: not supported by model "
                                          r"'bert-tiny' \(it runs the forward pass only"):
        distsim.build_program(ONNX, "dgx-a100", batch=8, seq=16, optimizer="sgd")
    _, config, _ = distsim.build_program(ONNX, "dgx-a100", batch=8, seq=16, train=True,
                                         optimizer="sgd")
    assert config["optimizer"] == "sgd"


# -- 3. batch and global_batch in the Python API ------------------------------------

def test_api_refuses_disagreeing_batch_and_global_batch():
    """``global_batch`` used to win unsaid (the CLI already refused it)."""
    with pytest.raises(ConfigError) as err:
        distsim.simulate(model="tiny", dp=8, batch=16, global_batch=32,
                         network_mode="analytical")
    assert str(err.value) == ("--batch 16 and --global-batch 32 differ (both are the global "
                              "batch: give one)")
    with pytest.raises(ConfigError, match="differ"):
        distsim.build_program("tiny", "dgx-a100", dp=8, batch=32, global_batch=16)
    _, config, _ = distsim.build_program("tiny", "dgx-a100", dp=8, batch=16, global_batch=16)
    assert config["global_batch"] == 16


# -- 5. --input-shape twice ----------------------------------------------------------

def test_input_shape_given_twice_is_refused(tmp_path, capsys):
    assert input_shapes_option(["ids=2x8", "mask=2x8"]) == {"ids": "2x8", "mask": "2x8"}
    with pytest.raises(ConfigError) as err:
        input_shapes_option(["ids=2x8", "ids=4x8"])
    assert str(err.value) == ("--input-shape: input 'ids' is given twice (ids=2x8 and "
                              "ids=4x8): give it once")
    out = tmp_path / "out"
    assert main(["simulate", "--model", ONNX, "--input-shape", "input_ids=8x16",
                 "--input-shape", "input_ids=4x16", "--no-plots", "--out", str(out)]) == 2
    err_text = capsys.readouterr().err
    assert err_text.startswith("distsim: error: --input-shape: input 'input_ids' is given twice")
    assert err_text.count("\n") == 1 and not out.exists()
    assert main(["import", ONNX, "--input-shape", "input_ids=8x16",
                 "--input-shape", "input_ids=4x16"]) == 2
    assert "given twice" in capsys.readouterr().err
