"""The estimator's ``communication_s`` against the full simulation's: each
tensor-parallel collective counts its whole time, as the simulator's
summary counts it, not only the wait it causes inside its compute item
(the part under compute, e.g. the input gradient's all-reduce under the
weight gradient's GEMM, was left out: 35-43 % low on tensor-parallel
points before); the op-by-op last backward's collectives, communication
items of their own, and ZeRO 2's per-micro-batch reduce-scatters (waits of
single items) are counted once."""
from __future__ import annotations

import pytest

from estimate_pairs import estimated_and_simulated

CASES = {
    # tp 8 on NVLink, 3 micro-batches: -43 % before
    "tp 8": {"model": "llama2-7b", "topology": "dgx-a100", "dp": 1, "tp": 8, "layers": 2,
             "seq": 512, "micro_batch": 1, "global_batch": 3, "zero": 0, "recompute": "none"},
    # tp 4 on PCIe with selective recomputation: -33 % before
    "tp 4 pcie": {"model": "llama2-7b", "topology": "workstation-4gpu-pcie", "dp": 1, "tp": 4,
                  "layers": 2, "seq": 512, "micro_batch": 1, "global_batch": 3, "zero": 0,
                  "recompute": "selective"},
    # no tensor parallelism, ZeRO 2's reduce-scatter per micro-batch: exact
    # before, and must stay so
    "zero 2 tp 1": {"model": "gpt3-1.3b", "topology": "workstation-4gpu-pcie", "dp": 4,
                    "layers": 2, "seq": 1024, "micro_batch": 1, "global_batch": 8, "zero": 2,
                    "recompute": "none"},
}


@pytest.mark.parametrize("name", list(CASES))
def test_communication_counts_every_collective_once(name):
    options = dict(CASES[name], network_mode="analytical")
    row, sim = estimated_and_simulated(options)
    assert row["communication_s"] == pytest.approx(sim["communication_s"], rel=1e-6)
