"""The estimator follows ``p2p_scatter`` (a pipeline transfer of a value
every tensor-parallel rank holds whole sent as 1/tp from each rank and
all-gathered on the receiving stage, :mod:`distsim.transforms.pipeline_split`):
the pieces sliced where the schedule places the send, their bytes on the
wire, the gather as the reading task starts, from the same answer of
which values split (:func:`distsim.estimate.crossing.stage_crossing`)."""
from __future__ import annotations

import pytest

from estimate_pairs import estimated_and_simulated

from distsim.estimate import AGREEMENT_TOLERANCE
from distsim.estimate.crossing import stage_crossing
from distsim.models.gpt_family import build_gpt_step, gpt_config
from distsim.transforms.strategy import Strategy

BASE = {"model": "gpt3-1.3b", "topology": "dgx-a100-x2", "layers": 8, "seq": 1024,
        "network_mode": "analytical", "micro_batch": 1}


@pytest.mark.parametrize("changes", [
    {"tp": 4, "pp": 2, "dp": 2, "global_batch": 16},
    # Megatron-LM 2021's setting scaled down: interleaved, full
    # recomputation, one all-reduce after the backward, synchronous p2p
    {"tp": 8, "pp": 2, "dp": 1, "global_batch": 8, "schedule": "interleaved",
     "virtual_stages": 2, "recompute": "full", "bucket_mb": 0, "comm_order": "stream",
     "p2p": "synchronous"},
    {"tp": 4, "pp": 4, "dp": 1, "global_batch": 8, "schedule": "interleaved",
     "virtual_stages": 2, "recompute": "full"},
    {"tp": 4, "pp": 2, "dp": 2, "global_batch": 16, "zero": 3},
    {"tp": 4, "pp": 2, "dp": 2, "global_batch": 16, "schedule": "zb-h1"},
    {"tp": 4, "pp": 2, "dp": 2, "global_batch": 16, "zero": 2, "network_mode": "flow"},
], ids=["1f1b", "interleaved-sync", "interleaved-recompute", "zero3", "zb-h1", "flow"])
def test_scattered_transfers_are_estimated_as_simulated(changes):
    case = {**BASE, **changes}
    on, sim_on = estimated_and_simulated({**case, "p2p_scatter": True})
    off, sim_off = estimated_and_simulated({**case, "p2p_scatter": False})
    for key in ("step_time_s", "max_peak_memory_bytes"):
        assert on[key] == pytest.approx(sim_on[key], rel=AGREEMENT_TOLERANCE), key
    # what the option moves, it moves by as much in both
    assert on["step_time_s"] / off["step_time_s"] == pytest.approx(
        sim_on["step_time_s"] / sim_off["step_time_s"], rel=AGREEMENT_TOLERANCE / 10)


def test_the_megatron_setting_is_faster_scattered():
    # 8 ranks of a stage send 1/8 each through their own NICs, the gather
    # runs over NVLink: less time on the wire than it adds
    case = {**BASE, "tp": 8, "pp": 2, "dp": 1, "global_batch": 8, "schedule": "interleaved",
            "virtual_stages": 2, "recompute": "full", "bucket_mb": 0, "comm_order": "stream",
            "p2p": "synchronous"}
    on, _ = estimated_and_simulated({**case, "p2p_scatter": True})
    off, _ = estimated_and_simulated({**case, "p2p_scatter": False})
    assert on["step_time_s"] < off["step_time_s"]


@pytest.mark.parametrize("sp", [False, True])
def test_the_crossing_values_say_which_split(sp):
    c = gpt_config({"layers": 2, "hidden": 64, "heads": 4, "vocab": 128, "seq": 32,
                    "micro_batch": 1, "global_batch": 1})
    step = build_gpt_step(c, Strategy(dp=1, tp=4, pp=2, sp=sp), 1)
    fwd, bwd, _, _, fwd_split, bwd_split = stage_crossing(step, 4, sp, "none")
    assert len(fwd_split) == len(fwd) == 1 and len(bwd_split) == len(bwd) == 1
    # the residual stream and its gradient: whole on every rank without
    # sequence parallelism (split), a shard of the sequence with it (not)
    expected = None if sp else c.dtype
    assert fwd_split == (expected,) and bwd_split == (expected,)
