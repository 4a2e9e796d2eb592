"""The overlap of a stage's compute and communication spans, for the
estimator's time split (:func:`.time_split.stage_breakdown`):
:func:`distsim.intervals.merged_overlap`'s walk with numpy.

``merged_overlap`` walks two sorted lists of spans pair by pair, adding
each positive overlap as it goes. A stage of a long pipeline has thousands
of spans, and the walk in Python was a seventh of an estimate. The walk is
a merge of the two lists by end (on a tie the communication span's end
comes first), so the pairs it visits follow from where each end falls in
the other list (``searchsorted``); their overlaps are added in the walk's
order by ``cumsum``, which adds one after the other as the walk does, so
the sum is the same to the last bit (a test checks it against
``merged_overlap``). Lists whose ends are not in order (not met in a
timeline, where a stream's spans follow each other) go to
``merged_overlap`` itself.
"""
from __future__ import annotations

from typing import List

import numpy as np

from ..intervals import merged_overlap


#: Below this many spans the walk in Python is faster than numpy's calls.
SMALL = 64


def span_overlap(a_starts: List[float], a_ends: List[float], b_starts: List[float],
                 b_ends: List[float], ordered: bool = False) -> float:
    """``merged_overlap(zip(a_starts, a_ends), zip(b_starts, b_ends))``
    (``ordered``: the caller knows each list's ends are in order, as a
    stream's spans are: not checked)."""
    na, nb = len(a_ends), len(b_ends)
    if not na or not nb:
        return 0.0
    if na + nb < SMALL:
        return merged_overlap(list(zip(a_starts, a_ends)), list(zip(b_starts, b_ends)))
    sa, ea = np.asarray(a_starts, dtype=float), np.asarray(a_ends, dtype=float)
    sb, eb = np.asarray(b_starts, dtype=float), np.asarray(b_ends, dtype=float)
    if not ordered and ((na > 1 and (ea[1:] < ea[:-1]).any())
                        or (nb > 1 and (eb[1:] < eb[:-1]).any())):
        return merged_overlap(list(zip(a_starts, a_ends)), list(zip(b_starts, b_ends)))
    # the walk moves past a's span i when a's end is below b's (strictly):
    # in the merged order, a_i follows every b_j with eb_j <= ea_i
    # (the arrays' methods, not numpy's functions: a sweep makes tens of
    # thousands of these calls, and the functions' dispatch costs more than
    # the work on short arrays)
    is_a = np.zeros(na + nb, dtype=bool)
    is_a[np.arange(na) + eb.searchsorted(ea, side="right")] = True
    a_before = is_a.cumsum() - is_a            # a's spans passed before each step
    b_before = np.arange(na + nb) - a_before
    # it stops when either list is passed (by the last step, one is)
    steps = int(((a_before >= na) | (b_before >= nb)).argmax())
    i, j = a_before[:steps], b_before[:steps]
    part = np.minimum(ea[i], eb[j]) - np.maximum(sa[i], sb[j])
    return float(np.where(part > 0.0, part, 0.0).cumsum()[-1])
