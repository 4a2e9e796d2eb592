"""The fused attention op (FlashAttention) and the GPT option that uses it
(``attention: fused``).

- the numpy kernels against a plain numpy attention and, backward, against
  finite differences (including the gradient through the log-sum-exps);
- the GPT step with ``attention: fused`` against ``explicit``: the same loss
  and gradients (grouped-query attention included), the same updates under
  tensor parallelism lowered to every rank;
- FLOPs and time by hand, the saved activations by hand, the simulated peak;
- bad shapes and bad config values: one error naming the op or the field;
- end to end: a small Llama-like model simulates faster with the fused op,
  and the sweep estimator agrees with the simulation on it.
"""
from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pytest

import distsim
from distsim.cli import main
from distsim.cost.device import ATTENTION_VS_MATMUL, DeviceSpec
from distsim.cost.flops import op_flops
from distsim.cost.flops_nn import causal_fraction
from distsim.cost.model import CostModel
from distsim.errors import ConfigError, VerifyError
from distsim.interp import execute
from distsim.interp.gradcheck import finite_difference
from distsim.interp.kernels import KERNELS
from distsim.ir import DType, FunctionBuilder, TensorType, verify
from distsim.ir.core import Module
from distsim.ir.mesh import DeviceMesh, Partial, Replicate, Shard
from distsim.models.gpt import GPTConfig, gpt_forward
from distsim.models.gpt_family import build_gpt_step
from distsim.text import parse_module, print_function, print_program
from distsim.transforms.autodiff import Autodiff
from distsim.transforms.memory_model import saved_activation_bytes
from distsim.transforms.sharding import annotate_sharding, check_lowering, shard_program
from distsim.transforms.strategy import Strategy
from strategies_reference import strategies_reference

F64 = DType.F64


def t(*shape, dtype=F64):
    return TensorType(shape, dtype, 0)


def reference_attention(q, k, v, scale, causal):
    """softmax(scale q k^T + mask) v and the rows' log-sum-exps, by the book."""
    s = scale * q @ np.swapaxes(k, -1, -2)
    if causal:
        sq, sk = s.shape[-2:]
        hidden = np.arange(sk)[None, :] > np.arange(sq)[:, None] + (sk - sq)
        s = np.where(hidden, -np.inf, s)
    lse = np.log(np.sum(np.exp(s), axis=-1))
    return np.exp(s - lse[..., None]) @ v, lse


# -- kernels -----------------------------------------------------------------------
@pytest.mark.parametrize("causal", [True, False])
def test_kernel_is_exact_attention_with_grouped_query_broadcast(causal):
    rng = np.random.default_rng(0)
    q = rng.normal(size=(2, 3, 2, 5, 4))        # (batch, kv heads, group, seq, d)
    k = rng.normal(size=(2, 3, 1, 6, 4))        # more keys than queries
    v = rng.normal(size=(2, 3, 1, 6, 7))        # d_v != d
    out, lse = KERNELS["fused_attention"]({"scale": 0.3, "causal": causal}, q, k, v)
    want_out, want_lse = reference_attention(q, k, v, 0.3, causal)
    np.testing.assert_allclose(out, want_out, rtol=1e-12)
    np.testing.assert_allclose(lse, want_lse, rtol=1e-12)
    assert out.dtype == np.float64 and lse.dtype == np.float64


def test_lse_is_float32_for_half_precision_inputs():
    b = FunctionBuilder("f")
    q = b.input("q", t(1, 2, 8, 16, dtype=DType.BF16))
    kv = b.input("kv", t(1, 2, 8, 16, dtype=DType.BF16))
    out, lse = b.op("fused_attention", [q, kv, kv])
    assert out.type == q.type
    assert lse.type == TensorType((1, 2, 8), DType.F32, 0)
    # and the executor computes it so (bf16 runs in float32 there)
    f = verify(b.finish([out, lse]))
    rng = np.random.default_rng(1)
    got = execute(f, [rng.normal(size=(1, 2, 8, 16)).astype(np.float32)] * 2)
    assert got[1].dtype == np.float32


