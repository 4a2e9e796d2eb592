"""The H100 runs of the validation: NVIDIA's DGX Cloud benchmarking
recipes for Llama 3.1 on DGX H100 in BF16 (NeMo 24.09 container,
Megatron-core), whose step times and parallel layouts are published, and
whose NeMo configuration names every feature the run switched on.

Source: NVIDIA/dgxc-benchmarking ``llama3.1/README_8b.md`` and
``llama3.1/README_70b.md`` at commit 143b90dd91f9be958fed4773ae95d941a3356a82
(GSW 25.01, ``launch.sh``: ``FW_VERSION=24.09``), the tables "Llama 3.1 8b
24.09 BF16" and "Llama 3.1 70b 24.09 BF16", row "Training step time
(seconds per step)"; the model and training settings are NeMo-Framework-
Launcher's ``launcher_scripts/conf/training/llama/llama3_1_8b.yaml`` and
``llama3_1_70b.yaml`` (which the recipe's ``configure.sh`` runs with
``--config-name=llama3.1_${MODEL_SIZE}.yaml``, overriding only the global
batch, the dtype and the step count), and ``configure.sh``'s environment
(``NVTE_FUSED_ATTN=1``: cuDNN's fused attention, ``NVTE_FLASH_ATTN=0``).

The rule for the headline, written before any of these rows was simulated:
a row is in the headline unless the run used a feature distsim does not
model that removes from the critical path communication distsim times as
exposed, or changes the arithmetic (FP8). The 70B rows ran Transformer
Engine's userbuffers overlap of the tensor-parallel all-gathers and
reduce-scatters with the GEMMs (``ub_tp_comm_overlap: true``), which
distsim does not model (``tp_overlap`` moves the backward's collective
before the weight-gradient GEMM; it does not split GEMMs to hide the
sequence-parallel collectives): outside the headline. The 8B rows (tp 1,
no tensor-parallel collective) are in it.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List

import yaml

ROOT = Path(__file__).resolve().parent.parent.parent

_RECIPES = ("https://github.com/NVIDIA/dgxc-benchmarking/tree/"
            "143b90dd91f9be958fed4773ae95d941a3356a82/llama3.1")

SOURCES_H100: Dict[str, Dict[str, Any]] = {
    "dgxc-llama31": {
        "cite": "NVIDIA dgxc-benchmarking, Llama 3.1 8B pre-training on DGX H100, NeMo 24.09, "
                "BF16 (llama3.1/README_8b.md)",
        "url": _RECIPES,
        "what": "step time per global batch of Llama 3.1 8B, BF16, TP 1, PP 1, CP 2, MBS 1, "
                "GA 32, on 8-128 H100 (global batch 128 per 8 GPUs); configuration "
                "NeMo-Framework-Launcher llama3_1_8b.yaml",
    },
    "dgxc-llama31-tpoverlap": {
        "cite": "NVIDIA dgxc-benchmarking, Llama 3.1 70B pre-training on DGX H100, NeMo 24.09, "
                "BF16 (llama3.1/README_70b.md)",
        "url": _RECIPES,
        "what": "step time per global batch of Llama 3.1 70B, BF16, TP 4, PP 4, CP 2, VP 5, "
                "MBS 1, GA 64, on 64-2048 H100 (global batch 128 per 64 GPUs); configuration "
                "NeMo-Framework-Launcher llama3_1_70b.yaml. Outside the headline figures: the "
                "run overlaps its tensor-parallel collectives with the GEMMs by Transformer "
                "Engine's userbuffers (ub_tp_comm_overlap), which distsim does not model",
        "headline": False,
    },
}


def _named_model(name: str, **extra: Any) -> Dict[str, Any]:
    """The repository's named model config (``models/<name>.yaml``), with
    the run's batch and loss settings."""
    with open(ROOT / "models" / f"{name}.yaml", encoding="utf-8") as fh:
        model = yaml.safe_load(fh)
    model.update(extra)
    return model


def _options(tp: int, pp: int, cp: int, v: int = 0) -> Dict[str, Any]:
    """Megatron-core under NeMo 24.09 as the launcher configs set it: the
    distributed optimizer (ZeRO-1: ``mcore_distributed_optim`` /
    ``distributed_fused_adam``), gradients reduced in 125 MB buckets during
    the backward (``overlap_grad_sync``, ``bucket_cap_mb: 125``), no
    activation recomputation (``activations_checkpoint_granularity: null``),
    the backward's tensor-parallel collective issued before the
    weight-gradient GEMM (Megatron-core's async all-reduce), context
    parallelism as ring attention (Megatron-core / Transformer Engine's
    ``cp_comm_type: p2p``), sequence parallelism with tensor parallelism
    (``sequence_parallel: true`` in the 70B config)."""
    options: Dict[str, Any] = {"tp": tp, "pp": pp, "cp": cp, "micro_batch": 1, "zero": 1,
                               "bucket_mb": 125, "recompute": "none", "tp_overlap": True}
    if cp > 1:
        options["cp_comm"] = "ring"
    if tp > 1:
        options["sp"] = True
    if v:
        options.update(schedule="interleaved", virtual_stages=v)
    return options


def dgxc_llama31() -> List[Dict[str, Any]]:
    """The BF16 rows: 8B on 8, 16 and 128 GPUs (one server, two, and the
    table's largest), 70B on 64 GPUs (its smallest scale; the larger ones
    add data parallelism only)."""
    # Llama 3.1 has Llama 3's shapes (the same config.json but for the rope
    # scaling, which changes no op): the named configs match exactly.
    # The loss: Megatron-core's fused vocab-parallel cross entropy
    # (cross_entropy_loss_fusion: true) on float32 logits; the attention:
    # cuDNN's fused attention (configure.sh: NVTE_FUSED_ATTN=1,
    # NVTE_FLASH_ATTN=0), timed by dgx-h100.yaml's attention.kernels.cudnn
    loss = {"loss_dtype": "fp32", "attention_kernel": "cudnn"}
    runs = []
    for gpus, seconds in ((8, 12.91), (16, 13.00), (128, 13.10)):
        batch = 128 * gpus // 8
        runs.append({
            "id": f"dgxc-llama31-8b-{gpus}", "source": "dgxc-llama31",
            "label": "Llama 3.1 8B (32 x 4096, 32 heads, 8 KV heads)", "gpus": gpus,
            "model": _named_model("llama3-8b", global_batch=batch, micro_batch=1, **loss),
            "topology": "dgx-h100" if gpus == 8 else f"dgx-h100-x{gpus // 8}",
            "options": _options(1, 1, 2),
            "config": f"t 1, p 1, cp 2, d {gpus // 2}, B {batch}, b 1, seq 8192, no "
                      f"pipeline, no recompute, ZeRO-1, 125 MB buckets, fused attention",
            "published": {"step_time_s": seconds},
        })
    runs.append({
        "id": "dgxc-llama31-70b-64", "source": "dgxc-llama31-tpoverlap",
        "label": "Llama 3.1 70B (80 x 8192, 64 heads, 8 KV heads)", "gpus": 64,
        "model": _named_model("llama3-70b", global_batch=128, micro_batch=1, **loss),
        "topology": "dgx-h100-x8",
        "options": _options(4, 4, 2, v=5),
        "config": "t 4, p 4, cp 2, d 2, B 128, b 1, seq 8192, interleaved v=5, SP, no "
                  "recompute, ZeRO-1, 125 MB buckets, fused attention (TP overlap by "
                  "userbuffers not modelled)",
        "published": {"step_time_s": 14.72},
    })
    return runs
