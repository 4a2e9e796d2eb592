"""``distsim print``: print a program in the textual format.

With a file argument the file is parsed, verified and printed again (the
output equals the input for any file distsim printed). Without one, the
training step of ``--model`` under the strategy options is built and printed.
"""
from __future__ import annotations

import argparse
import sys

from ..api import DEFAULT_MODEL, DEFAULT_TOPOLOGY, build_program
from ..errors import ConfigError
from ..text import print_module, print_program
from .files import read_program
from .options import (add_model_options, add_onnx_options, add_strategy_options,
                      add_topology_option, program_options)

#: what program_options gives when no model or strategy flag is set
_UNSET = {"model": DEFAULT_MODEL, "topology": DEFAULT_TOPOLOGY, "tp": 1, "pp": 1}


def add_parser(sub) -> None:
    p = sub.add_parser("print", help="print a program in the DistIR text format",
                       description="Print the program of --model after the parallel transforms, "
                                   "or parse, verify and re-print a .dir text file.")
    p.add_argument("file", nargs="?", help="a DistIR text file to parse, verify and print")
    add_model_options(p)
    add_onnx_options(p)     # ONNX models need --input-shape / --train as in simulate
    add_strategy_options(p)
    add_topology_option(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.file:
        # the file is printed as it is: a model or strategy flag beside it
        # would be silently ignored
        given = [k for k, v in program_options(args).items() if _UNSET.get(k) != v]
        if given:
            flag = "--" + given[0].replace("_", "-")
            raise ConfigError(f"{flag}: a model or strategy option does not apply to a file "
                              f"({args.file} is printed as it is)")
        sys.stdout.write(print_module(read_program(args.file)))
        return 0
    program, _, _ = build_program(**program_options(args))
    sys.stdout.write(print_program(program))
    return 0
