"""Initializers that are buffers, not weights (``frozen``): ONNX cannot tell
them apart, so the importer freezes the names that match a pattern. The
Llama export's rotary ``inv_freq`` (4 elements: head_dim 8 / 2) is frozen
by default; trained, it got an AdamW update and ZeRO 3 refused to shard
its 4 elements over 8 ranks."""
import json

import onnx
import pytest

import distsim
from distsim.errors import ConfigError
from distsim.importers.onnx import DEFAULT_FROZEN, import_onnx
from distsim.paths import models_dir

LLAMA = str(models_dir() / "llama-tiny.onnx")
INV_FREQ = [i.name for i in onnx.load(LLAMA).graph.initializer if i.name.endswith("inv_freq")]


def _roles(frozen=None):
    f = import_onnx(LLAMA, batch=2, seq=16, frozen=frozen)
    return f.meta["roles"], f.meta["params"]


def test_the_llama_export_holds_one_rotary_buffer():
    assert DEFAULT_FROZEN == ("*inv_freq",)
    assert len(INV_FREQ) == 1


def test_the_rotary_buffer_is_a_constant_by_default_and_a_parameter_when_nothing_is_frozen():
    roles, params = _roles()
    # a constant: not trained (its rotary table is even folded at import)
    assert not any(roles.get(v) == "param" for v in roles if v.endswith("inv_freq"))
    assert not any(p.endswith("inv_freq") for p in params)
    roles_all, params_all = _roles(frozen=[])
    assert roles_all[INV_FREQ[0]] == "param"
    # everything else is the same: exactly the buffer moved out of the parameters
    assert set(params_all) - set(params) == {INV_FREQ[0]}
    assert set(params) < set(params_all)


def test_a_user_pattern_freezes_what_it_names():
    roles, params = _roles(frozen=["*embed_tokens*"])
    assert any("embed_tokens" in v and r == "const" for v, r in roles.items())
    assert not any("embed_tokens" in p for p in params)
    assert any(p.endswith("inv_freq") for p in params)   # the default is replaced


@pytest.mark.parametrize("frozen, message", [
    (["*no_such_weight*"], "pattern '\\*no_such_weight\\*' matches no initializer"),
    ("*inv_freq", "expected a list of initializer name patterns"),
    ([""], "expected a list of initializer name patterns"),
])
def test_bad_frozen_patterns_are_one_clear_error(frozen, message):
    with pytest.raises(ConfigError, match=message):
        import_onnx(LLAMA, batch=2, seq=16, frozen=frozen)


def test_zero3_on_eight_ranks_trains_the_llama_export_once_its_buffer_is_frozen():
    config = {"family": "onnx", "path": LLAMA, "train": True, "seq": 16}
    result = distsim.simulate(model=config, topology="dgx-a100", dp=8, zero=3, batch=8)
    assert result.step_time_s > 0
    with pytest.raises(distsim.errors.PassPreconditionError, match="inv_freq' has 4 elements"):
        distsim.simulate(model={**config, "frozen": []}, topology="dgx-a100", dp=8, zero=3,
                         batch=8)


def test_the_cli_takes_frozen_patterns(capsys):
    from distsim.cli import main
    assert main(["import", LLAMA, "--seq", "16", "--batch", "2", "--json"]) == 0
    default = json.loads(capsys.readouterr().out)["parameters"]
    assert main(["import", LLAMA, "--seq", "16", "--batch", "2", "--json",
                 "--frozen", "*embed_tokens*"]) == 0
    mine = json.loads(capsys.readouterr().out)["parameters"]
    # the embedding table frozen (vocab 128 x hidden 32, models/export_hf.py), the 4 rotary
    # frequencies (head_dim 32 / 4 heads = 8, halved) trained instead
    assert default - mine == 128 * 32 - 4
    code = main(["simulate", "--model", LLAMA, "--train", "--seq", "16", "--batch", "8",
                 "--frozen", "*no_such_weight*"])
    err = capsys.readouterr().err
    assert code == 2 and "pattern '*no_such_weight*' matches no initializer" in err
    assert len(err.strip().splitlines()) == 1
