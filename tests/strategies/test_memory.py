"""Memory: 16 bytes per parameter divided as ZeRO says (simulated), and
activations per layer as Korthikanti et al. (read off the GPT-3 175B
TP 8 / PP 8 program; within 5%)."""
import pytest

import distsim
from distsim.models import load_model_config
from distsim.models.gpt_family import build_gpt_step, gpt_config
from distsim.transforms.memory_model import (korthikanti_activation_bytes, model_state_bytes,
                                             saved_activation_bytes)
from distsim.transforms.pipeline import partition_layers
from distsim.transforms.strategy import Strategy

GPT3 = gpt_config(load_model_config("gpt3-175b"))


def per_layer(strategy, layer=50):
    step = build_gpt_step(GPT3, strategy, micro_batch=1)
    return saved_activation_bytes(step)[layer]


@pytest.mark.parametrize("tp, sp, recompute", [
    (8, False, "none"), (8, True, "none"), (8, True, "selective"), (8, False, "selective"),
    (8, True, "full")])
def test_gpt3_activations_follow_korthikanti(tp, sp, recompute):
    c = GPT3
    got = per_layer(Strategy(dp=1, tp=tp, pp=8, sp=sp, recompute=recompute))
    expected = korthikanti_activation_bytes(c.seq, 1, c.hidden, c.heads, tp, sp, recompute)
    assert got == pytest.approx(expected, rel=0.05)


