"""Atomic output files: write to a temporary file beside the target, then
rename, so that an interrupted run never leaves a truncated file under the
final name."""
from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Iterator, Optional, Union

from .errors import ConfigError

PathLike = Union[str, "os.PathLike[str]"]


@contextlib.contextmanager
def atomic_path(path: PathLike) -> Iterator[Path]:
    """Yield a temporary path in the target's folder; on success it is
    renamed to ``path``, on error it is removed. A folder that cannot be
    made or written is a ConfigError naming the file."""
    target = Path(path)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    except OSError as e:
        raise ConfigError(f"cannot write {target}: {e.strerror or e}") from None
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        # mkstemp creates 0600 files; give the output the usual permissions.
        os.chmod(tmp_path, 0o666 & ~_umask())
        os.replace(tmp_path, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp_path.unlink()
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_text_atomic(path: PathLike, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_json_atomic(path: PathLike, data: Any, indent: int | None = 2) -> None:
    write_text_atomic(path, json.dumps(data, indent=indent, sort_keys=False) + "\n")


def refuse_file_as_folder(out: PathLike) -> Path:
    """``out`` (an output folder, ``--out``) as a Path; a ConfigError naming
    it when a file already stands there (every command that writes a
    folder of results checks this before its work, not after)."""
    path = Path(out)
    if path.exists() and not path.is_dir():
        raise ConfigError(f"--out {path}: exists and is not a directory")
    return path


def first_missing(folder: Path) -> Optional[Path]:
    """The highest of ``folder`` and its parents that does not exist (what
    ``mkdir(parents=True)`` will make first), or None if ``folder`` exists."""
    missing = None
    for path in (folder, *folder.parents):
        if path.exists():
            break
        missing = path
    return missing


def remove_outputs(out: Path, paths: Any, made: Optional[Path]) -> None:
    """Remove the output files ``paths``, then the folder ``out`` and its
    parents up to ``made`` (each only if empty by then; None: the folder
    was there before, and stays): the clean-up of a
    run whose outputs must not stay (a :meth:`SimulationResult.write_outputs`
    that failed in folders it made, a printout that could not be written).
    Best effort: the original error is the one to report."""
    for path in paths:
        try:
            Path(path).unlink()
        except OSError:
            pass
    if made is None:
        return
    for folder in (out, *out.parents):
        try:
            folder.rmdir()
        except OSError:
            break
        if folder == made:
            break
