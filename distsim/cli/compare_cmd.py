"""``distsim compare A B [C ...]``: runs side by side (:func:`distsim.compare`)."""
from __future__ import annotations

import argparse
import json
import sys

from ..errors import ConfigError


def add_parser(sub) -> None:
    p = sub.add_parser(
        "compare", help="compare runs side by side (their folders or summary.json files)",
        description="Compare two or more runs (folders written by `distsim simulate --out`, "
                    "or their summary.json files): step time, tokens/s, MFU, exposed "
                    "communication, pipeline bubble, peak memory by category and the busiest "
                    "links, each with its difference from the first run (the baseline).")
    p.add_argument("runs", nargs="+", metavar="RUN", help="a run folder or a summary.json file")
    p.add_argument("--labels", default=None,
                   help="comma-separated names for the runs (default: the folder names)")
    p.add_argument("--json", action="store_true", help="print the comparison as JSON")
    p.add_argument("--chart", default=None, metavar="PNG",
                   help="also draw the comparison as a PNG chart at this path")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..report.compare import compare
    if len(args.runs) < 2:
        raise ConfigError(f"compare: give two runs or more (got {len(args.runs)})")
    labels = [x.strip() for x in args.labels.split(",")] if args.labels is not None else None
    comparison = compare(*args.runs, labels=labels)
    if args.chart:
        comparison.write_chart(args.chart)
    if args.json:
        json.dump(comparison.to_dict(), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(comparison.table())
        if args.chart:
            print(f"wrote {args.chart}")
    return 0
