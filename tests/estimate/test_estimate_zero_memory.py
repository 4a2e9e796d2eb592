"""The estimator's peak memory against the full simulation with ZeRO 1/2
where the adversarial sample (reports/estimator/) found it outside its
error bound; each case failed before its fix (the numbers in the
comments: estimate against simulation, before).

* The optimizer's transient was measured on a template that updates whole
  parameters (dp 1), where ZeRO 1/2/3 with dp > 1 update a 1/dp shard:
  the update's temporaries (SGD's fp32 copy of the gradient) shrink by
  shard / whole, and ZeRO 1/2 add the new parameter all-gathered whole.
* ZeRO 2/3 reduce-scatter each micro-batch's gradients: a gradient is a
  value of its own (the buffer is a shard) and is flattened into a copy
  of the same size right after the op that makes it (both live at once),
  which the template, writing gradients into whole buffers in place, never
  holds; and the copies still waiting for their reduce-scatters add up
  inside the backward that makes them and at each block of later ones.
"""
from __future__ import annotations

import pytest

import distsim
from distsim.estimate import AGREEMENT_TOLERANCE
from distsim.estimate import point as est
from distsim.models import load_model_config

#: GPT-2 with its loss in float32 (``loss_dtype: fp32``)
GPT2_FP32 = {**load_model_config("gpt2"), "loss_dtype": "fp32"}


def _memory(options):
    sim = distsim.simulate(**options).summary()["max_peak_memory_bytes"]
    return est.estimate(options)["max_peak_memory_bytes"], sim


def test_zero2_optimizer_transient_on_the_shard():
    # the sim's peak is in the backward (the lm_head gradient); the
    # template's SGD update made a 2 x 77 MB transient (a flat gradient
    # and its fp32 copy) the ZeRO 2 shard of dp 16 does not (+28.5 %)
    options = {"model": "gpt2", "topology": "dgx-a100-x4", "dp": 16, "pp": 2, "layers": 2,
               "seq": 512, "micro_batch": 1, "global_batch": 128, "schedule": "1f1b",
               "zero": 2, "recompute": "full", "order": "pp-dp-tp", "optimizer": "sgd",
               "network_mode": "analytical"}
    row, sim = _memory(options)
    assert row == pytest.approx(sim, rel=AGREEMENT_TOLERANCE)


def test_zero1_optimizer_transient_on_the_shard():
    # ZeRO 1: the flat gradient is whole, its sliced shard and the update
    # are not (+3.9 %)
    options = {"model": "llama3-8b", "topology": "dgx-a100-x2", "dp": 16, "layers": 2,
               "seq": 512, "micro_batch": 2, "global_batch": 32, "zero": 1,
               "optimizer": "sgd", "network_mode": "analytical"}
    row, sim = _memory(options)
    assert row == pytest.approx(sim, rel=AGREEMENT_TOLERANCE)


def test_zero2_whole_gradient_and_its_flat_copy():
    # GPipe, one micro-batch: the last stage's peak is the lm_head
    # gradient (525 MB per tensor-parallel rank) made by a reduce_sum of
    # the matmul's as large output, no longer written into a whole buffer
    # (-15.4 %)
    options = {"model": "llama3-8b", "topology": "dgx-a100-x4", "dp": 8, "tp": 2, "pp": 2,
               "layers": 4, "seq": 512, "micro_batch": 1, "global_batch": 8,
               "schedule": "gpipe", "sp": True, "zero": 2, "recompute": "none",
               "network_mode": "analytical"}
    row, sim = _memory(options)
    assert row == pytest.approx(sim, rel=AGREEMENT_TOLERANCE)


def test_zero2_flat_copies_waiting_inside_the_backward():
    # PCIe, dp 2: the embedding's gradient and its flat copy (1 GB each)
    # while the copies of the layers' gradients made just before still
    # wait for their slow reduce-scatters (+8.4 %: the optimizer's
    # transient overestimated; -8.4 % with that fixed alone)
    options = {"model": "llama3-8b", "topology": "workstation-4gpu-pcie", "dp": 2, "pp": 2,
               "layers": 4, "seq": 512, "micro_batch": 1, "global_batch": 2,
               "schedule": "1f1b", "zero": 2, "recompute": "none", "optimizer": "sgd",
               "network_mode": "analytical"}
    row, sim = _memory(options)
    assert row == pytest.approx(sim, rel=AGREEMENT_TOLERANCE)


