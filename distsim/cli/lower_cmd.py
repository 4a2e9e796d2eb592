"""``distsim lower FILE.dir``: propagate the shardings of a global-view
program (meshes, DTensor annotations, calls) and print its local view."""
from __future__ import annotations

import argparse
import sys

from ..ir.verifier import verify
from ..text import print_function, print_module
from ..transforms.sharding import shard_program
from .files import about_file, check_entry, read_program


def add_parser(sub) -> None:
    p = sub.add_parser("lower", help="propagate shardings and print the local-view program",
                       description="Read a global-view DistIR file (meshes, sharding annotations, "
                                   "calls), propagate placements, lower to per-device ops and "
                                   "explicit collectives, and print the result.")
    p.add_argument("file", help="a DistIR text file with a @main function")
    p.add_argument("--entry", default="main", help="the entry function (default: %(default)s)")
    p.add_argument("--global", dest="show_global", action="store_true",
                   help="print the propagated global view instead of the local view")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    module = read_program(args.file)
    check_entry(module, args.file, args.entry)
    with about_file(args.file):
        sharded, local = shard_program(module, args.entry)
        text = print_module(sharded) if args.show_global else print_function(verify(local))
    sys.stdout.write(text)
    return 0