def test_gpt3_model_state_is_16_bytes_per_parameter_on_each_gpu():
    c = GPT3
    # a middle stage of PP 8: 12 layers of 12 h^2 + 13 h parameters, split over TP 8
    # except the layernorms and output biases (6 h), which every TP rank holds
    start, end = partition_layers(c.layers, 8)[3]
    h = c.hidden
    params = (end - start) * ((12 * h * h + 7 * h) // 8 + 6 * h)
    for zero, dp, total in ((0, 8, 16.0), (1, 8, 4 + 12 / 8), (2, 8, 2 + 14 / 8), (3, 8, 16 / 8)):
        state = model_state_bytes(params, zero, dp)
        assert sum(state.values()) == pytest.approx(total * params)
    step = build_gpt_step(c, Strategy(dp=1, tp=8, pp=8), micro_batch=1)
    roles = step.meta["roles"]
    stage_params = sum(v.type.numel for v in step.inputs if roles.get(v.name) == "param"
                       and v.name.split("_")[0] in {f"l{i}" for i in range(start, end)})
    assert stage_params == params


SMALL = dict(model="tiny", topology="dgx-a100", hidden=64, layers=8, vocab=64, seq=16,
             network_mode="analytical")


def small_stage0():
    """(parameters of stage 0 on one TP rank of tp 2 / pp 2, of one of its
    layers, of its largest parameter) for SMALL."""
    c = gpt_config({**load_model_config("tiny"), "hidden": 64, "layers": 8, "vocab": 64})
    h = c.hidden
    layer = (12 * h * h + 7 * h) // 2 + 6 * h
    # embedding shard (tied, vocab/2 x h), positions, layers 0-3
    return c.vocab * h // 2 + c.seq * h + 4 * layer, layer, h * 4 * h // 2


@pytest.mark.parametrize("zero", [0, 1, 2])
def test_simulated_model_state_divides_by_zero_stage(zero):
    r = distsim.simulate(**SMALL, dp=2, tp=2, pp=2, zero=zero)
    stage0, layer, largest = small_stage0()
    state = model_state_bytes(stage0, zero, 2)
    peak = r.summary()["memory_by_category"]["0"]
    assert peak["optimizer"] == state["optimizer"]
    assert peak["weights"] == state["weights"]
    # the resident gradient buffer, plus the fresh gradient of one parameter
    # on its way into it (ZeRO 2: and its flattened copy, reduce-scattered)
    assert state["gradients"] <= peak["gradients"] <= state["gradients"] + 2 * 2 * largest


def test_zero3_holds_shards_and_the_layers_being_gathered():
    """ZeRO-3: the weights at the peak are the resident 1/dp shards plus the
    gathered parameters of at most prefetch + 1 layers (each with its gated
    shards in flight and one parameter's flat copy); each prefetched layer
    adds about one layer."""
    stage0, layer, largest = small_stage0()
    shards = 2.0 * stage0 / 2
    gathered = {}
    for prefetch in (0, 1, 2):
        r = distsim.simulate(**SMALL, dp=2, tp=2, pp=2, zero=3, prefetch=prefetch)
        peak = r.summary()["memory_by_category"]["0"]
        assert peak["optimizer"] == model_state_bytes(stage0, 3, 2)["optimizer"]
        gathered[prefetch] = peak["weights"] - shards
        assert 0 < gathered[prefetch] <= (prefetch + 1) * 2 * layer * 1.5 + 2 * largest
        assert gathered[prefetch] < 2 * stage0  # never the whole stage at once
    for p in (1, 2):  # at least about one more layer (2 bytes a parameter)
        assert 0.9 * 2 * layer <= gathered[p] - gathered[p - 1]
    # No upper bound on the step from one prefetch to the next: the weights
    # are read where the whole device peaks, which need not be where a
    # layer is wholly gathered. Under NCCL's step latencies, gathers are long
    # beside this model's tiny compute, and without prefetch the peak comes
    # while 0.78 of a layer is gathered (1.31 with flat latencies), so
    # prefetch 1 adds 1.51 layers; the bound above on each prefetch holds.


def test_oom_reports_the_dominating_category():
    r = distsim.simulate(model="gpt3-175b", topology="dgx-a100", tp=8, layers=24, seq=64,
                         global_batch=1, network_mode="analytical")
    s = r.summary()
    assert s["oom"] and s["oom_category"] == "optimizer"
    assert "OOM" in r.summary_table() and "optimizer" in r.summary_table()


# -- GPT-3 175B, TP 8 / PP 8, simulated: the simulated per-GPU memory of
# weights, gradients and optimizer state equals the standard mixed-precision
# Adam accounting ------------------------------------------------------------
H = GPT3.hidden
#: parameters of one transformer layer on one TP rank of 8: the split
#: matrices and biases, (12 h^2 + 7 h) / 8, and the replicated layernorms
#: and output biases, 6 h
LAYER_175B = (12 * H * H + 7 * H) // 8 + 6 * H
#: the vocabulary padded to a multiple of 8 (50264), per TP rank
VOCAB_SHARD = -(-GPT3.vocab // 8)


def gpt3_stage_params(stage, layers_per_stage, pp=8):
    """Parameters of one TP rank of a pipeline stage, by hand: its layers,
    plus the embedding shard and learned positions on the first stage, the
    final layernorm and the (untied) output layer's shard on the last."""
    params = layers_per_stage * LAYER_175B
    if stage == 0:
        params += VOCAB_SHARD * H + GPT3.seq * H
    if stage == pp - 1:
        params += 2 * H + VOCAB_SHARD * H
    return params


def simulate_gpt3(zero, layers, dp=2, **extra):
    """GPT-3 175B's layers at full size, fewer of them, 2 micro-batches of
    one sequence, one representative device per stage (--symmetry)."""
    return distsim.simulate(model="gpt3-175b", topology=f"dgx-a100-x{8 * dp}", tp=8, pp=8,
                            dp=dp, layers=layers, microbatches=2, micro_batch=1,
                            global_batch=2 * dp, zero=zero, symmetry=True,
                            network_mode="analytical", **extra)


@pytest.mark.parametrize("zero", [0, 1, 2])
def test_gpt3_175b_simulated_bytes_per_parameter(zero):
    """At each stage's simulated peak: weights 2 bytes a parameter,
    gradients 2 (the resident bf16 buffer; 2/dp from ZeRO 2), optimizer 12
    (fp32 master, m, v; 12/dp from ZeRO 1). ZeRO 0/1 may add one fresh
    gradient beside its buffer: the second micro-batch's, made by its
    weight-gradient GEMM and not yet added in (at most the stage's largest
    matrix: fc1's h x 4h / 8, or on the first and last stages the
    vocabulary shard, 6283 x h; the last stage peaks there, at the output
    layer's). ZeRO 2 may add the gradients in flight to their
    reduce-scatters: one parameter's flat copy and its reduced shard while
    its reduce-scatter runs (1 + 1/dp copies of the largest matrix), the
    next one's fresh gradient and flat copy made meanwhile (2 more: the
    backward makes gradients faster than the reduce-scatters move them),
    and the small vectors of a layer (biases, layernorms: 7h / 8 + 6h)."""
    dp, layers = 2, 16
    r = simulate_gpt3(zero, layers, dp)
    s = r.summary()
    expected = {"weights": 2.0, "gradients": 2.0 / (dp if zero >= 2 else 1),
                "optimizer": 12.0 / (dp if zero >= 1 else 1)}
    assert {int(k) for k in s["memory_by_category"]} == {16 * st for st in range(8)}
    for stage in range(8):
        params = gpt3_stage_params(stage, layers // 8)
        peak = s["memory_by_category"][str(16 * stage)]   # the stage's representative
        per_param = {k: peak[k] / params for k in expected}
        # weights: + the vocab_mask constant (6283 x 2 bytes) on the last stage
        assert per_param["weights"] == pytest.approx(2.0, rel=1e-4)
        assert per_param["optimizer"] == pytest.approx(expected["optimizer"], rel=1e-9)
        largest = max(4 * H * H // 8, VOCAB_SHARD * H if stage in (0, 7) else 0)
        vectors = 7 * H // 8 + 6 * H
        in_flight = (2 * ((3 + 1 / dp) * largest + vectors) / params if zero >= 2 else
                     2 * largest / params)
        assert expected["gradients"] - 1e-9 <= per_param["gradients"] \
            <= expected["gradients"] + in_flight + 1e-9
        total = sum(per_param.values())
        assert total == pytest.approx({0: 16, 1: 4 + 12 / dp, 2: 2 + 14 / dp}[zero],
                                      abs=in_flight + 1e-3)


def test_gpt3_175b_zero3_keeps_shards_and_gathers_one_layer():
    """ZeRO 3 (prefetch 0): weights, gradients and optimizer state resident
    as 1/dp shards (2/dp, 2/dp, 12/dp bytes a parameter); at the peak the
    weights also hold the gathered layer (2 bytes x a layer, with its gated
    shards, 1/dp more) and one parameter's flat copy, never the whole stage."""
    dp, layers = 2, 32
    r = simulate_gpt3(3, layers, dp, prefetch=0)
    s = r.summary()
    for stage in (1, 4):                                  # middle stages
        params = gpt3_stage_params(stage, layers // 8)
        peak = s["memory_by_category"][str(16 * stage)]
        assert peak["optimizer"] / params == pytest.approx(12.0 / dp, rel=1e-9)
        fc1 = 4 * H * H // 8
        assert 2.0 / dp <= peak["gradients"] / params <= 2.0 / dp + 2 * 2 * fc1 / params
        gathered = peak["weights"] - 2.0 * params / dp
        assert 0 < gathered <= 2 * LAYER_175B * (1 + 1 / dp) + 2 * fc1
        assert peak["weights"] < 2.0 * params              # never the whole stage


def test_sgd_state_is_4_bytes_per_parameter_plus_4_for_momentum():
    """SGD with fp32 master weights: optimizer state 4 bytes a parameter,
    8 with momentum (the buffer), divided over dp by ZeRO 1."""
    stage0, _, _ = small_stage0()
    for momentum, per in ((0.0, 4.0), (0.9, 8.0)):
        for zero in (0, 1):
            config = {**load_model_config("tiny"), "hidden": 64, "layers": 8, "vocab": 64,
                      "seq": 16, "momentum": momentum}
            r = distsim.simulate(model=config, topology="dgx-a100", dp=2, tp=2, pp=2, zero=zero,
                                 optimizer="sgd", network_mode="analytical")
            peak = r.summary()["memory_by_category"]["0"]
            state = model_state_bytes(stage0, zero, 2, optimizer="sgd", momentum=momentum > 0)
            assert state["optimizer"] == per * stage0 / (2 if zero else 1)
            assert peak["optimizer"] == state["optimizer"]
            assert peak["weights"] == state["weights"]
            assert r.program.meta["optimizer"] == "sgd"
