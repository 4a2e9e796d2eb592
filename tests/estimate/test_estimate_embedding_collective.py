"""The embedding's tensor-parallel collective (the vocabulary-parallel
all-reduce, or reduce-scatter with sp) ends the embedding's forward, and
the first layer waits for it. The template's first layer carried that wait
and the representative layer, which times every layer, did not, so the
estimator left one collective out of every micro-batch's forward: on PCIe,
where it is 0.21 ms, llama2-7b tp 4 read -2.6 % with one micro-batch and
-4.0 % with three before the fix (estimate against simulation)."""
from __future__ import annotations

import pytest

from distsim.estimate import AGREEMENT_TOLERANCE

from estimate_pairs import estimated_and_simulated

BASE = {"model": "llama2-7b", "topology": "workstation-4gpu-pcie", "dp": 1, "tp": 4,
        "layers": 2, "seq": 512, "micro_batch": 1, "zero": 0, "recompute": "none",
        "network_mode": "analytical"}


@pytest.mark.parametrize("batch, tolerance", [(1, 1e-9), (3, AGREEMENT_TOLERANCE)])
def test_the_embeddings_collective_is_in_its_forward(batch, tolerance):
    options = dict(BASE, global_batch=batch)
    row, sim = estimated_and_simulated(options)
    # one micro-batch: the whole timeline is the template's, exact
    assert row["step_time_s"] == pytest.approx(sim["step_time_s"], rel=tolerance)
    # (the estimator's bound covers step time and memory; its exposed
    # communication is held to 3 % here)
    assert row["exposed_communication_s"] == pytest.approx(sim["exposed_communication_s"],
                                                           rel=max(tolerance, 0.03))
