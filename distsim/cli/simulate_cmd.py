"""``distsim simulate``: simulate one training step and write the reports."""
from __future__ import annotations

import argparse
import json
import sys

from ..api import OUTPUT_FILES, simulate
from .options import (add_model_options, add_onnx_options, add_strategy_options,
                      add_topology_option, program_options)


def add_parser(sub) -> None:
    p = sub.add_parser(
        "simulate", help="simulate one training step (default: an MLP, data-parallel on dgx-a100)",
        description="Simulate one training step of a model under a parallel strategy on a "
                    "topology. Prints a summary table (or JSON with --json) and writes "
                    + ", ".join(OUTPUT_FILES) + " into the output folder.")
    add_model_options(p)
    add_onnx_options(p)
    add_strategy_options(p)
    add_topology_option(p)
    g = p.add_argument_group("simulation")
    g.add_argument("--network-mode", choices=["flow", "analytical"], default="flow",
                   help="flow: max-min fair sharing of links; analytical: alpha-beta on each "
                        "route's bottleneck, no contention (default: %(default)s)")
    g.add_argument("--collective-algo", default="auto",
                   help="collective algorithm: auto, ring, tree, hierarchical, ... "
                        "(default: %(default)s)")
    o = p.add_argument_group("output")
    o.add_argument("--out", default="distsim-out",
                   help="output folder for the trace, plots and summary (default: %(default)s)")
    o.add_argument("--json", action="store_true",
                   help="print the summary as JSON on stdout instead of the table")
    o.add_argument("--no-plots", action="store_true", help="skip gantt.png and memory.png")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    result = simulate(network_mode=args.network_mode, collective_algo=args.collective_algo,
                      **program_options(args))
    paths = result.write_outputs(args.out, plots=not args.no_plots)
    if args.json:
        json.dump(result.summary(), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(result.summary_table())
        print("wrote " + ", ".join(str(p) for p in paths.values()))
    return 0
