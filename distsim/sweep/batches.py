"""How the points of a sweep are handed to local worker processes.

Each worker process keeps what the estimator computes once and reuses
(:func:`~distsim.estimate.profile.layer_profile`, the collectives'
times): a point sent to a process that has not seen its per-layer profile
pays for building it (tens of milliseconds, as much as estimating a point).
So estimated points that share a profile go to a worker together, as one
*batch*, and each profile is built once in the whole sweep instead of once
per process. Simulated points go one at a time, as before.

The batches are then split into one *lane* per worker (:class:`Lanes`):
consecutive batches, so that a worker keeps to one part of the grid (points
next to each other share their data-parallel teams, hence the collectives
the estimator times, tens of milliseconds each for a large team), and a
worker whose lane is done takes batches from the end of the longest lane.
Each lane has a process of its own (a one-worker pool per lane, see
:class:`~.runners.LocalProcessRunner`): with one pool for all, a batch
went to whichever process was free, and every process came to time every
team's collectives (measured on the GPT-3 benchmark grid: 916 first
timings in each of the two processes, 2.5 s each; 756 and 632 with a
process per lane). How the points are batched changes nothing in their
rows, only where they run.
"""
from __future__ import annotations

from collections import deque
from typing import Any, Deque, Dict, List, Mapping, Optional, Sequence, Tuple

from ..estimate import cache_key

Task = Tuple[str, Dict[str, Any]]          # (point key, options)

#: The most points in one batch (a batch is retried point by point when its
#: worker dies, and the progress counts finished batches).
MAX_BATCH = 16
def profile_group(options: Mapping[str, Any]) -> Optional[tuple]:
    """The points whose estimates share a per-layer profile have the same
    group: the estimator's own :func:`~distsim.estimate.cache_key` (the
    points it refuses, which build nothing, share one); None for a
    simulated point."""
    if options.get("fidelity") != "estimate":
        return None
    key = cache_key({k: v for k, v in options.items() if k != "fidelity"})
    return ("refused",) if key is None else key


def estimated(batch: Sequence[Task]) -> bool:
    """Whether ``batch`` holds estimated points (short work: a batch may
    wait behind another of them without keeping an idle worker waiting)."""
    return profile_group(batch[0][1]) is not None


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


class Lanes:
    """``batches`` split into ``lanes`` runs of consecutive batches with
    about as many points each (see the module docstring). :meth:`take`
    gives a lane's next batch, or, when it is empty, the last batch of the
    lane with the most points left."""

    def __init__(self, batches: Sequence[List[Task]], lanes: int) -> None:
        total = sum(len(b) for b in batches)
        self.lanes: List[Deque[List[Task]]] = [deque() for _ in range(max(1, lanes))]
        done = 0
        for batch in batches:         # by where the batch's middle falls
            lane = (2 * done + len(batch)) * len(self.lanes) // max(1, 2 * total)
            self.lanes[min(lane, len(self.lanes) - 1)].append(batch)
            done += len(batch)
        self.left = [sum(len(b) for b in lane) for lane in self.lanes]

    def __bool__(self) -> bool:
        return any(self.lanes)

    def _source(self, lane: int) -> Tuple[int, bool]:
        """(lane, whether from its front) the next batch for ``lane`` comes from."""
        if self.lanes[lane]:
            return lane, True
        return max(range(len(self.lanes)), key=lambda i: self.left[i]), False

    def peek(self, lane: int) -> List[Task]:
        """The batch :meth:`take` would give ``lane`` now, left in place."""
        source, front = self._source(lane)
        return self.lanes[source][0 if front else -1]

    def take(self, lane: int) -> List[Task]:
        """The next batch for the worker of ``lane`` (the lanes must not
        all be empty)."""
        source, front = self._source(lane)
        batch = self.lanes[source].popleft() if front else self.lanes[source].pop()
        self.left[source] -= len(batch)
        return batch

    def put_back(self, lane: int, batch: List[Task]) -> None:
        """Return a batch that could not be submitted to the front of ``lane``."""
        self.lanes[lane].appendleft(batch)
        self.left[lane] += len(batch)
