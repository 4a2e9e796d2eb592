"""The estimator's row and the full simulation's summary of one
configuration, side by side, and the README's bounds between them: what
every estimate-against-simulation test compares."""
from __future__ import annotations

from typing import Any, Dict, Mapping, Tuple

import distsim
from distsim.sweep import estimate as est

#: the README's bounds: step time within 3 %, peak memory within 2 %
STEP_TOLERANCE = 0.03
MEMORY_TOLERANCE = 0.02


def estimated_and_simulated(options: Mapping[str, Any]) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """(estimate row, simulation summary) of ``options``."""
    sim = distsim.simulate(**options).summary()
    return est.estimate(options), sim
