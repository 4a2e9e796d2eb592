"""``distsim collective KIND``: the nccl-tests view of one collective.

Simulates one collective alone on a topology and prints its time,
algorithm bandwidth and bus bandwidth (nccl-tests definitions), for one
size or a sweep of sizes. A thin layer over
:mod:`distsim.sim.collective_bench`.
"""
from __future__ import annotations

import argparse
import json

from ..errors import ConfigError
from ..ir.comm import CollectiveType
from ..sim.collective_bench import (MAX_SWEEP_SIZES, format_table, parse_bytes, parse_kind,
                                    parse_ranks, parse_sweep, sweep_collective)
from ..sim.network import MODES


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "collective", help="simulate one collective and print time, algbw and busbw",
        description="Simulate one collective alone on a topology and print its time, "
                    "algorithm bandwidth (S/t) and bus bandwidth (nccl-tests factors). "
                    "Sizes: 4096, 64KB (1e3), 1GiB (2^30), 1.5GB.")
    p.add_argument("kind", metavar="KIND",
                   help="collective: " + ", ".join(k.value for k in CollectiveType))
    p.add_argument("--bytes", default="1GB",
                   help="message size S (all-gather/reduce-scatter/gather/scatter: the full "
                        "gathered size; all-to-all: each rank's input) (default: %(default)s)")
    p.add_argument("--sweep-bytes", metavar="MIN:MAX[:FACTOR]",
                   help="print a table over sizes MIN, MIN*FACTOR, ... <= MAX (factor 2; "
                        f"FACTOR > 1; at most {MAX_SWEEP_SIZES} sizes)")
    p.add_argument("--topology", default="dgx-a100",
                   help="topology name or .yaml path (default: %(default)s)")
    team = p.add_mutually_exclusive_group()
    team.add_argument("--devices", metavar="RANKS",
                      help="team ranks in order, e.g. 0-7 or 0,8,16 (default: all)")
    team.add_argument("--nodes", type=int,
                      help="every device of the first N servers; with a one-server topology "
                           "such as dgx-a100, its N-server cluster (dgx-a100-xN)")
    p.add_argument("--algo", default="auto",
                   help="algorithm: auto, ring, tree, hierarchical, direct (default: auto)")
    p.add_argument("--root", type=int, help="root rank of broadcast/reduce/gather/scatter "
                                            "(default: the first team rank)")
    p.add_argument("--mode", choices=MODES, default="flow",
                   help="network model: flow (max-min sharing) or analytical (default: flow)")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    kind = parse_kind(args.kind)
    if args.nodes is not None and args.nodes < 1:
        raise ConfigError(f"--nodes: must be a positive integer, got {args.nodes}")
    sizes = parse_sweep(args.sweep_bytes) if args.sweep_bytes else [parse_bytes(args.bytes)]
    # an empty --devices is a mistake, not "every device"
    ranks = parse_ranks(args.devices) if args.devices is not None else None
    rows = sweep_collective(kind, sizes, args.topology, ranks=ranks, nodes=args.nodes,
                            algorithm=args.algo, mode=args.mode, root=args.root)
    if args.json:
        print(json.dumps(rows if args.sweep_bytes else rows[0], indent=2))
        return 0
    first = rows[0]
    print(f"# {kind.value} on {first['topology']}, {first['ranks']} ranks, "
          f"{args.mode} model, algorithm {args.algo}")
    print(format_table(rows))
    return 0
