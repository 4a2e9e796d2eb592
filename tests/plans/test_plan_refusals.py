"""A plan that cannot be honoured is one clear line naming the plan entry,
the field or the op (exit status 2), before anything is simulated."""
import pytest

from distsim.cli import main
from distsim.errors import ConfigError

SMALL = ["simulate", "--layers", "4", "--hidden", "64", "--batch", "64", "--no-plots"]


def plan_file(tmp_path, text):
    path = tmp_path / "plan.yaml"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("text, flags, message", [
    ('parameters:\n  "wq*": colwise\n', ["--tp", "2"],
     "parameters: 'wq*': names no parameter of model 'mlp' (its parameters: w0, b0, w1"),
    ('parameters:\n  "b0": colwise\n', ["--tp", "2"],
     "parameters: 'b0': colwise needs %b0 to be a matmul's weight, but op %h0.1 = add reads it"),
    ('parameters:\n  "w0": diagonal\n', ["--tp", "2"],
     "parameters: 'w0': style must be one of colwise, fused_colwise, rowwise, vocab, replicate, "
     "got 'diagonal'"),
    ('parameters:\n  "w0": fused_colwise\n', ["--tp", "2"],
     "parameters: 'w0': fused_colwise needs the product %h0 split into its blocks along the "
     "features"),
    ('parameter:\n  "w0": colwise\n', ["--tp", "2"], "unknown field 'parameter'"),
    ('parameters: [1, 2\n', ["--tp", "2"], "malformed YAML"),
    ('parameters:\n  "w*": colwise\ncuts: [a0, a0]\n', ["--pp", "2"],
     "cuts[1] %a0 leaves pipeline layer 1 empty"),
    ('parameters:\n  "w*": colwise\ncuts: [h0]\n', ["--pp", "2"],
     "cuts[0] %h0 leaves pipeline layer 0 empty"),
    ('parameters:\n  "w*": colwise\ncuts: [zz]\n', ["--pp", "2"],
     "cuts[0]: no op of 'mlp_step' computes %zz"),
    ('parameters:\n  "w*": colwise\ncuts: [h2]\n', ["--pp", "4", "--dp", "1"],
     "--pp 4: 4 pipeline stages but model 'mlp' has only 2 layers (stage 2 would be empty)"),
    ('parameters:\n  "w[02]": colwise\n  "w[13]": rowwise\n', ["--tp", "3", "--dp", "1"],
     "parameters: 'w[02]': --tp 3 does not divide dim 1 of %w0 (size 64), which colwise splits"),
])
def test_plan_file_refusals(tmp_path, capsys, text, flags, message):
    path = plan_file(tmp_path, text)
    out = tmp_path / "out"
    assert main(SMALL + flags + ["--plan", path, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"distsim: error: {path}:") or "--pp" in message, err
    assert message in err and err.count("\n") == 1, err
    assert not out.exists()


@pytest.mark.parametrize("flags, message", [
    (["--tp", "3", "--dp", "1"],
     "plan megatron: %w0 (colwise): --tp 3 does not divide dim 1 of %w0 (size 64)"),
    (["--pp", "8", "--dp", "1"],
     "--pp 8: 8 pipeline stages but model 'mlp' has only 4 layers (stage 4 would be empty)"),
    (["--tp", "2", "--layers", "1", "--dp", "1"],
     "--tp 2: plan 'megatron' places no parameter of model 'mlp'"),
    (["--tp", "2", "--sp", "--batch", "63", "--dp", "1"],
     "--sp: --tp 2 does not divide dim 0 of %h1 (size 63), the sequence it splits"),
    (["--tp", "2", "--plan", "missing.yaml"],
     "missing.yaml: plan file not found (--plan takes megatron or a YAML file)"),
    (["--tp", "2", "--plan", ""], "--plan: must be 'megatron' or the path of a plan file"),
])
def test_strategy_refusals(tmp_path, capsys, flags, message):
    out = tmp_path / "out"
    assert main(SMALL + flags + ["--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err
    assert not out.exists()


def test_gpt_models_take_the_megatron_plan_only(tmp_path, capsys):
    """Their step is always placed by the megatron plan (the layout the
    estimator profiles): a plan file would be ignored, so it is refused (the
    estimator too: it checks the strategy with the same function)."""
    from distsim.estimate import estimate

    path = plan_file(tmp_path, 'parameters:\n  "l*_w1": colwise\n')
    out = tmp_path / "out"
    assert main(["simulate", "--model", "gpt2", "--layers", "1", "--tp", "2", "--plan", path,
                 "--no-plots", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"--plan {path}: GPT models take --plan megatron only" in err and not out.exists()
    with pytest.raises(ConfigError, match="take --plan megatron only"):
        estimate({"model": "gpt2", "topology": "dgx-a100", "tp": 2, "plan": path})
    assert main(["simulate", "--model", "gpt2", "--layers", "1", "--tp", "2", "--plan",
                 "megatron", "--no-plots", "--out", str(out)]) == 0


def test_a_plan_is_checked_on_one_device_too(tmp_path, capsys):
    path = plan_file(tmp_path, 'parameters:\n  "b0": rowwise\n')
    assert main(SMALL + ["--dp", "1", "--pp", "2", "--plan", path,
                         "--out", str(tmp_path / "o")]) == 2
    assert "rowwise needs %b0 to be a matmul's weight" in capsys.readouterr().err


def test_a_fused_weight_whose_blocks_tp_does_not_divide_is_refused():
    """Query, key and value blocks of 16, 8 and 8 columns cannot each be
    split over 16 ranks: the error names the plan entry and the blocks."""
    from distsim.models.gpt import GPTConfig, gpt_forward
    from distsim.transforms.megatron_plan import megatron_plan
    from distsim.transforms.tensor_parallel import TensorParallel
    one = gpt_forward(GPTConfig(layers=1, hidden=16, heads=4, kv_heads=2, vocab=32, seq=8))
    with pytest.raises(ConfigError) as e:
        TensorParallel(megatron_plan(one), 16)(one)
    assert str(e.value) == ("plan megatron: %l0_wqkv (fused_colwise): --tp 16 does not divide "
                            "every block [16, 8, 8] of %l0_wqkv (as %l0_q = split cuts its "
                            "product), which fused_colwise splits")
