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
    for p in (1, 2):  # one more layer (2 bytes a parameter), give or take the gated
        # shards in flight (at most another half layer at dp 2)
        assert 0.9 * 2 * layer <= gathered[p] - gathered[p - 1] <= 1.5 * 2 * layer


def test_oom_reports_the_dominating_category():
    r = distsim.simulate(model="gpt3-175b", topology="dgx-a100", tp=8, layers=24, seq=64,
                         global_batch=1, network_mode="analytical")
    s = r.summary()
    assert s["oom"] and s["oom_category"] == "optimizer"
    assert "OOM" in r.summary_table() and "optimizer" in r.summary_table()
