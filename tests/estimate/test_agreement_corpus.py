"""The agreement corpus: the estimator against the full simulation
(analytical network) on configurations drawn at random, at the one error
bound the estimator's contract states (:data:`AGREEMENT_TOLERANCE`, on
step time and on peak memory).

Every option the estimator covers is varied: GPT-2, GPT-3 1.3B and Llama
shapes with 2-8 layers and shorter sequences, ``tiny`` and the generic
``gpt``; dgx-a100 (one and two nodes) and the PCIe workstation; tp x pp x
dp and the mesh order; micro-batch sizes and counts; 1F1B, GPipe and
interleaved schedules (virtual stages), balanced partitions, and apart
the zero-bubble ZB-H1 schedule (its split backward: ZeRO 0-3, ZeRO 2/3
reduce-scattering each micro-batch or after the backward pass with data
parallelism); sequence
parallelism; context parallelism apart (cp 2 / 4, each ``cp_comm``,
ZeRO 3 included; and with mixtures of experts, expert parallelism
included, under ZeRO 0-3, ZeRO 3 by parameter); ZeRO 0-3 (prefetch 0-2, by parameter or by layer);
recomputation; gradient buckets (none, 0, 1-100 MB); AdamW and SGD; and
apart the loss in float32 (``loss_dtype: fp32``), the backward's
tensor-parallel collectives before the weight-gradient GEMMs
(``tp_overlap``), the gradient buffers in fp32 (``fp32_grads``, ZeRO
0/1 over dp), and pipeline transfers scattered over the tensor-parallel
ranks (``p2p_scatter``). An
invalid point must be refused by both, with the same error class.

The draws are derandomized (the same points on every run); the
``@example`` points are where the random sample of
``reports/estimator/sample.py`` found the two furthest apart.
"""
from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Tuple

import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

import distsim
from distsim.errors import DistsimError
from distsim.estimate import AGREEMENT_TOLERANCE, estimate
from distsim.models import load_model_config

from estimate_pairs import INPUTS_UNFUSED

#: model -> (layer counts, sequence lengths: None keeps the model's)
MODELS = {
    "tiny": ((2, 4, 8), (None,)),
    "gpt": ((2, 4, 8), (None, 256)),
    "gpt2": ((2, 4, 6), (256, 512)),
    "gpt3-1.3b": ((2, 4), (256, 512, 1024)),
    "llama2-7b": ((2, 4), (256, 512)),
    "llama3-8b": ((2, 4), (256, 512)),
}
#: topology -> devices
TOPOLOGIES = {"dgx-a100": 8, "dgx-a100-x2": 16, "workstation-4gpu-pcie": 4}
ORDERS = ("tp-dp-pp", "tp-pp-dp", "dp-tp-pp", "dp-pp-tp", "pp-tp-dp", "pp-dp-tp")


def _divisors(n: int, most: int):
    return [d for d in (1, 2, 4, 8, 16) if n % d == 0 and d <= most]


def _draw_zero(draw, o: Dict[str, Any]) -> None:
    """ZeRO 0-3 into ``o``; with ZeRO 3 its prefetch (default, 0 or 2) and
    unit (by parameter or by layer)."""
    o["zero"] = draw(st.integers(0, 3))
    if o["zero"] == 3:
        prefetch = draw(st.sampled_from([None, 0, 2]))
        if prefetch is not None:
            o["prefetch"] = prefetch
        if draw(st.booleans()):
            o["zero3_unit"] = "layer"


