"""GPT/Llama configs: parameter counts against published ones, the
builder's gradients against finite differences, `distsim models`, and
`distsim simulate`'s training flags (tp/pp/sp, ZeRO, recomputation,
schedules) with their one-line errors."""
import json
from dataclasses import replace

import numpy as np
import pytest

from distsim.cli import main
from distsim.errors import ConfigError
from distsim.interp import execute
from distsim.interp.gradcheck import finite_difference
from distsim.ir import verify
from distsim.models import available_models, load_model_config
from distsim.models.gpt import GPTConfig, gpt_forward
from distsim.models.gpt_family import build_gpt_step, gpt_config
from distsim.text import print_function
from distsim.transforms.autodiff import Autodiff
from distsim.transforms.strategy import Strategy
from strategies_reference import strategies_reference

GPT_MODELS = [n for n in available_models() if load_model_config(n)["family"] == "gpt"]


def test_every_gpt_and_llama_model_is_there():
    for name in ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl", "gpt3-1.3b", "gpt3-6.7b",
                 "gpt3-13b", "gpt3-175b", "llama2-7b", "llama2-13b", "llama2-70b", "llama3-8b",
                 "llama3-70b", "tiny", "gpt"):
        assert name in GPT_MODELS


@pytest.mark.parametrize("name", [n for n in GPT_MODELS
                                  if load_model_config(n).get("published_params")])
def test_parameter_count_matches_the_published_one(name):
    c = gpt_config(load_model_config(name))
    published = float(EXACT_COUNTS.get(name, (c.published_params,))[0])
    assert abs(c.parameter_count() / published - 1) <= 0.01


#: Exact published counts where the model's own figure is rounded. GPT-3
#: XL ("1.3B", Brown et al. 2020, table 2.1: 24 layers, d_model 2048, 16
#: heads, 2048 context, GPT-2's 50257-token vocabulary) has no exact count
#: published; EleutherAI's GPT-Neo 1.3B, their replication of that shape,
#: has 1,315,575,808 parameters (the sum of the tensors of
#: EleutherAI/gpt-neo-1.3B on the Hugging Face Hub), its q/k/v projections
#: without biases: 3 x 2048 per layer fewer than GPT-3's.
EXACT_COUNTS = {"gpt3-1.3b": (1_315_575_808, "EleutherAI/gpt-neo-1.3B")}


def test_gpt3_xl_count_is_gpt_neo_plus_the_qkv_biases():
    c = gpt_config(load_model_config("gpt3-1.3b"))
    assert c.parameter_count() == EXACT_COUNTS["gpt3-1.3b"][0] + c.layers * 3 * c.hidden
    # and it rounds to the paper's 1.3B at its two significant digits
    assert round(c.parameter_count() / 1e8) / 10 == float(c.published_params) / 1e9


@pytest.mark.parametrize("name", ["tiny", "gpt2"])
def test_program_parameters_equal_the_formula(name):
    c = gpt_config(load_model_config(name))
    f = gpt_forward(c, micro_batch=1)
    roles = f.meta["roles"]
    assert sum(v.type.numel for v in f.inputs if roles[v.name] == "param") == c.parameter_count()


@pytest.mark.parametrize("style", [
    dict(),
    dict(positions=7),  # a position table longer than seq: the step slices its first rows
    dict(norm="rmsnorm", activation="swiglu", bias=False, tied_embeddings=False,
         position="none", kv_heads=1)])
def test_gpt_gradients_match_finite_differences(style):
    c = GPTConfig(layers=1, hidden=8, heads=2, vocab=11, seq=4, dtype="f64", dropout=0.1,
                  **style)
    f = verify(gpt_forward(c, micro_batch=2))
    rng = np.random.default_rng(1)
    inputs = [rng.integers(0, 11, v.type.shape) if not v.type.dtype.is_float
              else rng.normal(0, 0.5, v.type.shape) for v in f.inputs]
    wrt = [n for n in f.meta["params"] if not n.startswith("l0_ln")][:6]
    g = verify(Autodiff(f.meta["loss"], wrt)(f))
    results = execute(g, inputs)
    names = [v.name for v in f.inputs]
    for k, name in enumerate(wrt):
        np.testing.assert_allclose(results[1 + k],
                                   finite_difference(f, inputs, names.index(name)),
                                   rtol=1e-5, atol=1e-8, err_msg=name)


