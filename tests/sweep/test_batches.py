"""Estimated points go to local worker processes in batches that share a
per-layer profile (distsim.sweep.batches); the rows are the same as
one point at a time, in the same order."""
from __future__ import annotations

import pandas as pd

import distsim
from distsim.sweep.batches import batch_tasks, profile_group

GPT2 = {"model": "gpt2", "layers": 4, "global_batch": 32, "network_mode": "analytical",
        "topology": "dgx-a100", "fidelity": "estimate"}


def test_points_that_share_a_profile_are_batched_in_point_order():
    tasks = [(f"k{i}", {**GPT2, "tp": tp, "pp": pp, "zero": zero})
             for i, (tp, pp, zero) in enumerate(
                 [(1, 1, 0), (1, 2, 0), (1, 4, 0), (2, 2, 1), (1, 8, 0), (2, 4, 2),
                  (1, 2, 3), (2, 1, 0)])]
    tasks.append(("sim", {"model": "mlp", "dp": 2}))
    batches = batch_tasks(tasks, max_batch=2)
    assert [[key for key, _ in b] for b in batches] == [
        ["k0"], ["k1", "k2"], ["k3", "k5"], ["k4"], ["k6"], ["k7"], ["sim"]]
    assert profile_group(tasks[1][1]) == profile_group(tasks[2][1])
    # pp 8 over 4 layers: refused by the estimator, grouped with what it refuses
    assert profile_group(tasks[4][1]) != profile_group(tasks[1][1])
    assert profile_group(tasks[3][1]) == profile_group(tasks[5][1])   # ZeRO 1 and 2
    assert profile_group(tasks[-1][1]) is None


def test_batched_processes_give_the_rows_of_one_process():
    grid = {"tp": [1, 2], "pp": [1, 2, 4], "zero": [0, 1, 2, 3]}
    one = distsim.sweep(GPT2, grid, workers=1, progress=False)
    two = distsim.sweep(GPT2, grid, workers=2, progress=False)
    assert (one["status"] == "ok").sum() > 10
    pd.testing.assert_frame_equal(one, two)


def test_lanes_keep_neighbouring_batches_together_and_share_at_the_end():
    from distsim.sweep.batches import Lanes
    batches = [[(f"k{i}", {})] * n for i, n in enumerate([2, 2, 2, 2, 1, 1])]
    lanes = Lanes(batches, 2)
    assert [len(lane) for lane in lanes.lanes] == [2, 4]     # 4 points each
    assert lanes.take(0) is batches[0] and lanes.take(1) is batches[2]
    assert lanes.take(0) is batches[1]
    assert lanes.take(0) is batches[5]      # lane 0 is done: the end of lane 1
    assert lanes.take(1) is batches[3] and lanes.take(1) is batches[4]
    assert not lanes
