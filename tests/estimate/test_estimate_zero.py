"""The estimator against the full simulation with ZeRO 2 and 3 where the
adversarial sample (reports/estimator/) found it outside its error bound;
each case failed before its fix.

* ZeRO 2/3 with a reduce-scatter per micro-batch: the first micro-batch's
  gradients are flattened and reduce-scattered one by one as the backward
  produces them (and with one micro-batch that is the whole sync, which
  the optimizer waits for). The estimate started all of a task's
  reduce-scatters at the task's start, before any gradient existed
  (-6.4 % to -16.3 % on step time); it now emits that backward op by op,
  as it does the last backward without a per-micro-batch reduce-scatter.
* The same, memory: the first micro-batch's backward accumulates nothing,
  so the compute runs on while its gradients' flat copies wait for their
  reduce-scatters; a copy is live until its reduce-scatter ends, through
  the tasks that start before then. The estimate did not count them
  (-9.9 % on peak memory); it now adds those still waiting when the
  backward ends and when each later task starts.
"""
from __future__ import annotations

import pytest

import distsim
from distsim.estimate import AGREEMENT_TOLERANCE
from distsim.estimate import point as est

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
    assert row["step_time_s"] == pytest.approx(sim["step_time_s"], rel=AGREEMENT_TOLERANCE)



PCIE_TWO_MICROBATCHES = {"model": "gpt3-1.3b", "topology": "workstation-4gpu-pcie", "dp": 4,
                         "layers": 2, "seq": 1024, "micro_batch": 1, "global_batch": 8,
                         "zero": 2, "network_mode": "analytical"}


def test_zero2_flat_gradient_copies_waiting_for_their_reduce_scatters():
    # F0 B0 F1 B1 on each rank. B0 ends with the tied embedding's gradient
    # (wte: 50,257 x 2,048 bf16 = 205,852,672 bytes), flattened into a copy
    # of the same size whose reduce-scatter over PCIe (about 4.8 ms) runs
    # through F1 into B1: the peak is B1's head (the wte gradient's matmul
    # and reduce_sum) with that copy still live. At the peak the simulator's
    # gradients are this rank's shards (a quarter of the 411,488,256 bytes
    # of weights) and the copy; the estimate was 205,852,672 bytes short
    # (-9.9 %)
    sim = distsim.simulate(**PCIE_TWO_MICROBATCHES).summary()
    wte_flat = 50257 * 2048 * 2
    weights = sim["memory_by_category"]["0"]["weights"]
    assert sim["memory_by_category"]["0"]["gradients"] == weights // 4 + wte_flat
    row = est.estimate(PCIE_TWO_MICROBATCHES)
    assert row["max_peak_memory_bytes"] == pytest.approx(sim["max_peak_memory_bytes"],
                                                         rel=AGREEMENT_TOLERANCE)
