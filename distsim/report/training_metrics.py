"""Training figures of a simulated step: throughput, FLOP utilisation,
pipeline bubble and memory by category.

- ``tokens_per_s``: global batch x sequence length / step time;
- ``model_flops``: the FLOPs the model needs per step, counted as in
  Narayanan et al. (2021): 3 x the forward matmuls (weights and attention
  scores / context, causal mask not discounted), no recomputation;
  ``mfu`` = model_flops / (step time x devices x peak FLOP/s of the
  compute dtype);
- ``hfu``: every FLOP the simulated devices executed (recomputation and
  element-wise ops included) over the same peak;
- ``bubble_fraction``: mean over devices of the share of the step during
  which a device runs nothing (0 without pipeline parallelism);
- ``memory_by_category``: per device, the bytes of each category
  (weights, gradients, optimizer, activations, temporaries) at its peak;
  ``oom_category``: the largest category of the device with the highest
  peak when some device exceeds its memory;
- ``notes``: remarks on the run's layout, e.g. tensor-parallel groups that
  span servers (tp larger than the GPUs per server, or ``--order`` putting
  TP ranks apart), whose collectives then cross the network.
"""
from __future__ import annotations

from typing import Any, Dict, List, Mapping

from ..errors import DistsimError
from ..ir.types import DType
from ..models.gpt_family import model_flops_per_step  # noqa: F401  (re-exported)
from ..transforms.strategy import Strategy


def layout_notes(strategy: Mapping[str, Any], topology: Any) -> List[str]:
    """Remarks on how the strategy's mesh sits on ``topology``: a note when
    some tensor-parallel group spans more than one server (Megatron keeps
    TP inside a node, where NVLink carries its per-layer all-reduces)."""
    try:
        s = Strategy.from_mapping(strategy)
    except DistsimError:
        return []
    if s.tp <= 1 or topology is None or s.dp is None \
            or s.num_devices > topology.num_devices:
        return []
    groups = s.tp_groups()
    spanning = sum(1 for g in groups if len({topology.node_of(r) for r in g}) > 1)
    if not spanning:
        return []
    per_node = topology.devices_per_node
    if s.tp > per_node:
        why = f"tp {s.tp} is more than the {per_node} GPUs per server"
    elif s.order != "tp-dp-pp":
        why = f"--order {s.order} puts tensor-parallel ranks apart"
    else:
        why = f"tp {s.tp} does not divide the {per_node} GPUs per server"
    return [f"tensor parallelism crosses servers: {spanning} of {len(groups)} TP groups span "
            f"more than one server ({why}); their collectives run over the network"]


def training_metrics(summary: Mapping[str, Any], trace_meta: Mapping[str, Any],
                     model: Mapping[str, Any], strategy: Mapping[str, Any],
                     peak_flops: float, topology: Any = None) -> Dict[str, Any]:
    step = float(summary["step_time_s"])
    devices = summary["devices"]
    n = int(summary.get("num_devices") or len(devices))  # devices represented, not simulated
    out: Dict[str, Any] = {}
    if "global_batch" in model and "seq" in model and step > 0:
        out["tokens_per_step"] = int(model["global_batch"] * model["seq"])
        out["tokens_per_s"] = out["tokens_per_step"] / step
    denom = step * n * peak_flops
    mflops = model_flops_per_step(model)
    if mflops is not None:
        out["model_flops"] = mflops
        out["mfu"] = mflops / denom if denom > 0 else 0.0
    out["hfu"] = float(summary.get("total_flops", 0.0)) / denom if denom > 0 else 0.0
    pp = int(strategy.get("pp") or 1)
    idle = sum(d["idle_s"] * d.get("represents", 1) for d in devices)
    out["bubble_fraction"] = idle / (n * step) if pp > 1 and n and step > 0 else 0.0
    by_cat = trace_meta.get("peak_memory_by_category", {}) or {}
    memory = {int(r): {k: int(v) for k, v in cats.items()} for r, cats in by_cat.items()}
    out["memory_by_category"] = {str(r): memory[r] for r in sorted(memory)}
    out["oom_category"] = None
    if summary.get("oom") and memory:
        worst = summary.get("max_peak_memory_rank")
        cats = memory.get(worst) or next(iter(memory.values()))
        out["oom_category"] = max(cats, key=lambda k: (cats[k], k)) if cats else None
    out["notes"] = layout_notes(strategy, topology)
    return out


def peak_flops_of(device_spec, dtype_name: str) -> float:
    return device_spec.peak_flops_for(DType.parse(dtype_name))


def format_training_metrics(summary: Mapping[str, Any]) -> str:
    """Lines appended to the summary table (empty when nothing applies)."""
    lines = []
    if "tokens_per_s" in summary:
        lines.append(f"tokens/s: {summary['tokens_per_s']:.4g}")
    if "mfu" in summary:
        lines.append(f"MFU: {100 * summary['mfu']:.1f}%   HFU: {100 * summary['hfu']:.1f}%")
    if summary.get("bubble_fraction"):
        lines.append(f"pipeline bubble: {100 * summary['bubble_fraction']:.1f}% of the step")
    memory = summary.get("memory_by_category") or {}
    worst = summary.get("max_peak_memory_rank")
    if memory and str(worst) in memory:
        cats = memory[str(worst)]
        parts = ", ".join(f"{k} {v / 1e9:.2f}" for k, v in sorted(cats.items()) if v)
        lines.append(f"peak memory on rank {worst} by category (GB): {parts}")
    if summary.get("oom_category"):
        lines.append(f"OOM: rank {worst} peaks at {summary['max_peak_memory_bytes'] / 1e9:.2f} GB, "
                     f"mostly {summary['oom_category']}")
    lines += [f"note: {n}" for n in summary.get("notes") or ()]
    return ("\n" + "\n".join(lines)) if lines else ""