def test_models_command_lists_counts(capsys):
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    assert "gpt3-175b" in out and "174.60B" in out and "llama3-8b" in out
    assert main(["models", "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["llama2-7b"]["parameters"] == 6738415616


def test_simulate_json_has_the_training_figures(tmp_path, capsys):
    code = main(["simulate", "--model", "tiny", "--tp", "2", "--pp", "2", "--sp",
                 "--zero", "1", "--recompute", "selective", "--microbatches", "4",
                 "--schedule", "interleaved", "--layers", "4", "--heads", "4", "--seq", "16",
                 "--network-mode", "analytical", "--json", "--no-plots", "--out", str(tmp_path)])
    assert code == 0
    s = json.loads(capsys.readouterr().out)
    for key in ("tokens_per_s", "mfu", "hfu", "bubble_fraction", "exposed_communication_s",
                "memory_by_category"):
        assert key in s
    assert s["bubble_fraction"] > 0 and 0 < s["mfu"] <= s["hfu"] * 1.5
    assert set(s["memory_by_category"]["0"]) >= {"weights", "gradients", "optimizer",
                                                  "activations"}
    assert s["config"]["microbatches"] == 4 and s["config"]["schedule"] == "interleaved"


def test_recomputed_ops_are_visible_in_the_trace():
    import distsim
    r = distsim.simulate(model="tiny", topology="dgx-a100", tp=2, recompute="full",
                         network_mode="analytical")
    recomputed = [op for op in r.trace.ops if op.detail == "recompute"]
    assert recomputed and all(op.category == "compute" for op in recomputed)


@pytest.mark.parametrize("flags, message", [
    (["--tp", "8", "--heads", "4"], "does not divide the 4 attention heads"),
    (["--dp", "2"], "does not match the 8 devices"),
    (["--pp", "8", "--layers", "4"], "only 4 layers"),
    # dp 4 x 3 micro-batches of 1 sequence: the global batch must be 12
    (["--pp", "2", "--schedule", "interleaved", "--microbatches", "3", "--layers", "8",
      "--global-batch", "12"], "not a multiple of the 2 pipeline stages"),
    (["--sp"], "needs tensor parallelism"),
])
def test_bad_strategy_is_one_line(tmp_path, capsys, flags, message):
    code = main(["simulate", "--model", "tiny", *flags, "--no-plots", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert code == 2 and message in err and err.count("\n") == 1


def test_position_table_defaults_to_seq_and_leaves_programs_unchanged():
    """``positions`` unset or equal to seq builds the program it always
    built (no slice); only a longer table adds the slice of its rows, on
    one device and in the tensor-parallel steps the megatron plan makes."""
    c = GPTConfig(layers=2, hidden=16, heads=4, vocab=32, seq=8, dropout=0.1)
    same = print_function(gpt_forward(replace(c, positions=8)))
    assert print_function(gpt_forward(c)) == same
    assert "slice" not in same
    longer = gpt_forward(replace(c, positions=12))
    assert longer.value_by_name("wpe").type.shape == (12, 16)
    assert [op.attrs["stop"] for op in longer.ops if op.op_type == "slice"] == [8]
    for sp in (False, True):
        s = Strategy(dp=1, tp=2, sp=sp)
        step = build_gpt_step(replace(c, positions=8), s, 1)
        assert print_function(build_gpt_step(c, s, 1)) == print_function(step)
        step = build_gpt_step(replace(c, positions=12), s, 1)
        assert step.meta["param_global_shapes"]["wpe"] == (12, 16)
        assert [op.attrs["stop"] for op in step.ops if op.op_type == "slice"] == [8]
    assert replace(c, positions=12).parameter_count() == c.parameter_count() + 4 * 16


def test_gpt2_keeps_its_1024_positions_at_any_seq():
    c = gpt_config(load_model_config("gpt2"))
    assert c.num_positions == 1024
    assert replace(c, seq=128).parameter_count() == c.parameter_count() == 124_439_808
    with pytest.raises(ConfigError, match="seq: 2048 is longer than the 1024 learned positions"):
        replace(c, seq=2048)
    with pytest.raises(ConfigError, match="positions: .*needs position: learned"):
        GPTConfig(position="rope", positions=16)
    with pytest.raises(ConfigError, match="positions: must be a positive integer"):
        GPTConfig(positions=0)


@pytest.mark.parametrize("strategy", [dict(dp=2, tp=2, pp=2, sp=True, zero=1),
                                      dict(tp=2, sp=True, recompute="full")])
def test_longer_position_table_under_strategies_matches_single_device(strategy):
    strategies_reference()(positions=12).check(**strategy)
