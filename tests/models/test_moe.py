"""Mixture-of-experts GPT models: parameter counts written out by hand from
the published architectures, the MoE fields' checks, the static token
slots per expert, the Hugging Face keys, and the one-device MoE layer
against a plain per-token numpy MoE."""
from __future__ import annotations

import numpy as np
import pytest

from distsim.cli import main
from distsim.errors import ConfigError, NotModelledError
from distsim.interp import execute
from distsim.ir import verify
from distsim.models import load_model_config
from distsim.models.gpt import GPTConfig, gpt_forward
from distsim.models.gpt_family import gpt_config, model_flops_per_step
from distsim.models.hf_config import hf_to_gpt
from distsim.models.moe import expert_slots, expert_tokens
from distsim.transforms.expert_parallel import dropless_occupancy

MIXTRAL_HF = {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral",
              "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
              "num_key_value_heads": 8, "num_hidden_layers": 32, "num_local_experts": 8,
              "num_experts_per_tok": 2, "vocab_size": 32000, "max_position_embeddings": 32768,
              "rms_norm_eps": 1e-5, "hidden_act": "silu", "tie_word_embeddings": False,
              "sliding_window": None, "router_aux_loss_coef": 0.02}
DEEPSEEK_HF = {"architectures": ["DeepseekForCausalLM"], "model_type": "deepseek",
               "hidden_size": 2048, "intermediate_size": 10944, "moe_intermediate_size": 1408,
               "num_attention_heads": 16, "num_key_value_heads": 16, "num_hidden_layers": 28,
               "n_routed_experts": 64, "n_shared_experts": 2, "num_experts_per_tok": 6,
               "first_k_dense_replace": 1, "moe_layer_freq": 1, "norm_topk_prob": False,
               "scoring_func": "softmax", "vocab_size": 102400,
               "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "hidden_act": "silu",
               "tie_word_embeddings": False, "attention_bias": False}


# -- parameter counts, by hand -------------------------------------------------------
def test_mixtral_counts_by_hand():
    # per layer: q and o 4096 x 4096, k and v 4096 x 1024 (8 key/value heads
    # of 128), two RMSNorm gains, the router 4096 x 8, and 8 SwiGLU experts
    # of 3 x 4096 x 14336; the embedding and the untied output layer
    # 32000 x 4096 each, the final norm 4096
    attention = 2 * 4096 * 4096 + 2 * 4096 * 1024 + 2 * 4096 + 4096 * 8
    expert = 3 * 4096 * 14336
    rest = 2 * 32000 * 4096 + 4096
    total = 32 * (attention + 8 * expert) + rest
    active = 32 * (attention + 2 * expert) + rest
    assert (total, active) == (46_702_792_704, 12_879_925_248)
    c = gpt_config(load_model_config("mixtral-8x7b"))
    assert c.parameter_count() == total == c.published_params
    assert c.parameter_count(active=True) == active
    assert round(active / 1e9, 1) == c.published_active_params / 1e9 == 12.9


def test_deepseek_moe_counts_by_hand():
    # per layer: attention 4 x 2048^2 and two gains; layer 0 a dense SwiGLU
    # MLP of 10944; layers 1..27 a router 2048 x 64, 64 routed experts of
    # 3 x 2048 x 1408 (6 used per token) and 2 shared ones of the same size
    attention = 4 * 2048 * 2048 + 2 * 2048
    dense = 3 * 2048 * 10944
    expert = 3 * 2048 * 1408
    rest = 2 * 102400 * 2048 + 2048
    total = 28 * attention + dense + 27 * (2048 * 64 + 64 * expert + 2 * expert) + rest
    active = 28 * attention + dense + 27 * (2048 * 64 + 6 * expert + 2 * expert) + rest
    assert (total, active) == (16_375_728_128, 2_828_650_496)
    c = gpt_config(load_model_config("deepseek-moe-16b"))
    assert (c.parameter_count(), c.parameter_count(active=True)) == (total, active)
    # published as 16.4B and 2.8B
    assert round(total / 1e9, 1) == c.published_params / 1e9
    assert round(active / 1e9, 1) == c.published_active_params / 1e9


