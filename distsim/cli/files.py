"""Reading DistIR text files for the CLI: one place for the file errors and
for choosing the verifier (global-view programs with meshes, sharded types
or calls get the sharding verifier; local-view programs the plain one).
Every error about a file's program names the file (:func:`about_file`)."""
from __future__ import annotations

import argparse
from contextlib import contextmanager
from typing import Iterator

from ..errors import ConfigError, DistsimError, ParseError
from ..ir.core import Module
from ..ir.mesh import DTensorType
from ..ir.verifier import verify_module
from ..paths import not_found_hint, resolve
from ..text import parse_module
from ..transforms.sharding import verify_sharded


def read_text(path_text: str) -> str:
    """The text of a DistIR file: a path, or the name of an example
    program in ``models/`` (``nested_mlp``)."""
    path = resolve("models", path_text, ".dir")
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: file not found"
                          f"{not_found_hint('models', path_text, '.dir')}") from None
    except IsADirectoryError:
        raise ConfigError(f"{path}: is a directory, expected a DistIR text file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: cannot read: {e}") from None


def is_global_view(module: Module) -> bool:
    if module.meshes:
        return True
    for f in module:
        if any(isinstance(v.type, DTensorType) for v in f.values()):
            return True
        if any(op.op_type == "call" for op in f.ops):   # (a fused op's segment is local view)
            return True
    return False


@contextmanager
def about_file(path_text: str) -> Iterator[None]:
    """Errors raised inside name the file: an error about an op read from
    it starts with ``path:line:`` already (see :mod:`distsim.ir.source`),
    any other gets ``path:`` in front."""
    try:
        yield
    except ParseError:
        raise
    except DistsimError as e:
        message = str(e)
        if message.startswith(f"{path_text}:"):
            raise
        raise type(e)(f"{path_text}: {message}") from None


def read_program(path_text: str) -> Module:
    """Parse and verify a DistIR text file; errors name the file."""
    module = parse_module(read_text(path_text), source=str(path_text))
    with about_file(path_text):
        return verify_sharded(module) if is_global_view(module) else verify_module(module)


def check_entry(module: Module, path_text: str, entry: str) -> None:
    """``--entry`` names a function of the file: said with the file name
    and the functions there are, before the sharding passes (whose own
    error names neither)."""
    if entry not in module.functions:
        known = ", ".join(f"@{name}" for name in module.functions)
        raise ConfigError(f"{path_text}: --entry {entry}: no function @{entry} "
                          f"(the file has {known})")


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
