"""The estimator follows ``tp_overlap`` (the backward's tensor-parallel
all-reduce, or reduce-scatter under sequence parallelism, issued before
the weight-gradient GEMM: :mod:`distsim.transforms.tp_order`): its
template is lowered in the same order (the option is part of the
profile's key), so the step it times holds each collective where the
simulated step does."""
from __future__ import annotations

import pytest

from estimate_pairs import estimated_and_simulated

from distsim.estimate import AGREEMENT_TOLERANCE
from distsim.estimate.point import cache_key

#: Korthikanti et al.'s setting scaled down: tp 8 with sequence
#: parallelism and selective recomputation, an interleaved pipeline, the
#: gradient sync after the backward, fused kernels, stream order (where
#: the order shows in time)
KORTHIKANTI_LIKE = {"model": "gpt3-1.3b", "topology": "dgx-a100-x2", "dp": 1, "tp": 8,
                    "pp": 2, "layers": 4, "seq": 1024, "micro_batch": 1, "global_batch": 4,
                    "schedule": "interleaved", "virtual_stages": 2, "sp": True,
                    "recompute": "selective", "bucket_mb": 0, "fusion": "megatron",
                    "comm_order": "stream", "network_mode": "analytical"}


@pytest.mark.parametrize("changes", [{}, {"tp": 4, "dp": 2, "zero": 1},
                                     {"schedule": "1f1b", "virtual_stages": None}])
def test_the_async_order_is_estimated_as_simulated(changes):
    case = {k: v for k, v in {**KORTHIKANTI_LIKE, **changes}.items() if v is not None}
    on, sim_on = estimated_and_simulated({**case, "tp_overlap": True})
    off, sim_off = estimated_and_simulated({**case, "tp_overlap": False})
    for key in ("step_time_s", "max_peak_memory_bytes"):
        assert on[key] == pytest.approx(sim_on[key], rel=AGREEMENT_TOLERANCE), key
    # the order is what moves the step: the all-reduce under the dW GEMM
    # shortens it in both, by as much
    assert sim_on["step_time_s"] < sim_off["step_time_s"]
    assert on["step_time_s"] / off["step_time_s"] == pytest.approx(
        sim_on["step_time_s"] / sim_off["step_time_s"], rel=AGREEMENT_TOLERANCE / 10)


def test_the_order_has_a_profile_of_its_own_with_tensor_parallelism():
    assert cache_key({**KORTHIKANTI_LIKE, "tp_overlap": True}) != cache_key(KORTHIKANTI_LIKE)
    one = {"model": "tiny", "topology": "workstation-4gpu-pcie", "dp": 4}
    # without tensor parallelism nothing moves: one profile for both
    assert cache_key({**one, "tp_overlap": True}) == cache_key(one)