@pytest.mark.parametrize("fields", [
    dict(experts=4, top_k=2, activation="swiglu", bias=False),
    dict(experts=4, top_k=1, bias=True, dense_layers=1, shared_experts=2, expert_ffn=8),
    dict(experts=3, top_k=3, moe_every=2, activation="relu", tied_embeddings=False),
])
def test_count_is_the_forward_programs_parameters(fields):
    c = GPTConfig(layers=3, hidden=16, heads=4, vocab=32, seq=8, **fields)
    f = gpt_forward(c)
    sizes = sum(v.type.numel for v in f.inputs if f.meta["roles"][v.name] == "param")
    assert sizes == c.parameter_count()


def test_dense_model_counts_are_unchanged():
    c = gpt_config(load_model_config("llama2-7b"))
    assert c.parameter_count() == c.parameter_count(active=True) == 6_738_415_616


def test_model_flops_count_the_experts_a_token_uses():
    m = load_model_config("mixtral-8x7b")
    # 6 x active matmul weights (all but norms and the embedding table) x tokens,
    # plus the attention's 3 x 4 x seq x heads x head_dim x layers per token
    weights = 12_879_925_248 - 32 * 2 * 4096 - 4096 - 32000 * 4096
    tokens = 1024 * 4096
    expected = 6 * weights * tokens + 3 * 4 * 4096 * 32 * 128 * 32 * tokens
    assert model_flops_per_step(m) == pytest.approx(expected, rel=1e-12)


# -- slots per expert ------------------------------------------------------------------
@pytest.mark.parametrize("fields, tokens, slots", [
    (dict(), 64, 16),                              # 64 x 2 / 8
    (dict(routing_skew=1.0), 64, 64),              # every token picks the busiest
    (dict(routing_skew=0.5), 64, 40),              # 16 + 0.5 x (64 - 16)
    (dict(capacity_factor=1.25), 64, 16),          # the busiest (16) is under 20
    (dict(routing_skew=0.5, capacity_factor=1.25), 64, 20),
    (dict(expert_loads=[3, 1, 1, 1, 1, 1, 1, 1]), 64, 39),   # 128 x 3 / 10 = 38.4
    (dict(expert_loads=[1, 0, 0, 0, 0, 0, 0, 0]), 64, 64),   # at most every token
    (dict(), 5, 2),                                # 10 / 8 rounded up
])
def test_expert_slots_by_hand(fields, tokens, slots):
    c = GPTConfig(experts=8, top_k=2, **fields)
    assert expert_slots(c, tokens) == slots


