"""Mixtral-8x7B on 64 H100s in Megatron-Core's published layout: simulated
step time, its split (the expert-parallel all-to-alls, the gradient
synchronisation, the pipeline bubble) and the memory per GPU, as ep goes
1, 2, 4, 8 in that layout.

    python reports/moe/run.py            # writes results.json, gantt-small.png, the README table
    python reports/moe/run.py --out DIR  # results.json and the PNG in DIR, README untouched

Every row is a full-model simulation (32 layers; ``symmetry=True,
coarsen=True``, exact in step time and memory: the ep 8 row is also
simulated without either and both figures are kept) on the repository's DGX H100 cluster
(``dgx-h100-x8``, bf16); nothing is fitted. Each row is also estimated
(``fidelity: estimate``, :func:`estimated`) beside its simulation in the
analytical network mode (reduced by symmetry), the estimator's bound; a row
it refused would keep the refusal. The per-kind split is rank 0's
(:func:`distsim.report.comm_kinds.communication_by_kind`): ``busy`` is the
union of a kind's transfers, ``exposed`` what of it no compute op covers.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path
from typing import Any, Dict, List

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
if str(ROOT) not in sys.path:          # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

from distsim.api import simulate  # noqa: E402
from distsim.errors import NotModelledError  # noqa: E402
from distsim.estimate import estimate  # noqa: E402
from distsim.report.comm_kinds import communication_by_kind  # noqa: E402

MODEL, TOPOLOGY = "mixtral-8x7b", "dgx-h100-x8"
#: Megatron-Core's reference mapping for Mixtral 8x7B (dropless, all-to-all
#: dispatcher, BF16, 64 x H100): TP 1, EP 8, PP 4, VP 8, MBS 1, GBS 256 at a
#: 4096-token sequence; Megatron's distributed optimizer is ZeRO 1.
LAYOUT: Dict[str, Any] = {"tp": 1, "pp": 4, "schedule": "interleaved", "virtual_stages": 8,
                          "zero": 1, "global_batch": 256, "micro_batch": 1, "seq": 4096}
RUNS: List[Dict[str, Any]] = [{"name": f"tp1 pp4 vp8 ep{ep}", "options": {**LAYOUT, "ep": ep}}
                              for ep in (1, 2, 4, 8)]
#: the small variant drawn as a Gantt chart: 4 layers on 2 nodes (pp 2, dp 8,
#: ep 8: one node's GPUs share the experts), 2 micro-batches per rank
SMALL: Dict[str, Any] = {"layers": 4, "tp": 1, "pp": 2, "ep": 8, "zero": 1,
                         "global_batch": 16, "micro_batch": 1, "seq": 4096}
PUBLISHED = {"tflops_per_gpu": 468, "precision": "bf16",
             "source": "https://github.com/NVIDIA/Megatron-LM/blob/"
                       "c230e0d7c2986e790c5c10b0e33318d6a4f4a9a5/"
                       "megatron/core/transformer/moe/README.md"}


def run(name: str, options: Dict[str, Any], reduced: bool = True) -> Dict[str, Any]:
    t0 = time.perf_counter()
    result = simulate(MODEL, TOPOLOGY, symmetry=reduced, coarsen=reduced, **options)
    s = result.summary()
    step = s["step_time_s"]
    comm = communication_by_kind(result.trace, result.program)
    return {"name": name, "options": options, "reduced": reduced,
            "devices": s["num_devices"], "step_time_s": step,
            "tokens_per_s_per_gpu": s["tokens_per_s"] / s["num_devices"],
            "model_tflops_per_gpu": s["model_flops"] / step / s["num_devices"] / 1e12,
            "mfu": s.get("mfu"), "compute_s": s["compute_s"],
            "exposed_communication_s": s["exposed_communication_s"],
            "bubble_s": s.get("bubble_fraction", 0.0) * step,
            "peak_memory_bytes": s["max_peak_memory_bytes"], "oom": s["oom"],
            "memory_at_peak": s["memory_by_category"]["0"], "comm_by_kind": comm,
            "wall_s": round(time.perf_counter() - t0, 1)}


def estimated(name: str, options: Dict[str, Any]) -> Dict[str, Any]:
    """The fast estimate of a row (``fidelity: estimate``) beside the
    simulation it is bounded against, both on the analytical network (the
    simulation reduced by ``symmetry``), or the line refusing it."""
    t0 = time.perf_counter()
    try:
        e = estimate({"model": MODEL, "topology": TOPOLOGY, **options,
                      "network_mode": "analytical"})
    except NotModelledError as exc:
        return {"name": name, "refused": str(exc)}
    wall = round(time.perf_counter() - t0, 2)
    s = simulate(MODEL, TOPOLOGY, network_mode="analytical", symmetry=True,
                 **options).summary()
    return {"name": name, "step_time_s": e["step_time_s"],
            "peak_memory_bytes": e["max_peak_memory_bytes"], "wall_s": wall,
            "analytical_step_time_s": s["step_time_s"],
            "analytical_peak_memory_bytes": s["max_peak_memory_bytes"]}


def estimate_table(rows: List[Dict[str, Any]], estimates: List[Dict[str, Any]]) -> str:
    """The README's estimate-against-simulation table."""
    out = ["| run | estimate step s | simulated step s, analytical / flow | estimate peak GB | "
           "simulated peak GB, analytical | estimate wall s |", "|---|---|---|---|---|---|"]
    for r, e in zip(rows, estimates):
        if "refused" in e:
            out.append(f"| {e['name']} | refused: {e['refused']} | - / {r['step_time_s']:.3f} | "
                       "- | - | - |")
            continue
        step = e["step_time_s"] / e["analytical_step_time_s"] - 1
        peak = e["peak_memory_bytes"] / e["analytical_peak_memory_bytes"] - 1
        out.append(f"| {e['name']} | {e['step_time_s']:.3f} ({step:+.2%}) | "
                   f"{e['analytical_step_time_s']:.3f} / {r['step_time_s']:.3f} | "
                   f"{e['peak_memory_bytes'] / 1e9:.1f} ({peak:+.2%}) | "
                   f"{e['analytical_peak_memory_bytes'] / 1e9:.1f} | {e['wall_s']} |")
    return "\n".join(out) + "\n"


