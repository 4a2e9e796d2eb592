"""The estimator against the full simulation with ZeRO 2 and 3 where the
adversarial sample (reports/estimator/) found it outside the README's
bounds (3 % on step time, 2 % on memory); each case failed before its fix.

* ZeRO 2/3 with a reduce-scatter per micro-batch: the first micro-batch's
  gradients are flattened and reduce-scattered one by one as the backward
  produces them (and with one micro-batch that is the whole sync, which
  the optimizer waits for). The estimate started all of a task's
  reduce-scatters at the task's start, before any gradient existed
  (-6.4 % to -16.3 % on step time); it now emits that backward op by op,
  as it does the last backward without a per-micro-batch reduce-scatter.
"""
from __future__ import annotations

import pytest

import distsim
from distsim.sweep import estimate as est

STEP_TOLERANCE = 0.03

ONE_MICROBATCH = {"model": "gpt3-1.3b", "topology": "dgx-a100", "dp": 8, "layers": 2,
                  "seq": 512, "micro_batch": 1, "global_batch": 8, "zero": 2,
                  "optimizer": "sgd", "network_mode": "analytical"}


def test_zero2_reduce_scatters_follow_their_gradients():
    # one micro-batch, no pipeline: the same timeline as the simulator's (was -6.35 %)
    sim = distsim.simulate(**ONE_MICROBATCH).summary()
    row = est.estimate(ONE_MICROBATCH)
    assert row["step_time_s"] == pytest.approx(sim["step_time_s"], rel=1e-9)
    assert row["exposed_communication_s"] == pytest.approx(sim["exposed_communication_s"],
                                                           rel=1e-6)


def test_zero2_first_microbatch_with_a_pipeline():
    # GPipe over two stages, one micro-batch, tensor and sequence parallel (was -16.3 %)
    options = {"model": "llama3-8b", "topology": "dgx-a100-x4", "dp": 8, "tp": 2, "pp": 2,
               "layers": 4, "seq": 512, "micro_batch": 1, "global_batch": 8,
               "schedule": "gpipe", "sp": True, "zero": 2, "network_mode": "analytical"}
    sim = distsim.simulate(**options).summary()
    row = est.estimate(options)
    assert row["step_time_s"] == pytest.approx(sim["step_time_s"], rel=STEP_TOLERANCE)

