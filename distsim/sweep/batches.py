"""How the points of a sweep are handed to local worker processes.

Each worker process keeps what the estimator computes once and reuses
(:func:`~distsim.sweep.estimate_profile.layer_profile`, the collectives'
times): a point sent to a process that has not seen its per-layer profile
pays for building it (tens of milliseconds, as much as estimating a point).
So estimated points that share a profile go to a worker together, as one
*batch*, and each profile is built once in the whole sweep instead of once
per process. Simulated points go one at a time, as before. How the points are batched
changes nothing in their rows, only where they run.
"""
from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

Task = Tuple[str, Dict[str, Any]]          # (point key, options)

#: The most points in one batch (a batch is retried point by point when its
#: worker dies, and the progress counts finished batches).
MAX_BATCH = 16
#: Options that do not change an estimate's per-layer profile (beyond
#: ``pp > 1`` and the ZeRO kind, which :func:`profile_group` keeps).
_NOT_IN_PROFILE = frozenset({"pp", "dp", "zero", "bucket_mb", "schedule", "virtual_stages",
                             "partition", "prefetch", "order", "symmetry", "coarsen",
                             "network_mode", "max_trace_records", "max_ops"})


def profile_group(options: Mapping[str, Any]) -> Optional[tuple]:
    """The points whose estimates share a per-layer profile have the same
    group (a heuristic from the options alone: points it puts apart that
    could share a profile only cost time); None for a simulated point."""
    if options.get("fidelity") != "estimate":
        return None
    zero = options.get("zero") or 0
    rest = tuple(sorted((k, repr(v)) for k, v in options.items() if k not in _NOT_IN_PROFILE))
    return (rest, options.get("pp") not in (None, 1), 3 if zero == 3 else (1 if zero else 0))


def batch_tasks(tasks: Sequence[Task], max_batch: int = MAX_BATCH) -> List[List[Task]]:
    """``tasks`` in batches, in the order of their first point: estimated
    points by :func:`profile_group` (at most ``max_batch`` a batch, in point
    order), every other point alone."""
    batches: List[List[Task]] = []
    open_batch: Dict[tuple, List[Task]] = {}
    for task in tasks:
        group = profile_group(task[1])
        batch = open_batch.get(group) if group is not None else None
        if batch is None or len(batch) >= max_batch:
            batch = []
            batches.append(batch)
            if group is not None:
                open_batch[group] = batch
        batch.append(task)
    return batches
