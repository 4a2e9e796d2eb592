"""The estimator's row and the full simulation's summary of one
configuration, side by side, and the README's bounds between them: what
every estimate-against-simulation test compares."""
from __future__ import annotations

from typing import Any, Dict, Mapping, Tuple

import pytest

import distsim
from distsim.estimate import point as est

#: the README's bounds: step time within 3 %, peak memory within 2 %
STEP_TOLERANCE = 0.03
MEMORY_TOLERANCE = 0.02


def estimated_and_simulated(options: Mapping[str, Any]) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """(estimate row, simulation summary) of ``options``."""
    sim = distsim.simulate(**options).summary()
    return est.estimate(options), sim


def assert_within_bounds(options: Mapping[str, Any], step: bool = True, memory: bool = True,
                         note: Any = None, memory_tolerance: float = MEMORY_TOLERANCE) -> None:
    """Estimate and simulate ``options`` and assert the bounds between
    them: step time within :data:`STEP_TOLERANCE`, peak memory within
    ``memory_tolerance`` (the README's :data:`MEMORY_TOLERANCE` unless a
    test holds a case to less), each unless turned off; ``note`` goes
    with a failure (e.g. the error before the fix)."""
    row, sim = estimated_and_simulated(options)
    if memory:
        assert row["max_peak_memory_bytes"] == pytest.approx(
            sim["max_peak_memory_bytes"], rel=memory_tolerance), note
    if step:
        assert row["step_time_s"] == pytest.approx(sim["step_time_s"], rel=STEP_TOLERANCE), note