def _attention_loss(use_lse: bool, causal: bool = True):
    """sum(out * w) (+ sum(lse * u)): a non-uniform gradient into both outputs."""
    b = FunctionBuilder("f")
    q, k, v = (b.input("q", t(1, 2, 2, 3, 4)), b.input("k", t(1, 2, 1, 5, 4)),
               b.input("v", t(1, 2, 1, 5, 3)))
    out, lse = b.op("fused_attention", [q, k, v], {"scale": 0.8, "causal": causal})
    w = b.input("w", out.type)
    loss = b.op("reduce_sum", [b.op("mul", [out, w])])
    if use_lse:
        u = b.input("u", lse.type)
        loss = b.op("add", [loss, b.op("reduce_sum", [b.op("mul", [lse, u])])])
    return verify(b.finish([b.op("identity", [loss], name="loss")]))


@pytest.mark.parametrize("use_lse", [False, True])
@pytest.mark.parametrize("causal", [True, False])
def test_gradient_kernel_matches_finite_differences(use_lse, causal):
    f = _attention_loss(use_lse, causal)
    rng = np.random.default_rng(2)
    inputs = [rng.uniform(-1, 1, v.type.shape) for v in f.inputs]
    g = verify(Autodiff("loss", ["q", "k", "v"])(f))
    grad_ops = [op for op in g.ops if op.op_type == "fused_attention_grad"]
    assert len(grad_ops) == 1 and len(grad_ops[0].inputs) == (7 if use_lse else 6)
    results = execute(g, inputs)
    for i, name in enumerate(["q", "k", "v"]):
        np.testing.assert_allclose(results[1 + i], finite_difference(f, inputs, i),
                                   rtol=1e-6, atol=1e-9, err_msg=name)


# -- the GPT step: fused against explicit ---------------------------------------------
STYLES = {
    "mha": dict(),
    "gqa": dict(kv_heads=2),
    "llama": dict(norm="rmsnorm", activation="swiglu", bias=False, tied_embeddings=False,
                  position="rope", kv_heads=1),
}


@pytest.mark.parametrize("style", sorted(STYLES))
def test_gpt_fused_and_explicit_give_the_same_loss_and_gradients(style):
    """float64, dropout 0.1 (the executor keeps everything, for both forms)."""
    results = {}
    for attention in ("explicit", "fused"):
        c = GPTConfig(layers=2, hidden=16, heads=4, vocab=23, seq=6, dtype="f64", dropout=0.1,
                      attention=attention, **STYLES[style])
        f = verify(gpt_forward(c, micro_batch=2))
        g = verify(Autodiff(f.meta["loss"], f.meta["params"])(f))
        rng = np.random.default_rng(3)
        inputs = [rng.integers(0, c.vocab, v.type.shape) if not v.type.dtype.is_float
                  else rng.normal(0, 0.5, v.type.shape) for v in g.inputs]
        results[attention] = (g, execute(g, inputs))
    explicit, fused = results["explicit"], results["fused"]
    assert [v.name for v in explicit[0].outputs] == [v.name for v in fused[0].outputs]
    for v, a, b in zip(explicit[0].outputs, explicit[1], fused[1]):
        np.testing.assert_allclose(b, a, rtol=1e-10, atol=1e-13, err_msg=v.name)
    ops = {op.op_type for op in fused[0].ops}
    assert {"fused_attention", "fused_attention_grad"} <= ops
    assert not ops & {"softmax", "causal_mask", "softmax_grad"}


@pytest.fixture(scope="module")
def fused_reference():
    return strategies_reference()(attention="fused")


def test_fused_reference_step_updates_as_the_explicit_one(fused_reference):
    explicit = strategies_reference()()      # the tiny GQA model (heads 4, kv_heads 2)
    assert fused_reference.loss == pytest.approx(explicit.loss, rel=1e-12)
    assert fused_reference.updated.keys() == explicit.updated.keys()
    for name, value in explicit.updated.items():
        np.testing.assert_allclose(fused_reference.updated[name], value, rtol=1e-10,
                                   atol=1e-13, err_msg=name)


@pytest.mark.parametrize("strategy", [dict(tp=2), dict(tp=2, sp=True, recompute="selective"),
                                      dict(dp=2, tp=2, pp=2, zero=1)],
                         ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items()))
