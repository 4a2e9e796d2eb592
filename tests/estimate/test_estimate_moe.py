"""The estimator on mixture-of-experts models without expert parallelism:
every layer MoE (Mixtral's layout), dense and MoE layers mixed (the first
dense, DeepSeekMoE's; every other one, GShard's), each layer timed and
counted by its own kind's block (distsim.estimate.layer_kinds), and the
routing balance part of the profile's key."""
from __future__ import annotations

import pytest

import distsim
from distsim.errors import ConfigError
from distsim.estimate import AGREEMENT_TOLERANCE, cache_key, estimate, resolve
from distsim.estimate.blocks import LAYER, MOE
from distsim.estimate.context import StepContext
from distsim.estimate.layer_kinds import layer_blocks, probe_layers
from distsim.estimate.point import _profile_for
from distsim.models.gpt import GPTConfig

#: a small GPT whose MLPs route to top-2 of 4 SwiGLU experts of 64, with
#: a shared expert
ALL_MOE = {"family": "gpt", "name": "small-moe", "layers": 4, "hidden": 64, "heads": 4,
       "vocab": 128, "seq": 32, "global_batch": 8, "experts": 4, "top_k": 2,
       "expert_ffn": 64, "shared_experts": 1, "activation": "swiglu"}
FIRST_DENSE = {**ALL_MOE, "name": "first-dense", "dense_layers": 1}
EVERY_OTHER = {**ALL_MOE, "name": "every-other", "moe_every": 2, "shared_experts": 0}


def _options(model, **strategy):
    return {"model": model, "topology": "dgx-a100", "network_mode": "analytical", **strategy}


def _config(model) -> GPTConfig:
    return GPTConfig.from_dict({k: v for k, v in model.items() if k not in ("family", "name")})


def test_each_layer_has_the_block_of_its_kind():
    assert layer_blocks(_config(ALL_MOE)) is None           # all alike: one template
    assert layer_blocks(_config(FIRST_DENSE)) == (LAYER, MOE, MOE, MOE)
    assert layer_blocks(_config(EVERY_OTHER)) == (MOE, LAYER, MOE, LAYER)
    # the fewest layers showing a parameter of each kind
    assert probe_layers(_config(ALL_MOE)) == 1
    assert probe_layers(_config(FIRST_DENSE)) == probe_layers(_config(EVERY_OTHER)) == 2


@pytest.mark.parametrize("model", [FIRST_DENSE, EVERY_OTHER])
def test_a_mixed_model_counts_every_layers_parameters_by_its_kind(model):
    case = resolve(_options(model, dp=4, tp=1, pp=2, global_batch=8))
    ctx = StepContext(case, _profile_for(case))
    profile = ctx.profile
    assert profile.layer_blocks == layer_blocks(case.config)
    names = {blk: {p.name.split("_", 1)[1] for p in profile.params[blk]} for blk in (LAYER, MOE)}
    assert any("router" in n for n in names[MOE]) and not any("router" in n
                                                                for n in names[LAYER])
    # every parameter of the model once, over the two stages (the tied
    # head's copy on the last stage aside): the model's own count
    counted = sum(ctx.param(key).numel for key, _ in ctx.all_params())
    tied_copy = case.config.vocab * case.config.hidden
    assert counted - tied_copy == case.config.parameter_count()
    # the chunks' blocks follow the layers' kinds
    kinds = layer_blocks(case.config)
    assert [name for name, layer in ctx.blocks_of("F", 0) if layer is not None] == list(kinds[:2])
    assert [name for name, layer in ctx.blocks_of("F", 1) if layer is not None] == list(kinds[2:])


def test_the_routing_balance_is_part_of_the_profiles_key():
    base = _options(FIRST_DENSE, dp=8)
    keys = {cache_key({**base, **extra}) for extra in (
        {}, {"routing_skew": 1.0}, {"routing_skew": 1.0, "capacity_factor": 1.0})}
    assert len(keys) == 3 and None not in keys
    even = _profile_for(resolve(base))
    skewed = _profile_for(resolve({**base, "routing_skew": 1.0}))
    capped = _profile_for(resolve({**base, "routing_skew": 1.0, "capacity_factor": 1.0}))
    # every token routed to one expert: each of the 4 experts has room for
    # all 32 tokens instead of 32 x 2 / 4 = 16, so the MoE block computes
    # more; a capacity factor of 1 caps the slots back at 16; the dense
    # layer's block is the same
    assert skewed.blocks[MOE].f_flops > even.blocks[MOE].f_flops
    assert capped.blocks[MOE].f_flops == even.blocks[MOE].f_flops
    assert skewed.blocks[LAYER].f_flops == even.blocks[LAYER].f_flops


@pytest.mark.parametrize("model, strategy", [
    (ALL_MOE, dict(dp=8)),
    (ALL_MOE, dict(dp=4, tp=2, zero=1)),
    (ALL_MOE, dict(dp=2, tp=2, pp=2, zero=2, global_batch=8)),
    (ALL_MOE, dict(dp=4, pp=2, zero=3, recompute="full", global_batch=16, micro_batch=2)),
    (FIRST_DENSE, dict(dp=8, zero=0, routing_skew=0.5)),
    (FIRST_DENSE, dict(dp=2, tp=2, pp=2, zero=1, recompute="selective", global_batch=8)),
    (FIRST_DENSE, dict(dp=4, tp=2, zero=2, sp=True, capacity_factor=1.25, global_batch=16)),
    (FIRST_DENSE, dict(dp=4, pp=2, zero=3, partition="balanced", global_batch=16)),
    (EVERY_OTHER, dict(dp=4, tp=1, pp=2, schedule="interleaved", virtual_stages=2,
                       global_batch=16, zero=1)),
    (EVERY_OTHER, dict(dp=2, tp=2, pp=2, zero=3, recompute="full", global_batch=8,
                       bucket_mb=0)),
    # ZB-H1: each kind's backward split into its B and W parts
    (FIRST_DENSE, dict(dp=4, pp=2, schedule="zb-h1", global_batch=16, zero=1)),
    (EVERY_OTHER, dict(dp=2, tp=2, pp=2, schedule="zb-h1", global_batch=8,
                       recompute="selective")),
], ids=lambda x: x.get("name") if "family" in x else ",".join(f"{k}={v}" for k, v in x.items()))
def test_the_estimate_agrees_with_the_simulation(model, strategy):
    options = _options(model, **strategy)
    row = estimate(options)
    summary = distsim.simulate(**options).summary()
    for key in ("step_time_s", "max_peak_memory_bytes"):
        error = abs(row[key] - summary[key]) / summary[key]
        assert error <= AGREEMENT_TOLERANCE, (key, row[key], summary[key], options)


def test_invalid_expert_parallelism_is_refused_as_the_simulator_refuses_it():
    # (valid points: tests/estimate/test_estimate_expert_parallel.py)
    with pytest.raises(ConfigError, match="--ep 8 does not divide"):
        estimate(_options(ALL_MOE, dp=8, ep=8))
    with pytest.raises(ConfigError, match="no experts"):
        estimate(_options("tiny", dp=8, ep=2))