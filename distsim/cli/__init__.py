"""The ``distsim`` command: a thin layer over the Python API.

Each subcommand lives in its own module exposing ``add_parser(subparsers)``
which registers it with ``func=run(args) -> int``. Errors a user can cause
(:class:`~distsim.errors.DistsimError`) print one line on stderr and exit
with status 2; anything else is an internal error (status 3: a bug, told
apart from the 1 with which ``check`` and ``search`` report a finding).
"""
from __future__ import annotations

import argparse
import sys
import traceback
import warnings
from typing import List, Optional

from .. import __version__
from ..errors import DistsimError
from . import (bench_cmd, check_cmd, collective, lower_cmd, print_cmd, simulate_cmd, sweep_cmd,
               topology)
from . import import_cmd
from .stdout import named_stdout, silence_stdout
from . import models_cmd
from . import search_cmd
from . import compare_cmd
from . import calibrate_cmd

# Subcommand modules, in the order ``distsim --help`` lists them.
COMMANDS = [simulate_cmd, print_cmd, import_cmd, sweep_cmd, search_cmd, collective, topology,
            calibrate_cmd, lower_cmd, check_cmd, bench_cmd, models_cmd, compare_cmd]


#: the exit status of an internal error (a bug in distsim): distinct from
#: 1, which ``check`` and ``search`` use to report what they found, so that
#: a script can tell "values differ" from "distsim crashed"
INTERNAL_ERROR = 3


class _Parser(argparse.ArgumentParser):
    """argparse that exits with status 2 and one line for bad flags (as it
    does) but without printing the whole usage block."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="distsim",
                     description="Simulate distributed deep-learning training on a cluster: "
                                 "step time, memory per device, where the time goes.",
                     epilog="Exit status: 0 success; 1 when `check` finds a value that differs "
                            "or `search` finds no strategy that fits; 2 bad input (one line "
                            "on stderr); 3 an internal error (a bug in distsim); 130 Ctrl-C; "
                            "143 `sweep` or `search` stopped by SIGTERM.")
    parser.add_argument("--version", action="version", version=f"distsim {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for module in COMMANDS:
        module.add_parser(sub)
    return parser


def _one_line_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """A warning as the CLI prints it: one line, like its errors (the
    Python default adds the source line of the call, which means nothing
    to someone running a command)."""
    print(f"distsim: warning: {message}", file=file or sys.stderr)


def main(argv: Optional[List[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    with warnings.catch_warnings():
        warnings.showwarning = _one_line_warning
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    try:
        with named_stdout():
            code = int(args.func(args) or 0)
            sys.stdout.flush()   # a failing stdout (disk full) is reported here, not at exit
        return code
    except DistsimError as e:
        print(f"distsim: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("distsim: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        silence_stdout()
        return 0
    except OSError as e:  # the system refused a write (disk full, permissions): not a bug
        where = f" {e.filename}" if e.filename else ""
        silence_stdout()
        print(f"distsim: error: cannot write{where}: {e.strerror or e}", file=sys.stderr)
        return 2
    except Exception:  # an internal error: a bug in distsim, not the user's input
        traceback.print_exc()
        print("distsim: internal error (a bug: please report it with the command above)",
              file=sys.stderr)
        return INTERNAL_ERROR


def entry() -> None:
    sys.exit(main())