def test_fused_attention_lowered_to_every_rank_matches_single_device(fused_reference, strategy):
    program = fused_reference.check(**strategy)
    assert any(op.op_type == "fused_attention_grad" for op in program.ops)


def test_selective_recomputation_has_nothing_to_recompute_in_fused_attention():
    c = GPTConfig(layers=2, hidden=16, heads=4, vocab=32, seq=8, attention="fused")
    plain = build_gpt_step(c, Strategy(dp=1), 1)
    selective = build_gpt_step(c, Strategy(dp=1, recompute="selective"), 1)
    assert print_function(selective) == print_function(plain)
    assert not any(op.meta.get("attn_core") for op in plain.ops)
    full = build_gpt_step(c, Strategy(dp=1, recompute="full"), 1)
    assert any(op.op_type == "fused_attention" and op.meta.get("recompute") for op in full.ops)


# -- cost ---------------------------------------------------------------------------
def _attention_op(causal=True, b=2, kv=2, group=2, s=8, d=16, dtype=DType.BF16):
    fb = FunctionBuilder("f")
    q = fb.input("q", TensorType((b, kv, group, s, d), dtype, 0))
    k = fb.input("k", TensorType((b, kv, 1, s, d), dtype, 0))
    v = fb.input("v", TensorType((b, kv, 1, s, d), dtype, 0))
    out, _ = fb.op("fused_attention", [q, k, v], {"causal": causal})
    f = Autodiff("loss", ["q", "k", "v"])(
        fb.finish([fb.op("reduce_sum", [out], name="loss")]))
    return (next(op for op in f.ops if op.op_type == "fused_attention"),
            next(op for op in f.ops if op.op_type == "fused_attention_grad"))


def test_flops_by_hand():
    # batch 2 x heads (2 kv heads x group 2 = 4) x seq 8 x seq 8 x d 16:
    # q k^T and P v, 2 FLOPs a multiply-add each: 4 * 2 * 4 * 8 * 8 * 16 = 32768
    fwd, bwd = _attention_op(causal=False)
    assert op_flops(fwd) == 4 * 2 * 4 * 8 * 8 * 16 == 32768
    assert op_flops(bwd) == 2.5 * 32768                    # five matmuls for two
    fwd_c, bwd_c = _attention_op(causal=True)
    assert op_flops(fwd_c) == 32768 / 2                    # causal: half the blocks
    assert op_flops(bwd_c) == 2.5 * 32768 / 2


@pytest.mark.parametrize("sq, sk", [(1, 1), (5, 5), (3, 7), (6, 8), (1, 9)])
def test_causal_fraction_is_the_area_under_the_diagonal(sq, sk):
    # row i sees keys j <= i + sk - sq, the last one counted half
    visible = sum(min(sk, i + sk - sq + 1) - 0.5 for i in range(sq))
    assert causal_fraction(sq, sk) == pytest.approx(visible / (sq * sk), rel=1e-12)


def test_time_uses_a_share_of_the_matmul_efficiency():
    device = DeviceSpec("d", {"bf16": 1e12}, memory_bandwidth_Bps=1e15, memory_bytes=10 ** 10,
                        matmul_efficiency=0.8, vector_efficiency=0.3)
    model = CostModel(device)
    fwd, bwd = _attention_op(causal=True, s=256, d=64)
    for op, share in ((fwd, ATTENTION_VS_MATMUL["fused_attention"]),
                      (bwd, ATTENTION_VS_MATMUL["fused_attention_grad"])):
        assert model.op_cost(op).time_s == pytest.approx(op_flops(op) / (1e12 * 0.8 * share))
    assert 0 < ATTENTION_VS_MATMUL["fused_attention_grad"] < \
        ATTENTION_VS_MATMUL["fused_attention"] < 1


# -- memory -------------------------------------------------------------------------
SEQ, HEADS, HD = 256, 4, 16          # hidden 64


