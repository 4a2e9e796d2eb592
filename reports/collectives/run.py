"""Bus bandwidth against message size for each collective on dgx-a100 and
dgx-a100-x4 (the nccl-tests view). Writes busbw.png and busbw.csv here.

    python reports/collectives/run.py
"""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from distsim.fileio import atomic_path, write_text_atomic  # noqa: E402
from distsim.sim.collective_bench import parse_sweep, sweep_collective  # noqa: E402

HERE = Path(__file__).resolve().parent
TOPOLOGIES = ["dgx-a100", "dgx-a100-x4"]
KINDS = ["allreduce", "allgather", "reducescatter", "alltoall", "broadcast"]
SIZES = parse_sweep("1KB:4GB:4")


def main() -> None:
    rows = [r for topo in TOPOLOGIES for kind in KINDS
            for r in sweep_collective(kind, SIZES, topo)]
    df = pd.DataFrame(rows)
    write_text_atomic(HERE / "busbw.csv", df.to_csv(index=False))
    fig, axes = plt.subplots(1, len(TOPOLOGIES), figsize=(12, 4.5), sharey=True)
    for ax, topo in zip(axes, TOPOLOGIES):
        for kind in KINDS:
            d = df[(df.topology == topo) & (df.collective == kind)]
            ax.plot(d["bytes"], d["busbw_Bps"] / 1e9, marker="o", ms=3, label=kind)
        ax.set_xscale("log")
        ax.set_xlabel("message size (bytes)")
        ax.set_title(f"{topo} ({int(d['ranks'].iloc[0])} GPUs), algorithm auto")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("bus bandwidth (GB/s)")
    axes[0].legend()
    with atomic_path(HERE / "busbw.png") as tmp:
        fig.savefig(tmp, format="png", dpi=90, bbox_inches="tight")
    big = df[df["bytes"] == df["bytes"].max()][["topology", "collective", "algorithm",
                                                 "time_s", "busbw_Bps"]]
    print(big.to_string(index=False))


if __name__ == "__main__":
    main()
