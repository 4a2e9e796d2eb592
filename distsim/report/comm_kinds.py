"""Where one device's communication went, by kind (TP, DP, CP, EP, ...):
for each kind its busy time (the union of its records' intervals) and its
exposed time (what of that no compute record of the device covers), read
from a trace's records with each op's kind from the program
(:func:`~distsim.report.phases.record_phases`). The reports in
``reports/`` split a step's communication this way."""
from __future__ import annotations

from typing import Any, Dict, Optional

import numpy as np

from distsim.intervals import difference_length, union_length
from distsim.report.phases import KEYS, record_phases
from distsim.sim.trace import Trace


def communication_by_kind(trace: Trace, program: Optional[Any] = None,
                          rank: int = 0) -> Dict[str, Dict[str, float]]:
    """``{kind: {"busy_s": ..., "exposed_s": ...}}`` for ``rank``'s
    communication records (see the module docstring), kinds named as in the
    charts' legend."""
    cols = trace.op_columns
    keys = record_phases(trace, program).key[cols.label]
    mine = cols.rank == rank
    comm = np.asarray([c == "communication" for c in cols.categories])[cols.category]
    spans = list(zip(cols.start_s.tolist(), cols.end_s.tolist()))
    compute = [spans[i] for i in np.flatnonzero(mine & ~comm)]
    out = {}
    for k in sorted(set(keys[mine & comm].tolist())):
        kind = [spans[i] for i in np.flatnonzero(mine & comm & (keys == k))]
        out[KEYS[k]] = {"busy_s": union_length(kind),
                        "exposed_s": difference_length(kind, compute)}
    return out
