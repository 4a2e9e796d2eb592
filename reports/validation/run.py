"""Predicted against published: every measured end-to-end training run
whose configuration is published well enough to simulate, run through
distsim (full simulation, ``symmetry=True, coarsen=True``) and its fast
estimator (``distsim.estimate.estimate``), with the signed error of each.

    python reports/validation/run.py            # every run (cached: see below)
    python reports/validation/run.py --quick    # the smallest runs only
    python reports/validation/run.py --force    # ignore the cache
    python reports/validation/run.py --only korthikanti-22b-full --out /tmp/v
    python reports/validation/run.py --comm-streams per-group --out /tmp/v
    python reports/validation/run.py --fusion none --out /tmp/v   # unfused

Writes ``results.json`` and the table in ``README.md`` (between the
``<!-- results -->`` markers) in this folder, or in ``--out``. A run whose
configuration and distsim's code (every file under ``distsim/`` and
``topologies/``, and this folder's topology files) are unchanged since it
was last simulated is read back from ``results.json`` instead of simulated
again, so a rerun after an edit elsewhere costs seconds.

Every run is simulated under stream order (``comm_order: stream``): each
collective starts no earlier than the end of the compute issued before it
on its device, as PyTorch's ProcessGroupNCCL orders its streams, which
every source ran on. The backward's tensor-parallel all-reduce sits where
each source's Megatron-LM issued it (``tp_overlap``, per source below).
Every run ran Megatron-LM's fused kernels (``fusion: megatron``:
scale-mask-softmax, bias-GeLU, bias-dropout-add; ``--fusion none``
simulates them unfused). Each source's pipeline transfers are issued as
its training engine issued them (``p2p``, :data:`P2P`). The estimator's
column estimates the same run with the same options; it refuses BLOOM's
blocking launches.

Nothing here is fitted: the topologies are the repository's (the DGX A100
cluster ``dgx-a100-xN``; Jean Zay for BLOOM, described beside this file
from its published hardware with dgx-a100's device figures; the DGX H100
cluster ``dgx-h100-xN`` for the H100 runs of ``sources_h100.py``), and the
published figures are only compared against.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import re
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
for _path in (ROOT, HERE):              # run as a script from anywhere
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from sources_h100 import SOURCES_H100, dgxc_llama31  # noqa: E402  (after the path)

A100_PEAK = 312e12   # the dense 16-bit peak every source divides by

SOURCES: Dict[str, Dict[str, str]] = {
    "narayanan-t1": {
        "cite": "Narayanan et al. 2021, Efficient Large-Scale Language Model Training on GPU "
                "Clusters Using Megatron-LM (arXiv 2104.04473), Table 1",
        "url": "https://arxiv.org/abs/2104.04473",
        "what": "weak scaling, GPT 1.7B-1T on 32-3072 A100 80GB (Selene, DGX A100, 8 x HDR "
                "200 Gb/s per node); achieved TFLOP/s per GPU. Micro-batch, virtual stages and "
                "DDP kind per row from the paper's own scripts, NVIDIA/Megatron-LM "
                "examples/sc21/run_table_1.sh",
    },
    "narayanan-t2": {
        "cite": "Narayanan et al. 2021 (arXiv 2104.04473), Table 2, PTD-P rows",
        "url": "https://arxiv.org/abs/2104.04473",
        "what": "GPT-3 175B (t 8, p 12) and 530B (t 8, p 35) at a fixed global batch on 2-4x "
                "as many GPUs (data parallelism grows); TFLOP/s per GPU",
    },
    "narayanan-t2-zero3": {
        "cite": "Narayanan et al. 2021 (arXiv 2104.04473), Table 2, ZeRO-3 rows",
        "url": "https://arxiv.org/abs/2104.04473",
        "what": "the same two models with DeepSpeed ZeRO-3 and no model parallelism (data "
                "parallelism over every GPU), micro-batch 4, 2, 1; TFLOP/s per GPU. Outside "
                "the headline figures: DeepSpeed's 2021 ZeRO-3 (how it groups, orders and "
                "overlaps its gathers) is not what distsim's ZeRO-3 models",
        "headline": False,
    },
    "korthikanti-t5": {
        "cite": "Korthikanti et al. 2022, Reducing Activation Recomputation in Large "
                "Transformer Models (arXiv 2205.05198), Tables 3 and 5",
        "url": "https://arxiv.org/abs/2205.05198",
        "what": "22B, 175B, 530B, 1T on 8-512 A100 80GB without data parallelism: iteration "
                "time with full recomputation and with sequence parallelism + selective "
                "recomputation (Table 5); and the 530B with data parallelism 8 on 2240 GPUs as "
                "MFU, 54.2 % and 42.1 % with full recomputation (the abstract)",
    },
    "bloom": {
        "cite": "BigScience BLOOM-176B training (tr11-176B-ml), chronicles.md 2022-03-18 and "
                "tr11-176B-ml.slurm",
        "url": "https://github.com/bigscience-workshop/bigscience/tree/master/train/tr11-176B-ml",
        "what": "the production run on 384 A100 80GB of Jean Zay once the batch ramp-up ended: "
                "logged 'elapsed time per iteration (s): 105.22' at global batch 2048",
    },
}


# ---------------------------------------------------------------- FLOP formulas
def narayanan_flops(B: int, s: int, l: int, h: int, V: int) -> float:
    """Eq. 3 of Narayanan et al.: FLOPs of one iteration counting the
    recomputed forward pass (4 forward passes' worth of GEMMs):
    96 B s l h^2 (1 + s/6h + V/16lh)."""
    return 96.0 * B * s * l * h * h * (1 + s / (6.0 * h) + V / (16.0 * l * h))


def korthikanti_model_flops(B: int, s: int, l: int, h: int, V: int) -> float:
    """Eq. 7 of Korthikanti et al.: model FLOPs of one iteration (no
    recomputation): 72 B l s h^2 (1 + s/6h + V/12hl)."""
    return 72.0 * B * l * s * h * h * (1 + s / (6.0 * h) + V / (12.0 * h * l))


# ---------------------------------------------------------------- the runs
def megatron_gpt(layers: int, hidden: int, heads: int, vocab: int = 51200, seq: int = 2048,
                 dtype: str = "f16", **extra: Any) -> Dict[str, Any]:
    """Megatron-LM's GPT: learned positions, GELU, LayerNorm, biases, word
    embeddings tied to the output layer, dropout 0.1, attention op by op
    (these runs predate FlashAttention); V = 51,200 as the papers state;
    the loss in fp32 (``gpt_model.py``: ``vocab_parallel_cross_entropy(
    output.float(), labels)``, ``--fp16-lm-cross-entropy`` off)."""
    model = {"family": "gpt", "layers": layers, "hidden": hidden, "heads": heads,
             "vocab": vocab, "seq": seq, "dropout": 0.1, "dtype": dtype,
             "attention": "explicit", "loss_dtype": "fp32"}
    model.update(extra)
    return model


def _shape(run: Dict[str, Any]) -> tuple:
    m = run["model"]
    return m["global_batch"], m["seq"], m["layers"], m["hidden"], m["vocab"]


def table1() -> List[Dict[str, Any]]:
    """Narayanan Table 1, with run_table_1.sh's micro-batch, virtual stages
    (--num-layers-per-virtual-pipeline-stage) and DDP kind per row."""
    #  name,  heads, hidden, layers, tp, pp, gpus, batch, tflops, mbs, layers/virtual stage, ddp
    rows = [("1.7B", 24, 2304, 24, 1, 1, 32, 512, 137, 16, None, "torch"),
            ("3.6B", 32, 3072, 30, 2, 1, 64, 512, 138, 16, None, "torch"),
            ("7.5B", 32, 4096, 36, 4, 1, 128, 512, 142, 16, None, "torch"),
            ("18.4B", 48, 6144, 40, 8, 1, 256, 1024, 135, 8, None, "torch"),
            ("39.1B", 64, 8192, 48, 8, 2, 512, 1536, 138, 4, None, "local"),
            ("76.1B", 80, 10240, 60, 8, 4, 1024, 1792, 140, 2, 5, "local"),
            ("145.6B", 96, 12288, 80, 8, 8, 1536, 2304, 148, 2, 5, "local"),
            ("310.1B", 128, 16384, 96, 8, 16, 1920, 2160, 155, 1, 3, "local"),
            ("529.6B", 128, 20480, 105, 8, 35, 2520, 2520, 163, 1, 1, "local"),
            ("1008.0B", 160, 25600, 128, 8, 64, 3072, 3072, 163, 1, None, "local")]
    runs = []
    for name, heads, hidden, layers, tp, pp, gpus, batch, tflops, mbs, per_v, ddp in rows:
        options: Dict[str, Any] = {"tp": tp, "pp": pp, "micro_batch": mbs,
                                   "recompute": "full",
                                   # torch DDP: 25 MB buckets overlapped with the
                                   # backward; Megatron's local DDP: one all-reduce
                                   # of the gradient buffer after the backward
                                   "bucket_mb": 25 if ddp == "torch" else 0,
                                   # Megatron-LM v2: the input gradient's all-reduce is
                                   # copy_to_tensor_model_parallel_region's backward, issued
                                   # after the linear's dX and dW GEMMs (mpu/layers.py)
                                   "tp_overlap": False}
        if per_v is not None:
            options.update(schedule="interleaved", virtual_stages=layers // pp // per_v)
        model = megatron_gpt(layers, hidden, heads, global_batch=batch)
        schedule = (f"interleaved v={options['virtual_stages']}" if per_v else
                    ("1F1B" if pp > 1 else "no pipeline"))
        runs.append({
            "id": f"narayanan-t1-{name.lower()}", "source": "narayanan-t1",
            "label": f"GPT {name} ({layers} x {hidden}, {heads} heads)",
            "gpus": gpus, "model": model, "topology": f"dgx-a100-x{gpus // 8}",
            "options": options,
            "config": f"t {tp}, p {pp}, d {gpus // (tp * pp)}, B {batch}, b {mbs}, {schedule}, "
                      f"full recompute, {ddp} DDP",
            "published": {"tflops_per_gpu": tflops, "formula": "narayanan"},
        })
    return runs


def table2() -> List[Dict[str, Any]]:
    """Narayanan Table 2, the PTD-P rows. Micro-batch 1 (the table); the
    interleaved schedule with 2 layers per virtual stage for 175B (as the
    paper's scripts for the same t 8, p 12 layout, run_figure_12/18.sh) and
    1 for 530B (as run_table_1.sh's 530B row): the table does not say."""
    runs = []
    for name, heads, hidden, layers, pp, per_v, batch, points in (
            ("174.6B", 96, 12288, 96, 12, 2, 1536, ((384, 153), (768, 149), (1536, 141))),
            ("529.6B", 128, 20480, 105, 35, 1, 2240, ((560, 171), (1120, 167), (2240, 159)))):
        for gpus, tflops in points:
            v = layers // pp // per_v
            runs.append({
                "id": f"narayanan-t2-{name.lower()}-{gpus}", "source": "narayanan-t2",
                "label": f"GPT {name} ({layers} x {hidden}, {heads} heads)",
                "gpus": gpus, "model": megatron_gpt(layers, hidden, heads, global_batch=batch),
                "topology": f"dgx-a100-x{gpus // 8}",
                "options": {"tp": 8, "pp": pp, "micro_batch": 1, "recompute": "full",
                            "schedule": "interleaved", "virtual_stages": v, "bucket_mb": 0,
                            "tp_overlap": False},
                "config": f"t 8, p {pp}, d {gpus // (8 * pp)}, B {batch}, b 1, interleaved "
                          f"v={v} (assumed), full recompute, local DDP",
                "published": {"tflops_per_gpu": tflops, "formula": "narayanan"},
            })
    return runs


def table2_zero3() -> List[Dict[str, Any]]:
    """Narayanan Table 2, the ZeRO-3 rows (DeepSpeed, no model
    parallelism). Assumed, as the table does not say: full recomputation
    (as every other run of the paper) and parameters gathered a layer at a
    time, one layer ahead (``zero3_unit: layer``, ``prefetch: 1``). The
    530B row on 640 GPUs ran at global batch 2560 (the table's footnote:
    2240 did not fit at micro-batch 4 on 560 GPUs)."""
    runs = []
    for name, heads, hidden, layers, points in (
            ("174.6B", 96, 12288, 96, ((384, 1536, 4, 144), (768, 1536, 2, 88),
                                       (1536, 1536, 1, 44))),
            ("529.6B", 128, 20480, 105, ((640, 2560, 4, 138), (1120, 2240, 2, 98),
                                         (2240, 2240, 1, 48)))):
        for gpus, batch, mbs, tflops in points:
            runs.append({
                "id": f"narayanan-t2-zero3-{name.lower()}-{gpus}", "source": "narayanan-t2-zero3",
                "label": f"GPT {name} ({layers} x {hidden}, {heads} heads)",
                "gpus": gpus, "model": megatron_gpt(layers, hidden, heads, global_batch=batch),
                "topology": f"dgx-a100-x{gpus // 8}",
                "options": {"tp": 1, "pp": 1, "micro_batch": mbs, "recompute": "full",
                            "zero": 3, "zero3_unit": "layer", "prefetch": 1},
                "config": f"d {gpus}, B {batch}, b {mbs}, ZeRO-3 by layer, prefetch 1 "
                          f"(assumed), full recompute (assumed)",
                "published": {"tflops_per_gpu": tflops, "formula": "narayanan"},
            })
    return runs


def korthikanti() -> List[Dict[str, Any]]:
    """Korthikanti Table 5 (Table 3's configurations), both columns, and the
    530B with data parallelism 8 (the abstract's MFU; global batch assumed
    8 x 280 = 2240, Table 3's batch per replica). Interleaved with 3 model
    chunks per device for 175B and 530B (the paper's setup); 22B has no
    pipeline and 1T runs 1F1B. The backward's tensor-parallel all-reduce
    (reduce-scatter with SP) issued before the weight-gradient GEMM
    (``tp_overlap``): LinearWithGradAccumulationAndAsyncAllreduce,
    which the paper names as its overlap of that communication."""
    runs = []
    #  name, heads, hidden, layers, pp, gpus, batch, mbs, v, full_s, present_s
    for name, heads, hidden, layers, pp, gpus, batch, mbs, v, full_s, present_s in (
            ("22B", 64, 6144, 48, 1, 8, 4, 4, None, 1.42, 1.10),
            ("175B", 96, 12288, 96, 8, 64, 64, 1, 3, 18.13, 13.75),
            ("530B", 128, 20480, 105, 35, 280, 280, 1, 3, 49.05, 37.83),
            ("1T", 160, 25600, 128, 64, 512, 512, 1, None, 94.42, 71.49)):
        for variant, seconds in (("full", full_s), ("present", present_s)):
            options: Dict[str, Any] = {"tp": 8, "pp": pp, "micro_batch": mbs, "bucket_mb": 0,
                                       "tp_overlap": True}
            if variant == "full":
                options["recompute"] = "full"
            else:
                options.update(recompute="selective", sp=True)
            if v:
                options.update(schedule="interleaved", virtual_stages=v)
            schedule = f"interleaved v={v}" if v else ("1F1B" if pp > 1 else "no pipeline")
            what = "full recompute" if variant == "full" else "SP + selective recompute"
            runs.append({
                "id": f"korthikanti-{name.lower()}-{variant}", "source": "korthikanti-t5",
                "label": f"{name} ({layers} x {hidden}, {heads} heads)",
                "gpus": gpus, "model": megatron_gpt(layers, hidden, heads, dtype="bf16",
                                                    global_batch=batch),
                "topology": "dgx-a100" if gpus == 8 else f"dgx-a100-x{gpus // 8}",
                "options": options,
                "config": f"t 8, p {pp}, d 1, B {batch}, b {mbs}, {schedule}, {what}",
                "published": {"step_time_s": seconds},
            })
    # the abstract: 530B on 2240 GPUs at MFU 54.2 % (SP + selective), 42.1 %
    # with full recomputation
    for variant, mfu in (("full", 0.421), ("present", 0.542)):
        options = {"tp": 8, "pp": 35, "micro_batch": 1, "schedule": "interleaved",
                   "virtual_stages": 3, "bucket_mb": 0, "tp_overlap": True}
        if variant == "full":
            options["recompute"] = "full"
        else:
            options.update(recompute="selective", sp=True)
        what = "full recompute" if variant == "full" else "SP + selective recompute"
        runs.append({
            "id": f"korthikanti-530b-{variant}-dp8", "source": "korthikanti-t5",
            "label": "530B (105 x 20480, 128 heads)", "gpus": 2240,
            "model": megatron_gpt(105, 20480, 128, dtype="bf16", global_batch=2240),
            "topology": "dgx-a100-x280", "options": options,
            "config": f"t 8, p 35, d 8, B 2240 (assumed), b 1, interleaved v=3, {what}",
            "published": {"mfu": mfu, "formula": "korthikanti"},
        })
    return runs


def bloom() -> List[Dict[str, Any]]:
    """BLOOM-176B (tr11-176B-ml.slurm): ALiBi (no position parameters; its
    bias add is not modelled), tied embeddings, vocabulary padded to 250,880,
    bf16, DeepSpeed ZeRO-1 (BF16_Optimizer), activation checkpointing of
    every layer, the embedding counted as a pipeline layer
    ('type:transformer|embedding': partition balanced), gradients
    accumulated and all-reduced in fp32 (the BF16_Optimizer), and blocking kernel
    launches: the job script sets ``export CUDA_LAUNCH_BLOCKING=1`` ("do
    not remove or the training will hang"), so ``launch: blocking``."""
    return [{
        "id": "bloom-176b", "source": "bloom", "label": "BLOOM 176B (70 x 14336, 112 heads)",
        "gpus": 384,
        "model": {"family": "gpt", "layers": 70, "hidden": 14336, "heads": 112,
                  "vocab": 250880, "seq": 2048, "dropout": 0.1, "dtype": "bf16",
                  "position": "none", "attention": "explicit", "global_batch": 2048,
                  # Megatron-DeepSpeed's pipe loss: vocab_parallel_cross_entropy(
                  # output.contiguous().float(), labels)
                  "loss_dtype": "fp32"},
        "topology": str((HERE / "jean-zay-a100-x48.yaml").relative_to(ROOT)),
        "options": {"tp": 4, "pp": 12, "micro_batch": 2, "recompute": "full", "zero": 1,
                    "partition": "balanced", "bucket_mb": 0, "launch": "blocking",
                    # DeepSpeed's BF16_Optimizer (bf16_optimizer.py, the olruwase/bf16-updates
                    # branch the run used, merged as microsoft/DeepSpeed#1801): after every
                    # micro-batch's backward update_hp_grads casts each bf16 gradient to fp32
                    # and adds it into fp32 buffers, which _bf16_reduce_grads all-reduces
                    # in fp32 (tr11-176B-ml/README.md: "accumulates grads in fp32")
                    "fp32_grads": True,
                    # Megatron-DeepSpeed's ColumnParallelLinear (mpu/layers.py) reaches the
                    # all-reduce by copy_to_tensor_model_parallel_region, as Megatron-LM v2
                    "tp_overlap": False},
        "config": "t 4, p 12, d 8, B 2048, b 2, 1F1B (DeepSpeed), full recompute, ZeRO-1, "
                  "fp32 gradients, balanced stages, blocking launches (CUDA_LAUNCH_BLOCKING=1 "
                  "in the job script)",
        "published": {"step_time_s": 105.22},
    }]


#: the H100 runs' sources (sources_h100.py) after the A100 ones
SOURCES.update(SOURCES_H100)


#: how every run's collectives start: PyTorch's stream order (module docstring)
COMM_ORDER = "stream"
#: the kernel fusion every run ran: Megatron-LM's fused scale-mask-softmax,
#: bias-GeLU and bias-dropout-add are on unless disabled
#: (``--no-masked-softmax-fusion``, ``--no-bias-gelu-fusion``,
#: ``--no-bias-dropout-fusion``), which no source's script does; BLOOM's
#: even aborts without them (``--abort-on-unmet-fused-kernel-constraints``);
#: a source whose runs used Megatron-core sets its own (``megatron-core``)
FUSION = "megatron"


#: how each source's training engine issued its pipeline transfers (``p2p``,
#: distsim.sim.launch_queue): Megatron-LM of 2021 (Narayanan et al.'s sc21
#: scripts) and 2022 (Korthikanti et al.) groups a stage's transfers in one
#: ``batch_isend_irecv`` and calls ``torch.cuda.synchronize()`` after each
#: group (``p2p_communication._communicate``): synchronous; DeepSpeed's
#: pipeline engine, BLOOM's, calls ``dist.send`` / ``dist.recv`` one
#: transfer at a time (``runtime/pipe/p2p.py``): separate; Megatron-core
#: under NeMo 24.09 runs with ``overlap_p2p_comm: true``, ``batch_p2p_comm:
#: false`` (``llama3_1_70b.yaml``), no synchronisation: async. The ZeRO-3
#: rows have no pipeline. Megatron-LM's interleaved schedule runs
#: synchronous too: the lowering places its exchanges where that schedule
#: issues them (``distsim/transforms/pipeline_exchanges.py``).
P2P = {"narayanan-t1": "synchronous", "narayanan-t2": "synchronous",
       "korthikanti-t5": "synchronous", "bloom": "separate",
       "dgxc-llama31": "async", "dgxc-llama31-tpoverlap": "async"}

#: Which sources' pipeline engines sent a value every tensor-parallel rank
#: holds whole as 1/t from each rank, all-gathered over the receiving
#: stage's tensor-parallel group (``p2p_scatter``). Megatron-LM's
#: ``p2p_communication._communicate``, in the 2021 code (Narayanan et al.,
#: section 4.1, "scatter/gather communication optimization";
#: ``--scatter-gather-tensors-in-pipeline`` on by default) and the 2022 code
#: (the same, skipped under sequence parallelism, whose tensors are shards
#: already: distsim splits only what every rank holds whole):
#: ``split_tensor_into_1d_equal_chunks`` before the ``batch_isend_irecv``,
#: ``gather_split_1d_tensor`` after it. DeepSpeed's pipeline engine, BLOOM's:
#: activations and gradients partitioned over the model-parallel group
#: (``is_pipe_partitioned``, ``is_grad_partitioned``: ``PartitionedTensor``,
#: gathered by ``.full()`` on arrival). Megatron-core under NeMo 24.09 sends
#: whole tensors (its ``p2p_communication`` has no scatter/gather).
P2P_SCATTER = {"narayanan-t1": True, "narayanan-t2": True, "korthikanti-t5": True,
               "bloom": True}


def all_runs() -> List[Dict[str, Any]]:
    runs = (table1() + table2() + table2_zero3() + korthikanti() + bloom()
            + dgxc_llama31())
    for run in runs:
        run["published"]["step_time_s"] = published_time(run)
        run["options"] = {"fusion": FUSION, **run["options"], "comm_order": COMM_ORDER}
        if run["source"] in P2P:
            run["options"]["p2p"] = P2P[run["source"]]
        if P2P_SCATTER.get(run["source"]) and run["options"].get("pp", 1) > 1:
            run["options"]["p2p_scatter"] = True
            if not run["options"].get("sp"):      # sp's transfers are shards already
                run["config"] += ", transfers scattered over t"
    return runs


#: the subset ``--quick`` runs and the test runs: 8 GPUs, one micro-batch
QUICK = ("korthikanti-22b-full", "korthikanti-22b-present")


def published_time(run: Dict[str, Any]) -> float:
    """The published step time: given, or from the per-GPU rate with the
    FLOP formula its source used."""
    pub = run["published"]
    if "tflops_per_gpu" in pub:
        flops = narayanan_flops(*_shape(run))
        pub["flops_per_step"] = flops
        return flops / (pub["tflops_per_gpu"] * 1e12 * run["gpus"])
    if "mfu" in pub:
        flops = korthikanti_model_flops(*_shape(run))
        pub["flops_per_step"] = flops
        return flops / (pub["mfu"] * A100_PEAK * run["gpus"])
    return float(pub["step_time_s"])


# ---------------------------------------------------------------- running
def code_fingerprint() -> str:
    """A digest of what a prediction depends on: distsim's code, the
    repository's topologies and this folder's topology files."""
    digest = hashlib.sha256()
    files = sorted([*(ROOT / "distsim").rglob("*.py"), *(ROOT / "topologies").glob("*.yaml"),
                    *HERE.glob("*.yaml")])
    for path in files:
        digest.update(str(path.relative_to(ROOT)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def run_key(run: Dict[str, Any]) -> str:
    what = {k: run[k] for k in ("model", "topology", "options", "gpus")}
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:16]


def simulate_run(run: Dict[str, Any]) -> Dict[str, Any]:
    """The full simulation (symmetry + coarsening: the same step time as
    the whole program) and the estimator on the same options."""
    import distsim
    from distsim.estimate import estimate

    from distsim.errors import ConfigError, PassPreconditionError

    opts = dict(run["options"])
    t0 = time.perf_counter()
    try:
        result = distsim.simulate(model=dict(run["model"]), topology=run["topology"],
                                  symmetry=True, coarsen=True, **opts)
    except (ConfigError, PassPreconditionError) as exc:
        # a configuration distsim refuses is reported, not hidden
        return {"step_time_s": None, "refused": f"{type(exc).__name__}: {exc}",
                "estimate_step_time_s": None}
    wall = time.perf_counter() - t0
    s = result.summary()
    out: Dict[str, Any] = {
        "step_time_s": s["step_time_s"],
        "compute_s": s["compute_s"], "communication_s": s["communication_s"],
        "exposed_communication_s": s["exposed_communication_s"], "idle_s": s["idle_s"],
        "min_idle_s": s["min_idle_s"], "bubble_fraction": s["bubble_fraction"],
        "mfu": s.get("mfu"), "hfu": s.get("hfu"), "model_flops": s.get("model_flops"),
        "total_flops": s["total_flops"], "num_devices": s["num_devices"],
        "max_peak_memory_bytes": s["max_peak_memory_bytes"], "oom": s["oom"],
        "simulated_devices": s["meta"].get("simulated_devices"),
        "wall_s": round(wall, 2),
    }
    del result
    t0 = time.perf_counter()
    try:
        est = estimate({"model": dict(run["model"]), "topology": run["topology"], **opts})
        out["estimate_step_time_s"] = est["step_time_s"]
        out["estimate_wall_s"] = round(time.perf_counter() - t0, 3)
    except Exception as exc:   # the estimator's contract: it refuses what it does not cover
        out["estimate_step_time_s"] = None
        out["estimate_error"] = f"{type(exc).__name__}: {exc}"
    return out


def signed_error(predicted: Optional[float], published: float) -> Optional[float]:
    if predicted is None or not math.isfinite(predicted) or predicted <= 0:
        return None
    return 100.0 * (predicted - published) / published


def run_all(runs: List[Dict[str, Any]], previous: Dict[str, Any], force: bool,
            save) -> List[Dict[str, Any]]:
    fingerprint = code_fingerprint()
    cached = {r["id"]: r for r in previous.get("runs", [])}
    rows = []
    for i, run in enumerate(runs, 1):
        key = run_key(run)
        old = cached.get(run["id"])
        if (not force and old and old.get("key") == key
                and old.get("code") == fingerprint and "predicted" in old):
            predicted = old["predicted"]
            print(f"[{i}/{len(runs)}] {run['id']}: cached", flush=True)
        else:
            print(f"[{i}/{len(runs)}] {run['id']}: simulating {run['gpus']} GPUs ...",
                  flush=True)
            predicted = simulate_run(run)
            if predicted["step_time_s"] is None:
                print(f"    refused: {predicted['refused']}", flush=True)
            else:
                print(f"    {predicted['step_time_s']:.3f} s (published "
                      f"{run['published']['step_time_s']:.3f} s), {predicted['wall_s']} s wall",
                      flush=True)
        pub = run["published"]["step_time_s"]
        row = {**run, "key": key, "code": fingerprint, "predicted": predicted,
               "error_pct": signed_error(predicted["step_time_s"], pub),
               "estimate_error_pct": signed_error(predicted.get("estimate_step_time_s"), pub)}
        rows.append(row)
        save(rows)          # keep what is done if a later run is interrupted
    return rows


def headline(rows: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """The runs the headline figures cover: all but those of a source
    marked ``headline: False`` (an implementation distsim does not model)."""
    return [r for r in rows if SOURCES[r["source"]].get("headline", True)]


def statistics(rows: List[Dict[str, Any]], key: str) -> Dict[str, Any]:
    errors = [r[key] for r in rows if r.get(key) is not None]
    if not errors:
        return {"n": 0}
    return {"n": len(errors), "mean_abs_pct": sum(abs(e) for e in errors) / len(errors),
            "max_abs_pct": max(abs(e) for e in errors),
            "signed_mean_pct": sum(errors) / len(errors),
            "over": sum(e > 0 for e in errors), "under": sum(e < 0 for e in errors)}


# ---------------------------------------------------------------- the table
def _s(x: Optional[float]) -> str:
    if x is None:
        return "-"
    return f"{x:.2f}" if x < 100 else f"{x:.1f}"


def _estimate_cell(p: Dict[str, Any]) -> str:
    """The estimate's step time, or "refused" where the estimator refused
    the run's options (its reason is in results.json)."""
    est = p.get("estimate_step_time_s")
    return "refused" if est is None and p.get("estimate_error") else _s(est)


def _pct(x: Optional[float]) -> str:
    return "-" if x is None else f"{x:+.1f}%"


def _published_cell(run: Dict[str, Any]) -> str:
    pub = run["published"]
    if "tflops_per_gpu" in pub:
        return f"{_s(pub['step_time_s'])} ({pub['tflops_per_gpu']} TFLOP/s/GPU)"
    if "mfu" in pub:
        return f"{_s(pub['step_time_s'])} (MFU {100 * pub['mfu']:.1f}%)"
    return _s(pub["step_time_s"])


def _split(p: Dict[str, Any]) -> str:
    """Where the busiest device's step goes: compute, exposed communication,
    idle (the pipeline bubble and waits), as % of the step (means over the
    devices)."""
    step = p["step_time_s"]
    if not step:
        return "-"
    return (f"{100 * p['compute_s'] / step:.0f} / {100 * p['exposed_communication_s'] / step:.0f}"
            f" / {100 * p['idle_s'] / step:.0f}")


def table(rows: List[Dict[str, Any]]) -> str:
    lines = ["| run | GPUs | configuration | published s | distsim s | error | estimate s | "
             "est. error | compute / exposed comm / idle % |",
             "|---|---|---|---|---|---|---|---|---|"]
    source = None
    for r in rows:
        if r["source"] != source:
            source = r["source"]
            lines.append(f"| **{SOURCES[source]['cite']}** | | | | | | | | |")
        p = r["predicted"]
        if p["step_time_s"] is None:
            lines.append(f"| {r['label']} | {r['gpus']} | {r['config']} | {_published_cell(r)} | "
                         f"refused ({p['refused'].split(': ', 1)[-1].split(', so')[0]}) | "
                         f"- | - | - | - |")
            continue
        lines.append(f"| {r['label']} | {r['gpus']} | {r['config']} | {_published_cell(r)} | "
                     f"{_s(p['step_time_s'])}{' (OOM)' if p.get('oom') else ''} | "
                     f"{_pct(r['error_pct'])} | "
                     f"{_estimate_cell(p)} | {_pct(r['estimate_error_pct'])} | "
                     f"{_split(p)} |")
    lines.append("")
    main_rows = headline(rows)
    for subset, scope in ((main_rows, "headline runs"), (rows, "all runs")):
        if scope == "all runs" and len(subset) == len(main_rows):
            continue
        for key, what in (("error_pct", "distsim (full simulation)"),
                          ("estimate_error_pct", "estimator")):
            st = statistics(subset, key)
            if st["n"]:
                lines.append(f"**{what}, {scope}** ({st['n']}): mean |error| "
                             f"{st['mean_abs_pct']:.1f}%, max |error| {st['max_abs_pct']:.1f}%, "
                             f"signed mean {st['signed_mean_pct']:+.1f}% ({st['over']} over, "
                             f"{st['under']} under the published time).")
                lines.append("")
    by_source = []
    for key in SOURCES:
        sub = [r for r in rows if r["source"] == key]
        st = statistics(sub, "error_pct")
        if st["n"]:
            by_source.append(f"{key} {st['signed_mean_pct']:+.1f}% signed, "
                             f"{st['mean_abs_pct']:.1f}% mean |error| ({st['n']})")
    if by_source:
        lines.append("By source (distsim): " + "; ".join(by_source) + ".")
        lines.append("")
    codes = sorted({r["code"] for r in rows})
    if len(codes) == 1:
        lines.append(f"distsim code fingerprint `{codes[0]}` (run.py's `code_fingerprint`).")
    else:
        lines.append(f"Rows from {len(codes)} versions of distsim's code "
                     f"({', '.join(f'`{c}`' for c in codes)}): a run without `--only` or "
                     f"`--quick` brings them to one.")
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help=f"only the smallest runs ({', '.join(QUICK)})")
    parser.add_argument("--only", action="append", metavar="ID",
                        help="only the run of this id (repeatable)")
    parser.add_argument("--force", action="store_true", help="simulate even cached runs")
    parser.add_argument("--out", type=Path, default=HERE,
                        help="folder for results.json and README.md (default: this folder)")
    parser.add_argument("--list", action="store_true", help="list the runs and exit")
    parser.add_argument("--comm-streams", choices=("per-group", "shared"),
                        help="simulate every run with this comm_streams setting (default: "
                             "distsim's); the estimator refuses a setting it does not model, "
                             "and the row says so")
    parser.add_argument("--fusion", choices=("none", "megatron", "megatron-core"),
                        help=f"simulate every run under this kernel fusion (default: "
                             f"{FUSION}, what every source ran)")
    args = parser.parse_args(argv)

    from distsim.fileio import write_json_atomic, write_text_atomic

    runs = all_runs()
    if args.list:
        for r in runs:
            print(f"{r['id']:36s} {r['gpus']:5d} GPUs  {r['config']}")
        return 0
    wanted = set(args.only or ()) | (set(QUICK) if args.quick else set())
    if wanted:
        unknown = wanted - {r["id"] for r in runs}
        if unknown:
            parser.error(f"unknown run id(s): {', '.join(sorted(unknown))} (see --list)")
        runs = [r for r in runs if r["id"] in wanted]
    if args.comm_streams:          # part of each run's options, so of its cache key
        for r in runs:
            r["options"] = {**r["options"], "comm_streams": args.comm_streams}
    if args.fusion:
        for r in runs:
            r["options"] = {**r["options"], "fusion": args.fusion}
    args.out.mkdir(parents=True, exist_ok=True)
    results_path = args.out / "results.json"
    try:
        previous = json.loads(results_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        previous = {}
    order = {r["id"]: i for i, r in enumerate(all_runs())}
    # rows of runs not (yet) redone this time stay as they were, so that an
    # interrupted or partial run loses nothing
    earlier = [r for r in previous.get("runs", []) if r["id"] in order]

    def merge(rows: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
        done = {r["id"] for r in rows}
        return sorted([r for r in earlier if r["id"] not in done] + rows,
                      key=lambda r: order[r["id"]])

    def save(rows: List[Dict[str, Any]]) -> None:
        merged = merge(rows)
        write_json_atomic(results_path, {
            "sources": SOURCES,
            "summary": {"distsim": statistics(headline(merged), "error_pct"),
                        "estimate": statistics(headline(merged), "estimate_error_pct"),
                        "distsim_all": statistics(merged, "error_pct"),
                        "estimate_all": statistics(merged, "estimate_error_pct")},
            "runs": merged})

    rows = run_all(runs, previous, args.force, save)
    merged = merge(rows)
    text = table(merged)
    readme = args.out / "README.md"
    if readme.exists():
        old = readme.read_text(encoding="utf-8")
        new = re.sub(r"(<!-- results -->\n).*?(<!-- /results -->)",
                     lambda m: m.group(1) + text + "\n" + m.group(2), old, flags=re.S)
    else:
        new = f"<!-- results -->\n{text}\n<!-- /results -->\n"
    write_text_atomic(readme, new)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