@st.composite
def configurations(draw, zero_bubble: bool = False,
                   models: Mapping[str, Tuple[Tuple[int, ...], Tuple[Any, ...]]] = MODELS,
                   schedules: Tuple[str, ...] = ("1f1b", "gpipe", "interleaved")
                   ) -> Dict[str, Any]:
    """One configuration as ``distsim simulate`` options (analytical network);
    ``zero_bubble``: a pipeline under ZB-H1 (ZeRO 3 over dp too: its
    gathers in the forward and the input-gradient B tasks, the gradients
    reduce-scattered where the B or W task makes them final); of one of
    ``models`` (name -> layer counts, sequence lengths); a pipeline's
    schedule one of ``schedules``."""
    model = draw(st.sampled_from(sorted(models)))
    layer_counts, seqs = models[model]
    topology = draw(st.sampled_from(sorted(TOPOLOGIES)))
    n = TOPOLOGIES[topology]
    tp = draw(st.sampled_from([d for d in _divisors(n, 8) if not zero_bubble or n // d > 1]))
    pp = draw(st.sampled_from([d for d in _divisors(n // tp, 4) if not zero_bubble or d > 1]))
    dp = n // (tp * pp)
    o: Dict[str, Any] = {"model": model, "topology": topology, "dp": dp, "tp": tp, "pp": pp,
                         "layers": draw(st.sampled_from(layer_counts)),
                         "network_mode": "analytical"}
    seq = draw(st.sampled_from(seqs))
    if seq is not None:
        o["seq"] = seq
    micro_batch = draw(st.sampled_from([1, 1, 2, 4]))
    microbatches = draw(st.integers(1, 8 if pp > 1 else 3))
    o["micro_batch"] = micro_batch
    o["global_batch"] = dp * micro_batch * microbatches
    if zero_bubble:
        o["schedule"] = "zb-h1"
    elif pp > 1:
        o["schedule"] = draw(st.sampled_from(schedules))
        if o["schedule"] == "interleaved":
            o["virtual_stages"] = draw(st.integers(2, 4))
        if draw(st.booleans()):
            o["partition"] = "balanced"
    o["layers"] = max(o["layers"], pp * o.get("virtual_stages", 1))
    if tp > 1 and draw(st.booleans()):
        o["sp"] = True
    _draw_zero(draw, o)
    o["recompute"] = draw(st.sampled_from(["none", "selective", "full"]))
    bucket = draw(st.sampled_from([None, 0, 1, 5, 25, 100]))
    if bucket is not None:
        o["bucket_mb"] = bucket
    order = draw(st.sampled_from((None,) + ORDERS))
    if order is not None:
        o["order"] = order
    o["optimizer"] = draw(st.sampled_from(["adamw", "sgd"]))
    # unfused, by inputs (_agrees pins both); fused points are the examples below
    return o


#: known gaps (reports/estimator/README.md, "ZeRO 3 by parameter and by
#: layer"), measured on ZERO3_ONLY=1 reports/estimator/sample.py 77 200
ZERO3_TRAILING_ALL_REDUCE = (
    "ZeRO 3, bucket_mb 0, tp 8, dp 2 over two nodes: the step 2.3 % under the simulation's "
    "(a backward block's trailing tensor-parallel all-reduce queues behind the next "
    "layer's prefetched gathers; the block-level backward has its wait in the next "
    "block's template time)")
ZERO3_SPREAD_STEP = ("ZeRO 3, bucket_mb 0, dp 4 x tp 4 spread over two nodes (dp-tp-pp): "
                     "the step 1.5 % under the simulation's")
ZERO3_PREFETCH2_MEMORY = ("ZeRO 3, prefetch 2, dp 4 x tp 4 x pp 2, sp: peak memory 1.7 % "
                          "(by parameter) over the simulation's")
ZERO3_LAYER_PREFETCH2_MEMORY = ("ZeRO 3 by layer, prefetch 2: peak memory 4.1 % (dp 4 x tp 4 "
                                "x pp 2, sp) and 2.7 % (gpt3-1.3b dp 8, three micro-batches) "
                                "over the simulation's")


#: mixture-of-experts models: the named ones, and small shapes of the
#: mixes the named ones do not have (:data:`MOE_SHAPES`)
MOE_MODELS = {
    "mixtral-8x7b": ((2, 4), (256,)),          # every layer MoE, top-2 of 8
    "deepseek-moe-16b": ((2, 4), (256,)),      # the first layer dense, 2 shared experts
    "tiny-moe": ((2, 4, 8), (None,)),
    "gpt2-moe-every-2": ((2, 4, 6), (256,)),
}
MOE_SHAPES = {
    # top-2 of 4 with a shared expert, the first layer dense
    "tiny-moe": {"family": "gpt", "layers": 4, "hidden": 32, "heads": 4, "vocab": 64,
                 "seq": 16, "global_batch": 8, "experts": 4, "top_k": 2, "expert_ffn": 64,
                 "shared_experts": 1, "dense_layers": 1, "activation": "swiglu"},
    # top-1 of 4 every other layer (GShard's interleaving), the first MoE
    "gpt2-moe-every-2": {"family": "gpt", "layers": 4, "hidden": 768, "heads": 12,
                         "vocab": 50304, "seq": 256, "global_batch": 8, "experts": 4,
                         "top_k": 1, "moe_every": 2},
}


@st.composite
def moe_configurations(draw) -> Dict[str, Any]:
    """A configuration of a mixture-of-experts model (:data:`MOE_MODELS`),
    with a routing balance and a capacity factor drawn as well. ZeRO 3
    prefetching is drawn off (``prefetch: 0``): the memory of the
    parameters a block gathers ahead is bounded as whole from the block's
    start (:func:`distsim.estimate.profile_memory.prefetched_bytes`, the
    known gap of reports/estimator/README.md), which the experts' large
    weights make a few per cent (the expected failures below). The routing
    skew is drawn up to 0.3: at 1 (every expert's slots the whole
    micro-batch) the experts' tensor-parallel all-reduce is large enough
    that where the simulation queues it behind the gradient sync (tp > 1,
    two micro-batches) the template's timing of it shows in the peak
    (:data:`MOE_LAST_BACKWARD_ALL_REDUCE`). Under sequence parallelism full
    recomputation is drawn as selective (:data:`MOE_SHARED_BRANCHES_RECOMPUTED`)."""
    o = draw(configurations(models=MOE_MODELS))
    if o["zero"] == 3:
        o["prefetch"] = 0
    if o.get("sp") and o["recompute"] == "full":
        o["recompute"] = "selective"
    o["model"] = MOE_SHAPES.get(o["model"], o["model"])
    skew = draw(st.sampled_from([None, 0.0, 0.1, 0.3]))
    if skew is not None:
        o["routing_skew"] = skew
    capacity = draw(st.sampled_from([None, None, 1.0, 1.25]))
    if capacity is not None:
        o["capacity_factor"] = capacity
    return o


@st.composite
def expert_parallel_configurations(draw) -> Dict[str, Any]:
    """A :func:`moe_configurations` draw with expert parallelism: ``ep`` 2
    or 4 where it divides dp and the experts (dp 1: the draw is rejected),
    sequence parallelism as drawn (each tp rank routing its shard), ZeRO
    0-2, ZeRO 2 with ep = dp drawn as ZeRO 1 (as these draws always were:
    the other strategies drawing from this one keep their draws); ZeRO 2
    with ep = dp (:func:`expert_parallel_whole_configurations`) and ZeRO 3
    (:func:`expert_parallel_zero3_configurations`) have their own draws."""
    o = draw(moe_configurations())
    model = o["model"]
    experts = (model if isinstance(model, dict) else load_model_config(model))["experts"]
    eps = [e for e in (2, 4) if o["dp"] % e == 0 and experts % e == 0]
    assume(eps)
    o["ep"] = draw(st.sampled_from(eps))
    if o["zero"] == 3:
        o["zero"] = draw(st.integers(0, 2))
        o.pop("prefetch", None)
        o.pop("zero3_unit", None)
    if o["zero"] == 2 and o["dp"] == o["ep"]:
        o["zero"] = 1
    return o


#: known gap of ZeRO 2 with ep = dp (reports/estimator/README.md)
MOE_EP_WHOLE_UPDATE_MEMORY = (
    "Mixtral under ZeRO 2 with ep = dp 2 or 4 (an expert's weights of 117-235 M elements a "
    "rank, updated whole on their team of one rank): the estimate's largest optimizer "
    "transient is an expert's (its flat copy and update, twice its bytes, the template's "
    "measure), which sets the peak once the others' gradients are shards: peak memory "
    "1.2-3.7 % over the simulation's (not with a pipeline); at dp = ep = 8 (one expert a "
    "rank) the embedding's update is larger and the peak agrees")


@st.composite
def expert_parallel_whole_configurations(draw) -> Dict[str, Any]:
    """A :func:`moe_configurations` draw under ZeRO 2 with ``ep`` = dp (2
    or 4, dividing the experts): the experts' gradients, on a team of one
    rank, kept whole and accumulated in place beside the others
    reduce-scattered each micro-batch (or after the backward with
    ``bucket_mb`` 0); not of Mixtral (:data:`MOE_EP_WHOLE_UPDATE_MEMORY`)."""
    o = draw(moe_configurations())
    model = o["model"]
    experts = (model if isinstance(model, dict) else load_model_config(model))["experts"]
    assume(o["dp"] in (2, 4) and experts % o["dp"] == 0 and model != "mixtral-8x7b")
    o.update(ep=o["dp"], zero=2)
    o.pop("prefetch", None)
    o.pop("zero3_unit", None)
    return o


#: known gap of ZeRO 3 under expert parallelism (reports/estimator/README.md)
MOE_EP_ZERO3_TINY_MEMORY = (
    "tiny-moe (hidden 32, 16 tokens), ZeRO 3 under expert parallelism: peak memory about "
    "2 KiB (one dispatch buffer's bytes, experts x slots x hidden) over the simulation's at "
    "the MoE block's backward, where the experts' gathers run behind the others': 0.7-2.2 % "
    "of its 100 KiB; the larger MoE models (whose peaks are MiB) within the bound")


@st.composite
def expert_parallel_zero3_configurations(draw) -> Dict[str, Any]:
    """An :func:`expert_parallel_configurations` draw under ZeRO 3 by
    parameter, without prefetch (the known gap of prefetching the
    experts' weights, :data:`MOE_ZERO3_PREFETCH_MEMORY`), ep < dp (ep = dp
    has its own draws: :func:`expert_parallel_zero3_whole_configurations`),
    each
    parameter gathered and reduce-scattered over its own team (dp, or
    dp / ep for an expert's weights); not of tiny-moe
    (:data:`MOE_EP_ZERO3_TINY_MEMORY`)."""
    o = draw(expert_parallel_configurations())
    assume(o["ep"] < o["dp"] and o["model"] != MOE_SHAPES["tiny-moe"])
    o.update(zero=3, prefetch=0)
    o.pop("zero3_unit", None)
    return o


@st.composite
def expert_parallel_zero3_whole_configurations(draw) -> Dict[str, Any]:
    """A :func:`moe_configurations` draw under ZeRO 3 by parameter with
    ``ep`` = dp (2, 4 or 8, dividing the experts), without prefetch
    (:data:`MOE_ZERO3_PREFETCH_MEMORY`): the experts' weights, on a team
    of one rank, not gathered and their gradients kept whole, beside the
    others gathered and reduce-scattered over dp."""
    o = draw(moe_configurations())
    model = o["model"]
    experts = (model if isinstance(model, dict) else load_model_config(model))["experts"]
    assume(o["dp"] in (2, 4, 8) and experts % o["dp"] == 0)
    o.update(ep=o["dp"], zero=3, prefetch=0)
    o.pop("zero3_unit", None)
    return o


#: the MoE draws: 40, derandomized as the others
MOE_DRAWS = settings(derandomize=True, database=None, deadline=None, max_examples=40,
                     suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                                            HealthCheck.data_too_large])
#: known gaps of mixture-of-experts models (reports/estimator/README.md)
MOE_LAST_BACKWARD_ALL_REDUCE = (
    "MoE, tp 2 without sp, two micro-batches, routing_skew 1: the last backward's all-reduce "
    "of the "
    "experts' input gradient (experts x slots x hidden) queues behind the gradient sync in "
    "the simulation, after the experts' first GEMM; the template, without sync, runs it "
    "under that GEMM: peak memory 1.1-1.5 % over the simulation's")
MOE_SHARED_BRANCHES_RECOMPUTED = (
    "MoE with shared experts under sp, full recomputation, collectives in input order: the "
    "recomputed forward's routed branch (the slots' tp all-gather and reduce-scatter) and "
    "its shared experts' (their input's all-gather, their output's reduce-scatter) overlap "
    "each other's compute in the simulation more than the estimate's block does: step time "
    "1.1 % over at tp 8 (0.3 % without the shared experts; agreeing under stream order)")
MOE_ZERO3_PREFETCH_MEMORY = (
    "MoE, ZeRO 3 prefetching the experts' weights: the gathered parameters bounded as whole "
    "from the block's start, peak memory 1.2-3.3 % over the simulation's")


def _outcome(run) -> Tuple[Optional[Mapping[str, Any]], Optional[type]]:
    try:
        return run(), None
    except DistsimError as exc:
        return None, type(exc)


def _relative(estimated: float, simulated: float) -> float:
    return abs(estimated - simulated) / simulated


#: the draws of each test below: 100, derandomized (the same on every run)
DRAWS = settings(derandomize=True, database=None, deadline=None, max_examples=100,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                                        HealthCheck.data_too_large])


# the points of reports/estimator/sample.py (seed 1234, 300 draws) past
# the bound before the estimator modelled what they miss
@example({'model': 'tiny', 'topology': 'dgx-a100-x2', 'dp': 2, 'tp': 2, 'pp': 4, 'layers': 4,
          'network_mode': 'analytical', 'micro_batch': 1, 'global_batch': 6, 'schedule': '1f1b',
          'sp': True, 'zero': 1, 'recompute': 'selective'})
@example({'model': 'gpt3-1.3b', 'topology': 'dgx-a100-x2', 'dp': 4, 'tp': 4, 'pp': 1,
          'layers': 2, 'network_mode': 'analytical', 'seq': 512, 'micro_batch': 1,
          'global_batch': 12, 'sp': True, 'zero': 2, 'recompute': 'selective', 'bucket_mb': 1,
          'order': 'dp-tp-pp'})
@example({'model': 'gpt3-1.3b', 'topology': 'workstation-4gpu-pcie', 'dp': 4, 'tp': 1, 'pp': 1,
          'layers': 2, 'network_mode': 'analytical', 'seq': 1024, 'micro_batch': 1,
          'global_batch': 8, 'zero': 2, 'recompute': 'none'})
@example({'model': 'gpt2', 'topology': 'dgx-a100-x4', 'dp': 2, 'tp': 4, 'pp': 4, 'layers': 4,
          'network_mode': 'analytical', 'seq': 256, 'micro_batch': 2, 'global_batch': 16,
          'schedule': 'gpipe', 'sp': True, 'zero': 0, 'recompute': 'none'})
@example({'model': 'gpt3-1.3b', 'topology': 'dgx-a100', 'dp': 1, 'tp': 4, 'pp': 2, 'layers': 4,
          'network_mode': 'analytical', 'seq': 512, 'micro_batch': 4, 'global_batch': 32,
          'schedule': 'interleaved', 'virtual_stages': 2, 'zero': 0, 'recompute': 'none',
          'bucket_mb': 100, 'order': 'dp-tp-pp'})
@example({'model': 'llama2-7b', 'topology': 'dgx-a100-x2', 'dp': 4, 'tp': 2, 'pp': 2,
          'layers': 2, 'network_mode': 'analytical', 'seq': 1024, 'micro_batch': 2,
          'global_batch': 48, 'schedule': '1f1b', 'zero': 2, 'recompute': 'full',
          'bucket_mb': 25, 'order': 'pp-tp-dp'})
@example({'model': 'gpt3-1.3b', 'topology': 'dgx-a100-x2', 'dp': 4, 'tp': 4, 'pp': 1,
          'layers': 2, 'network_mode': 'analytical', 'seq': 512, 'micro_batch': 4,
          'global_batch': 16, 'sp': True, 'zero': 3, 'prefetch': 0, 'recompute': 'selective',
          'order': 'tp-pp-dp'})
@example({'model': 'gpt3-1.3b', 'topology': 'dgx-a100', 'dp': 2, 'tp': 2, 'pp': 2, 'layers': 2,
          'network_mode': 'analytical', 'seq': 1024, 'micro_batch': 1, 'global_batch': 8,
          'schedule': '1f1b', 'zero': 3, 'recompute': 'full', 'bucket_mb': 1})
@example({'model': 'gpt', 'topology': 'dgx-a100', 'dp': 2, 'tp': 1, 'pp': 4, 'layers': 8,
          'network_mode': 'analytical', 'micro_batch': 4, 'global_batch': 16, 'schedule': '1f1b',
          'zero': 3, 'prefetch': 2, 'recompute': 'selective', 'order': 'pp-dp-tp'})
@example({'model': 'gpt3-1.3b', 'topology': 'workstation-4gpu-pcie', 'dp': 2, 'tp': 2, 'pp': 1,
          'layers': 2, 'network_mode': 'analytical', 'seq': 1024, 'micro_batch': 2,
          'global_batch': 8, 'zero': 3, 'recompute': 'selective'})
@example({'model': 'gpt2', 'topology': 'workstation-4gpu-pcie', 'dp': 2, 'tp': 2, 'pp': 1,
          'layers': 2, 'network_mode': 'analytical', 'seq': 512, 'micro_batch': 2,
          'global_batch': 4, 'sp': True, 'zero': 3, 'prefetch': 2, 'recompute': 'none'})
@example({'model': 'gpt', 'topology': 'workstation-4gpu-pcie', 'dp': 2, 'tp': 2, 'pp': 1,
          'layers': 8, 'network_mode': 'analytical', 'micro_batch': 1, 'global_batch': 4,
          'zero': 3, 'recompute': 'full', 'optimizer': 'sgd'})
@example({'model': 'gpt', 'topology': 'dgx-a100-x4', 'dp': 4, 'tp': 4, 'pp': 2, 'layers': 8,
          'network_mode': 'analytical', 'micro_batch': 4, 'global_batch': 128,
          'schedule': '1f1b', 'zero': 3, 'prefetch': 2, 'recompute': 'full', 'bucket_mb': 0,
          'order': 'dp-tp-pp'})
@example({'model': 'gpt2', 'topology': 'dgx-a100', 'dp': 2, 'tp': 1, 'pp': 4, 'layers': 8,
          'network_mode': 'analytical', 'seq': 512, 'micro_batch': 2, 'global_batch': 32,
          'schedule': 'interleaved', 'virtual_stages': 2, 'zero': 3, 'recompute': 'none',
          'order': 'dp-tp-pp'})
@example({'model': 'gpt3-1.3b', 'topology': 'dgx-a100-x2', 'dp': 1, 'tp': 4, 'pp': 4,
          'layers': 4, 'network_mode': 'analytical', 'seq': 1024, 'micro_batch': 4,
          'global_batch': 12, 'schedule': '1f1b', 'zero': 3, 'prefetch': 2, 'recompute': 'full',
          'bucket_mb': 0})
@example({'model': 'gpt3-1.3b', 'topology': 'dgx-a100', 'dp': 2, 'tp': 1, 'pp': 4, 'layers': 4,
          'network_mode': 'analytical', 'seq': 512, 'micro_batch': 1, 'global_batch': 16,
          'schedule': '1f1b', 'zero': 3, 'recompute': 'full'})
@example({'model': 'llama2-7b', 'topology': 'workstation-4gpu-pcie', 'dp': 4, 'tp': 1, 'pp': 1,
          'layers': 4, 'network_mode': 'analytical', 'seq': 1024, 'micro_batch': 4,
          'global_batch': 48, 'zero': 3, 'recompute': 'none', 'order': 'pp-dp-tp',
          'optimizer': 'sgd'})
@example({'model': 'gpt3-1.3b', 'topology': 'workstation-4gpu-pcie', 'dp': 2, 'tp': 1, 'pp': 2,
          'layers': 2, 'network_mode': 'analytical', 'seq': 1024, 'micro_batch': 2,
          'global_batch': 16, 'schedule': 'gpipe', 'partition': 'balanced', 'zero': 3,
          'prefetch': 2, 'recompute': 'none', 'bucket_mb': 0})
@example({'model': 'gpt3-1.3b', 'topology': 'dgx-a100-x2', 'dp': 1, 'tp': 8, 'pp': 2,
          'layers': 4, 'network_mode': 'analytical', 'seq': 512, 'micro_batch': 1,
          'global_batch': 4, 'schedule': 'interleaved', 'virtual_stages': 2,
          'partition': 'balanced', 'sp': True, 'zero': 0, 'recompute': 'none', 'bucket_mb': 25,
          'optimizer': 'sgd'})
@example({'model': 'tiny', 'topology': 'dgx-a100', 'dp': 4, 'tp': 1, 'pp': 2, 'layers': 4,
          'network_mode': 'analytical', 'micro_batch': 1, 'global_batch': 16, 'schedule': '1f1b',
          'zero': 3, 'prefetch': 0, 'recompute': 'none', 'bucket_mb': 25})
@example({'model': 'llama3-8b', 'topology': 'dgx-a100-x2', 'dp': 8, 'tp': 2, 'pp': 1,
          'layers': 4, 'network_mode': 'analytical', 'seq': 512, 'micro_batch': 4,
          'global_batch': 32, 'sp': True, 'zero': 3, 'recompute': 'none'})
# ZeRO 3 by layer: a task's first unit of shards is concatenated while the
# stage waits for its input, only the gather after it is gated on it (was
# +1.17 %)
@example({'model': 'llama2-7b', 'topology': 'dgx-a100', 'dp': 2, 'tp': 1, 'pp': 4, 'layers': 4,
          'network_mode': 'analytical', 'seq': 1024, 'micro_batch': 1, 'global_batch': 8,
          'schedule': '1f1b', 'partition': 'balanced', 'zero': 3, 'zero3_unit': 'layer',
          'recompute': 'full'})
# ZeRO 3 by layer: the next task's first copy-in made where a backward
# ends, beside that backward's flat copies, its unit of shards, and its
# last gradient, which gates the gathers (was -4.88 %)
@example({'model': 'llama2-7b', 'topology': 'dgx-a100', 'dp': 2, 'tp': 1, 'pp': 4, 'layers': 8,
          'network_mode': 'analytical', 'seq': 512, 'micro_batch': 1, 'global_batch': 16,
          'schedule': 'interleaved', 'virtual_stages': 2, 'zero': 3, 'prefetch': 0,
          'zero3_unit': 'layer', 'recompute': 'none', 'bucket_mb': 1, 'order': 'dp-tp-pp',
          'optimizer': 'sgd'})
# ZeRO 3 by layer: a forward or backward right after a backward prefetches
# units while the backward's flat copies wait and its last gradient gates
# the gathers (was -1.12 %); two gathers back to back meet at one instant,
# the first's gate freed there (was +1.73 %)
@example({'model': 'llama2-7b', 'topology': 'dgx-a100-x2', 'dp': 2, 'tp': 4, 'pp': 2,
          'layers': 2, 'network_mode': 'analytical', 'seq': 512, 'micro_batch': 1,
          'global_batch': 6, 'schedule': '1f1b', 'zero': 3, 'zero3_unit': 'layer',
          'recompute': 'none', 'bucket_mb': 100})
@example({'model': 'llama2-7b', 'topology': 'dgx-a100-x2', 'dp': 2, 'tp': 8, 'pp': 1,
          'layers': 2, 'network_mode': 'analytical', 'seq': 1024, 'micro_batch': 1,
          'global_batch': 4, 'sp': True, 'zero': 3, 'zero3_unit': 'layer', 'recompute': 'none'})
# ZeRO 3 where that sample still finds the two apart: expected failures, so
# that closing a gap shows (an xfail example that passes fails)
@example({'model': 'llama2-7b', 'topology': 'dgx-a100-x2', 'dp': 2, 'tp': 8, 'pp': 1,
          'layers': 4, 'network_mode': 'analytical', 'seq': 512, 'micro_batch': 4,
          'global_batch': 24, 'zero': 3, 'recompute': 'selective', 'bucket_mb': 0}
         ).xfail(raises=AssertionError, reason=ZERO3_TRAILING_ALL_REDUCE)
@example({'model': 'gpt2', 'topology': 'dgx-a100-x2', 'dp': 4, 'tp': 4, 'pp': 1, 'layers': 2,
          'network_mode': 'analytical', 'seq': 256, 'micro_batch': 1, 'global_batch': 12,
          'zero': 3, 'recompute': 'none', 'bucket_mb': 0, 'order': 'dp-tp-pp'}
         ).xfail(raises=AssertionError, reason=ZERO3_SPREAD_STEP)
@example({'model': 'llama2-7b', 'topology': 'dgx-a100-x4', 'dp': 4, 'tp': 4, 'pp': 2,
          'layers': 4, 'network_mode': 'analytical', 'seq': 512, 'micro_batch': 1,
          'global_batch': 24, 'schedule': '1f1b', 'partition': 'balanced', 'sp': True,
          'zero': 3, 'prefetch': 2, 'recompute': 'none', 'order': 'dp-tp-pp'}
         ).xfail(raises=AssertionError, reason=ZERO3_PREFETCH2_MEMORY)
@example({'model': 'llama2-7b', 'topology': 'dgx-a100-x4', 'dp': 4, 'tp': 4, 'pp': 2,
          'layers': 4, 'network_mode': 'analytical', 'seq': 512, 'micro_batch': 1,
          'global_batch': 24, 'schedule': '1f1b', 'partition': 'balanced', 'sp': True,
          'zero': 3, 'prefetch': 2, 'zero3_unit': 'layer', 'recompute': 'none',
          'order': 'dp-tp-pp'}).xfail(raises=AssertionError, reason=ZERO3_LAYER_PREFETCH2_MEMORY)
@example({'model': 'gpt3-1.3b', 'topology': 'dgx-a100', 'dp': 8, 'tp': 1, 'pp': 1, 'layers': 2,
          'network_mode': 'analytical', 'seq': 1024, 'micro_batch': 4, 'global_batch': 96,
          'zero': 3, 'prefetch': 2, 'zero3_unit': 'layer', 'recompute': 'none',
          'bucket_mb': 25}).xfail(raises=AssertionError, reason=ZERO3_LAYER_PREFETCH2_MEMORY)
# fused kernels (megatron, pytorch-eager)
@example({'model': 'gpt2', 'topology': 'dgx-a100', 'dp': 2, 'tp': 4, 'pp': 1, 'layers': 4,
          'network_mode': 'analytical', 'seq': 512, 'micro_batch': 2, 'global_batch': 8,
          'sp': True, 'zero': 1, 'recompute': 'selective', 'fusion': 'megatron'})
@example({'model': 'gpt3-1.3b', 'topology': 'dgx-a100-x2', 'dp': 2, 'tp': 2, 'pp': 4,
          'layers': 4, 'network_mode': 'analytical', 'seq': 512, 'micro_batch': 1,
          'global_batch': 8, 'schedule': '1f1b', 'zero': 0,
          'recompute': 'none', 'fusion': 'pytorch-eager'})
@example({'model': 'gpt2', 'topology': 'workstation-4gpu-pcie', 'dp': 1, 'tp': 2, 'pp': 2,
          'layers': 6, 'network_mode': 'analytical', 'seq': 512, 'micro_batch': 1,
          'global_batch': 7, 'schedule': '1f1b', 'zero': 0, 'recompute': 'none',
          'optimizer': 'adamw', 'fusion': 'megatron'})
# ZeRO 2, one micro-batch: the embedding's gradient op starts while the
# first layer's flat copies still wait for their reduce-scatters (NCCL
# latency), which end before the op does (was -2.26 %; adamw -1.93 %;
# two micro-batches, recomputed: -1.77 %)
@example({'model': 'gpt3-1.3b', 'topology': 'dgx-a100', 'dp': 8, 'tp': 1, 'pp': 1, 'layers': 2,
          'network_mode': 'analytical', 'seq': 512, 'micro_batch': 1, 'global_batch': 8,
          'zero': 2, 'recompute': 'none', 'optimizer': 'sgd'})
@example({'model': 'gpt3-1.3b', 'topology': 'dgx-a100', 'dp': 8, 'tp': 1, 'pp': 1, 'layers': 2,
          'network_mode': 'analytical', 'seq': 512, 'micro_batch': 1, 'global_batch': 8,
          'zero': 2, 'recompute': 'none', 'optimizer': 'adamw'})
@example({'model': 'gpt3-1.3b', 'topology': 'dgx-a100', 'dp': 8, 'tp': 1, 'pp': 1, 'layers': 4,
          'network_mode': 'analytical', 'seq': 256, 'micro_batch': 1, 'global_batch': 16,
          'zero': 2, 'recompute': 'full', 'bucket_mb': 5, 'order': 'tp-pp-dp',
          'optimizer': 'sgd'})
@DRAWS
@given(configurations())
def test_the_estimate_agrees_with_the_simulation(options):
    _agrees(options)


#: known gap of ZB-H1 under ZeRO 3 (reports/estimator/README.md), found by
#: a wider random draw of such points than the corpus's
ZB_ZERO3_NEXT_GATES_MEMORY = (
    "ZB-H1, ZeRO 3 without prefetch: a W task's last gradient (the embedding's), its flat "
    "copy and its reduce-scatter's result are live while the next task's first gathers are "
    "gated (their shards' gated copies, live until the gathers run after that "
    "reduce-scatter), which the estimate counts at the next task only: peak memory 3.6 % "
    "(llama3-8b) and 6.3 % (gpt3-1.3b by layer) under the simulation's")


@example({'model': 'llama3-8b', 'topology': 'dgx-a100-x2', 'dp': 2, 'tp': 2, 'pp': 4,
          'layers': 4, 'network_mode': 'analytical', 'seq': 256, 'micro_batch': 1,
          'global_batch': 14, 'schedule': 'zb-h1', 'zero': 3, 'prefetch': 0,
          'recompute': 'selective', 'order': 'dp-pp-tp', 'optimizer': 'sgd'}
         ).xfail(raises=AssertionError, reason=ZB_ZERO3_NEXT_GATES_MEMORY)
@example({'model': 'gpt3-1.3b', 'topology': 'dgx-a100-x2', 'dp': 2, 'tp': 4, 'pp': 2,
          'layers': 2, 'network_mode': 'analytical', 'seq': 256, 'micro_batch': 1,
          'global_batch': 14, 'schedule': 'zb-h1', 'sp': True, 'zero': 3, 'prefetch': 0,
          'zero3_unit': 'layer', 'recompute': 'full', 'bucket_mb': 25, 'order': 'dp-tp-pp',
          'optimizer': 'sgd'}).xfail(raises=AssertionError, reason=ZB_ZERO3_NEXT_GATES_MEMORY)
@DRAWS
@given(configurations(zero_bubble=True))
def test_the_zero_bubble_estimate_agrees_with_the_simulation(options):
    _agrees(options)


#: known gaps under stream order (reports/estimator/README.md)
STREAM_INTERLEAVED_MEMORY = (
    "interleaved, tp 8 with sp, fused: peak memory 1.5 % over the simulation's (0.8 % with "
    "collectives ordered by their inputs: stream order takes 2.1 MB off the simulation's "
    "peak, where the next task's sequence-parallel all-gather no longer runs under the "
    "embedding's backward, and 0.3 MB off the estimate's)")
STREAM_ZB_PER_GROUP_MEMORY = (
    "ZB-H1, ZeRO 2, sp, comm_streams per-group: peak memory 1.4 % under the simulation's "
    "(the last stage's second W task starts while the first's head reduce-scatter runs)")


@st.composite
def stream_ordered_configurations(draw) -> Dict[str, Any]:
    """A configuration (any schedule, ZB-H1 among them) under stream order
    (``comm_order: stream``), with or without Megatron's fused kernels."""
    o = draw(configurations(zero_bubble=draw(st.booleans())))
    o["comm_order"] = "stream"
    fusion = draw(st.sampled_from([None, "megatron"]))
    if fusion is not None:
        o["fusion"] = fusion
    return o


# where reports/estimator/sample.py (COMM_ORDER=stream, with FUSION=megatron
# and without) and a wider draw of this test found the two furthest apart:
# the ZeRO-3 gap of collectives ordered by their inputs, and two on memory
# (reports/estimator/README.md)
@example({'model': 'gpt', 'topology': 'dgx-a100', 'dp': 2, 'tp': 4, 'pp': 1, 'layers': 4,
          'network_mode': 'analytical', 'micro_batch': 2, 'global_batch': 8, 'sp': True,
          'zero': 3, 'recompute': 'selective', 'bucket_mb': 0, 'fusion': 'megatron',
          'comm_order': 'stream'}).xfail(raises=AssertionError, reason=ZERO3_TRAILING_ALL_REDUCE)
@example({'model': 'gpt3-1.3b', 'topology': 'dgx-a100-x2', 'dp': 1, 'tp': 8, 'pp': 2,
          'layers': 4, 'network_mode': 'analytical', 'seq': 512, 'micro_batch': 1,
          'global_batch': 4, 'schedule': 'interleaved', 'virtual_stages': 2,
          'partition': 'balanced', 'sp': True, 'zero': 0, 'recompute': 'none', 'bucket_mb': 25,
          'optimizer': 'sgd', 'fusion': 'megatron', 'comm_order': 'stream'}
         ).xfail(raises=AssertionError, reason=STREAM_INTERLEAVED_MEMORY)
@example({'model': 'gpt', 'topology': 'dgx-a100-x2', 'dp': 4, 'tp': 2, 'pp': 2, 'layers': 2,
          'network_mode': 'analytical', 'seq': 256, 'micro_batch': 1, 'global_batch': 8,
          'schedule': 'zb-h1', 'sp': True, 'zero': 2, 'recompute': 'none', 'optimizer': 'adamw',
          'comm_order': 'stream', 'comm_streams': 'per-group'}
         ).xfail(raises=AssertionError, reason=STREAM_ZB_PER_GROUP_MEMORY)
@DRAWS
@given(stream_ordered_configurations())
def test_the_stream_ordered_estimate_agrees_with_the_simulation(options):
    _agrees(options)


#: gaps of the memory walk under ZB-H1 with ZeRO 2 and 3 (the same with
#: ``p2p: async``: not the engine's), found by this test's draws
ZB_ZERO2_LAST_STAGE_MEMORY = (
    "ZB-H1, ZeRO 2 over dp 4, pp 2, no sp (gpt3-1.3b, seq 512, two micro-batches): peak "
    "memory on the last stage 4.7 % under the simulation's, whatever the engine or order")
ZB_ZERO3_STREAM_MEMORY = (
    "ZB-H1, ZeRO 3 (prefetch 1) over dp 2 x tp 2 x pp 2, sp, one micro-batch, stream order "
    "(llama2-7b, 4 layers, seq 256): peak memory 1.06 % over the simulation's, whatever the "
    "engine")


@st.composite
def waiting_engine_configurations(draw) -> Dict[str, Any]:
    """A pipeline (pp > 1: the draw is rejected otherwise; any schedule,
    ZB-H1 among them) whose engine waits for its transfers (``p2p:
    synchronous`` or ``separate``), under stream order (the estimator
    refuses them by inputs), with or without Megatron's fused kernels.
    ZB-H1 with ZeRO 2 or 3 is drawn off: its memory walk has gaps of its
    own there, whatever the engine (:data:`ZB_ZERO2_LAST_STAGE_MEMORY`,
    :data:`ZB_ZERO3_STREAM_MEMORY`, the expected failures below)."""
    o = draw(configurations(zero_bubble=draw(st.booleans())))
    assume(o["pp"] > 1)
    assume(not (o.get("schedule") == "zb-h1" and o["zero"] >= 2))
    o["p2p"] = draw(st.sampled_from(["synchronous", "separate"]))
    return _ordered_and_fused(draw, o, ("stream",))


@example({'model': 'gpt3-1.3b', 'topology': 'dgx-a100', 'dp': 4, 'tp': 1, 'pp': 2,
          'layers': 2, 'network_mode': 'analytical', 'seq': 512, 'micro_batch': 1,
          'global_batch': 8, 'schedule': 'zb-h1', 'zero': 2, 'recompute': 'none',
          'optimizer': 'adamw', 'p2p': 'synchronous', 'comm_order': 'stream'}
         ).xfail(raises=AssertionError, reason=ZB_ZERO2_LAST_STAGE_MEMORY)
@example({'model': 'llama2-7b', 'topology': 'dgx-a100', 'dp': 2, 'tp': 2, 'pp': 2,
          'layers': 4, 'network_mode': 'analytical', 'seq': 256, 'micro_batch': 1,
          'global_batch': 2, 'schedule': 'zb-h1', 'sp': True, 'zero': 3, 'recompute': 'none',
          'optimizer': 'adamw', 'p2p': 'synchronous', 'comm_order': 'stream'}
         ).xfail(raises=AssertionError, reason=ZB_ZERO3_STREAM_MEMORY)
@DRAWS
@given(waiting_engine_configurations())
def test_the_estimate_of_an_engine_waiting_for_its_transfers_agrees(options):
    _agrees(options)


@st.composite
def interleaved_synchronous_configurations(draw) -> Dict[str, Any]:
    """An interleaved pipeline (pp > 1: the draw is rejected otherwise)
    whose engine waits for each group of transfers, as Megatron-LM's
    interleaved schedule of 2021-2022 does (``p2p: synchronous``), under
    stream order. At tp 8 without sequence parallelism is drawn off: the
    known memory gap of interleaved schedules there
    (:data:`INTERLEAVED_TP8_MEMORY`); and the ``tiny`` model, whose
    interleaved steps of a few milliseconds the estimate puts up to 1.1 %
    over the simulation's whatever the ``p2p`` (:data:`INTERLEAVED_TINY_STEP`,
    the expected failure below)."""
    o = draw(configurations(schedules=("interleaved",),
                            models={k: v for k, v in MODELS.items() if k != "tiny"}))
    assume(o["pp"] > 1)
    assume(not (o["tp"] == 8 and not o.get("sp")))
    o["p2p"] = "synchronous"
    return _ordered_and_fused(draw, o, ("stream",))


#: found by the draws of the test below: the estimate over the simulation's
#: by as much under ``p2p: async``, before the exchanges were placed as
#: Megatron-LM's (1.14 %) and after (1.12 %)
INTERLEAVED_TINY_STEP = (
    "interleaved v 3 over pp 2, tp 4 with sp, selective recompute, Megatron's kernels "
    "(tiny, 6 layers, 6 micro-batches): step 1.01 % over the simulation's (async 1.1 %)")


@example({'model': 'tiny', 'topology': 'dgx-a100', 'dp': 1, 'tp': 4, 'pp': 2, 'layers': 6,
          'network_mode': 'analytical', 'micro_batch': 1, 'global_batch': 6,
          'schedule': 'interleaved', 'virtual_stages': 3, 'sp': True, 'zero': 0,
          'recompute': 'selective', 'optimizer': 'adamw', 'p2p': 'synchronous',
          'comm_order': 'stream', 'fusion': 'megatron'}
         ).xfail(raises=AssertionError, reason=INTERLEAVED_TINY_STEP)
@settings(DRAWS, max_examples=40)
@given(interleaved_synchronous_configurations())
def test_the_interleaved_synchronous_estimate_agrees(options):
    _agrees(options)


@st.composite
def tp_overlap_configurations(draw) -> Dict[str, Any]:
    """A configuration with tensor parallelism (tp > 1: the draw is
    rejected otherwise) and the backward's tensor-parallel collectives
    issued before the weight-gradient GEMMs (``tp_overlap``), any
    schedule, ZB-H1 among them, collectives ordered by their inputs or
    behind the compute (the order shows in time under ``stream``), with or
    without Megatron's fused kernels. Interleaved at tp 8 without sequence
    parallelism is drawn off: its memory is the known gap of interleaved
    schedules there, the same in either order
    (:data:`INTERLEAVED_TP8_MEMORY`, the expected failure below)."""
    o = draw(configurations(zero_bubble=draw(st.booleans())))
    assume(o["tp"] > 1)
    assume(not (o.get("schedule") == "interleaved" and o["tp"] == 8 and not o.get("sp")))
    o["tp_overlap"] = True
    return _ordered_and_fused(draw, o, ("stream", "stream", "inputs"))


def _ordered_and_fused(draw, o: Dict[str, Any], orders: Tuple[str, ...]) -> Dict[str, Any]:
    """``o`` with a ``comm_order`` drawn from ``orders``, with Megatron's
    fused kernels or without."""
    o["comm_order"] = draw(st.sampled_from(orders))
    fusion = draw(st.sampled_from([None, "megatron"]))
    if fusion is not None:
        o["fusion"] = fusion
    return o


#: a gap of interleaved schedules, the same with tp_overlap off (not the
#: order's): tp 8 without sequence parallelism (gpt3-1.3b, seq 1024)
INTERLEAVED_TP8_MEMORY = (
    "interleaved v 2 over pp 2, tp 8 without sp, recompute full or none: peak memory -0.8 % "
    "to +1.5 % (up to 4.2 MB, one sequence x hidden activation, replicated over tp) off "
    "the simulation's on the first stage, with the backward's tensor-parallel collectives "
    "in either order")


# where a draw of 100 found the two furthest apart (drawn off since; under
# stream order, as drawn, the pipeline's two directions moving at once
# have closed it, by inputs it stays)
@example({'model': 'gpt3-1.3b', 'topology': 'dgx-a100-x2', 'dp': 1, 'tp': 8, 'pp': 2,
          'layers': 4, 'network_mode': 'analytical', 'seq': 1024, 'micro_batch': 1,
          'global_batch': 2, 'schedule': 'interleaved', 'virtual_stages': 2,
          'partition': 'balanced', 'zero': 0, 'recompute': 'full', 'bucket_mb': 5,
          'order': 'dp-tp-pp', 'optimizer': 'sgd', 'fusion': 'megatron', 'comm_order': 'inputs',
          'tp_overlap': True}
         ).xfail(raises=AssertionError, reason=INTERLEAVED_TP8_MEMORY)
@DRAWS
@given(tp_overlap_configurations())
def test_the_tp_overlap_estimate_agrees_with_the_simulation(options):
    _agrees(options)


@st.composite
def p2p_scatter_configurations(draw) -> Dict[str, Any]:
    """A pipeline with tensor parallelism (tp > 1 and pp > 1: the draw is
    rejected otherwise; any schedule, ZB-H1 among them) whose transfers of
    values every tensor-parallel rank holds whole go as 1/tp from each rank
    and are gathered on arrival (``p2p_scatter``), any engine under stream
    order (async by inputs), with or without Megatron's fused kernels.
    ZB-H1 with ZeRO 2 or 3 under a waiting engine is drawn off
    (:data:`ZB_ZERO2_LAST_STAGE_MEMORY`)."""
    o = draw(configurations(zero_bubble=draw(st.booleans())))
    assume(o["tp"] > 1 and o["pp"] > 1)
    o["p2p_scatter"] = True
    o = _ordered_and_fused(draw, o, ("stream", "stream", "inputs"))
    if o["comm_order"] == "stream":
        o["p2p"] = draw(st.sampled_from(["async", "synchronous", "separate"]))
        assume(not (o["p2p"] != "async" and o.get("schedule") == "zb-h1" and o["zero"] >= 2))
    return o


@settings(DRAWS, max_examples=30)
@given(p2p_scatter_configurations())
def test_the_p2p_scatter_estimate_agrees_with_the_simulation(options):
    # a point past the bound with every rank sending whole values is a gap
    # of its own, not the option's: its draw is set aside. Found so: tp 8
    # without sp (gpt3-1.3b, 2 layers, 1F1B, micro-batch 2), the first
    # stage's peak 1.05 % over (one sequence x hidden activation), hidden
    # before by the last stage's higher peak; ZB-H1 with one micro-batch
    # (gpt2, tp 2, pp 4, by inputs), peak 1.5 % over
    assume(_within({**options, "p2p_scatter": False}))
    _agrees(options)


@st.composite
def fp32_grads_configurations(draw) -> Dict[str, Any]:
    """A configuration (any schedule, ZB-H1 among them; a mixture of
    experts under expert parallelism one draw in four) with its gradient
    buffers in fp32 (``fp32_grads``), collectives ordered by their inputs
    or behind the compute, with or without Megatron's fused kernels. ZeRO
    2/3 over dp > 1 is drawn as ZeRO 0/1: the estimator refuses it with
    fp32 buffers (:func:`distsim.estimate.point.resolve`)."""
    if draw(st.integers(0, 3)) == 0:
        o = draw(expert_parallel_configurations())
    else:
        o = draw(configurations(zero_bubble=draw(st.booleans())))
    o["fp32_grads"] = True
    if o["zero"] >= 2 and o["dp"] > 1:
        o["zero"] = draw(st.integers(0, 1))
        o.pop("prefetch", None)
        o.pop("zero3_unit", None)
    return _ordered_and_fused(draw, o, ("stream", "inputs"))


# a bucket (fp32: twice the bytes, it fills sooner) flushed inside the
# embedding's backward, at the position embedding's gradient, and held
# through the block's peak after it, where the tied table's gradients are
# summed (was 2.6 % under: counted from the next block on)
@example({'model': 'gpt2', 'topology': 'dgx-a100-x2', 'dp': 4, 'tp': 4, 'pp': 1, 'layers': 4,
          'network_mode': 'analytical', 'seq': 512, 'micro_batch': 1, 'global_batch': 4,
          'sp': True, 'zero': 1, 'recompute': 'selective', 'bucket_mb': 5, 'order': 'dp-pp-tp',
          'optimizer': 'sgd', 'fp32_grads': True, 'comm_order': 'stream'})
@DRAWS
@given(fp32_grads_configurations())
def test_the_fp32_grads_estimate_agrees_with_the_simulation(options):
    _agrees(options)


@st.composite
def fp32_loss_configurations(draw) -> Dict[str, Any]:
    """A configuration (any schedule, ZB-H1 among them; collectives in
    either order; with or without Megatron's fused kernels, which at one
    tensor-parallel rank write the loss as its vocabulary-parallel steps)
    whose loss is computed in float32 (``loss_dtype: fp32``, a model field:
    :func:`_with_loss_dtype`)."""
    o = draw(configurations(zero_bubble=draw(st.booleans())))
    # not ZeRO 3 synchronising after the backward (bucket_mb 0) with tp > 1:
    # the step's known gap (ZERO3_TRAILING_ALL_REDUCE), whatever the loss's
    # dtype (the expected failure below)
    assume(not (o["zero"] == 3 and o.get("bucket_mb") == 0 and o["tp"] > 1))
    if draw(st.booleans()):
        o["comm_order"] = "stream"
    fusion = draw(st.sampled_from([None, "megatron"]))
    if fusion is not None:
        o["fusion"] = fusion
    o["loss_dtype"] = "fp32"
    return o


# where the estimator departed with the loss in float32: a forward's flat
# copies counted at its end, not at the cast of the logits where the last
# stage peaks (gpt2 -2.8 %, the zero-bubble pipeline -3.6 %); a backward's
# at its start, not at the last pass of Megatron's loss (+1.3 %)
@example({'model': 'gpt2', 'topology': 'workstation-4gpu-pcie', 'dp': 2, 'pp': 2, 'layers': 4,
          'network_mode': 'analytical', 'seq': 256, 'micro_batch': 1, 'global_batch': 8,
          'schedule': '1f1b', 'zero': 2, 'recompute': 'none', 'loss_dtype': 'fp32'})
@example({'model': 'gpt2', 'topology': 'workstation-4gpu-pcie', 'dp': 2, 'pp': 2, 'layers': 4,
          'network_mode': 'analytical', 'seq': 256, 'micro_batch': 1, 'global_batch': 8,
          'schedule': '1f1b', 'zero': 2, 'recompute': 'none', 'fusion': 'megatron',
          'comm_order': 'stream', 'loss_dtype': 'fp32'})
@example({'model': 'gpt2', 'topology': 'dgx-a100-x2', 'dp': 4, 'tp': 1, 'pp': 4, 'layers': 4,
          'network_mode': 'analytical', 'seq': 256, 'micro_batch': 1, 'global_batch': 24,
          'schedule': 'zb-h1', 'zero': 2, 'bucket_mb': 2, 'fusion': 'megatron',
          'comm_order': 'stream', 'loss_dtype': 'fp32'})
# ZeRO 3, bucket_mb 0, tp 2: the step 1.02 % under the simulation's, as
# with the loss in bf16 (1.04 %, the same 76 us)
@example({'model': 'gpt', 'topology': 'dgx-a100', 'dp': 4, 'tp': 2, 'pp': 1, 'layers': 2,
          'network_mode': 'analytical', 'seq': 256, 'micro_batch': 1, 'global_batch': 8,
          'sp': True, 'zero': 3, 'prefetch': 0, 'recompute': 'selective', 'bucket_mb': 0,
          'optimizer': 'adamw', 'loss_dtype': 'fp32'}
         ).xfail(raises=AssertionError, reason=ZERO3_TRAILING_ALL_REDUCE)
@MOE_DRAWS      # 40 derandomized draws, as the MoE ones
@given(fp32_loss_configurations())
def test_the_estimate_agrees_with_the_simulation_with_the_loss_in_float32(options):
    _agrees(options)


@example({'model': 'deepseek-moe-16b', 'topology': 'dgx-a100', 'dp': 4, 'tp': 2, 'pp': 1,
          'layers': 2, 'network_mode': 'analytical', 'seq': 256, 'micro_batch': 1,
          'global_batch': 8, 'zero': 1, 'recompute': 'none', 'optimizer': 'adamw',
          'routing_skew': 1.0}).xfail(raises=AssertionError, reason=MOE_LAST_BACKWARD_ALL_REDUCE)
@example({'model': 'deepseek-moe-16b', 'topology': 'dgx-a100', 'dp': 1, 'tp': 8, 'pp': 1,
          'layers': 4, 'network_mode': 'analytical', 'seq': 256, 'micro_batch': 1,
          'global_batch': 1, 'sp': True, 'zero': 0, 'recompute': 'full', 'optimizer': 'sgd',
          'routing_skew': 0.0}
         ).xfail(raises=AssertionError, reason=MOE_SHARED_BRANCHES_RECOMPUTED)
# under sp the experts' slots are reduce-scattered, not all-reduced: no such gap
@example({'model': 'deepseek-moe-16b', 'topology': 'workstation-4gpu-pcie', 'dp': 2, 'tp': 2,
          'pp': 1, 'layers': 4, 'network_mode': 'analytical', 'seq': 256, 'micro_batch': 2,
          'global_batch': 8, 'sp': True, 'zero': 1, 'recompute': 'full', 'bucket_mb': 5,
          'order': 'pp-tp-dp', 'optimizer': 'adamw', 'routing_skew': 1.0})
@example({'model': 'mixtral-8x7b', 'topology': 'dgx-a100', 'dp': 2, 'tp': 2, 'pp': 2,
          'layers': 6, 'network_mode': 'analytical', 'seq': 256, 'micro_batch': 1,
          'global_batch': 8, 'schedule': 'interleaved', 'virtual_stages': 3,
          'partition': 'balanced', 'sp': True, 'zero': 3, 'recompute': 'selective',
          'bucket_mb': 25, 'order': 'dp-pp-tp', 'optimizer': 'sgd', 'routing_skew': 0.3}
         ).xfail(raises=AssertionError, reason=MOE_ZERO3_PREFETCH_MEMORY)
@example({'model': 'mixtral-8x7b', 'topology': 'workstation-4gpu-pcie', 'dp': 1, 'tp': 4,
          'pp': 1, 'layers': 2, 'network_mode': 'analytical', 'seq': 256, 'micro_batch': 4,
          'global_batch': 8, 'zero': 3, 'prefetch': 2, 'zero3_unit': 'layer',
          'recompute': 'selective', 'bucket_mb': 5, 'order': 'dp-pp-tp', 'optimizer': 'adamw',
          'routing_skew': 0.0, 'capacity_factor': 1.0}
         ).xfail(raises=AssertionError, reason=MOE_ZERO3_PREFETCH_MEMORY)
@MOE_DRAWS
@given(moe_configurations())
def test_the_estimate_agrees_with_the_simulation_on_mixtures_of_experts(options):
    _agrees(options)


#: context parallelism: model -> (layer counts, sequence lengths), long
#: enough that the gathered keys and values, the ring steps and the
#: all-to-alls weigh, short enough to simulate fast
CP_MODELS = {
    "gpt": ((2, 4), (512, 1024)),
    "gpt3-1.3b": ((2, 4), (1024, 2048)),
    "llama3-8b": ((2, 4), (1024, 2048)),
    "llama2-7b": ((2,), (2048, 4096)),
}


@st.composite
def cp_configurations(draw, models: Mapping[str, Tuple[Tuple[int, ...], Tuple[Any, ...]]]
                      = CP_MODELS) -> Dict[str, Any]:
    """A configuration with context parallelism: cp 2 or 4 with each
    ``cp_comm`` (the ring under fused attention, which it needs), crossed
    with tp, sp, pp (and its schedules), dp, ZeRO 0-3, recomputation,
    the gradient sync per gradient, in buckets or after the backward
    (``bucket_mb`` 0), the mesh order and the optimizer; ZeRO 3 too
    (prefetch 0-2, by parameter or by layer), its parameters sharded and
    gathered over the dp x cp ranks; of one of ``models``."""
    model = draw(st.sampled_from(sorted(models)))
    layer_counts, seqs = models[model]
    topology = draw(st.sampled_from(sorted(TOPOLOGIES)))
    n = TOPOLOGIES[topology]
    cp = draw(st.sampled_from([2, 4]))
    tp = draw(st.sampled_from(_divisors(n // cp, 4)))
    pp = draw(st.sampled_from(_divisors(n // (cp * tp), 2)))
    dp = n // (cp * tp * pp)
    cp_comm = draw(st.sampled_from(["allgather", "ring", "alltoall"]))
    o: Dict[str, Any] = {"model": model, "topology": topology, "dp": dp, "tp": tp, "pp": pp,
                         "cp": cp, "cp_comm": cp_comm, "seq": draw(st.sampled_from(seqs)),
                         "layers": draw(st.sampled_from(layer_counts)),
                         "network_mode": "analytical"}
    if cp_comm == "ring" or draw(st.booleans()):
        o["attention"] = "fused"
    micro_batch = draw(st.sampled_from([1, 1, 2]))
    microbatches = draw(st.integers(1, 6 if pp > 1 else 3))
    o["micro_batch"] = micro_batch
    o["global_batch"] = dp * micro_batch * microbatches
    if pp > 1:
        o["schedule"] = draw(st.sampled_from(["1f1b", "gpipe", "interleaved", "zb-h1"]))
        if o["schedule"] == "interleaved":
            o["virtual_stages"] = 2
            o["layers"] = max(o["layers"], 4)
    if tp > 1 and draw(st.booleans()):
        o["sp"] = True
    _draw_zero(draw, o)
    o["recompute"] = draw(st.sampled_from(["none", "selective", "full"]))
    bucket = draw(st.sampled_from([None, 0, 5, 25]))
    if bucket is not None:
        o["bucket_mb"] = bucket
    order = draw(st.sampled_from((None,) + ORDERS))
    if order is not None:
        o["order"] = order
    o["optimizer"] = draw(st.sampled_from(["adamw", "sgd"]))
    return o


# the ring's steps on their pairs' own queues: not behind the gradient sync
# (was +7.6 % with the steps on the communication stream); a bucket flushed
# inside a block, held through the rest of it (was 1.0 % under: counted
# from the next block on)
@example({'model': 'llama3-8b', 'topology': 'dgx-a100', 'dp': 2, 'tp': 1, 'pp': 1, 'cp': 4,
          'cp_comm': 'ring', 'seq': 2048, 'layers': 2, 'network_mode': 'analytical',
          'attention': 'fused', 'micro_batch': 1, 'global_batch': 4, 'zero': 1})
@example({'model': 'gpt3-1.3b', 'topology': 'dgx-a100', 'dp': 4, 'tp': 1, 'pp': 1, 'cp': 2,
          'cp_comm': 'allgather', 'seq': 2048, 'layers': 2, 'network_mode': 'analytical',
          'micro_batch': 1, 'global_batch': 4, 'zero': 1, 'recompute': 'selective',
          'bucket_mb': 25, 'optimizer': 'adamw'})
@MOE_DRAWS      # 40 derandomized draws, as the MoE ones
@given(cp_configurations())
def test_the_context_parallel_estimate_agrees_with_the_simulation(options):
    _agrees(options)


#: the two-layer Mixtral of the seeds below, under ZeRO 2 with ep = dp
MIXTRAL_EP_WHOLE = {'model': 'mixtral-8x7b', 'pp': 1, 'layers': 2, 'network_mode': 'analytical',
                    'seq': 256, 'micro_batch': 1, 'zero': 2, 'recompute': 'none'}


# ZeRO 2 with ep = dp, where the estimator flattened and reduce-scattered
# the experts' gradients as the others' (measured 1.3-4.0 % over in step
# time): now kept whole, as on their team of one rank
@example({**MIXTRAL_EP_WHOLE, 'topology': 'dgx-a100', 'dp': 8, 'tp': 1, 'global_batch': 16,
          'ep': 8})
@example({'model': MOE_SHAPES['gpt2-moe-every-2'], 'topology': 'workstation-4gpu-pcie',
          'dp': 2, 'tp': 2, 'pp': 1, 'layers': 4, 'network_mode': 'analytical', 'seq': 256,
          'micro_batch': 1, 'global_batch': 8, 'zero': 2, 'recompute': 'none', 'ep': 2})
@example({'model': MOE_SHAPES['tiny-moe'], 'topology': 'dgx-a100', 'dp': 4, 'tp': 2,
          'pp': 1, 'layers': 2, 'network_mode': 'analytical', 'micro_batch': 1,
          'global_batch': 8, 'zero': 2, 'recompute': 'none', 'ep': 4})
@example({**MIXTRAL_EP_WHOLE, 'topology': 'dgx-a100', 'dp': 4, 'tp': 2, 'global_batch': 8,
          'ep': 4, 'bucket_mb': 0})
@example({**MIXTRAL_EP_WHOLE, 'topology': 'workstation-4gpu-pcie', 'dp': 4, 'tp': 1,
          'global_batch': 4, 'optimizer': 'adamw', 'ep': 4}
         ).xfail(raises=AssertionError, reason=MOE_EP_WHOLE_UPDATE_MEMORY)
@example({**MIXTRAL_EP_WHOLE, 'topology': 'workstation-4gpu-pcie', 'dp': 2, 'tp': 2,
          'micro_batch': 4, 'global_batch': 8, 'recompute': 'selective', 'bucket_mb': 5,
          'order': 'dp-tp-pp', 'optimizer': 'adamw', 'routing_skew': 0.1,
          'capacity_factor': 1.25, 'ep': 2}
         ).xfail(raises=AssertionError, reason=MOE_EP_WHOLE_UPDATE_MEMORY)
@MOE_DRAWS
@given(expert_parallel_whole_configurations())
def test_the_estimate_agrees_with_the_simulation_under_zero2_with_ep_equal_to_dp(options):
    _agrees(options)


@MOE_DRAWS
@given(expert_parallel_configurations())
def test_the_estimate_agrees_with_the_simulation_under_expert_parallelism(options):
    _agrees(options)


#: known gap of ZeRO 3 under expert parallelism with prefetch
#: (reports/estimator/README.md): the bound of MOE_ZERO3_PREFETCH_MEMORY
MOE_EP_ZERO3_PREFETCH_MEMORY = (
    "MoE, ZeRO 3 under expert parallelism prefetching the experts' weights: the gathered "
    "parameters bounded as whole from the block's start, peak memory up to 7.4 % (Mixtral "
    "dp 16 ep 2, prefetch 2) over the simulation's")


# the shapes the estimator measured 6.6-13.6 % off in step time while it
# gathered every parameter over dp (now each over its own team)
@example({'model': 'mixtral-8x7b', 'topology': 'dgx-a100', 'dp': 8, 'tp': 1, 'pp': 1,
          'layers': 2, 'network_mode': 'analytical', 'seq': 256, 'micro_batch': 1,
          'global_batch': 16, 'zero': 3, 'prefetch': 0, 'recompute': 'none', 'ep': 2})
@example({'model': 'mixtral-8x7b', 'topology': 'dgx-a100', 'dp': 4, 'tp': 2, 'pp': 1,
          'layers': 4, 'network_mode': 'analytical', 'seq': 256, 'micro_batch': 2,
          'global_batch': 24, 'zero': 3, 'prefetch': 0, 'recompute': 'none', 'ep': 2})
@example({'model': 'deepseek-moe-16b', 'topology': 'dgx-a100-x2', 'dp': 16, 'tp': 1, 'pp': 1,
          'layers': 2, 'network_mode': 'analytical', 'seq': 256, 'micro_batch': 1,
          'global_batch': 16, 'zero': 3, 'prefetch': 0, 'recompute': 'none', 'ep': 2})
@example({'model': MOE_SHAPES['tiny-moe'], 'topology': 'dgx-a100-x2', 'dp': 16, 'tp': 1,
          'pp': 1, 'layers': 2, 'network_mode': 'analytical', 'micro_batch': 1,
          'global_batch': 16, 'zero': 3, 'prefetch': 0, 'recompute': 'selective',
          'bucket_mb': 1, 'order': 'pp-dp-tp', 'routing_skew': 0.1, 'ep': 2}
         ).xfail(raises=AssertionError, reason=MOE_EP_ZERO3_TINY_MEMORY)
@example({'model': 'mixtral-8x7b', 'topology': 'dgx-a100-x2', 'dp': 16, 'tp': 1, 'pp': 1,
          'layers': 2, 'network_mode': 'analytical', 'seq': 256, 'micro_batch': 1,
          'global_batch': 16, 'zero': 3, 'prefetch': 2, 'recompute': 'none', 'bucket_mb': 1,
          'order': 'dp-tp-pp', 'optimizer': 'sgd', 'routing_skew': 0.3,
          'capacity_factor': 1.25, 'ep': 2}
         ).xfail(raises=AssertionError, reason=MOE_EP_ZERO3_PREFETCH_MEMORY)
@MOE_DRAWS
@given(expert_parallel_zero3_configurations())
def test_the_estimate_agrees_with_the_simulation_under_expert_parallelism_and_zero3(options):
    _agrees(options)


# ZeRO 3 with ep = dp, refused while the walk gathered the experts' weights
# on the communication stream behind the others' reduce-scatters (their
# reads waiting there: up to 2.0 % over in step time, Mixtral with a
# pipeline) and left out the moment a block's gates are made while the
# block before's flat gradient copy still waits for its reduce-scatter
# (the experts' weights whole from their gates: DeepSeekMoE under pipelines,
# 0.5-1.9 % under in memory)
@example({'model': 'mixtral-8x7b', 'topology': 'dgx-a100', 'dp': 8, 'tp': 1, 'pp': 1,
          'layers': 2, 'network_mode': 'analytical', 'seq': 256, 'micro_batch': 1,
          'global_batch': 16, 'zero': 3, 'prefetch': 0, 'recompute': 'none', 'ep': 8})
@example({'model': 'mixtral-8x7b', 'topology': 'dgx-a100', 'dp': 4, 'tp': 2, 'pp': 1,
          'layers': 2, 'network_mode': 'analytical', 'seq': 256, 'micro_batch': 1,
          'global_batch': 8, 'zero': 3, 'prefetch': 0, 'recompute': 'none', 'ep': 4,
          'bucket_mb': 0})
@example({'model': 'mixtral-8x7b', 'topology': 'dgx-a100', 'dp': 4, 'tp': 1, 'pp': 2,
          'layers': 4, 'network_mode': 'analytical', 'seq': 256, 'micro_batch': 1,
          'global_batch': 16, 'zero': 3, 'prefetch': 0, 'recompute': 'none', 'ep': 4,
          'schedule': '1f1b'})
@example({'model': 'mixtral-8x7b', 'topology': 'dgx-a100', 'dp': 2, 'tp': 2, 'pp': 2,
          'layers': 4, 'network_mode': 'analytical', 'seq': 256, 'micro_batch': 1,
          'global_batch': 8, 'zero': 3, 'prefetch': 0, 'recompute': 'none', 'ep': 2,
          'schedule': 'interleaved', 'virtual_stages': 2})
@example({'model': 'deepseek-moe-16b', 'topology': 'workstation-4gpu-pcie', 'dp': 2, 'tp': 1,
          'pp': 2, 'layers': 2, 'network_mode': 'analytical', 'seq': 256, 'micro_batch': 2,
          'global_batch': 8, 'schedule': 'gpipe', 'partition': 'balanced', 'zero': 3,
          'recompute': 'selective', 'bucket_mb': 1, 'optimizer': 'sgd', 'prefetch': 0,
          'capacity_factor': 1.0, 'ep': 2})
@example({'model': 'deepseek-moe-16b', 'topology': 'workstation-4gpu-pcie', 'dp': 2, 'tp': 1,
          'pp': 2, 'layers': 2, 'network_mode': 'analytical', 'seq': 256, 'micro_batch': 1,
          'global_batch': 8, 'schedule': '1f1b', 'zero': 3, 'recompute': 'none',
          'prefetch': 0, 'ep': 2})
@MOE_DRAWS
@given(expert_parallel_zero3_whole_configurations())
def test_the_estimate_agrees_with_the_simulation_under_zero3_with_ep_equal_to_dp(options):
    _agrees(options)


#: known gaps of ZeRO 3 by layer on MoE models (reports/estimator/README.md),
#: without expert parallelism too
MOE_LAYER_MEMORY = (
    "ZeRO 3 by layer without prefetch, peak memory over the simulation's (by parameter "
    "within the bound): deepseek-moe-16b (2 layers, the first dense), dp 4 tp 2 sp: 14.7 % "
    "at ep 1, 5.4 % at ep = dp 4; tiny-moe, dp 2 tp 4 pp 2 interleaved: 3.2 % at ep 1, "
    "1.05 % at ep = dp 2")


@st.composite
def expert_parallel_zero3_layer_configurations(draw) -> Dict[str, Any]:
    """An :func:`expert_parallel_zero3_configurations` (ep < dp) or
    :func:`expert_parallel_zero3_whole_configurations` (ep = dp) draw by
    layer (``zero3_unit: layer``): a MoE block's units each over its own
    team, the others' parameters dp divides over dp and, with ep < dp,
    the experts' over dp / ep (with ep = dp, on a team of one rank, in no
    unit); not under sequence parallelism nor of tiny-moe
    (:data:`MOE_LAYER_MEMORY`)."""
    whole = draw(st.booleans())
    o = draw(expert_parallel_zero3_whole_configurations() if whole
             else expert_parallel_zero3_configurations())
    assume(not o.get("sp") and o["model"] != MOE_SHAPES["tiny-moe"])
    o["zero3_unit"] = "layer"
    return o


# ZeRO 3 by layer with ep, refused while the walk knew one unit per block
# (with ep < dp 2.5-8.4 % over in step time on small MoE models); Mixtral
# under stream order 1.2 % over while each block's gathers waited for all
# its copy-ins (the others' gather for the experts' concatenation after it)
@example({'model': 'mixtral-8x7b', 'topology': 'dgx-a100', 'dp': 8, 'tp': 1, 'pp': 1,
          'layers': 2, 'network_mode': 'analytical', 'seq': 256, 'micro_batch': 1,
          'global_batch': 8, 'zero': 3, 'zero3_unit': 'layer', 'prefetch': 0,
          'recompute': 'none', 'ep': 2, 'comm_order': 'stream', 'fusion': 'megatron'})
@example({'model': 'mixtral-8x7b', 'topology': 'dgx-a100', 'dp': 8, 'tp': 1, 'pp': 1,
          'layers': 2, 'network_mode': 'analytical', 'seq': 256, 'micro_batch': 1,
          'global_batch': 8, 'zero': 3, 'zero3_unit': 'layer', 'prefetch': 0,
          'recompute': 'none', 'ep': 2})
@example({'model': MOE_SHAPES['gpt2-moe-every-2'], 'topology': 'dgx-a100', 'dp': 4, 'tp': 1,
          'pp': 2, 'layers': 4, 'network_mode': 'analytical', 'seq': 256, 'micro_batch': 1,
          'global_batch': 16, 'zero': 3, 'zero3_unit': 'layer', 'prefetch': 0,
          'recompute': 'none', 'ep': 2, 'schedule': '1f1b'})
@example({'model': 'mixtral-8x7b', 'topology': 'dgx-a100', 'dp': 4, 'tp': 1, 'pp': 2,
          'layers': 4, 'network_mode': 'analytical', 'seq': 256, 'micro_batch': 1,
          'global_batch': 16, 'zero': 3, 'zero3_unit': 'layer', 'prefetch': 0,
          'recompute': 'none', 'ep': 4, 'schedule': '1f1b'})
@example({'model': 'deepseek-moe-16b', 'topology': 'dgx-a100', 'dp': 2, 'tp': 2, 'pp': 2,
          'layers': 4, 'network_mode': 'analytical', 'seq': 256, 'micro_batch': 1,
          'global_batch': 8, 'zero': 3, 'zero3_unit': 'layer', 'prefetch': 0,
          'recompute': 'none', 'ep': 2, 'schedule': 'interleaved', 'virtual_stages': 2})
@settings(MOE_DRAWS, max_examples=20)
@given(expert_parallel_zero3_layer_configurations())
def test_the_estimate_agrees_by_layer_under_zero3_and_expert_parallelism(options):
    _agrees(options)


#: mixture-of-experts models with context parallelism: model -> (layer
#: counts, sequence lengths); deepseek-moe-16b mixes a dense first layer in
MOE_CP_MODELS = {
    "mixtral-8x7b": ((2,), (512, 1024)),
    "deepseek-moe-16b": ((2, 3), (512, 1024)),
    "gpt2-moe-every-2": ((2, 4), (512, 1024)),
}


@st.composite
def expert_context_parallel_configurations(draw) -> Dict[str, Any]:
    """A :func:`cp_configurations` draw of a mixture-of-experts model
    (:data:`MOE_CP_MODELS`) under ZeRO 0/1, with or without expert
    parallelism: ``ep`` dividing the ``dp x cp`` ranks and the experts,
    its groups within one replica's cp ranks (ep <= cp) or across
    replicas; a routing balance and a capacity factor drawn as well."""
    o = draw(cp_configurations(models=MOE_CP_MODELS))
    o["model"] = MOE_SHAPES.get(o["model"], o["model"])
    model = o["model"]
    experts = (model if isinstance(model, dict) else load_model_config(model))["experts"]
    o["ep"] = draw(st.sampled_from([e for e in (1, 2, 4, 8)
                                    if (o["dp"] * o["cp"]) % e == 0 and experts % e == 0]))
    o["zero"] = draw(st.integers(0, 1))
    o.pop("prefetch", None)
    o.pop("zero3_unit", None)
    skew = draw(st.sampled_from([None, 0.0, 0.3]))
    if skew is not None:
        o["routing_skew"] = skew
    capacity = draw(st.sampled_from([None, 1.0, 1.25]))
    if capacity is not None:
        o["capacity_factor"] = capacity
    return o


# the template on lcm(ep, cp) ranks of the dp x cp axis (it held ep x cp:
# past the mesh where ep > dp, a TopologyError); the dense and MoE layers'
# templates of a mixed model both under cp (they ran without it: +27 % on
# step time and +5.6 % on memory here, +12.8 % on step time at ep 1)
@example({'model': 'deepseek-moe-16b', 'topology': 'dgx-a100', 'dp': 2, 'tp': 1, 'pp': 1,
          'cp': 4, 'ep': 4, 'cp_comm': 'alltoall', 'seq': 1024, 'layers': 2,
          'network_mode': 'analytical', 'micro_batch': 1, 'global_batch': 2, 'zero': 1})
@example({'model': 'deepseek-moe-16b', 'topology': 'dgx-a100', 'dp': 2, 'tp': 1, 'pp': 1,
          'cp': 4, 'ep': 1, 'cp_comm': 'alltoall', 'seq': 1024, 'layers': 2,
          'network_mode': 'analytical', 'micro_batch': 1, 'global_batch': 2, 'zero': 1})
@example({'model': 'mixtral-8x7b', 'topology': 'dgx-a100', 'dp': 1, 'tp': 2, 'pp': 1,
          'cp': 4, 'ep': 2, 'cp_comm': 'ring', 'attention': 'fused', 'seq': 1024,
          'layers': 2, 'network_mode': 'analytical', 'micro_batch': 1, 'global_batch': 2,
          'sp': True, 'zero': 1, 'order': 'dp-tp-pp'})
@MOE_DRAWS
@given(expert_context_parallel_configurations())
def test_the_estimate_agrees_with_the_simulation_under_expert_and_context_parallelism(options):
    _agrees(options)


#: known gap of ZeRO 3 under context parallelism on a mixed model, with or
#: without expert parallelism (reports/estimator/README.md)
MOE_CP_ZERO3_MIXED_MEMORY = (
    "the GShard-style mix (every other layer MoE) under ZeRO 3 by parameter with cp 4, "
    "three micro-batches: peak memory 3.7 % over the simulation's at ep 1, 2 and 4 alike "
    "(exact with one micro-batch or bucket_mb 0); not the experts' teams")


@st.composite
def expert_context_parallel_zero_configurations(draw) -> Dict[str, Any]:
    """An :func:`expert_context_parallel_configurations` draw with ``ep`` >
    1 under ZeRO 2 or ZeRO 3 by parameter (without prefetch:
    :data:`MOE_ZERO3_PREFETCH_MEMORY`; ZeRO 3 with ep = dp x cp and not
    under ring attention, ZeRO 2 not under ZB-H1: the estimator refuses the
    rest, see
    :func:`distsim.estimate.point.check_expert_parallel`): the experts'
    gradients synchronised,
    sharded and (ZeRO 3) gathered over their dp x cp / ep ranks, a team of
    one where ep = dp x cp; not Mixtral under ZeRO 2 (with a team of one
    :data:`MOE_EP_WHOLE_UPDATE_MEMORY`; at ep 2, tp 2, ``bucket_mb`` 0
    1.16 % over in memory with or without cp, dp 4 ep 2 alike), nor the GShard-style mix under
    ZeRO 3 (:data:`MOE_CP_ZERO3_MIXED_MEMORY`)."""
    o = draw(expert_context_parallel_configurations())
    assume(o["ep"] > 1)
    o["zero"] = draw(st.integers(2, 3))
    if o["zero"] == 3:
        o["prefetch"] = 0
        assume(o["cp_comm"] != "ring" and o["model"] != MOE_SHAPES["gpt2-moe-every-2"]
               and o["ep"] == o["dp"] * o["cp"])
    else:
        assume(o.get("schedule") != "zb-h1")
    assume(not (o["zero"] == 2 and o["model"] == "mixtral-8x7b"))
    return o


#: what the seeds of the ZeRO 2/3 ep x cp draws share
EP_CP_SEED = {'topology': 'dgx-a100', 'pp': 1, 'cp': 2, 'cp_comm': 'alltoall', 'seq': 512,
              'layers': 2, 'network_mode': 'analytical', 'micro_batch': 1}


# ZeRO 2 and 3 with the experts' team one rank (ep = dp x cp), ZeRO 2 with
# ep 2 of dp x cp 8 (refused while ep with cp under ZeRO 2/3 was: each
# within 0.08 % in step time and 0.01 % in memory)
@example({**EP_CP_SEED, 'model': 'deepseek-moe-16b', 'dp': 4, 'tp': 1, 'ep': 8,
          'global_batch': 8, 'zero': 2})
@example({**EP_CP_SEED, 'model': 'mixtral-8x7b', 'dp': 4, 'tp': 1, 'ep': 2, 'global_batch': 8,
          'zero': 2})
@example({**EP_CP_SEED, 'model': 'deepseek-moe-16b', 'dp': 4, 'tp': 1, 'ep': 8,
          'global_batch': 8, 'zero': 3, 'prefetch': 0})
@MOE_DRAWS
@given(expert_context_parallel_zero_configurations())
def test_the_estimate_agrees_with_the_simulation_under_expert_and_context_parallelism_zero23(
        options):
    _agrees(options)


def _with_loss_dtype(options: Dict[str, Any]) -> Dict[str, Any]:
    """``loss_dtype`` (a field of the model, not an option: ``fp32``, the
    logits cast to float32 for the loss) put into the model's fields."""
    loss = options.pop("loss_dtype", None)
    if loss is not None:
        model = options["model"]
        options["model"] = {**(model if isinstance(model, dict) else load_model_config(model)),
                            "loss_dtype": loss}
    return options


def _within(options: Mapping[str, Any]) -> bool:
    """Whether :func:`_agrees` holds for ``options``."""
    try:
        _agrees(options)
    except AssertionError:
        return False
    return True


def _agrees(options: Mapping[str, Any]) -> None:
    """Both refuse ``options`` with the same error class, or agree within
    the bound on step time and peak memory. The corpus was drawn and seeded
    with collectives ordered by their inputs and unfused kernels: a point
    that leaves ``comm_order`` or ``fusion`` unset runs under those."""
    options = _with_loss_dtype({**INPUTS_UNFUSED, **options})
    row, refused = _outcome(lambda: estimate(options))
    summary, sim_refused = _outcome(lambda: distsim.simulate(**options).summary())
    assert refused == sim_refused, (f"estimate refused with {refused}, "
                                    f"the simulation with {sim_refused}: {options}")
    if refused is not None:
        return
    for key in ("step_time_s", "max_peak_memory_bytes"):
        error = _relative(row[key], summary[key])
        assert error <= AGREEMENT_TOLERANCE, (
            f"{key}: estimate {row[key]!r}, simulation {summary[key]!r} "
            f"({error:.2%} apart, bound {AGREEMENT_TOLERANCE:.0%}): {options}")


#: a GPT of 1024 x 24 with Megatron-LM's shapes (16 heads, 2048 tokens)
GPT_1024_24 = {"name": "gpt-1024-24", "family": "gpt", "layers": 24, "hidden": 1024,
               "heads": 16, "vocab": 51200, "seq": 2048, "dtype": "fp16", "dropout": 0.1}
#: long interleaved pipelines at tp 8 under the flow network, one server per
#: stage: a stage's ranks send their forward outputs to the next stage while
#: their input gradients go to the one before (or receive from both), each
#: through its one NIC at once. Each transfer timed alone, the estimate was
#: 4.0 % (Megatron-LM's kernels, 48 micro-batches) and 3.2 % (unfused, 24)
#: under the simulation's, both under stream order (ordered by their inputs
#: the transfers of these two do not meet)
FLOW_PIPELINES = [
    {"model": GPT_1024_24, "topology": "dgx-a100-x6", "network_mode": "flow", "symmetry": True,
     "tp": 8, "pp": 6, "dp": 1, "micro_batch": 1, "global_batch": 48,
     "schedule": "interleaved", "virtual_stages": 4, "recompute": "full",
     "loss_dtype": "fp32", "fusion": "megatron", "comm_order": "stream"},
    {"model": GPT_1024_24, "topology": "dgx-a100-x6", "network_mode": "flow", "symmetry": True,
     "tp": 8, "pp": 6, "dp": 1, "micro_batch": 1, "global_batch": 24,
     "schedule": "interleaved", "virtual_stages": 4, "recompute": "full",
     "comm_order": "stream"},
]


#: a gap of the memory walk with the interleaved schedule's exchanges where
#: Megatron-LM issues them (the forward's output sent with the backward
#: after it; a rank-0 input received from the last stage ahead of its
#: forward): step times agree, the analytical network's peak memory too
#: (0.9 % under), the flow network's 1.7 % under the simulation's
FLOW_INTERLEAVED_MEMORY = (
    "interleaved v 4 over pp 6 at tp 8, 24 micro-batches, flow network: peak memory 1.7 % "
    "under the simulation's (received values held longer while transfers share a NIC)")


@pytest.mark.parametrize("options", [
    FLOW_PIPELINES[0],
    pytest.param(FLOW_PIPELINES[1], marks=pytest.mark.xfail(
        raises=AssertionError, reason=FLOW_INTERLEAVED_MEMORY, strict=True))],
    ids=["megatron-48", "unfused-24"])
def test_pipeline_transfers_sharing_a_nic_agree_under_the_flow_network(options):
    _agrees(dict(options))