@pytest.mark.parametrize("fields, counts, ep, busiest", [
    (dict(), (16,) * 8, 4, 32),                          # 64 x 2 / 8 each, 2 per rank
    # skew 0.5: expert 0 gets 40, the other 7 share the rest of 128: 88 / 7 each
    (dict(routing_skew=0.5), (40,) + (88 / 7,) * 7, 2, 40 + 3 * 88 / 7),
    # 3 : 1 x 7 of 128 token-choices: 38.4 and 12.8; rank 0 of 4 holds 38.4 + 12.8
    (dict(expert_loads=[3, 1, 1, 1, 1, 1, 1, 1]), (38.4,) + (12.8,) * 7, 4, 51.2),
    # one expert takes every token's first choice but gets each token once
    (dict(expert_loads=[1, 0, 0, 0, 0, 0, 0, 0]), (64,) + (0,) * 7, 8, 64),
])
def test_dropless_counts_and_the_busiest_rank_by_hand(fields, counts, ep, busiest):
    c = GPTConfig(experts=8, top_k=2, dispatch="dropless", **fields)
    assert expert_slots(c, 64) == 64                     # room for every token
    assert expert_tokens(c, 64) == pytest.approx(counts, rel=1e-12)
    experts, routed = dropless_occupancy(expert_tokens(c, 64), 64, ep)
    assert experts == pytest.approx(busiest / (8 // ep * 64), rel=1e-12)
    assert routed == pytest.approx(sum(counts) / (8 * 64), rel=1e-12)


# -- bad input -------------------------------------------------------------------------
@pytest.mark.parametrize("fields, message", [
    (dict(experts=4, top_k=5), "top_k: 5 is larger than the 4 experts"),
    (dict(experts=4, routing_skew=1.5), "routing_skew: must be in [0, 1]"),
    (dict(experts=4, routing_skew=-0.1), "routing_skew: must be in [0, 1]"),
    (dict(experts=4, expert_loads=[1, 2]), "expert_loads: must be a list of 4"),
    (dict(experts=2, expert_loads=[1, -1]), "expert_loads: loads must be >= 0"),
    (dict(experts=2, expert_loads=[1, 1], routing_skew=0.5), "routing_skew: give"),
    (dict(experts=4, capacity_factor=0), "capacity_factor: must be a positive number"),
    (dict(experts=-1), "experts: must be an integer >= 0"),
    (dict(top_k=2), "top_k: a mixture-of-experts field, but experts is 0"),
    (dict(experts=4, dense_layers=2), "dense_layers: 2 (moe_every 1) leaves no MoE layer"),
    (dict(experts=4, norm_topk="yes"), "norm_topk: must be true or false"),
])
def test_bad_moe_fields(fields, message):
    with pytest.raises(ConfigError) as info:
        GPTConfig.from_dict({"layers": 2, **fields}, where="m.yaml")
    assert str(info.value).startswith(f"m.yaml: {message}")


def test_cli_top_k_over_experts_is_one_line_exit_2(tmp_path, capsys):
    path = tmp_path / "m.yaml"
    path.write_text("family: gpt\nexperts: 2\ntop_k: 3\n")
    assert main(["simulate", "--model", str(path), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "top_k: 3 is larger than the 2 experts" in err


# -- Hugging Face configs --------------------------------------------------------------
def test_hf_mixtral():
    c = gpt_config(hf_to_gpt(MIXTRAL_HF))
    assert (c.experts, c.top_k, c.norm_topk, c.kv_heads) == (8, 2, True, 8)
    assert c.parameter_count() == 46_702_792_704


def test_hf_deepseek_moe():
    c = gpt_config(hf_to_gpt(DEEPSEEK_HF))
    assert (c.experts, c.top_k, c.expert_ffn, c.shared_experts, c.dense_layers,
            c.norm_topk) == (64, 6, 1408, 2, 1, False)
    assert c.parameter_count(active=True) == 2_828_650_496


@pytest.mark.parametrize("change, message", [
    ({"num_experts_per_tok": 9}, "num_experts_per_tok: 9 is larger than the 8 experts"),
    ({"num_local_experts": None}, "num_local_experts: missing"),
])
def test_hf_mixtral_errors(change, message):
    with pytest.raises(ConfigError, match=message):
        hf_to_gpt({**MIXTRAL_HF, **change})


# -- the one-device layer against a per-token numpy MoE ------------------------------------
def _layer_values(c: GPTConfig, seed: int = 0):
    """Params, the MoE layer's normed input and its MLP output (layer 1)."""
    f = gpt_forward(c)
    by_name = {v.name: v for op in f.ops for v in op.outputs}
    last = "l1_moe_sum" if c.shared_experts else "l1_moe_out"
    f.outputs = [f.outputs[0], by_name["l1_ln2_out"], by_name[last]]
    verify(f)
    rng = np.random.default_rng(seed)
    inputs = {}
    for v in f.inputs:
        if f.meta["roles"][v.name] == "data":
            inputs[v.name] = rng.integers(0, c.vocab, v.type.shape)
        else:
            inputs[v.name] = rng.normal(0, 0.5, v.type.shape)
    _, h, out = execute(f, [inputs[v.name] for v in f.inputs])
    return inputs, h, out


def _silu(x):
    return x / (1 + np.exp(-x))


def _expert(x, w1, w2, f):
    a = x @ w1
    return (_silu(a[..., :f]) * a[..., f:]) @ w2


def _per_token_moe(c: GPTConfig, p, h, capacity):
    """A token at a time: softmax router, top-k (ties to the lower index),
    gates renormalised or not, an expert's choices past ``capacity`` dropped
    (first choices served before second ones, in token order)."""
    x = h.reshape(-1, c.hidden)
    logits = x @ p["l1_router"]
    probs = np.exp(logits - logits.max(axis=1, keepdims=True))
    probs /= probs.sum(axis=1, keepdims=True)
    choices = [sorted(range(c.experts), key=lambda e: (-probs[t, e], e))[:c.top_k]
               for t in range(len(x))]
    used = [0] * c.experts
    kept = set()
    for j in range(c.top_k):
        for t in range(len(x)):
            e = choices[t][j]
            if used[e] < capacity:
                used[e] += 1
                kept.add((t, e))
    f = c.expert_ffn_size
    out = np.zeros_like(x)
    for t in range(len(x)):
        chosen = probs[t, choices[t]]
        gates = chosen / chosen.sum() if c.norm_topk else chosen
        for e, g in zip(choices[t], gates):
            if (t, e) in kept:
                out[t] += g * _expert(x[t], p["l1_experts_w1"][e], p["l1_experts_w2"][e], f)
    if c.shared_experts:
        out += _expert(x, p["l1_shared_w1"], p["l1_shared_w2"], c.shared_experts * f)
    return out.reshape(h.shape)


MOE = dict(layers=2, hidden=16, heads=4, vocab=32, seq=8, micro_batch=2, dtype="f64",
           activation="swiglu", bias=False, experts=4, top_k=2, expert_ffn=8, dense_layers=1)


@pytest.mark.parametrize("fields", [
    dict(routing_skew=1.0),                                    # room for every token
    dict(routing_skew=1.0, norm_topk=False, shared_experts=2, top_k=3),
    dict(capacity_factor=0.5),                                 # 4 slots: tokens dropped
    dict(),                                                    # 8 slots, balanced
])
def test_moe_layer_matches_a_per_token_moe(fields):
    c = GPTConfig(**{**MOE, **fields})
    p, h, out = _layer_values(c)
    capacity = expert_slots(c, c.micro_batch * c.seq)
    np.testing.assert_allclose(out, _per_token_moe(c, p, h, capacity), rtol=1e-12, atol=1e-12)


def test_the_estimator_covers_expert_parallelism_and_the_sweep_says_what_it_refuses():
    from distsim.estimate import estimate
    from distsim.sweep.point import run_point
    options = {"model": "mixtral-8x7b", "topology": "dgx-h100", "layers": 2}
    # with and without expert parallelism the estimator covers the MoE model
    for ep in (1, 2):
        row = run_point({**options, "ep": ep, "fidelity": "estimate"})
        assert row["status"] == "ok" and row["step_time_s"] > 0
    # ZeRO 2 with ep = dp too (the experts' gradients kept whole)
    row = run_point({**options, "ep": 8, "zero": 2, "fidelity": "estimate"})
    assert row["status"] == "ok" and row["step_time_s"] > 0
    # and ZeRO 3 with ep = dp (the experts' weights not gathered, kept whole)
    row = run_point({**options, "ep": 8, "zero": 3, "fidelity": "estimate"})
    assert row["status"] == "ok" and row["step_time_s"] > 0
    # and ZeRO 3 by layer, with ep = dp and ep < dp
    for ep in (8, 2):
        row = run_point({**options, "ep": ep, "zero": 3, "zero3_unit": "layer",
                         "fidelity": "estimate"})
        assert row["status"] == "ok" and row["step_time_s"] > 0
    # what it does not model (every kernel launch blocking) it refuses, and a
    # sweep skips the point saying why
    blocking = {**options, "ep": 2, "launch": "blocking"}
    with pytest.raises(NotModelledError, match="launch 'blocking'.* use fidelity: simulate"):
        estimate(blocking)
    row = run_point({**blocking, "fidelity": "estimate"})
    assert row["status"] == "skipped" and "launch 'blocking'" in row["reason"]
    assert row["step_time_s"] is None


def test_flops_of_dispatch_and_combine_by_hand():
    from distsim.cost import op_flops
    from distsim.ir import DType, FunctionBuilder, TensorType
    b = FunctionBuilder("f")
    x = b.input("x", TensorType((10, 6), DType.BF16, 0))
    p = b.input("p", TensorType((10, 4), DType.BF16, 0))
    route = {"top_k": 2, "capacity": 4}     # 20 choices, 16 slots
    y = b.op("moe_dispatch", [x, p], route)
    out = b.op("moe_combine", [y, p], route)
    f = b.finish([out])
    dispatch, combine = f.ops
    # routing: 10 x 4 comparisons; then per kept choice (16) and hidden element (6)
    assert op_flops(dispatch) == 10 * 4
    assert op_flops(combine) == 10 * 4 + 2 * 16 * 6


def test_tp_must_divide_the_experts_ffn():
    c = GPTConfig(**{**MOE, "expert_ffn": 6})
    from distsim.models.gpt import check_tensor_parallel
    with pytest.raises(ConfigError, match="--tp 4 does not divide the experts' feed-forward "
                                          "size 6"):
        check_tensor_parallel(c, 4, False)
    check_tensor_parallel(c, 2, False)


@pytest.mark.parametrize("fields", [dict(capacity_factor=0.5),
                                    dict(norm_topk=False, shared_experts=1)])
def test_moe_model_gradients_match_finite_differences(fields):
    # the whole model's loss: router and expert weights, tokens dropped or not
    from distsim.interp.gradcheck import finite_difference
    from distsim.transforms.autodiff import Autodiff
    c = GPTConfig(**{**MOE, "seq": 4, "micro_batch": 1, **fields})
    f = gpt_forward(c)
    wrt = ["l1_router", "l1_experts_w2"]
    g = verify(Autodiff(f.meta["loss"], wrt)(f))
    rng = np.random.default_rng(1)
    inputs = [rng.integers(0, c.vocab, v.type.shape) if f.meta["roles"][v.name] == "data"
              else rng.normal(0, 0.5, v.type.shape) for v in f.inputs]
    grads = execute(g, inputs)[1:]
    names = [v.name for v in f.inputs]
    for name, grad in zip(wrt, grads):
        expected = finite_difference(f, inputs, names.index(name))
        assert np.abs(expected).max() > 1e-4            # the loss depends on it
        np.testing.assert_allclose(grad, expected, rtol=1e-5, atol=1e-8, err_msg=name)


@pytest.mark.parametrize("skew, slots", [(0.0, 8), (0.5, 12), (1.0, 16)])
def test_expert_gemm_flops_follow_the_busiest_expert(skew, slots):
    # 16 tokens, top 2 of 4 experts: 8 per expert when uniform, 8 + s x (16 - 8)
    # for the busiest; every expert runs that many rows. Forward: 2 x E x slots x
    # h x 2f (gate and up) and 2 x E x slots x f x h; backward twice that.
    from distsim.cost import op_flops
    from distsim.models.gpt_family import gpt_reference_step
    c = GPTConfig(**{**MOE, "global_batch": 2, "routing_skew": skew})
    step = gpt_reference_step(c)
    experts = [o for o in step.ops if o.op_type == "matmul"
               and any("experts" in v.name for v in (*o.inputs, *o.outputs))]
    assert len(experts) == 6
    e, h, f = 4, 16, 8
    assert sum(op_flops(o) for o in experts) == 3 * (2 * e * slots * h * 2 * f
                                                     + 2 * e * slots * f * h)


@pytest.mark.parametrize("tp", [1, 2])
def test_simulated_mixtral_weights_by_hand(tp):
    # two Mixtral layers, bf16 weights: per layer attention 41,943,040 (split
    # over tp), norms 8192 and router 32,768 (whole), experts 8 x 3 x 4096 x 14336
    # (split over tp); embedding and output layer 2 x 32000 x 4096 (split), final
    # norm 4096; AdamW's fp32 master, m and v: 12 bytes a parameter
    import distsim
    layer = 41_943_040 // tp + 8192 + 32_768 + 8 * 3 * 4096 * 14336 // tp
    params = 2 * layer + 2 * 32000 * 4096 // tp + 4096
    summary = distsim.simulate("mixtral-8x7b", "dgx-h100", layers=2, global_batch=16, tp=tp,
                               symmetry=True).summary()
    memory = summary["memory_by_category"]["0"]
    assert memory["weights"] == 2 * params
    assert memory["optimizer"] == 12 * params
    assert summary["step_time_s"] > 0 and not summary["oom"]
