"""Llama-3-8B at a 128k context under context parallelism: simulated step
time, its split (compute, the context-parallel exchanges, the other
communication, what of each is exposed) and the memory per GPU as cp
grows, plus LLAMA2-7B at 128k in NeMo's published configuration.

    python reports/long-context/run.py            # writes results.json beside this file
    python reports/long-context/run.py --out DIR

Every run is a full simulation (``symmetry=True, coarsen=True``: exact in
step time and memory) on the repository's DGX H100 cluster (``dgx-h100-xN``, bf16);
nothing is fitted. The split is rank 0's
(:func:`distsim.report.comm_kinds.communication_by_kind`): ``busy`` is the
union of the kind's intervals, ``exposed`` what of it no compute op covers.
Beside each simulation, the sweep's fast estimate of the same options
(``fidelity: estimate``, :func:`distsim.estimate.estimate`): its step time
and peak memory, and how long it took.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, Dict, List

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
if str(ROOT) not in sys.path:          # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

from distsim.api import simulate  # noqa: E402
from distsim.estimate import estimate  # noqa: E402
from distsim.report.comm_kinds import communication_by_kind  # noqa: E402

SEQ = 131072
#: (name, model, topology, options): the cp sweep at 32 GPUs (tp 4, one
#: sequence of 128k tokens per data-parallel rank and micro-batch), the two
#: exchanges side by side (all-gather, ring, Ulysses' all-to-all), and NeMo's
#: published LLAMA2-7B 128k layout; all
#: with sequence parallelism (where tp > 1) and Megatron's distributed
#: optimizer (ZeRO 1 over dp x cp), as Megatron-LM's and NeMo's long-context
#: recipes run
RUNS: List[Dict[str, Any]] = [
    *[{"name": f"llama3-8b tp4 cp{cp}", "model": "llama3-8b", "topology": "dgx-h100-x4",
       "options": {"tp": 4, "cp": cp, "global_batch": 8}} for cp in (1, 2, 4, 8)],
    {"name": "llama3-8b tp4 cp8 ring", "model": "llama3-8b", "topology": "dgx-h100-x4",
     "options": {"tp": 4, "cp": 8, "cp_comm": "ring", "global_batch": 8}},
    {"name": "llama3-8b tp8 cp4", "model": "llama3-8b", "topology": "dgx-h100-x4",
     "options": {"tp": 8, "cp": 4, "global_batch": 8}},
    {"name": "llama3-8b tp8 cp4 ring", "model": "llama3-8b", "topology": "dgx-h100-x4",
     "options": {"tp": 8, "cp": 4, "cp_comm": "ring", "global_batch": 8}},
    {"name": "llama3-8b tp2 cp16", "model": "llama3-8b", "topology": "dgx-h100-x4",
     "options": {"tp": 2, "cp": 16, "global_batch": 8}},
    *[{"name": f"llama3-8b tp1 cp8 {comm}", "model": "llama3-8b", "topology": "dgx-h100-x4",
       "options": {"tp": 1, "cp": 8, "cp_comm": comm, "global_batch": 8}}
      for comm in ("allgather", "ring", "alltoall")],
    {"name": "llama2-7b tp4 cp4 dp8 (NeMo)", "model": "llama2-7b", "topology": "dgx-h100-x16",
     "options": {"tp": 4, "cp": 4, "global_batch": 16, "attention": "fused"}},
    {"name": "llama2-7b tp4 cp4 dp8 ring (NeMo)", "model": "llama2-7b",
     "topology": "dgx-h100-x16",
     "options": {"tp": 4, "cp": 4, "cp_comm": "ring", "global_batch": 16,
                 "attention": "fused"}},
    {"name": "llama2-7b tp4 cp4 dp8 alltoall", "model": "llama2-7b",
     "topology": "dgx-h100-x16",
     "options": {"tp": 4, "cp": 4, "cp_comm": "alltoall", "global_batch": 16,
                 "attention": "fused"}},
]


def run(spec: Dict[str, Any]) -> Dict[str, Any]:
    options = dict(seq=SEQ, zero=1, sp=spec["options"]["tp"] > 1, **spec["options"])
    t0 = time.perf_counter()
    fast = estimate({"model": spec["model"], "topology": spec["topology"], **options})
    fast_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    result = simulate(spec["model"], spec["topology"], symmetry=True, coarsen=True, **options)
    s = result.summary()
    rank0 = s["memory_by_category"]["0"]
    return {"name": spec["name"], "model": spec["model"], "topology": spec["topology"],
            "options": spec["options"], "devices": s["num_devices"],
            "step_time_s": s["step_time_s"], "tokens_per_s": s.get("tokens_per_s"),
            "mfu": s.get("mfu"), "hfu": s.get("hfu"),
            "compute_s": s["compute_s"], "communication_s": s["communication_s"],
            "exposed_communication_s": s["exposed_communication_s"],
            "peak_memory_bytes": s["max_peak_memory_bytes"], "oom": s["oom"],
            "memory_capacity_bytes": s.get("memory_capacity_bytes"),
            "activations_bytes_at_peak": rank0.get("activations"),
            "memory_at_peak": rank0,
            "comm_by_kind": communication_by_kind(result.trace, result.program),
            "wall_s": round(time.perf_counter() - t0, 1),
            "estimate": {"step_time_s": fast["step_time_s"],
                         "peak_memory_bytes": fast["max_peak_memory_bytes"],
                         "wall_s": round(fast_s, 2)}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=HERE)
    args = p.parse_args()
    rows = []
    for spec in RUNS:
        rows.append(run(spec))
        r = rows[-1]
        e = r["estimate"]
        print(f"{r['name']:36s} step {r['step_time_s']:8.3f} s  peak "
              f"{r['peak_memory_bytes'] / 1e9:6.1f} GB  exposed "
              f"{r['exposed_communication_s']:.3f} s  ({r['wall_s']} s); estimate "
              f"{e['step_time_s']:8.3f} s  {e['peak_memory_bytes'] / 1e9:6.1f} GB  "
              f"({e['wall_s']} s)", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
