"""``distsim bench``: the performance benchmarks (see reports/perf/)."""
from __future__ import annotations

import argparse
import json
import sys

from ..bench import ALL, OPTIONAL, run_suite
from ..errors import ConfigError
from ..fileio import write_json_atomic

# The figures the table shows, with their meaning and target.
TABLE = [
    ("engine_efficiency", "engine (every device simulated): ops/s over bare SimPy events/s",
     ">= 0.5"),
    ("gpt3_1024_wall_s", "GPT-3 175B, 1024 GPUs, one step: wall s", "< 20"),
    ("gpt3_1024_peak_rss_bytes", "  ... peak resident memory, bytes", "< 4e9"),
    ("allreduce_1024_wall_s", "1 GB all-reduce over 1024 GPUs, flow model: wall s (slower algo)",
     "< 5"),
    ("sweep_configs_per_s", "GPT-3 175B space on 1024 GPUs, estimated, 2 workers: configs/s",
     ">= 50"),
    ("sweep_configs_per_s_rounds", "  ... each round's, in the order run (above: their median)",
     ""),
    ("sweep_simulated_configs_per_s", "  ... simulated in full (analytical network): configs/s",
     ""),
    ("sweep_configs_per_bare_mevent",
     "  ... per 1e6 bare SimPy events/s (the machine's speed divided out)", ""),
    ("growth_exponent", "GPT-3 at 64/256/1024 GPUs and 2x layers: wall ~ ops^k, k (median rounds)",
     "<= 1"),
    ("growth_exponent_best", "  ... fitted to each point's best round instead of its median", ""),
    ("growth_exponent_values", "  ... wall ~ values^k (the program's values), k", ""),
    ("growth_exponent_values_alone", "  ... values ~ ops^k, k", ""),
    ("growth_exponent_round_min", "  ... k fitted to each round alone: lowest", ""),
    ("growth_exponent_round_max", "  ... k fitted to each round alone: highest", ""),
    ("growth_exponent_instructions",
     "  ... counted (--only growth_counts): instructions ~ ops^k, k",
     ""),
    ("growth_exponent_ll_misses", "  ... counted: last-level cache misses ~ ops^k, k", ""),
]


def add_parser(sub) -> None:
    p = sub.add_parser("bench", help="run the performance benchmarks",
                       description="Run the benchmark suite (each benchmark in its own process) "
                                   "and print its figures as a table, or as JSON with --json.")
    p.add_argument("--quick", action="store_true",
                   help="reduced sizes: the whole suite in about a minute (for CI logs)")
    p.add_argument("--only", action="append", choices=sorted(ALL),
                   help="run only this benchmark (repeatable); "
                        + ", ".join(sorted(OPTIONAL)) + " runs only when named: it counts "
                        "instructions and cache misses under Valgrind (about 15 minutes)")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    p.add_argument("--out", help="also write the figures as JSON to this file")
    p.set_defaults(func=run)


def format_value(value) -> str:
    """A figure as the tables show it: 4 significant digits, a list item by item."""
    if value is None:
        return "n/a"
    if isinstance(value, (list, tuple)):
        return ", ".join(map(format_value, value))
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def format_table(figures: dict) -> str:
    lines = [f"{'figure':<70} {'value':>14}  target"]
    for key, label, target in TABLE:
        text = format_value(figures.get(key))
        lines.append(f"{label:<70} {text:>14}  {target}")
    notes = [f"{k}: {v}" for k, v in sorted(figures.items()) if k.endswith("_note")]
    return "\n".join(lines + notes)


def run(args: argparse.Namespace) -> int:
    if args.out and not args.out.endswith(".json"):
        raise ConfigError(f"--out {args.out}: expected a .json file name")
    def log(name: str) -> None:
        print(f"running {name} ...", file=sys.stderr, flush=True)
    figures = run_suite(args.only, quick=args.quick, progress=log)
    if args.out:
        write_json_atomic(args.out, figures)
    if args.json:
        json.dump(figures, sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
    else:
        print(format_table(figures))
    return 0
