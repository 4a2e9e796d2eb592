"""The estimator under the all-gather token dispatcher (``dispatch:
allgather``): its profile is the lowered template of one expert-parallel
group, so each MoE block holds the group's all-gathers of the tokens and
probabilities and the reduce-scatter of the experts' partial outputs
where the all-to-all dispatcher holds two all-to-alls; the estimate agrees
with the simulation within :data:`AGREEMENT_TOLERANCE` as it does for the
all-to-all dispatcher (``test_estimate_expert_parallel.py``)."""
from __future__ import annotations

import pytest
from estimate_pairs import assert_within_bounds

#: top-2 of 4 SwiGLU experts of 64, a shared expert, the first layer dense
MODEL = {"family": "gpt", "name": "allgather-moe", "layers": 4, "hidden": 64, "heads": 4,
         "vocab": 128, "seq": 32, "global_batch": 8, "experts": 4, "top_k": 2,
         "expert_ffn": 64, "shared_experts": 1, "activation": "swiglu", "dense_layers": 1,
         "dispatch": "allgather"}


@pytest.mark.parametrize("strategy", [
    dict(dp=8, ep=2),
    dict(dp=8, ep=4, zero=1, global_batch=32),
    dict(dp=4, tp=2, ep=2, recompute="full"),
    dict(dp=4, tp=2, sp=True, ep=2),
    dict(dp=4, pp=2, ep=2, zero=2, global_batch=16),
    dict(dp=8, ep=2, zero=3),
], ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items()))
def test_the_estimate_agrees_with_the_simulation(strategy):
    assert_within_bounds({"model": MODEL, "topology": "dgx-a100",
                          "network_mode": "analytical", **strategy})
