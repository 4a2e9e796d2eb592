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

from estimate_pairs import assert_within_bounds, estimated_and_simulated

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
    assert_within_bounds(options, step=False)


# The sender's last layer, in its backward: the template takes its output
# off that layer's measure (gone by then there too), so the sending chunk,
# which took it off its saved activations once sent, counts it back for
# that block (it was counted off twice: tiny over 4 stages -4 kB, -1.1 %).
# And each micro-batch's token ids (the first stage) and labels (the last)
# are inputs live from the step's start until the backward that reads
# them: counted per micro-batch not yet read, not as whatever the
# template's two micro-batches held (tiny balanced pp 2 -2.0 %). Tiny's
# activations are a few kB: each estimate is the simulator's to 4 bytes.
TINY = {"model": "tiny", "topology": "dgx-a100", "micro_batch": 4, "network_mode": "analytical",
        "schedule": "1f1b", "optimizer": "adamw"}
STAGES = [
    dict(dp=2, tp=1, pp=4, layers=4, global_batch=64, zero=0, recompute="none", bucket_mb=0),
    dict(dp=2, tp=1, pp=4, layers=4, global_batch=8, zero=1, recompute="none", bucket_mb=0),
    dict(dp=2, tp=2, pp=2, layers=2, global_batch=32, partition="balanced", zero=0,
         recompute="selective", order="dp-tp-pp"),
    dict(dp=2, tp=2, pp=2, layers=2, global_batch=32, partition="balanced", sp=True, zero=0,
         recompute="selective", order="dp-tp-pp"),
]


@pytest.mark.parametrize("strategy", STAGES, ids=["zero0", "zero1", "balanced", "balanced-sp"])
def test_a_stage_holds_its_sent_output_and_its_data_as_the_simulator_does(strategy):
    row, sim = estimated_and_simulated({**TINY, **strategy})
    assert row["max_peak_memory_bytes"] == pytest.approx(sim["max_peak_memory_bytes"], abs=16)


@pytest.mark.parametrize("zero", [0, 3])
def test_a_received_value_lives_from_its_transfer(zero):
    # 1F1B's last stage receives the next micro-batch's input while it runs
    # the backward before (the transfer starts as the stage before ends its
    # forward): held from then on, not from the forward that reads it. The
    # head's backward peaks with it (gpt3-1.3b over 4 stages: -1.5 %; with
    # ZeRO 3 at dp 1 -1.4 %); now within 0.01 %
    options = {"model": "gpt3-1.3b", "topology": "dgx-a100-x2", "dp": 1, "tp": 4, "pp": 4,
               "layers": 4, "seq": 1024, "micro_batch": 4, "global_batch": 12,
               "schedule": "1f1b", "zero": zero, "recompute": "full",
               "network_mode": "analytical"}
    if zero == 3:
        options.update(prefetch=2, bucket_mb=0)
    row, sim = estimated_and_simulated(options)
    assert row["max_peak_memory_bytes"] == pytest.approx(sim["max_peak_memory_bytes"], rel=1e-4)