def _kind(r: Dict[str, Any], key: str) -> str:
    k = r["comm_by_kind"].get(key, {"busy_s": 0.0, "exposed_s": 0.0})
    return f"{k['busy_s']:.2f} / {k['exposed_s']:.2f}"


def table(rows: List[Dict[str, Any]]) -> str:
    """The README's results table."""
    out = ["| run | step s | tokens/s/GPU | model TFLOP/s/GPU | compute s | EP all-to-all "
           "busy / exposed s | DP busy / exposed s | ZeRO busy / exposed s | pipeline p2p "
           "busy / exposed s | exposed comm s (all) | bubble s | peak GB |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        name = r["name"] + (" (OOM)" if r["oom"] else "")
        out.append(f"| {name} | {r['step_time_s']:.2f} | {r['tokens_per_s_per_gpu']:.0f} | "
                   f"{r['model_tflops_per_gpu']:.0f} | {r['compute_s']:.2f} | "
                   f"{_kind(r, 'EP')} | {_kind(r, 'DP')} | {_kind(r, 'ZeRO')} | "
                   f"{_kind(r, 'pipeline p2p')} | {r['exposed_communication_s']:.2f} | "
                   f"{r['bubble_s']:.2f} | "
                   f"{r['peak_memory_bytes'] / 1e9:.1f} |")
    return "\n".join(out) + "\n"


def write_readme_table(rows: List[Dict[str, Any]], estimates: List[Dict[str, Any]]) -> None:
    readme = HERE / "README.md"
    text = readme.read_text()
    for tag, body in (("table", table(rows)), ("estimates", estimate_table(rows, estimates))):
        text = re.sub(rf"(<!-- {tag} -->\n).*?(<!-- /{tag} -->)",
                      lambda m: m.group(1) + body + m.group(2), text, flags=re.S)
    readme.write_text(text)


def echo(r: Dict[str, Any]) -> Dict[str, Any]:
    """Print one row's headline figures as it finishes; returns it."""
    print(f"{r['name']:30s} step {r['step_time_s']:7.3f} s  {r['model_tflops_per_gpu']:5.0f} "
          f"TFLOP/s/GPU  peak {r['peak_memory_bytes'] / 1e9:6.1f} GB  ({r['wall_s']} s)",
          flush=True)
    return r


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE)
    out = parser.parse_args().out
    rows = [echo(run(spec["name"], spec["options"])) for spec in RUNS]
    full = echo(run(RUNS[-1]["name"] + " (not reduced)", RUNS[-1]["options"], reduced=False))
    estimates = [estimated(spec["name"], spec["options"]) for spec in RUNS]
    out.mkdir(parents=True, exist_ok=True)
    small = simulate(MODEL, "dgx-h100-x2", **SMALL)   # every device: a lane each
    small.gantt(str(out / "gantt-small.png"))
    (out / "results.json").write_text(json.dumps(
        {"published": PUBLISHED, "rows": rows, "unreduced_check": full,
         "small_variant": {"topology": "dgx-h100-x2", "options": SMALL,
                           "step_time_s": small.summary()["step_time_s"]},
         "estimates": estimates},
        indent=1) + "\n")
    if out.resolve() == HERE:
        write_readme_table(rows, estimates)


if __name__ == "__main__":
    main()
