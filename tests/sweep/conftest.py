"""Shared fixtures of the sweep tests."""
from __future__ import annotations

import pandas as pd
import pytest

import distsim
from sweep_fakes import TINY


@pytest.fixture(scope="session")
def tiny_frame() -> pd.DataFrame:
    """A small finished sweep (in-process): ok, invalid (tp 3 does not divide
    the width) and skipped rows."""
    return distsim.sweep({**TINY, "hidden": 64}, {"dp": [1, 2, 4, 8, 16], "tp": [1, 3]},
                         constraints=["dp <= devices"], workers=1, progress=False)