@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_saved_activations_lose_the_seq_squared_tensors(dropout):
    """Per layer and micro-batch (b = 1, bf16): the explicit form keeps the
    probabilities (2 b a s^2 bytes) and, with dropout, the keep mask
    (b a s^2) and the dropped probabilities (2 b a s^2); the fused form keeps
    instead its output (2 b a s d) and the log-sum-exps (4 b a s, float32)."""
    saved = {}
    for attention in ("explicit", "fused"):
        c = GPTConfig(layers=2, hidden=HEADS * HD, heads=HEADS, kv_heads=2, vocab=64, seq=SEQ,
                      dropout=dropout, attention=attention)
        saved[attention] = saved_activation_bytes(build_gpt_step(c, Strategy(dp=1), 1))
    squares = HEADS * SEQ * SEQ * (2 + (1 + 2 if dropout else 0))
    fused_extra = 2 * HEADS * SEQ * HD + 4 * HEADS * SEQ
    for layer in (0, 1):
        assert saved["explicit"][layer] - saved["fused"][layer] == squares - fused_extra
    for layer in (-1, 2):   # embedding, head: untouched
        assert saved["explicit"][layer] == saved["fused"][layer]


def test_simulated_peak_memory_drops_by_at_least_the_squares():
    base = dict(family="gpt", name="m", layers=2, hidden=HEADS * HD, heads=HEADS, kv_heads=2,
                vocab=64, seq=SEQ, global_batch=8, micro_batch=1)
    peaks = {}
    for attention in ("explicit", "fused"):
        r = distsim.simulate(model=dict(base, attention=attention), topology="dgx-a100", dp=8,
                             network_mode="analytical")
        peaks[attention] = r.summary()["max_peak_memory_bytes"]
    per_layer = 2 * HEADS * SEQ * SEQ - (2 * HEADS * SEQ * HD + 4 * HEADS * SEQ)
    assert peaks["explicit"] - peaks["fused"] >= 2 * per_layer


# -- bad input ------------------------------------------------------------------------
@pytest.mark.parametrize("shapes, attrs, message", [
    (((1, 2, 8, 16), (1, 2, 8, 8), (1, 2, 8, 16)), {}, "head dims differ"),
    (((1, 2, 8, 16), (1, 2, 6, 16), (1, 2, 8, 16)), {"causal": False},
     "different key lengths"),
    (((1, 4, 8, 16), (1, 3, 8, 16), (1, 3, 8, 16)), {}, "k (1, 3, 8, 16) does not broadcast "
                                                        "to q (1, 4, 8, 16)"),
    (((2, 8, 16), (1, 2, 8, 16), (1, 2, 8, 16)), {}, "does not broadcast to q"),
    (((1, 2, 8, 16), (1, 2, 4, 16), (1, 2, 4, 16)), {}, "causal attention needs at least as "
                                                        "many keys (4) as queries (8)"),
    (((16,), (8, 16), (8, 16)), {}, "q must have rank >= 2"),
    (((1, 8, 16),) * 3, {"causal": "yes"}, "causal must be true or false"),
    (((1, 8, 16),) * 3, {"dropout": 1.0}, "dropout probability must be in [0, 1)"),
    (((1, 8, 16),) * 3, {"scale": float("nan")}, "scale must be a finite number"),
])
def test_bad_shapes_are_one_error_naming_the_op(shapes, attrs, message):
    b = FunctionBuilder("f")
    ins = [b.input(n, t(*s)) for n, s in zip("qkv", shapes)]
    with pytest.raises(VerifyError) as info:
        b.op("fused_attention", ins, attrs, name="attn")
    assert str(info.value).startswith("op 'attn' (fused_attention): ")
    assert message in str(info.value)


def test_bad_program_text_names_the_op():
    text = """func @main(%q: f32[1,2,8,16]@0, %k: f32[1,2,8,8]@0, %v: f32[1,2,8,16]@0)
    -> (f32[1,2,8,16]@0) {
  %o, %l = fused_attention(%q, %k, %v) {causal = true} : f32[1,2,8,16]@0, f32[1,2,8]@0
  return %o
}
"""
    with pytest.raises(VerifyError, match=r"fused_attention.*head dims differ"):
        verify(parse_module(text).functions["main"])


