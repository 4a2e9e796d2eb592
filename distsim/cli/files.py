"""Reading DistIR text files for the CLI: the readers live in
:mod:`distsim.program_file` (which the API's simulation of a text program
uses as well); every error about a file's program names the file."""
from __future__ import annotations

import argparse

from ..program_file import (about_file, check_entry, is_global_view, read_program,  # noqa: F401
                            read_text)


def seed_option(text: str) -> int:
    """argparse type of ``--seed``: an integer numpy's generators accept
    (0 to 2^64 - 1), so that a negative seed is a usage error, not a crash."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if not 0 <= value < 2 ** 64:
        raise argparse.ArgumentTypeError(f"must be from 0 to 2^64 - 1, got {value}")
    return value
