"""The estimator's peak memory in a chunk's first backward, against the full
simulation, where the adversarial sample (reports/estimator/) found it past
the README's 2 % bound; each case failed before the fix (estimate against
simulation, before, in the comments).

With several micro-batches, the first backward of a chunk (micro-batch 0)
writes its bare gradients as the accumulation buffers, where each later one
makes a gradient beside the buffer and adds it in (LowerSPMD's "first" and
"accumulate" modes). The estimator charged every backward the later ones'
transient (``Block.b_excess``); the first one's is the template's
micro-batch-0 measure (``b0_excess``). It matters where the first backward
holds the most activations: under GPipe every micro-batch's, under
interleaving the most of a chunk's.
"""
from __future__ import annotations

import pytest

from estimate_pairs import assert_within_bounds


CASES = {
    # the output layer's fresh weight gradient beside its buffer, counted
    # with all four micro-batches' activations held (+5.1 %)
    "llama3-8b gpipe zero 1": {
        "model": "llama3-8b", "topology": "dgx-a100-x4", "dp": 8, "tp": 2, "pp": 2,
        "layers": 2, "seq": 512, "micro_batch": 1, "global_batch": 32, "schedule": "gpipe",
        "sp": True, "zero": 1, "recompute": "none", "network_mode": "analytical"},
    # the same with gradient buckets flushed as soon as they fill (+3.7 %)
    "gpt2 gpipe zero 1 bucket 0": {
        "model": "gpt2", "topology": "dgx-a100-x2", "dp": 8, "tp": 1, "pp": 2, "layers": 2,
        "seq": 512, "micro_batch": 1, "global_batch": 32, "schedule": "gpipe",
        "partition": "balanced", "zero": 1, "recompute": "selective", "bucket_mb": 0,
        "network_mode": "analytical"},
    # interleaved, no data parallelism to reduce-scatter over (-4.9 %: the
    # peak moved to a later task, still wrong)
    "gpt2 interleaved zero 3": {
        "model": "gpt2", "topology": "dgx-a100-x2", "dp": 1, "tp": 4, "pp": 4, "layers": 8,
        "seq": 256, "micro_batch": 1, "global_batch": 8, "schedule": "interleaved",
        "virtual_stages": 2, "zero": 3, "recompute": "none", "network_mode": "analytical"},
}


@pytest.mark.parametrize("name", list(CASES))
def test_first_backward_peak_memory(name):
    options = CASES[name]
    assert_within_bounds(options, step=False)
