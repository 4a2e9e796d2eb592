"""``distsim sweep SPEC.yaml --out DIR``: run a sweep spec, write the
results table, the charts and report.html."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..report.summary import MS
from ..sweep import load_spec, sweep
from ..sweep.interrupt import EXIT_TERMINATED, Terminated, sigterm_as_interrupt
from ..sweep.runners import DEFAULT_CONNECT_TIMEOUT_S
from ..sweep.spec import DEFAULT_MAX_POINTS


def add_parser(sub) -> None:
    p = sub.add_parser(
        "sweep", help="simulate every point of a grid of options (YAML spec)",
        description="Simulate (or, with fidelity: estimate, estimate in milliseconds) every "
                    "configuration of a sweep spec (base options, a grid of values, "
                    "constraints, check: N to simulate the N best estimates in full; see the "
                    "README's 'Sweeps and search' and reports/sweeps/). Writes "
                    "results.csv, results.parquet and the journal results.jsonl into --out as "
                    "points finish, then heatmap/scaling/pareto/breakdown PNGs and report.html. "
                    "Rerunning the same command resumes: finished points are not simulated again.")
    p.add_argument("spec", metavar="SPEC.yaml", help="the sweep spec")
    p.add_argument("--out", default="distsim-sweep",
                   help="output folder (default: %(default)s)")
    p.add_argument("--workers", type=int, default=None,
                   help="local worker processes (default: every core; 1: in this process); "
                        "with --scheduler local-dask, the number of Dask workers")
    p.add_argument("--scheduler", default=None,
                   help="run on Dask: tcp://HOST:PORT of a running scheduler, or local-dask to "
                        "start a LocalCluster here (needs: pip install 'distsim[dask]')")
    p.add_argument("--connect-timeout", type=float, default=DEFAULT_CONNECT_TIMEOUT_S,
                   metavar="SECONDS",
                   help="how long to wait for the Dask scheduler (default: %(default)s)")
    p.add_argument("--max-points", type=int, default=DEFAULT_MAX_POINTS, dest="max_points",
                   metavar="N",
                   help="refuse a grid that expands to more than N points, before any work "
                        "starts; 0: no limit (default: %(default)s)")
    p.add_argument("--no-charts", action="store_true", help="skip the PNG charts and report.html")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """The command; SIGTERM stops it as Ctrl-C does (workers stopped, the
    journal kept for a rerun to resume) and exits with status 143."""
    with sigterm_as_interrupt():
        try:
            return _run(args)
        except Terminated:
            print(f"distsim: terminated (SIGTERM): the finished points are kept in "
                  f"{Path(args.out) / 'results.jsonl'}; run the same command again to resume",
                  file=sys.stderr)
            return EXIT_TERMINATED


def _run(args: argparse.Namespace) -> int:
    # the charts' modules load matplotlib and pandas: imported when the
    # command runs, so that `distsim --help` and the other commands start fast
    from ..report.html import write_sweep_report
    from ..report.sweep_charts import (param_columns, ranked, throughput_column,
                                       write_sweep_charts)
    spec = load_spec(args.spec, max_points=args.max_points)
    out = Path(args.out)
    df = sweep(spec=spec, workers=args.workers, scheduler=args.scheduler, out_dir=out,
               progress=not args.quiet, connect_timeout_s=args.connect_timeout)
    written = [out / "results.csv", out / "results.parquet"]
    if not args.no_charts:
        heatmap = spec.charts.get("heatmap")
        hue = spec.charts.get("hue")
        charts = write_sweep_charts(df, out, heatmap=heatmap, hue=hue)
        written += list(charts.values())
        written.append(write_sweep_report(df, out / "report.html", title=f"distsim sweep: "
                                          f"{spec.name}", charts=charts,
                                          description=spec.description))
    counts = df["status"].value_counts().to_dict()
    print(f"{spec.name}: {len(df)} configurations: "
          + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())))
    ok = ranked(df)     # step time at a common batch, else throughput
    fits = ok[~ok["oom"].fillna(False).astype(bool)]
    params = param_columns(df)
    col, _ = throughput_column(df)
    unit = "tokens/s" if col == "tokens_per_s" else "samples/s"
    mixed = df["fidelity"].nunique() > 1       # estimated and simulated rows
    for rank, (_, row) in enumerate(fits.head(5).iterrows(), 1):
        opts = " ".join(f"{p}={row[p]}" for p in params if p in spec.grid and p != "fidelity")
        how = f"  ({row['fidelity']})" if mixed else ""
        print(f"  {rank}. {row['step_time_s'] * MS:10.4f} ms  {row[col]:10.4g} {unit}  "
              f"{opts}{how}")
    print("wrote " + ", ".join(str(p) for p in written if Path(p).exists()))
    return 0
