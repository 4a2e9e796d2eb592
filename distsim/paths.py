"""Where the data users edit lives: the named topologies, the models and
example programs, the example sweep specs. One lookup, three places:

1. ``DISTSIM_DATA``, when set: a folder holding ``topologies/``,
   ``models/`` and ``reports/sweeps/`` (a user's own collection);
2. a source checkout (the package imported from a repository: an editable
   install, or ``PYTHONPATH`` at it): the repository's own folders, so an
   edit there takes effect at once;
3. an installed package (a wheel): the copies the build put into the
   package, ``distsim/data/<kind>/`` (``setup.py`` copies them), read with
   :mod:`importlib.resources`.

This module imports only the standard library: ``setup.py`` reads
:data:`DATA_FOLDERS` and :func:`data_files` from it at build time.
"""
from __future__ import annotations

import importlib.resources
import os
from pathlib import Path
from typing import Dict, List, Optional

PACKAGE_ROOT = Path(__file__).resolve().parent

#: Each kind of data: its folder in the repository (and under
#: ``DISTSIM_DATA``), and the file patterns that are data.
DATA_FOLDERS: Dict[str, str] = {"topologies": "topologies", "models": "models",
                                "sweeps": "reports/sweeps"}
DATA_PATTERNS: Dict[str, tuple] = {"topologies": ("*.yaml",),
                                   "models": ("*.yaml", "*.onnx", "*.dir"),
                                   "sweeps": ("*.yaml",)}
#: Where a built package holds its copies, relative to the build's root.
PACKAGE_DATA = "distsim/data"


def source_root() -> Optional[Path]:
    """The repository the package is imported from, or None for an
    installed package (no ``pyproject.toml`` and ``topologies/`` beside it)."""
    root = PACKAGE_ROOT.parent
    if (root / "pyproject.toml").is_file() and (root / DATA_FOLDERS["topologies"]).is_dir():
        return root
    return None


def packaged_dir(kind: str) -> Path:
    """The copy of the ``kind`` folder inside the installed package."""
    folder = importlib.resources.files("distsim").joinpath("data", kind)
    # an installed package is plain files (a Path); the loaders glob and stat it
    return folder if isinstance(folder, Path) else Path(str(folder))


def data_dir(kind: str) -> Path:
    """The folder of ``kind`` (``topologies``, ``models``, ``sweeps``)."""
    env = os.environ.get("DISTSIM_DATA")
    if env:
        return Path(env) / DATA_FOLDERS[kind]
    root = source_root()
    if root is not None:
        return root / DATA_FOLDERS[kind]
    return packaged_dir(kind)


def data_files(root: Path) -> Dict[str, List[Path]]:
    """The data files of a repository at ``root``, by kind (what a build
    copies into the package), sorted by name."""
    out: Dict[str, List[Path]] = {}
    for kind, folder in DATA_FOLDERS.items():
        found = {p for pattern in DATA_PATTERNS[kind] for p in (root / folder).glob(pattern)
                 if p.is_file()}
        out[kind] = sorted(found)
    return out


def topologies_dir() -> Path:
    return data_dir("topologies")


def models_dir() -> Path:
    return data_dir("models")


def sweeps_dir() -> Path:
    return data_dir("sweeps")


def named_file(kind: str, name: str, suffix: str) -> Optional[Path]:
    """``<kind folder>/<name><suffix>`` when ``name`` is a plain name (no
    folder, no suffix) and that file exists; else None."""
    if not name or "/" in name or os.sep in name or name.endswith(suffix) or name in (".", ".."):
        return None
    path = data_dir(kind) / f"{name}{suffix}"
    try:
        return path if path.is_file() else None
    except (OSError, ValueError):     # a name the OS refuses (too long, NUL)
        return None


def names(kind: str, suffix: str) -> List[str]:
    """The names of the ``<name><suffix>`` files of ``kind``, sorted."""
    folder = data_dir(kind)
    return sorted(p.name[: -len(suffix)] for p in folder.glob(f"*{suffix}")) \
        if folder.is_dir() else []


def resolve(kind: str, text: str, suffix: str) -> Path:
    """What the user gave for a file of ``kind``: the file ``text`` when it
    exists (a path, relative to the working folder), else the built-in
    ``<name><suffix>`` of that name, else ``text`` as a path (which the
    caller reports as not found, with :func:`not_found_hint`)."""
    path = Path(text)
    try:
        if path.is_file():
            return path
    except (OSError, ValueError):
        return path
    found = named_file(kind, text, suffix)
    return found if found is not None else path


def not_found_hint(kind: str, text: str, suffix: str) -> str:
    """The end of a "file not found" message: the built-in name to use
    when ``text`` is a path to one from another folder, else the names."""
    stem = Path(text).name
    stem = stem[: -len(suffix)] if stem.endswith(suffix) else stem
    known = names(kind, suffix)
    if stem in known and stem != text:
        return f" (the built-in one is found from any folder by its name: {stem})"
    if not known:
        return ""
    shown = ", ".join(known[:12]) + (", ..." if len(known) > 12 else "")
    return f" (built-in names: {shown}; or a path to a {suffix} file)"
