"""Run the benchmark suite and regenerate this folder's figures:
``bench.json`` (every figure), ``growth.png`` (benchmark 5) and the table
in ``README.md`` between the markers.

    python reports/perf/run.py            # the full suite (a few minutes)
    python reports/perf/run.py --quick    # reduced sizes
    python reports/perf/run.py --counts   # and growth in counted work (Valgrind,
                                          # about 15 minutes more)
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from distsim.bench import BENCHMARKS, OPTIONAL, run_suite
from distsim.cli.bench_cmd import TABLE, format_value
from distsim.fileio import atomic_path, write_json_atomic, write_text_atomic

HERE = Path(__file__).resolve().parent


def growth_plot(figures: dict, path: Path) -> None:
    points = figures.get("growth_points") or []
    counted = figures.get("growth_count_points") or []
    fig = Figure(figsize=(11 if counted else 6, 4))
    ax = fig.add_subplot(1, 2 if counted else 1, 1)
    ops = np.array([p["ops"] for p in points], dtype=float)
    wall = np.array([p["wall_s"] for p in points], dtype=float)
    ax.loglog(ops, wall, "o-", label="simulation wall time")
    if len(ops) > 1:
        ref = wall[0] * ops / ops[0]
        ax.loglog(ops, ref, "--", color="grey", label="linear in ops")
    for p in points:
        ax.annotate(f"{p['gpus']} GPUs, {p['layers']} layers", (p["ops"], p["wall_s"]),
                    fontsize=7, textcoords="offset points", xytext=(4, -10))
    ax.set_xlabel("simulated ops")
    ax.set_ylabel("wall time (s)")
    ax.set_title(f"Growth: wall ~ ops^{figures.get('growth_exponent', float('nan')):.2f}")
    ax.legend(fontsize=8)
    _plain_ticks(ax)
    if counted:
        _counted_plot(fig.add_subplot(1, 2, 2), figures, counted)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=110)


def _plain_ticks(ax) -> None:
    """Log axes labelled in plain numbers (6, 8, 10 s; 300k ops), not
    powers of ten: the points span less than a decade."""
    def label(x: float, _pos: int) -> str:
        return f"{x / 1000:g}k" if x >= 10000 else f"{x:g}"
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_formatter(FuncFormatter(label))
        axis.set_minor_formatter(FuncFormatter(label))


def _counted_plot(ax, figures: dict, points: list) -> None:
    """Counted work (Valgrind): instructions and simulated last-level
    cache misses per point, each relative to the first point, against the
    ops relative to the first point."""
    ops = np.array([p["ops"] for p in points], dtype=float)
    x = ops / ops[0]
    for key, label, exp in (("instructions", "instructions", "growth_exponent_instructions"),
                            ("ll_misses", "last-level cache misses", "growth_exponent_ll_misses")):
        y = np.array([p[key] for p in points], dtype=float)
        ax.loglog(x, y / y[0], "o-", label=f"{label} (k = {figures.get(exp, float('nan')):.2f})")
    ax.loglog(x, x, "--", color="grey", label="linear in ops")
    ax.set_xlabel("simulated ops (relative to the first point)")
    ax.set_ylabel("count (relative to the first point)")
    ax.set_title("Growth in counted work (cachegrind)")
    ax.legend(fontsize=8)
    _plain_ticks(ax)


#: the figures of benchmark 6 (counted work), kept from the last run that
#: counted them when a run does not
COUNTED = ("growth_exponent_instructions", "growth_exponent_ll_misses",
           "growth_exponent_d1_misses", "growth_count_points", "growth_count_caches",
           "growth_instructions_per_op", "growth_ll_misses_per_op",
           "growth_counts_benchmark_wall_s", "growth_counts_commit")


def carried_counts(previous: Path, quick: bool) -> dict:
    """The counted figures of the last run that counted (``previous``, its
    bench.json, of the same size), with a note saying so: counts take a
    quarter of an hour and do not move with the machine, only with the
    code, so a run without ``--counts`` shows the last ones, marked, rather
    than none."""
    try:
        old = json.loads(previous.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if old.get("quick") != quick or "growth_exponent_instructions" not in old:
        return {}
    carried = {k: old[k] for k in COUNTED if k in old}
    commit = old.get("growth_counts_commit", "an earlier commit")
    carried["growth_counts_note"] = (f"the counted figures are carried over from the last "
                                     f"run with --counts (on {commit}), not measured in this run")
    return carried


def _commit() -> str:
    """The checked-out commit (short), or "unknown" outside a git checkout."""
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE,
                             capture_output=True, text=True, check=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.stdout.strip() or "unknown"


def table(figures: dict) -> str:
    rows = ["| figure | value | target |", "|---|---|---|"]
    for key, label, target in TABLE:
        rows.append(f"| {label.strip()} (`{key}`) | {format_value(figures.get(key))} | {target} |")
    m = figures["machine"]
    rows.append("")
    for key in sorted(k for k in figures if k.endswith("_note")):
        rows.append(f"Note ({key}): {figures[key]}.")
        rows.append("")
    rows.append(f"Machine: {m['processor']}, {m['cpus']} CPUs, Python {m['python']}, "
                f"{m['platform']}; quick={figures['quick']}.")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="reduced sizes")
    parser.add_argument("--counts", action="store_true",
                        help="also count growth in instructions and cache misses (Valgrind)")
    args = parser.parse_args()
    names = [*BENCHMARKS, *OPTIONAL] if args.counts else None
    figures = run_suite(names, quick=args.quick,
                        progress=lambda n: print("running", n, flush=True))
    if args.counts:
        figures["growth_counts_commit"] = _commit()
    else:
        figures.update(carried_counts(HERE / "bench.json", args.quick))
    write_json_atomic(HERE / "bench.json", figures)
    growth_plot(figures, HERE / "growth.png")
    readme = HERE / "README.md"
    text = readme.read_text(encoding="utf-8")
    text = re.sub(r"(<!-- table -->\n).*?(\n<!-- /table -->)",
                  lambda m: m.group(1) + table(figures) + m.group(2), text, flags=re.S)
    write_text_atomic(readme, text)
    print(table(figures))


if __name__ == "__main__":
    main()
