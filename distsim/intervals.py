"""Interval arithmetic on half-open ``[start, end)`` time intervals.

The summary needs three questions answered per device: how long was some
compute running (a union), how long was some communication running (a
union), and how much communication was *not* hidden behind compute (a
union minus an intersection). Ops on one stream never overlap, but ops on
different streams do, so plain sums would double count.

The summary answers them with :func:`union_length_of` on numpy arrays (a
device of a large run has hundreds of thousands of ops; exposed time is
``|comm u compute| - |compute|``). The list helpers below work on merged
(sorted, disjoint) interval lists: :func:`merged_overlap` serves the sweep
estimator's per-stream items, and :func:`union_length` is the plain
reference the numpy union is tested against.
"""
from __future__ import annotations

from typing import Iterable, List, Sequence, Tuple

import numpy as np

Interval = Tuple[float, float]


def merge_intervals(intervals: Iterable[Interval]) -> List[Interval]:
    """Sorted, disjoint intervals covering the same points as ``intervals``.

    Empty or reversed intervals (``end <= start``) are dropped; touching
    intervals (``a.end == b.start``) are joined.
    """
    merged: List[Interval] = []
    for start, end in sorted((s, e) for s, e in intervals if e > s):
        if merged and start <= merged[-1][1]:
            if end > merged[-1][1]:
                merged[-1] = (merged[-1][0], end)
        else:
            merged.append((start, end))
    return merged


def total_length(merged: Iterable[Interval]) -> float:
    """Sum of the lengths of already merged (disjoint) intervals."""
    return sum(end - start for start, end in merged)


def union_length(intervals: Iterable[Interval]) -> float:
    """Length of the union of ``intervals``."""
    return total_length(merge_intervals(intervals))


def intersection_length(a: Iterable[Interval], b: Iterable[Interval]) -> float:
    """Length of ``union(a) ∩ union(b)``, by a linear sweep of both merged lists."""
    return merged_overlap(merge_intervals(a), merge_intervals(b))


def merged_overlap(a: Sequence[Interval], b: Sequence[Interval]) -> float:
    """Length of the overlap of two merged (sorted, disjoint) interval lists."""
    i = j = 0
    total = 0.0
    while i < len(a) and j < len(b):
        lo = a[i][0] if a[i][0] > b[j][0] else b[j][0]
        hi = a[i][1] if a[i][1] < b[j][1] else b[j][1]
        if hi > lo:
            total += hi - lo
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def difference_length(a: Iterable[Interval], b: Iterable[Interval]) -> float:
    """Length of ``union(a) \\ union(b)``: the part of ``a`` not covered by ``b``."""
    a = list(a)
    return union_length(a) - intersection_length(a, b)


def union_length_of(starts: np.ndarray, ends: np.ndarray) -> float:
    """:func:`union_length` of the intervals ``[starts[i], ends[i])``, with
    numpy (a device of a large run has hundreds of thousands of ops):
    sorted by start, an interval opens a new group when it starts after
    every earlier one has ended; each group spans its first start to its
    last end."""
    keep = ends > starts
    s, e = starts[keep], ends[keep]
    if not len(s):
        return 0.0
    order = np.argsort(s, kind="stable")
    s, e = s[order], e[order]
    opens = np.ones(len(s), dtype=bool)
    opens[1:] = s[1:] > np.maximum.accumulate(e)[:-1]
    firsts = np.flatnonzero(opens)
    return float(np.sum(np.maximum.reduceat(e, firsts) - s[firsts]))
