"""The estimator follows the fusion setting: its template is lowered under
the same setting (the setting is part of the profile's key), so where the
unfused estimate is the simulator's step, the fused one is too."""
from __future__ import annotations

import pytest

from estimate_pairs import estimated_and_simulated

from distsim.estimate.point import cache_key

CASE = {"model": "tiny", "topology": "dgx-a100-x2", "dp": 2, "tp": 2, "pp": 4, "layers": 4,
        "micro_batch": 1, "global_batch": 6, "schedule": "1f1b", "zero": 1,
        "recompute": "selective", "network_mode": "analytical"}


def test_each_setting_is_the_simulators_step():
    steps = {}
    for fusion in ("none", "pytorch-eager", "megatron"):
        row, sim = estimated_and_simulated(dict(CASE, fusion=fusion))
        assert row["step_time_s"] == pytest.approx(sim["step_time_s"], rel=1e-9), fusion
        steps[fusion] = sim["step_time_s"]
    assert steps["megatron"] < steps["pytorch-eager"] < steps["none"]


def test_settings_have_profiles_of_their_own():
    keys = {f: cache_key(dict(CASE, fusion=f)) for f in ("none", "megatron")}
    assert keys["none"] != keys["megatron"]
    assert cache_key(CASE) == keys["megatron"]      # the GPT family's default


@pytest.mark.parametrize("tp", [1, 2])
def test_megatron_core_is_the_simulators_step(tp):
    # a SwiGLU model (silu+mul fused) with its loss in float32 (at tp 1 one
    # fused kernel under megatron-core, Megatron-LM's steps under megatron)
    model = {"name": "llama2-7b", "family": "gpt", "layers": 2, "hidden": 64, "heads": 4,
             "kv_heads": 4, "ffn": 172, "vocab": 512, "seq": 64, "activation": "swiglu",
             "norm": "rmsnorm", "position": "rope", "tied_embeddings": False, "bias": False,
             "dtype": "bf16", "loss_dtype": "fp32"}
    case = {"model": model, "topology": "dgx-a100", "dp": 8 // (2 * tp), "tp": tp, "pp": 2,
            "layers": 2, "micro_batch": 1, "global_batch": 8, "network_mode": "analytical"}
    steps = {}
    for fusion in ("megatron", "megatron-core"):
        row, sim = estimated_and_simulated(dict(case, fusion=fusion))
        assert row["step_time_s"] == pytest.approx(sim["step_time_s"], rel=1e-9), fusion
        assert row["max_peak_memory_bytes"] == pytest.approx(sim["max_peak_memory_bytes"],
                                                             rel=0.01), fusion
        steps[fusion] = sim["step_time_s"]
    assert steps["megatron-core"] < steps["megatron"]
