"""A stream's spans on the estimator's timeline (:mod:`.engine`): the
union of spans in any order, and a stream's spans with its replayed
runs in place (each record's spans shifted by its origin, made when
counted, a few numpy calls for all the runs at once)."""
from __future__ import annotations

from operator import itemgetter
from typing import List, Sequence, Tuple

import numpy as np

#: A replayed run of one stream's spans (see :attr:`.engine.Timeline.compute_runs`).
Run = Tuple[int, np.ndarray, np.ndarray, float]
_AT, _REL_S, _REL_E, _ORIGIN = itemgetter(0), itemgetter(1), itemgetter(2), itemgetter(3)
#: Up to this many runs, :func:`spans` joins the pieces one by one.
_FEW_RUNS = 8


def union(starts: Sequence[float], ends: Sequence[float]) -> Tuple[np.ndarray, np.ndarray]:
    """Spans ``(starts[i], ends[i])`` merged into disjoint ones in time order
    (a span starting at or before the latest end so far joins it): with
    numpy, sorted by start then end as Python sorts the pairs; a merged
    span ends at the latest end of its members, exactly."""
    s = np.asarray(starts, dtype=float)
    e = np.asarray(ends, dtype=float)
    if not len(s):
        return s, e
    order = np.lexsort((e, s))
    s, e = s[order], e[order]
    reach = np.maximum.accumulate(e)
    new = np.empty(len(s), dtype=bool)
    new[0] = True
    new[1:] = s[1:] > reach[:-1]
    first = new.nonzero()[0]
    last = np.empty_like(first)
    last[:-1] = first[1:] - 1
    last[-1] = len(s) - 1
    return s[first], reach[last]


def shifted(runs: List[Tuple[np.ndarray, np.ndarray, float]], which: int) -> np.ndarray:
    """The starts (``which`` 0) or ends (1) of replayed records' spans,
    ``(starts, ends, origin)`` each, plus their origins: the same floats
    as an addition per record, in a few numpy calls for all of them."""
    rel = [run[which] for run in runs]
    lens = np.fromiter(map(len, rel), np.int64, len(rel))
    return np.concatenate(rel) + np.repeat(np.fromiter(map(itemgetter(2), runs), float,
                                                       len(runs)), lens)


def spans(runs: List[Run], starts: List[float], ends: List[float]
           ) -> Tuple[Sequence[float], Sequence[float]]:
    """A stream's spans in stream order: its lists with its runs in their
    places (the lists themselves where it has no runs). Each run's spans
    are its record's plus its origin (the same floats as adding them at
    the replay), made by a few numpy calls over all runs at once however
    many there are (a ZeRO 2/3 stage replays hundreds of blocks and
    tasks): no Python step per run but the gathering of their fields."""
    if not runs:
        return starts, ends
    k = len(runs)
    if k <= _FEW_RUNS:
        # a few runs (a stage's replayed last backward): the lists' pieces
        # and the runs' spans joined in order, fewer numpy calls
        parts_s: List[Sequence[float]] = []
        parts_e: List[Sequence[float]] = []
        done = 0
        for at, rel_s, rel_e, origin in runs:
            if at > done:
                parts_s.append(starts[done:at])
                parts_e.append(ends[done:at])
                done = at
            parts_s.append(rel_s + origin)
            parts_e.append(rel_e + origin)
        if done < len(starts):
            parts_s.append(starts[done:])
            parts_e.append(ends[done:])
        return np.concatenate(parts_s), np.concatenate(parts_e)
    # all runs' spans at once: their records' spans joined, each plus its
    # run's origin (the same floats as one addition per span), put in
    # their places among the lists' spans
    at = np.fromiter(map(_AT, runs), np.int64, k)
    rel_s = list(map(_REL_S, runs))
    lens = np.fromiter(map(len, rel_s), np.int64, k)
    shift = np.repeat(np.fromiter(map(_ORIGIN, runs), float, k), lens)
    n = len(starts) + len(shift)
    out_s, out_e = np.empty(n), np.empty(n)
    placed = np.repeat(at, lens) + np.arange(len(shift))
    listed = np.ones(n, dtype=bool)
    listed[placed] = False
    out_s[listed] = starts
    out_e[listed] = ends
    out_s[placed] = np.concatenate(rel_s) + shift
    out_e[placed] = np.concatenate(list(map(_REL_E, runs))) + shift
    return out_s, out_e
