"""What a command prints on stdout belongs to its result: when stdout
cannot take it (a full disk, an I/O error), the command fails (exit
status 2, the error naming ``<stdout>``) and leaves none of the files it
wrote behind. A closed pipe (``distsim models | head``) is no failure."""
from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path
from typing import Any, Iterable, Iterator, Optional, TextIO

from ..fileio import remove_outputs

STDOUT = "<stdout>"


class _NamedStdout:
    """``sys.stdout`` whose refused writes are OSErrors naming ``<stdout>``
    (a print does not say where it failed)."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            raise
        except OSError as e:
            raise OSError(e.errno, e.strerror or str(e), STDOUT) from None

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            raise
        except OSError as e:
            raise OSError(e.errno, e.strerror or str(e), STDOUT) from None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


@contextlib.contextmanager
def named_stdout() -> Iterator[None]:
    """Within the block, a refused write to stdout names ``<stdout>``."""
    stream = sys.stdout
    sys.stdout = _NamedStdout(stream)  # type: ignore[assignment]
    try:
        yield
    finally:
        if isinstance(sys.stdout, _NamedStdout):
            sys.stdout = stream


def silence_stdout() -> None:
    """Point stdout at /dev/null so that the interpreter's final flush of
    what could not be written does not print a second error."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # stdout already closed or not a file
        pass


@contextlib.contextmanager
def printed_or_removed(paths: Iterable[Path], out: Path,
                       made: Optional[Path]) -> Iterator[None]:
    """Print in the block; if stdout refuses it, remove ``paths`` (and the
    folder ``out`` up to ``made``, the highest folder the command made) and
    raise the OSError. A closed pipe (``| head``) is not a failure: the
    files are complete and stay."""
    paths = list(paths)
    try:
        yield
        sys.stdout.flush()
    except BrokenPipeError:
        raise
    except OSError as e:
        if not paths:
            raise
        remove_outputs(out, paths, made)
        raise OSError(e.errno, f"{e.strerror or e} (the output files were removed)",
                      STDOUT) from None
