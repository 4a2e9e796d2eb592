"""The estimator's row and the full simulation's summary of one
configuration, side by side, and the estimator's error bound between
them (:data:`~distsim.estimate.AGREEMENT_TOLERANCE`): what every
estimate-against-simulation test compares."""
from __future__ import annotations

from typing import Any, Dict, Mapping, Tuple

import pytest

import distsim
from distsim.estimate import AGREEMENT_TOLERANCE
from distsim.estimate import point as est


#: the options a test written for collectives ordered by their inputs and
#: unfused kernels pins (the defaults are stream order and, for GPT models,
#: Megatron's fusion)
INPUTS_UNFUSED = {"comm_order": "inputs", "fusion": "none"}


def estimated_and_simulated(options: Mapping[str, Any]) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """(estimate row, simulation summary) of ``options``."""
    sim = distsim.simulate(**options).summary()
    return est.estimate(options), sim


def assert_within_bounds(options: Mapping[str, Any], step: bool = True, memory: bool = True,
                         note: Any = None) -> None:
    """Estimate and simulate ``options`` and assert the estimator's bound
    between them (:data:`AGREEMENT_TOLERANCE`) on step time and on peak
    memory, each unless turned off; ``note`` goes with a failure (e.g. the
    error before the fix)."""
    row, sim = estimated_and_simulated(options)
    if memory:
        assert row["max_peak_memory_bytes"] == pytest.approx(
            sim["max_peak_memory_bytes"], rel=AGREEMENT_TOLERANCE), note
    if step:
        assert row["step_time_s"] == pytest.approx(sim["step_time_s"],
                                                   rel=AGREEMENT_TOLERANCE), note

