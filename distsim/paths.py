"""Where the data folders users edit live (``topologies/``, ``models/``).

They sit beside the package in the repository (an editable install, the
way the README installs distsim); ``DISTSIM_DATA`` overrides the root.
"""
from __future__ import annotations

import os
from pathlib import Path

PACKAGE_ROOT = Path(__file__).resolve().parent


def data_root() -> Path:
    env = os.environ.get("DISTSIM_DATA")
    return Path(env) if env else PACKAGE_ROOT.parent


def topologies_dir() -> Path:
    return data_root() / "topologies"


def models_dir() -> Path:
    return data_root() / "models"
