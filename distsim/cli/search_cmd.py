"""``distsim search --model M --topology T --gpus N``: the fastest parallel
strategy, found by pruning with cheap estimates and simulating the rest."""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any, Dict, List

import yaml

from ..errors import ConfigError
from ..fileio import atomic_path, refuse_file_as_folder
from ..sweep.interrupt import EXIT_TERMINATED, Terminated, sigterm_as_interrupt
from ..sweep.search import DEFAULT_KEEP, search


def add_parser(sub) -> None:
    p = sub.add_parser(
        "search", help="find the fastest parallel strategy for a model on N GPUs",
        description="Enumerate every dp x tp x pp (x cp with --space cp=1,2,4) that uses the "
                    "GPUs at the model's global batch, crossed with micro-batch sizes for GPT "
                    "models, every valid expert-parallel degree ep for a mixture of experts, "
                    "and the --space options (e.g. zero, recompute, schedule=1f1b,zb-h1, "
                    "cp_comm=allgather,ring,alltoall); prune by a weights bound; estimate the "
                    "rest: a GPT point with the estimator (milliseconds each) where it models "
                    "it, else (a point it does not model, e.g. context parallelism) and for "
                    "other models by an analytical simulation -- the estimates' "
                    "estimated_by column says which; simulate the --keep fastest estimates in "
                    "full (GPT: with coarsening, and symmetry where exact), and print the top "
                    "strategies with why the best wins. Progress goes to stderr. Exit status 1 "
                    "when no strategy fits (every point invalid or out of memory; the reasons "
                    "are printed), 2 for bad options.")
    p.add_argument("--model", required=True, help="model name or .yaml path")
    p.add_argument("--topology", required=True, help="topology name or .yaml path")
    p.add_argument("--gpus", type=int, default=None,
                   help="GPU count (default and required: the topology's device count)")
    p.add_argument("--set", action="append", default=[], metavar="OPTION=VALUE",
                   help="a fixed option, e.g. --set global_batch=512 (repeatable)")
    p.add_argument("--space", action="append", default=[], metavar="OPTION=V1,V2",
                   help="an extra option to search over, e.g. --space zero=0,1, --space "
                        "cp=1,2,4, --space ep=1,2 (default for a mixture of experts: every "
                        "valid ep) (repeatable)")
    p.add_argument("--keep", type=int, default=None,
                   help=f"how many estimates to simulate in full (default: {DEFAULT_KEEP})")
    p.add_argument("--network-mode", choices=["flow", "analytical"], default="flow",
                   help="network mode of the full simulations (default: %(default)s)")
    p.add_argument("--top", type=int, default=5,
                   help="strategies to print, at least 1 (default: 5)")
    p.add_argument("--workers", type=int, default=None, help="local worker processes")
    p.add_argument("--scheduler", default=None,
                   help="Dask: tcp://HOST:PORT or local-dask; runs the full simulations (and "
                        "the analytical estimates). The estimator's estimates stay in "
                        "--workers local processes, each keeping its per-layer profiles")
    p.add_argument("--out", default=None,
                   help="also write estimates.csv, full.csv, the charts and report.html here")
    p.set_defaults(func=run)


def _value(text: str, where: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        raise ConfigError(f"{where}: cannot read value {text!r}") from None


def _pairs(items: List[str], flag: str, many: bool) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for item in items:
        if "=" not in item:
            raise ConfigError(f"{flag} {item!r}: expected OPTION=VALUE")
        key, text = item.split("=", 1)
        key = key.strip().replace("-", "_")
        out[key] = ([_value(v, f"{flag} {key}") for v in text.split(",")] if many
                    else _value(text, f"{flag} {key}"))
    return out


def check_out_dir(out: Path) -> None:
    """Refuse an ``--out`` that cannot become a writable folder (a file
    there or above it, no permission) without creating anything: the
    search may still fail on its own options."""
    refuse_file_as_folder(out)
    here = out.absolute()
    while not here.exists() and here != here.parent:
        here = here.parent
    if not here.is_dir():
        raise ConfigError(f"--out {out}: {here} is not a directory")
    if not os.access(here, os.W_OK | os.X_OK):
        raise ConfigError(f"--out {out}: {here} is not writable")


def run(args: argparse.Namespace) -> int:
    """The command; SIGTERM stops it as Ctrl-C does (the workers stopped)
    and exits with status 143."""
    with sigterm_as_interrupt():
        try:
            return _run(args)
        except Terminated:
            print("distsim: terminated (SIGTERM): the search stopped",
                  file=sys.stderr)
            return EXIT_TERMINATED


def _run(args: argparse.Namespace) -> int:
    from ..sweep.params import check_value, simulate_parameters
    params = simulate_parameters()
    base = _pairs(args.set, "--set", many=False)
    space = _pairs(args.space, "--space", many=True)
    for k, v in base.items():
        check_value(params, k, v, f"--set {k}")
    for k, values in space.items():
        for v in values:
            check_value(params, k, v, f"--space {k}")
    if args.top < 1:
        raise ConfigError(f"--top: must be a positive integer, got {args.top}")
    out = Path(args.out) if args.out else None
    if out is not None:
        check_out_dir(out)   # before the search, not after minutes of it
    result = search(args.model, args.topology, args.gpus, base=base, space=space,
                    keep=args.keep, network_mode=args.network_mode, workers=args.workers,
                    scheduler=args.scheduler, progress=True)
    print(result.table(args.top))
    print()
    print(result.explain())
    if out is not None:
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ConfigError(f"--out {out}: cannot create the folder ({e.strerror or e})"
                              ) from None
        for name, df in (("estimates.csv", result.estimates), ("full.csv", result.full)):
            with atomic_path(out / name) as tmp:
                df.to_csv(tmp, index=False)
        from ..report.html import write_sweep_report     # matplotlib, pandas: when drawn
        from ..report.sweep_charts import write_sweep_charts
        charts = write_sweep_charts(result.estimates, out, heatmap=["tp", "pp"])
        write_sweep_report(result.estimates, out / "report.html",
                           title=f"distsim search: {args.model} on {args.topology}",
                           charts=charts, description=result.explain())
        print(f"wrote {out}/estimates.csv, full.csv, charts and report.html")
    return 0 if result.best is not None else 1     # like grep: ran, found nothing
