"""The lifetimes of a coarsened program's values placed where the full
program has them: the inner memory events of every fused op
(:mod:`.segment_bodies`, once per body) applied to each of its instances
with numpy.

A fused op starting at ``s`` and ending at ``e`` puts an event at offset
``o`` of its body at ``s + o``, and one at the body's whole duration at
``e`` itself (so that a segment's last free and the next op's first
allocation tie as they do in the full program, frees first). With the
host's launch queue off (``host_launch_s: 0``, the topologies' default)
the inner ops run back to back from ``s``, exactly as in the full
program. With it on, the full program's inner ops may wait for their
launches inside the segment; the coarsened program keeps them back to
back from the segment's start (its end is the full program's): the inner
events may come early by the host's lag, never past the segment's end.

- a value a fused op makes is allocated at its inner producer's start,
  with that op's category; a packed bundle is replaced by its parts, each
  allocated at its own producer's start;
- a fused op reading a value frees it (if it is the last reader) at its
  last inner reader's end; an unpacking reader frees each part of a
  bundle at its own last reader's end;
- each temporary lives as in the full program, on the op's device.
"""
from __future__ import annotations

from typing import List, Tuple

import numpy as np

from .program_columns import spans
from .program_index import ProgramIndex
from .segment_bodies import SegmentTable

__all__ = ["SegmentLifetimes"]


class SegmentLifetimes:
    """The inner events of ``ix``'s fused ops, given every simulated compute
    op's ``start_s`` and ``end_s``. :func:`.value_lifetimes.value_lifetimes`
    calls :meth:`place_values`, :meth:`read_times`, then :meth:`lifetimes`."""

    def __init__(self, ix: ProgramIndex, table: SegmentTable, start_s: np.ndarray,
                 end_s: np.ndarray) -> None:
        self.ix, self.table = ix, table
        self.start_s, self.end_s = start_s, end_s
        self.fused = np.flatnonzero(table.body >= 0)
        self.category = ix.category.copy()
        nv = len(ix.values)
        #: each bundle value's first piece (-1: not one) and its part count
        self.first_piece = np.full(nv, -1, np.int64)
        self.part_count = np.zeros(nv, np.int64)
        self.piece_value = self.piece_bytes = self.piece_category = np.zeros(0, np.int64)
        self.piece_alloc = self.piece_ready = np.zeros(0)
        self.part_reads: Tuple[np.ndarray, np.ndarray] = (np.zeros(0, np.int64), np.zeros(0))

    def _at(self, k: np.ndarray, offset: np.ndarray) -> np.ndarray:
        """The time of ``offset`` into compute op ``k`` (``inf``: the op's
        end, :class:`.segment_bodies.SegmentTable`)."""
        times = self.start_s[k] + offset
        at_end = np.isposinf(offset)
        times[at_end] = self.end_s[k[at_end]]
        return times

    def place_values(self, alloc: np.ndarray, ready: np.ndarray) -> None:
        """Allocate (and make ready) each value a fused op makes at its
        inner producer's start (and end); find the bundles to split."""
        ix, t = self.ix, self.table
        producer = ix.producer
        vals = np.flatnonzero(producer >= 0)
        vals = vals[t.body[producer[vals]] >= 0]
        if not len(vals):
            return
        k = producer[vals]
        # an op's results are numbered one after another, ops in order
        if (k[1:] >= k[:-1]).all():
            first = vals[np.searchsorted(k, k)]
        else:
            first_of = np.full(len(t.body), len(producer), np.int64)
            np.minimum.at(first_of, k, vals)
            first = first_of[k]
        row = t.out_start[t.body[k]] + (vals - first)
        alloc[vals] = self._at(k, t.out_alloc[row])
        ready[vals] = self._at(k, t.out_ready[row])
        self.category[vals] = t.out_category[row]
        # bundles of bytes (a bundle updated in place has none): their parts
        split = (t.out_part_count[row] > 0) & (ix.size[vals] > 0)
        vals, k, row = vals[split], k[split], row[split]
        n = t.out_part_count[row]
        self.part_count[vals] = n
        self.first_piece[vals] = np.cumsum(n) - n
        parts = spans(t.out_part_start[row], n)
        kp = np.repeat(k, n)
        self.piece_value = np.repeat(vals, n)
        self.piece_alloc = self._at(kp, t.out_part_alloc[parts])
        self.piece_ready = self._at(kp, t.out_part_ready[parts])
        self.piece_bytes = t.out_part_bytes[parts]
        self.piece_category = t.out_part_category[parts]

    def read_times(self, read_s: np.ndarray) -> np.ndarray:
        """``read_s`` (when each compute read ends: its op's end) with a
        fused op's reads at its last inner reader's end; its reads of a
        split bundle's parts kept apart (:meth:`lifetimes`)."""
        ix, t = self.ix, self.table
        fused = self.fused
        counts = ix.compute_read_counts
        first = np.cumsum(counts) - counts
        n = counts[fused]
        at = spans(first[fused], n)
        k = np.repeat(fused, n)
        row = t.in_start[t.body[k]] + (at - np.repeat(first[fused], n))
        read_s[at] = self._at(k, t.in_free[row])
        v = ix.compute_reads[at]
        by_part = (self.part_count[v] > 0) & (t.in_part_count[row] == self.part_count[v])
        if by_part.any():
            at, k, row, v = at[by_part], k[by_part], row[by_part], v[by_part]
            m = self.part_count[v]
            pieces = spans(self.first_piece[v], m)
            times = self._at(np.repeat(k, m), t.in_part_free[spans(t.in_part_start[row], m)])
            self.part_reads = (pieces, times)
            read_s[at] = -np.inf
        return read_s

    def lifetimes(self, alloc: np.ndarray, free: np.ndarray, unheld: np.ndarray,
                  last_use: np.ndarray) -> Tuple[np.ndarray, np.ndarray, np.ndarray,
                                                 np.ndarray, np.ndarray, List[str]]:
        """(device, size, category, alloc, free, categories) of every piece:
        the values (a split bundle's of no bytes), the bundles' parts, the
        temporaries. ``free``: the values' free times, ``unheld`` before
        in-place updates held them; ``last_use``: their last reads but a
        split bundle's parts'."""
        ix, t = self.ix, self.table
        pv = self.piece_value
        piece_free = last_use[pv]
        pieces, times = self.part_reads
        if len(pieces):
            np.maximum.at(piece_free, pieces, times)
        piece_free = np.where(np.isneginf(piece_free), self.piece_ready, piece_free)
        piece_free[ix.kept[pv]] = np.inf
        held = free[pv] > unheld[pv]       # updated in place: as long as the update
        piece_free[held] = np.maximum(piece_free[held], free[pv][held])
        size = ix.size
        if len(pv):
            size = size.copy()
            size[pv] = 0
        body = t.body[self.fused]
        n = t.tmp_count[body]
        rows = spans(t.tmp_start[body], n)
        k = np.repeat(self.fused, n)
        return (np.concatenate([ix.device, ix.device[pv], ix.compute_rank[k]]),
                np.concatenate([size, self.piece_bytes, t.tmp_bytes[rows]]),
                np.concatenate([self.category, self.piece_category, t.tmp_category[rows]]),
                np.concatenate([alloc, self.piece_alloc, self._at(k, t.tmp_alloc[rows])]),
                np.concatenate([free, piece_free, self._at(k, t.tmp_free[rows])]),
                t.categories)
