"""``distsim check FILE.dir``: run a global-view program and its lowering
on the same random inputs; exit 0 when every value agrees, 1 naming the
first value that differs."""
from __future__ import annotations

import argparse

from ..ir.verifier import verify
from ..transforms.sharding import check_lowering, shard_program
from .files import about_file, check_entry, read_program, seed_option


def add_parser(sub) -> None:
    p = sub.add_parser("check", help="check a sharded program's lowering against the original",
                       description="Propagate and lower a global-view DistIR file, run both "
                                   "with the numpy executor on random inputs and compare every "
                                   "value. Exit 0 when they agree, 1 when they differ.")
    p.add_argument("file", help="a DistIR text file with a @main function")
    p.add_argument("--entry", default="main", help="the entry function (default: %(default)s)")
    p.add_argument("--seed", type=seed_option, default=0,
                   help="random input seed, 0 to 2^64 - 1 (default: %(default)s)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    module = read_program(args.file)
    check_entry(module, args.file, args.entry)
    with about_file(args.file):
        _, local = shard_program(module, args.entry)
        verify(local)
        result = check_lowering(module, local, args.entry, seed=args.seed)
    print(f"{args.file}: {result}")
    return 0 if result.ok else 1
