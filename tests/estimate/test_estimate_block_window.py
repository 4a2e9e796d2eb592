"""A block's transient memory is measured on the template's memory curve
inside the block's time window; the samples at the window's last instant
belong to the op that starts there. The embedding's last backward ends
with the tied gradient's all-reduce, and at that instant the optimizer
casts the gradient to float32 (twice its bytes): counted as the
embedding's backward transient, it was charged to every backward of the
embedding's chunk, activations and all (+5.4 % before the fix, against
the full simulation). Then -1.4 %: the next backward (sequence parallel)
starts with collectives that re-gather what its forward kept, which the
communication stream runs once the embedding's last collective is over,
while the embedding still computes its gradient: their results count at
the end of the block before (:attr:`distsim.estimate.profile.Block.b_early`).
"""
from __future__ import annotations

from estimate_pairs import INPUTS_UNFUSED, assert_within_bounds


def test_next_ops_results_are_not_the_blocks_transient():
    options = {"model": "gpt3-1.3b", "topology": "dgx-a100-x2", "dp": 1, "tp": 8, "pp": 2,
               "layers": 4, "seq": 512, "micro_batch": 1, "global_batch": 4,
               "schedule": "interleaved", "virtual_stages": 2, "partition": "balanced",
               "sp": True, "zero": 0, "recompute": "none", "bucket_mb": 25, "optimizer": "sgd",
               "network_mode": "analytical", **INPUTS_UNFUSED}
    assert_within_bounds(options, step=False)
