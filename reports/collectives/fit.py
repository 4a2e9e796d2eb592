"""The calibration behind the topology files' fitted collective figures:
for each, the values that minimise the largest |error| against the
published points of published.csv they are fitted to (a grid, refined
twice around its best), printed beside the files' values. Nothing is
written: copy a value into topologies/*.yaml by hand, with its source.

    python reports/collectives/fit.py

Fitted (all on collective microbenchmarks only):
- dgx-a100 Simple: the NVLink hop latency and the pipeline fill, on the
  8-GPU all-reduce curve (Azure ND A100 v4, 1 MiB to 8 GiB);
- dgx-h100 NVLS: its hop latency and pipeline fill, on the NVLS curve
  (Azure ND H100 v5, 1 MiB to 8 GiB).
"""
from __future__ import annotations

import itertools
from pathlib import Path
from typing import Callable, Dict, List, Sequence, Tuple

from distsim.paths import topologies_dir
from distsim.sim.collective_bench import benchmark_collective
from distsim.topology import topology_from_dict
from distsim.yamlio import load_yaml_file

from run import published  # noqa: E402  (reports/collectives/run.py)

HERE = Path(__file__).resolve().parent


def _topology(system: str, setter: Callable[[Dict], None]):
    base = system.split("-x")[0]
    data = load_yaml_file(str(topologies_dir() / f"{base}.yaml"), "topology file")
    setter(data["collectives"])
    nodes = int(system.split("-x")[1]) if "-x" in system else None
    return topology_from_dict(data, f"{base}.yaml", nodes=nodes, name=system)


def worst_error(rows: Sequence[Dict[str, str]], setter: Callable[[Dict], None]) -> float:
    topo = _topology(rows[0]["system"], setter)
    worst = 0.0
    for r in rows:
        got = benchmark_collective(r["collective"], int(r["bytes"]), topo,
                                   ranks=range(int(r["ranks"])), algorithm=r["algorithm"],
                                   mode="analytical")["busbw_Bps"] / 1e9
        worst = max(worst, abs(got / float(r["busbw_GBps"]) - 1))
    return worst


def fit(rows, make: Callable[..., Callable[[Dict], None]],
        grids: Sequence[Sequence[float]]) -> Tuple[Tuple[float, ...], float]:
    """The grid point (refined twice around the best) with the least
    worst error."""
    best: Tuple[Tuple[float, ...], float] = ((), float("inf"))
    for _ in range(3):
        for point in itertools.product(*grids):
            err = worst_error(rows, make(*point))
            if err < best[1]:
                best = (point, err)
        grids = [[v * f for f in (0.85, 0.9, 0.95, 1.0, 1.05, 1.1, 1.15)] for v in best[0]]
    return best


def _select(system: str, collective: str, algorithm: str, low: int, high: int) -> List[Dict]:
    return [r for r in published() if r["system"] == system and r["collective"] == collective
            and r["algorithm"] == algorithm and low <= int(r["bytes"]) <= high
            and "Azure" in r["source"]]


def main() -> None:
    a100 = _select("dgx-a100", "allreduce", "auto", 2 ** 20, 2 ** 33)

    def simple(hop, fill):
        def setter(c):
            c["protocols"]["simple"]["hop_latency_us"]["nvlink"] = hop
            c["protocols"]["simple"]["pipeline_us"] = fill
        return setter

    (hop, fill), err = fit(a100, simple, [[0.5, 1.0, 2.0, 3.0], [100, 200, 300]])
    print(f"dgx-a100 simple: hop_latency_us.nvlink {hop:.2f}, pipeline_us {fill:.0f} "
          f"(worst error {100 * err:.1f} % over {len(a100)} points)")

    h100 = _select("dgx-h100", "allreduce", "nvls", 2 ** 20, 2 ** 33)

    def nvls(hop, fill):
        def setter(c):
            c["nvls"]["hop_latency_us"]["nvlink"] = hop
            c["nvls"]["pipeline_us"] = fill
        return setter

    (hop, fill), err = fit(h100, nvls, [[2.0, 5.0, 10.0, 15.0], [20, 40, 60]])
    print(f"dgx-h100 nvls: hop_latency_us.nvlink {hop:.2f}, pipeline_us {fill:.1f} "
          f"(worst error {100 * err:.1f} % over {len(h100)} points)")


if __name__ == "__main__":
    main()
