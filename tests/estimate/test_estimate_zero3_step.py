"""The estimator's ZeRO-3 step time against the full simulation where the
adversarial sample (reports/estimator/) found it outside its error bound
(then 3 %); each case failed before its fix (in the comments: estimate
against simulation, before).

* The embedding's forward waited for the communication stream (the
  prefetched gathers of the next blocks) before computing anything: its
  compute before its tensor-parallel reduce-scatter runs as soon as its
  own table is gathered (and the first reshape of the gathered table was
  not part of the block).
* A block's compute waited for all of the block's gathers at its start:
  in the simulator only the reshape of a gathered parameter waits, for
  that parameter's gather (the op-by-op backward: the compute before the
  block's first read; the forward: each read). The backwards emitted block
  by block (``bucket_mb 0``: no reduce-scatter per micro-batch, all but
  the last) waited for all of a block's gathers at its start: their first
  compute piece is cut at its reads as the forward's is.
"""
from __future__ import annotations

import pytest

import distsim
from distsim.estimate import AGREEMENT_TOLERANCE
from distsim.estimate import point as est


def _step(options):
    sim = distsim.simulate(**options).step_time_s
    return est.estimate(options)["step_time_s"], sim


def test_zero3_embedding_and_head_do_not_wait_for_every_gather():
    # tp 2, prefetch 2, one micro-batch: the embedding computes under the
    # layers' gathers, the head's backward starts its loss gradient before
    # the tied table is gathered again (+7.1 %)
    options = {"model": "gpt2", "topology": "workstation-4gpu-pcie", "dp": 2, "tp": 2,
               "layers": 2, "seq": 512, "micro_batch": 2, "global_batch": 4, "sp": True,
               "zero": 3, "prefetch": 2, "recompute": "none", "network_mode": "analytical"}
    row, sim = _step(options)
    assert row == pytest.approx(sim, rel=1e-6)


def test_zero3_forward_waits_per_parameter_prefetch_0():
    # prefetch 0, PCIe: each layer's gathers take longer than its compute;
    # the compute reads each parameter as it is gathered (+7.3 %)
    options = {"model": "llama2-7b", "topology": "workstation-4gpu-pcie", "dp": 2, "tp": 2,
               "layers": 4, "seq": 512, "micro_batch": 2, "global_batch": 12, "zero": 3,
               "prefetch": 0, "recompute": "none", "network_mode": "analytical"}
    row, sim = _step(options)
    assert row == pytest.approx(sim, rel=AGREEMENT_TOLERANCE)


def test_zero3_forward_waits_per_parameter_without_tensor_parallelism():
    # tp 1, pp 2, prefetch 0 (+7.4 %)
    options = {"model": "tiny", "topology": "dgx-a100", "dp": 4, "pp": 2, "layers": 4,
               "micro_batch": 1, "global_batch": 16, "schedule": "1f1b", "zero": 3,
               "prefetch": 0, "recompute": "none", "bucket_mb": 25,
               "network_mode": "analytical"}
    row, sim = _step(options)
    assert row == pytest.approx(sim, rel=AGREEMENT_TOLERANCE)


@pytest.mark.parametrize("options", [
    # the head's backward computes its loss gradient under the tied
    # table's gather (GPipe, prefetch 2: +0.8 %, and -1.7 % on memory,
    # where the next layer's gates are live as it starts)
    {"model": "gpt3-1.3b", "topology": "workstation-4gpu-pcie", "dp": 2, "pp": 2, "layers": 2,
     "seq": 1024, "micro_batch": 2, "global_batch": 16, "schedule": "gpipe",
     "partition": "balanced", "zero": 3, "prefetch": 2, "recompute": "none", "bucket_mb": 0},
    # GPipe over 4 stages, prefetch 0 (+4.0 %)
    {"model": "gpt3-1.3b", "topology": "dgx-a100-x4", "dp": 8, "pp": 4, "layers": 4, "seq": 512,
     "micro_batch": 1, "global_batch": 64, "schedule": "gpipe", "zero": 3, "prefetch": 0,
     "recompute": "none", "bucket_mb": 0},
    # one stage, tp 2, prefetch 0 (+2.1 %)
    {"model": "tiny", "topology": "dgx-a100", "dp": 4, "tp": 2, "layers": 4, "micro_batch": 4,
     "global_batch": 48, "zero": 3, "prefetch": 0, "recompute": "selective", "bucket_mb": 0},
], ids=["gpipe-prefetch2", "gpipe-prefetch0", "tp2-prefetch0"])
def test_zero3_block_level_backward_waits_per_parameter(options):
    options = dict(options, network_mode="analytical")
    sim = distsim.simulate(**options).summary()
    row = est.estimate(options)
    assert row["step_time_s"] == pytest.approx(sim["step_time_s"], rel=1e-3)
    assert row["max_peak_memory_bytes"] == pytest.approx(sim["max_peak_memory_bytes"],
                                                         rel=AGREEMENT_TOLERANCE)
