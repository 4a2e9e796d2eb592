"""Every field of a model file is checked by type and range, one line
naming the field, exit 2: a wrong type never crashes (an int dtype), never
reads as its truthiness (``bias: "no"``), and a NaN or infinite rate never
reaches the summary (where it is not JSON). Numbers in exponent notation
that YAML 1.1 leaves as text (``lr: 1e-4``) are read as numbers."""
from __future__ import annotations

import pytest

from distsim.cli import main
from distsim.errors import ConfigError
from distsim.models import MLPConfig, load_model_config
from distsim.models.gpt import GPTConfig

NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize("field, value, message", [
    ("dtype", 16, "dtype: must be a dtype name such as bf16, got 16"),
    ("dtype", "i32", "dtype: must be a floating-point dtype"),
    ("master_dtype", "bool", "master_dtype: must be a floating-point dtype"),
    ("bias", "yes", "bias: must be true or false, got 'yes'"),
    ("tied_embeddings", "no", "tied_embeddings: must be true or false, got 'no'"),
    ("lr", NAN, "lr: must be a positive number, got nan"),
    ("lr", INF, "lr: must be a positive number, got inf"),
    ("lr", "fast", "lr: must be a positive number, got 'fast'"),
    ("weight_decay", -1, "weight_decay: must be a number >= 0, got -1"),
    ("norm_eps", 0, "norm_eps: must be a positive number, got 0"),
    ("published_params", "many", "published_params: must be a positive number"),
    ("description", 5, "description: must be text, got 5"),
])
def test_gpt_fields(field, value, message):
    with pytest.raises(ConfigError) as info:
        GPTConfig.from_dict({field: value}, where="m.yaml")
    assert str(info.value).startswith(f"m.yaml: {message}")


@pytest.mark.parametrize("field, value, message", [
    ("lr", INF, "mlp.lr: must be a positive number, got inf"),
    ("dtype", "u8", "mlp.dtype: must be a floating-point dtype"),
])
def test_mlp_fields(field, value, message):
    with pytest.raises(ConfigError, match="^" + message.replace(".", r"\.")):
        MLPConfig(**{field: value})


def test_exponent_text_is_a_number(tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text("family: gpt\nlr: 1e-4\nnorm_eps: 1e-6\ndescription: 1e5\n")
    config = load_model_config(str(path))
    assert config["lr"] == 1e-4 and config["norm_eps"] == 1e-6
    assert config["description"] == "1e5"          # text fields stay text
    assert GPTConfig.from_dict({k: v for k, v in config.items()
                                if k not in ("family", "name")}).lr == 1e-4


def test_cli_infinite_rate_is_exit_2_and_no_output(tmp_path, capsys):
    path = tmp_path / "m.yaml"
    path.write_text("family: mlp\nlayers: 1\nhidden: 8\nbatch: 8\nlr: .inf\n")
    out = tmp_path / "out"
    assert main(["simulate", "--model", str(path), "--dp", "1", "--no-plots",
                 "--out", str(out)]) == 2
    assert capsys.readouterr().err == (f"distsim: error: {path}: mlp.lr: must be a positive "
                                       "number, got inf\n")
    assert not out.exists()
