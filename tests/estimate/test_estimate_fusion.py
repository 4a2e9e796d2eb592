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
