"""A pipeline stage holds the activation it received from the stage before
(the residual stream its first layer's backward reads) until its backward,
once per micro-batch in flight; the stage that sent it freed its own copy
once sent, though the template counts that value in the saved activations
of the layer that made it. The estimator moved it to the receiving chunk.
Both cases read the last stage's peak (the head's backward, every
micro-batch's activations held under GPipe) low before the fix (estimate
against simulation: -2.5 %, -2.3 %; 4 micro-batches x one received
activation)."""
from __future__ import annotations

import pytest

from estimate_pairs import assert_within_bounds

MEMORY_TOLERANCE = 0.002

CASES = {
    "gpt3-1.3b gpipe pp 4": {
        "model": "gpt3-1.3b", "topology": "dgx-a100-x4", "dp": 2, "tp": 4, "pp": 4,
        "layers": 4, "seq": 1024, "micro_batch": 4, "global_batch": 32, "schedule": "gpipe",
        "zero": 0, "recompute": "none", "network_mode": "analytical"},
    "llama3-8b gpipe tp 8 pp 2": {
        "model": "llama3-8b", "topology": "dgx-a100-x2", "dp": 1, "tp": 8, "pp": 2,
        "layers": 4, "seq": 512, "micro_batch": 4, "global_batch": 16, "schedule": "gpipe",
        "zero": 0, "recompute": "selective", "order": "tp-pp-dp", "optimizer": "sgd",
        "network_mode": "analytical"},
}


@pytest.mark.parametrize("name", list(CASES))
def test_received_activations_count_on_the_receiving_stage(name):
    options = CASES[name]
    assert_within_bounds(options, step=False, memory_tolerance=MEMORY_TOLERANCE)
