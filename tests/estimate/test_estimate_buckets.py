"""The estimator against the full simulation with gradient buckets where
the adversarial sample (reports/estimator/) found it outside the README's
3 % (step) / 2 % (memory) bounds; each case failed before its fix (the
numbers in the comments: estimate against simulation, before).

* ZeRO 3: a task's first gathers wait for the compute emitted before them
  (LowerSPMD gates them on the rank's last compute op, the previous
  task's), not only for the task's input. With a reduce-scatter per
  micro-batch the backward's accumulation held the communication stream
  and hid it; with ``bucket_mb 0`` the next backward's gathers ran under
  the previous backward's compute.
* ZeRO 2/3 with ``bucket_mb 0``: after the backward pass each gradient is
  flattened into a copy, one after another on the compute stream, while
  their reduce-scatters queue on the communication stream; each copy lives
  until its reduce-scatter ends, each shard it makes until its update.
* ZeRO 0/1 with ``bucket_mb``: a bucket of several gradients is a flat
  copy (a concat) that lives until the buckets are unpacked after the
  backward pass, so the buckets flushed by a backward's earlier blocks
  are held while its later blocks run, activations and all.
"""
from __future__ import annotations

import pytest

from estimate_pairs import assert_within_bounds


def test_zero3_bucket0_gathers_wait_for_the_previous_task():
    # GPipe on PCIe: each backward's gathers (the 3.2 ms lm_head's among
    # them) ran under the previous backward's compute (-17.3 %)
    options = {"model": "gpt3-1.3b", "topology": "workstation-4gpu-pcie", "dp": 2, "pp": 2,
               "layers": 2, "seq": 1024, "micro_batch": 2, "global_batch": 16,
               "schedule": "gpipe", "partition": "balanced", "zero": 3, "prefetch": 2,
               "recompute": "none", "bucket_mb": 0, "network_mode": "analytical"}
    assert_within_bounds(options, memory=False)


@pytest.mark.parametrize("zero", [2, 3])
def test_zero23_bucket0_flat_copies_queued_after_the_backward(zero):
    # the peak is the last flat copy made, every earlier one still waiting
    # for its reduce-scatter (ZeRO 2: -9.1 %, ZeRO 3: -3.5 %)
    options = {"model": "llama2-7b", "topology": "workstation-4gpu-pcie", "dp": 2, "tp": 2,
               "layers": 2, "seq": 512, "micro_batch": 1, "global_batch": 6,
               "sp": zero == 2, "zero": zero, "recompute": "none", "bucket_mb": 0,
               "network_mode": "analytical"}
    assert_within_bounds(options)


@pytest.mark.parametrize("options", [
    # 1 MB buckets: each large weight flushed with the small ones before
    # it; the peak is the tied embedding's gradient, with the buckets of
    # every layer held (-6.4 %)
    {"model": "gpt3-1.3b", "topology": "dgx-a100", "dp": 8, "layers": 4, "seq": 512,
     "micro_batch": 2, "global_batch": 32, "zero": 0, "recompute": "full", "bucket_mb": 1},
    # tensor and sequence parallelism, 5 MB buckets (-3.3 %)
    {"model": "gpt2", "topology": "dgx-a100-x2", "dp": 4, "tp": 4, "layers": 4, "seq": 256,
     "micro_batch": 1, "global_batch": 12, "sp": True, "zero": 0, "recompute": "full",
     "bucket_mb": 5},
], ids=["gpt3-1mb", "gpt2-tp4-5mb"])
def test_zero0_buckets_flushed_during_the_backward(options):
    options = dict(options, network_mode="analytical")
    assert_within_bounds(options)
