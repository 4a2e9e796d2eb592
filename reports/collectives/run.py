"""distsim's collectives against the published nccl-tests figures of
published.csv: for every published point, distsim's bus bandwidth in both
network modes and the error; and distsim's curves from 1 KB to 8 GB beside
the published points. Writes comparison.csv, busbw.csv and busbw.png here
and prints the comparison as a markdown table (README.md holds a copy).

    python reports/collectives/run.py
"""
from __future__ import annotations

import csv
from pathlib import Path
from typing import Dict, List

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from distsim.fileio import atomic_path, write_text_atomic  # noqa: E402
from distsim.sim.collective_bench import benchmark_collective  # noqa: E402

HERE = Path(__file__).resolve().parent
MODES = ("flow", "analytical")
CURVE_SIZES = [2 ** k for k in range(10, 34)]          # 1 KiB .. 8 GiB
#: the size range the model is held to (10 %)
CHECKED = (2 ** 20, 2 ** 33)


def published() -> List[Dict[str, str]]:
    """The rows of published.csv (comment lines skipped)."""
    with open(HERE / "published.csv", newline="") as f:
        return list(csv.DictReader(line for line in f if not line.startswith("#")))


def distsim_busbw(row: Dict[str, str], mode: str) -> Dict[str, object]:
    """distsim's run of one published point: busbw (GB/s), algorithm and
    protocol used."""
    r = benchmark_collective(row["collective"], int(row["bytes"]), row["system"],
                             ranks=range(int(row["ranks"])), algorithm=row["algorithm"],
                             mode=mode)
    return {"busbw": r["busbw_Bps"] / 1e9, "algorithm": r["algorithm"],
            "protocol": r["protocol"]}


def compare() -> pd.DataFrame:
    out = []
    for row in published():
        got = {mode: distsim_busbw(row, mode) for mode in MODES}
        pub = float(row["busbw_GBps"])
        out.append({
            "system": row["system"], "ranks": int(row["ranks"]),
            "collective": row["collective"], "nccl_algorithm": row["algorithm"],
            "bytes": int(row["bytes"]), "published_GBps": pub,
            "flow_GBps": round(got["flow"]["busbw"], 5),
            "analytical_GBps": round(got["analytical"]["busbw"], 5),
            "error_pct": round(100 * (got["flow"]["busbw"] / pub - 1), 1),
            "distsim_algorithm": f"{got['flow']['algorithm']}/{got['flow']['protocol']}",
            "source": row["source"]})
    return pd.DataFrame(out)


def curves(cmp: pd.DataFrame) -> pd.DataFrame:
    rows = []
    groups = cmp[["system", "ranks", "collective", "nccl_algorithm"]].drop_duplicates()
    for _, g in groups.iterrows():
        for mode in MODES:
            for size in CURVE_SIZES:
                r = benchmark_collective(g["collective"], size, g["system"],
                                         ranks=range(g["ranks"]), algorithm=g["nccl_algorithm"],
                                         mode=mode)
                rows.append({"system": g["system"], "ranks": g["ranks"],
                             "collective": g["collective"], "nccl_algorithm": g["nccl_algorithm"],
                             "mode": mode, "bytes": size, "time_s": r["time_s"],
                             "busbw_GBps": r["busbw_Bps"] / 1e9, "algorithm": r["algorithm"]})
    return pd.DataFrame(rows)


def chart(cmp: pd.DataFrame, cur: pd.DataFrame) -> None:
    panels = [("dgx-a100", 8, "8 x A100 (one DGX A100)"),
              ("dgx-a100-x2", 16, "2 x DGX A100, 8 x HDR each"),
              ("dgx-h100", 8, "8 x H100 (one DGX H100)")]
    fig, axes = plt.subplots(1, len(panels) + 1, figsize=(20, 4.8))
    colours = {"allreduce": "C0", "allgather": "C1"}
    for ax, (system, ranks, title) in zip(axes, panels):
        for (kind, algo), d in cur[(cur.system == system) & (cur["mode"] == "flow")].groupby(
                ["collective", "nccl_algorithm"]):
            style = "--" if algo == "ring" else "-"
            label = f"distsim {kind}" + ("" if algo == "auto" else f" ({algo})")
            ax.plot(d["bytes"], d["busbw_GBps"], style, color=colours[kind], label=label)
            p = cmp[(cmp.system == system) & (cmp.collective == kind) &
                    (cmp.nccl_algorithm == algo)]
            ax.plot(p["bytes"], p["published_GBps"], "o", color=colours[kind], mfc="none",
                    ms=6, label=f"published {kind}" + ("" if algo == "auto" else f" ({algo})"))
        ax.set_xscale("log", base=2)
        ax.set_xlabel("message size (bytes)")
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
        ax.axvspan(*CHECKED, color="0.9", zorder=0)
        ax.legend(fontsize=7)
    axes[0].set_ylabel("bus bandwidth (GB/s)")
    err = axes[-1]
    for system, d in cmp.groupby("system"):
        err.plot(d["bytes"], d["error_pct"], "o", label=system, ms=5)
    err.axhspan(-10, 10, color="0.9", zorder=0)
    err.axhline(0, color="k", lw=0.5)
    err.set_xscale("log", base=2)
    err.set_ylim(-50, 50)
    err.set_xlabel("message size (bytes)")
    err.set_ylabel("distsim / published - 1 (%)")
    err.set_title("error per published point (flow model)")
    err.grid(True, which="both", alpha=0.3)
    err.legend(fontsize=7)
    with atomic_path(HERE / "busbw.png") as tmp:
        fig.savefig(tmp, format="png", dpi=80, bbox_inches="tight")


def _size(nbytes: int) -> str:
    for unit, scale in (("GiB", 2 ** 30), ("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if nbytes >= scale:
            return f"{nbytes // scale} {unit}"
    return f"{nbytes} B"


def markdown(cmp: pd.DataFrame) -> str:
    lines = ["| system | GPUs | collective | NCCL algo | size | published | distsim flow | "
             "analytical | error | distsim algo/protocol |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for _, r in cmp.iterrows():
        lines.append(f"| {r['system']} | {r['ranks']} | {r['collective']} | "
                     f"{r['nccl_algorithm']} | {_size(r['bytes'])} | {r['published_GBps']:.4g} | "
                     f"{r['flow_GBps']:.4g} | {r['analytical_GBps']:.4g} | "
                     f"{r['error_pct']:+.1f} % | {r['distsim_algorithm']} |")
    inside = cmp[(cmp["bytes"] >= CHECKED[0]) & (cmp["bytes"] <= CHECKED[1])]
    lines.append("")
    lines.append(f"{len(inside)} points from 1 MiB to 8 GiB: mean |error| "
                 f"{inside['error_pct'].abs().mean():.1f} %, max |error| "
                 f"{inside['error_pct'].abs().max():.1f} %, signed mean "
                 f"{inside['error_pct'].mean():+.1f} %.")
    return "\n".join(lines)


def main() -> None:
    cmp = compare()
    write_text_atomic(HERE / "comparison.csv", cmp.to_csv(index=False))
    cur = curves(cmp)
    write_text_atomic(HERE / "busbw.csv", cur.to_csv(index=False))
    chart(cmp, cur)
    print(markdown(cmp))


if __name__ == "__main__":
    main()
