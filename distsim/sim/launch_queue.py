"""The host's launch queue: kernels start no earlier than the host issued them.

A device's host issues its compute kernels in program order, one every
``H = host_launch_s`` from time 0 (the j-th is issued at ``j H``), and
runs ahead of the device: a kernel waits for its launch only when the
device gets to it first. Behind a long kernel the host's launches are
hidden; behind kernels shorter than H the device waits for the host,
and the overhead shows (as in PyTorch's eager mode). ``H = 0`` (the
default) issues every kernel at once and adds nothing.

The simulator's compute streams keep their ops' times as prefix sums ``P``
of their durations from each block's start ``s``. With the queue, op ``i``
of a block beginning at position ``b`` ends at

    end_i = P[i+1] + max(s - P[b], lead[i]),
    lead[i] = max over ops j <= i of  c_j H + a_j - P[j]

where ``c_j`` counts the kernels before op j on the stream and ``a_j`` is
op j's own lead (:meth:`~distsim.cost.model.CostModel.host_lead`: H for one
kernel; a fused segment's lag over its kernels). The maximum may run over
the whole stream, not only the block: an earlier op's launch bound is
already met by the ops that ran after it, so it never binds later. An
op's first kernel starts at ``P[i] + max(s - P[b], lead[i-1], (c_i + 1) H
- P[i])``.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import numpy as np

from ..cost.model import CostModel

#: (lead per op, first-launch bound per op), both as lists of floats
Leads = Tuple[List[float], List[float]]


def stream_leads(ops: list, stream_ops: List[int], prefix: List[float],
                 cost: CostModel) -> Optional[Leads]:
    """``(lead, first)`` of one compute stream (module docstring), or None
    when the device issues its kernels at once (``host_launch_s`` 0).
    ``ops``: the program's compute Op objects; ``stream_ops`` the stream's
    indices into them; ``prefix`` its durations' prefix sums."""
    h = cost.device.host_launch_s
    if h <= 0 or not stream_ops:
        return None
    n = len(stream_ops)
    kernels = np.empty(n, np.int64)
    own = np.empty(n)
    for q, k in enumerate(stream_ops):
        kernels[q], own[q] = cost.host_lead(ops[k])
    before = np.concatenate(([0], np.cumsum(kernels)[:-1]))
    p = np.asarray(prefix[:-1], dtype=float)
    with np.errstate(invalid="ignore"):
        lead = np.maximum.accumulate(before * h + own - p)
    first = np.where(kernels > 0, (before + 1) * h - p, -np.inf)
    return lead.tolist(), first.tolist()


def leads_by_rank(ix, prefixes: Dict[int, List[float]], cost: CostModel
                  ) -> Dict[int, Optional[Leads]]:
    """:func:`stream_leads` of every simulated compute stream of ``ix``."""
    return {rank: stream_leads(ix.compute, stream.ops, prefixes[rank], cost)
            for rank, stream in ix.compute_streams.items()}


def op_times(prefix: np.ndarray, base: np.ndarray, s0: np.ndarray,
             leads: Optional[Leads]) -> Tuple[np.ndarray, np.ndarray]:
    """(start, end) of each op of a stream: ``s0`` and ``base`` are its
    block's start and first prefix, per op."""
    if leads is None:
        return s0 + (prefix[:-1] - base), s0 + (prefix[1:] - base)
    lead = np.asarray(leads[0])
    off = s0 - base
    end = prefix[1:] + np.maximum(off, lead)
    earlier = np.concatenate(([-np.inf], lead[:-1]))
    start = prefix[:-1] + np.maximum(np.maximum(off, earlier), np.asarray(leads[1]))
    return start, end