def test_program_text_round_trips():
    c = GPTConfig(layers=1, hidden=16, heads=4, kv_heads=2, vocab=32, seq=8, dropout=0.1,
                  attention="fused")
    f = build_gpt_step(c, Strategy(dp=1), 1)
    text = print_program(f)         # the step, then its fused kernels' functions
    assert "fused_attention(" in text and "fused_attention_grad(" in text
    parsed = verify(parse_module(text).functions[f.name])
    assert print_program(parsed) == text


def test_bad_attention_field_names_the_field():
    with pytest.raises(ConfigError) as info:
        GPTConfig.from_dict({"attention": "flash"}, where="m.yaml")
    assert str(info.value) == "m.yaml: attention: must be one of explicit, fused, got 'flash'"
    with pytest.raises(ConfigError, match="^attention: must be one of explicit, fused, got 1$"):
        GPTConfig(attention=1)


def test_cli_bad_attention_in_a_model_file_is_exit_2(tmp_path, capsys):
    path = tmp_path / "m.yaml"
    path.write_text("family: gpt\nlayers: 2\nhidden: 32\nheads: 4\nvocab: 64\nseq: 16\n"
                    "attention: flash\n")
    out = tmp_path / "out"
    assert main(["simulate", "--model", str(path), "--no-plots", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err == (f"distsim: error: {path}: attention: must be one of explicit, fused, "
                   "got 'flash'\n")
    assert not out.exists()


def test_cli_attention_flag_overrides_the_model_file(tmp_path, capsys):
    code = main(["simulate", "--model", "tiny", "--tp", "2", "--attention", "fused",
                 "--network-mode", "analytical", "--json", "--no-plots",
                 "--out", str(tmp_path)])
    assert code == 0
    s = json.loads(capsys.readouterr().out)
    assert s["config"]["attention"] == "fused"


# -- sharding rules ------------------------------------------------------------------
R, P = Replicate(), Partial("sum")
MESH = DeviceMesh("m", (2,), ("a",))


@pytest.mark.parametrize("dim, causal, expected", [
    (0, True, [Shard(0), Shard(0)]),      # batch: k and v follow
    (2, True, [Shard(2), Shard(2)]),      # the query group: k and v (broadcast) replicated
    (3, False, [Shard(3), Shard(3)]),     # the queries, without the causal mask
])
def test_sharding_rule_lowers_to_the_unsharded_numbers(dim, causal, expected):
    b = FunctionBuilder("main")
    q = b.input("q", TensorType((2, 2, 2, 4, 4), DType.F32))
    k = b.input("k", TensorType((2, 2, 1, 4, 4), DType.F32))
    v = b.input("v", TensorType((2, 2, 1, 4, 4), DType.F32))
    annotate_sharding(q, MESH, [Shard(dim)])
    y = b.op("fused_attention", [q, k, v], {"causal": causal}, name="y")
    module = Module({"main": b.finish([y[0], y[1]])}, {MESH.name: MESH})
    sharded, local = shard_program(module)
    verify(local)
    op = next(o for o in sharded.functions["main"].ops if o.op_type == "fused_attention")
    assert [v.type.placements[0] for v in op.outputs] == expected
    assert check_lowering(module, local).ok


@pytest.mark.parametrize("dim, causal, dk", [(0, True, Shard(0)), (2, True, P), (3, False, P)])
def test_sharding_rule_of_the_backward(dim, causal, dk):
    b = FunctionBuilder("main")
    shapes = {"dout": (2, 2, 2, 4, 4), "q": (2, 2, 2, 4, 4), "k": (2, 2, 1, 4, 4),
              "v": (2, 2, 1, 4, 4), "out": (2, 2, 2, 4, 4), "lse": (2, 2, 2, 4)}
    ins = {n: b.input(n, TensorType(s, DType.F32)) for n, s in shapes.items()}
    for n in ("dout", "q", "out", "lse"):
        annotate_sharding(ins[n], MESH, [Shard(dim)])
    y = b.op("fused_attention_grad", list(ins.values()), {"causal": causal}, name="y")
    module = Module({"main": b.finish(list(y))}, {MESH.name: MESH})
    sharded, local = shard_program(module)
    verify(local)
    op = next(o for o in sharded.functions["main"].ops if o.op_type == "fused_attention_grad")
    assert [v.type.placements[0] for v in op.outputs] == [Shard(dim), dk, dk]
    assert check_lowering(module, local).ok


# -- end to end -----------------------------------------------------------------------
LLAMA_LIKE = dict(family="gpt", name="llama-small", layers=4, hidden=256, heads=8, kv_heads=2,
                  ffn=704, vocab=512, seq=1024, norm="rmsnorm", activation="swiglu", bias=False,
                  tied_embeddings=False, position="rope", global_batch=8, micro_batch=1)


def test_llama_like_model_simulates_faster_and_smaller_with_fused_attention():
    results = {}
    for attention in ("explicit", "fused"):
        r = distsim.simulate(model=dict(LLAMA_LIKE, attention=attention), topology="dgx-a100",
                             tp=2, pp=2, network_mode="analytical")
        results[attention] = r.summary()
    explicit, fused = results["explicit"], results["fused"]
    assert fused["step_time_s"] < 0.9 * explicit["step_time_s"]
    assert fused["max_peak_memory_bytes"] < explicit["max_peak_memory_bytes"]
    assert fused["config"]["attention"] == "fused"
    # the model FLOPs do not depend on the kernel; the executed ones do (the
    # fused kernel skips the masked half of the scores)
    assert fused["model_flops"] == explicit["model_flops"]
    assert fused["total_flops"] < explicit["total_flops"]


def test_sweep_estimate_agrees_with_the_simulation_on_fused_attention():
    from distsim.estimate import point as est
    options = {"model": "gpt2", "layers": 4, "global_batch": 32, "network_mode": "analytical",
               "topology": "dgx-a100", "dp": 2, "tp": 2, "pp": 2, "attention": "fused"}
    sim = distsim.simulate(**options).summary()
    row = est.estimate(options)
    assert row["step_time_s"] == pytest.approx(sim["step_time_s"], rel=0.03)
    assert row["max_peak_memory_bytes"] == pytest.approx(sim["max_peak_memory_bytes"], rel=0.02)


def test_llama3_70b_attention_share_by_hand():
    """The motivating case: Llama 3 70B at seq 8192, one layer on one GPU
    (tp 1): the fused forward's FLOPs are the two attention matmuls,
    4 b h s^2 d / 2 = 4 x 64 x 8192^2 x 128 / 2 FLOPs."""
    c = replace(GPTConfig(layers=1, hidden=8192, heads=64, kv_heads=8, ffn=28672, vocab=128,
                          seq=8192, norm="rmsnorm", activation="swiglu", bias=False,
                          position="rope"), attention="fused")
    f = gpt_forward(c)
    op = next(op for op in f.ops if op.op_type == "fused_attention")
    assert op_flops(op) == 4 * 64 * 8192 ** 2 * 128 / 2
    assert op.attrs["scale"] == pytest.approx(1 / math.sqrt(128))


@pytest.mark.parametrize("name, attention", [
    ("llama2-7b", "fused"), ("llama2-13b", "fused"), ("llama2-70b", "fused"),
    ("llama3-8b", "fused"), ("llama3-70b", "fused"),
    ("gpt2", "explicit"), ("gpt3-175b", "explicit")])
def test_model_files_say_how_their_models_were_trained(name, attention):
    """The README's claim: the Llama files model FlashAttention-style
    kernels, the GPT-2/3 files explicit attention; the flag overrides."""
    from distsim.models.gpt_family import gpt_config
    from distsim.models.registry import load_model_config
    config = load_model_config(name)
    assert gpt_config(config).attention == attention
    other = "explicit" if attention == "fused" else "fused"
    assert gpt_config({**config, "attention": other}).attention == other


def test_models_listing_shows_the_attention(capsys):
    assert main(["models"]) == 0
    lines = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines()}
    assert lines["model"][-1] == "attention"
    assert lines["llama3-8b"][-1] == "fused" and lines["gpt2"][-1] == "explicit"
    assert lines["bert-tiny"][-1] == "-"      # an ONNX model has no such field