def test_zero2_flat_copies_waiting_per_block_of_a_later_backward():
    # interleaved, four virtual stages: the embedding's flat copy of one
    # backward is still waiting when the next backward of that chunk
    # starts, but not by the time it reaches the embedding (+22.6 % when
    # counted at every block)
    options = {"model": "gpt2", "topology": "dgx-a100-x2", "dp": 8, "pp": 2, "layers": 8,
               "seq": 256, "micro_batch": 1, "global_batch": 32, "schedule": "interleaved",
               "virtual_stages": 4, "zero": 2, "recompute": "full", "optimizer": "sgd",
               "network_mode": "analytical"}
    row, sim = _memory(options)
    assert row == pytest.approx(sim, rel=AGREEMENT_TOLERANCE)


#: gpt2 on a ZeRO-2 pipeline under megatron's fused kernels: the estimate
#: 679.7 MB, the simulation 705.9 MB (-3.7 %; unfused and pytorch-eager
#: within 2 kB, the step times equal under every setting)
FUSED_PIPELINE_PEAK = "ZeRO 2 pipeline, megatron fusion: peak 3.7 % under the simulation's"


@pytest.mark.parametrize("options", [
    # measured unfused (the fused peak: the strict expected failure below)
    {"model": "gpt2", "topology": "workstation-4gpu-pcie", "dp": 2, "pp": 2, "layers": 4,
     "seq": 256, "micro_batch": 1, "global_batch": 8, "schedule": "1f1b", "zero": 2,
     "fusion": "none"},
    pytest.param({"model": "gpt2", "topology": "workstation-4gpu-pcie", "dp": 2, "pp": 2,
                  "layers": 4, "seq": 256, "micro_batch": 1, "global_batch": 8,
                  "schedule": "1f1b", "zero": 2, "fusion": "megatron"},
                 marks=pytest.mark.xfail(raises=AssertionError, strict=True,
                                         reason=FUSED_PIPELINE_PEAK)),
    {"model": "llama2-7b", "topology": "workstation-4gpu-pcie", "dp": 4, "layers": 2,
     "seq": 512, "micro_batch": 1, "global_batch": 8, "zero": 2, "recompute": "full",
     "optimizer": "sgd"},
    # the loss in float32: the last stage's forward peaks at the cast of its
    # logits, before the loss ends, where the lm_head's reduce-scatter is
    # still running (counted at the forward's end: 660.8 against 679.7 MB);
    # under Megatron's fusion the loss is its steps (at one rank too),
    # whose backward peaks at its last pass, after reduce-scatters that
    # were running as it started have ended (counted at its start: 726.5
    # against 717.0 MB)
    {"model": GPT2_FP32, "topology": "workstation-4gpu-pcie", "dp": 2, "pp": 2, "layers": 4,
     "seq": 256, "micro_batch": 1, "global_batch": 8, "schedule": "1f1b", "zero": 2,
     "fusion": "none"},
    {"model": GPT2_FP32, "topology": "workstation-4gpu-pcie", "dp": 2, "pp": 2, "layers": 4,
     "seq": 256, "micro_batch": 1, "global_batch": 8, "schedule": "1f1b", "zero": 2,
     "fusion": "megatron"}],
    ids=["pipeline", "pipeline-megatron", "one-stage", "pipeline-fp32-loss",
         "pipeline-megatron-fp32-loss"])
def test_copies_still_waiting_where_a_later_backward_makes_its_gradients(options):
    # ZeRO 2 on PCIe: the first backward's flat copies wait long for their
    # reduce-scatters. A later backward peaks where it makes a gradient
    # and its flat copy; the copies still waiting then are those whose
    # reduce-scatters have not ended by that op, not all those waiting
    # when its block started (gpt2's lm_head, 77 MB: +13.1 %; llama2-7b
    # +4.9 %). Both to within a few kB of the simulator's.
    row, sim = _memory({**options, "network_mode": "analytical"})
    assert row == pytest.approx(sim, rel=1e-5)
