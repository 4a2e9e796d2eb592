"""ZeRO-3's gathered parameters placed on the step's walk: each block's
memory curve (:class:`.gathered.GatherCurve`) with the gathers the walk
issued (their gates, starts and ends, by parameter or by layer), the
flat gradient copies and units of shards it meets, noted per task kind
for the memory estimate (:func:`note_peak`, :func:`note_again`), and the
sizes and shapes of what is gathered (:func:`param_bytes`,
:func:`item_bytes`, :func:`unit_shape`).
"""
from __future__ import annotations

import math
from typing import List, Optional, Sequence, Tuple

import numpy as np

from .context import StepContext
from .costs import shard_size
from .gates import gather_plan
from .gathered import Entry, GatherCurve, UnitShape, block_peak

def param_bytes(b: StepContext, kind: str, block: str) -> List[Tuple[int, int]]:
    """Per position of ``block``'s gathered parameters in a ``kind`` task
    (of builder ``b``), (its shard's bytes, its whole bytes)."""
    hit = b.memo.gathered_bytes.get((kind, block))
    if hit is None:
        blk = b.profile.blocks[block]
        hit = []
        for owner, i in (blk.f_gather if kind == "F" else blk.b_gather):
            p = b.profile.params[owner][i]
            size = p.dtype.itemsize
            hit.append((shard_size(p.numel, b.team(p)) * size, p.numel * size))
        b.memo.gathered_bytes[(kind, block)] = hit
    return hit


def entries_of(b: StepContext, kind: str, k: int, block: str, gate: float,
               groups: Sequence[Tuple[float, int, float]]) -> List[Entry]:
    """The :data:`Entry` of each all-gather of ``block`` (at position
    ``k`` of a ``kind`` task), gated at ``gate`` and gathered in
    ``groups`` (each: its time, the position of its last all-gather, its
    end) that run one after another (:attr:`.gates.GatherPlan.items`):
    by parameter one per gathered parameter; by layer
    (:func:`item_bytes`) the unit's first, its gate the concatenation of
    its shards, which runs on the compute stream before ``gate``. A
    parameter gathered over no team (an expert's with ep = dp: no
    collective) is whole from its gate on, its gather's start and end
    the gate."""
    plan = gather_plan(b, kind, block)
    items = plan.items
    whole = param_bytes(b, kind, block)
    sizes = item_bytes(b, kind, block) if b.by_layer else whole
    out: List[Entry] = [(k, j, whole[j][0], whole[j][1], gate, gate, gate)
                        for j in plan.alone]
    first = 0
    for time_s, upto, end in groups:
        at = end - time_s
        for j in range(first, upto + 1):
            if b.by_layer:
                read, shard, whole = sizes[j]
                gated = gate - plan.copy_in if len(plan.members[j]) > 1 else gate
                out.append((k, read, shard, whole, gated, at, at + items[j]))
            else:         # the parameter item j gathers
                read = plan.members[j][0]
                shard, whole = sizes[read]
                out.append((k, read, shard, whole, gate, at, at + items[j]))
            at += items[j]
        first = upto + 1
    return out


def item_bytes(b: StepContext, kind: str, block: str) -> List[Tuple[int, int, int]]:
    """ZeRO-3 by layer: per all-gather of ``block`` in a ``kind`` task
    (:attr:`.gates.GatherPlan.members`: the unit's first, those over no
    team left out), (the position of the gathered parameter read first,
    whose read waits for it; its gate's bytes: the concatenated shards
    over its team, or one shard; the bytes gathered)."""
    key = (kind, block, "items")
    hit = b.memo.gathered_bytes.get(key)
    if hit is None:
        sizes = param_bytes(b, kind, block)
        hit = [(group[0], sum(sizes[j][0] for j in group), sum(sizes[j][1] for j in group))
               for group in gather_plan(b, kind, block).members]
        b.memo.gathered_bytes[key] = hit
    return hit


def unit_shape(b: StepContext, kind: str, block: str, curve: GatherCurve) -> Optional[UnitShape]:
    """ZeRO-3 by layer: the :class:`UnitShape` of ``block``'s units in a
    ``kind`` task on its template ``curve``, as LowerSPMD splits each: at
    the unit's first read, one ``chunk_split`` (:attr:`.gates.GatherPlan.unit_splits`)
    in place of that read's reshape makes every parameter of the unit,
    and the unit's later reads have no reshape; a parameter split out and
    never read is gone when the split ends. None: no unit, or the first
    is not read."""
    key = (kind, block, id(curve))
    memo = b.memo.unit_shapes
    if key in memo:
        return memo[key]
    plan = gather_plan(b, kind, block)
    out = None
    if plan.first is not None and curve.reads[plan.first][0] != math.inf:
        sizes = param_bytes(b, kind, block)
        moves, pieces = [], []
        for unit, split_s in zip(plan.units, plan.unit_splits):
            r0, r1 = curve.reads[unit[0]]
            if r0 == math.inf:
                continue
            moves.append((r1, split_s - plan.reshape_s[unit[0]]))
            for j in unit[1:]:
                at, end = curve.reads[j]
                if at == math.inf:
                    pieces.append((r0, r1, sizes[j][1]))
                    continue
                moves.append((end, -plan.reshape_s[j]))
                pieces.append((r0, at, sizes[j][1]))
        moves.sort()
        move_at, move_by, total = [], [], 0.0
        for at, by in moves:
            total += by
            if move_at and move_at[-1] == at:
                move_by[-1] = total
            else:
                move_at.append(at)
                move_by.append(total)
        out = UnitShape(tuple(move_at), tuple(move_by), tuple(pieces))
    memo[key] = out
    return out


#: a block's gathers in a task (see :func:`note_peak`): (the position of
#: the block that reads them, the block's name, their gate's time, and
#: their groups: each (its time, the position of its last parameter, its
#: end), run one after another)
Issued = Tuple[int, str, float, Tuple[Tuple[float, int, float], ...]]


def note_peak(b: StepContext, key: tuple, k: int, curve: Optional[GatherCurve], t0: float,
              issued: List[Issued], kind: str, wait_all: bool = False,
              held: Optional[Sequence[Tuple[int, float]]] = None,
              units: Sequence[Tuple[int, float, float, bool]] = (),
              ran: Optional[tuple] = None, own: Optional[tuple] = None) -> Optional[tuple]:
    """:func:`block_peak` of block ``k`` of a ``kind`` task, the
    gathers ``issued`` so far, noted for the memory estimate, the most
    over the walks (:attr:`.state.Memo.gather_peaks`, ``key``: the task's
    kind, chunk shape, first backward or not); returns what it noted (a
    replay notes it again with :func:`note_again`). The block's own
    gathers are dropped from ``issued`` (read: gone from the next blocks).
    ``held``: the flat gradient copies earlier tasks left waiting for
    their reduce-scatters (bytes, end), each live until it ends; by layer,
    ``units``: the units of gradient shards the block meets
    (:func:`.units.held_units`), those pending when it starts settled
    where it completes its own unit (:func:`.units.unit_curve`); ``ran``:
    the op-by-op backward's block as the timeline ran it (its name,
    whether the first micro-batch's entries, and each entry's end:
    :func:`run_offsets`); ``own``: the task's flat gradient copies, those
    waiting as the block starts (bytes, end) and the block's (bytes, from
    when, end), each live until its reduce-scatter ends."""
    got = None
    if curve is not None:
        runs = ends = None
        ran_at = None
        if ran is not None:
            runs, ends = run_offsets(b, curve, ran), ran[2]
            ran_at = tuple([int((ends[i] - time_s - t0) * 1e13) for i, _, time_s in runs])
        if own is not None and own[0]:
            held = list(held or ()) + own[0]
        # the copies still waiting when the block's own gathers are gated
        # (its entering, at or before its compute's start)
        lo = min([t0] + [gate for owner, _, gate, _ in issued if owner == k])
        waiting = tuple([(nbytes, int((end - t0) * 1e13)) for nbytes, end in held
                         if end > lo]) if held else ()
        made_here = tuple([(nbytes, int((start - t0) * 1e13), int((end - t0) * 1e13))
                           for nbytes, start, end in own[1]]) if own is not None else ()
        met = tuple([(nbytes, int((start - t0) * 1e13), int((end - t0) * 1e13), before)
                     for nbytes, start, end, before in units]) if units else ()
        # the same block in the same place among its gathers (a steady
        # pipeline's tasks) worked out once; times to a tenth of a
        # picosecond (a replayed task's are its record's shifted, to rounding)
        sig = (id(curve), wait_all, kind, waiting, met, ran_at, made_here) + tuple(
            [(owner - k, block, int((gate - t0) * 1e13),
              tuple([int((end - t0) * 1e13) for _, _, end in groups]))
             for owner, block, gate, groups in issued])
        got = b.memo.block_peaks.get(sig)
        if got is None:
            entries = [e for owner, block, gate, groups in issued
                       for e in entries_of(b, kind, owner, block, gate, groups)]
            # a flat copy waiting: an entry of no block, whole until its end
            entries += [(-1, 0, 0, nbytes, 0.0, -math.inf, end) for nbytes, end in held or ()
                        if end > lo]
            if own is not None:
                entries += [(-1, 0, 0, nbytes, 0.0, start, end) for nbytes, start, end in own[1]]
            unit = None
            if b.by_layer:
                name = next((block for owner, block, _, _ in issued if owner == k), None)
                if name is not None:
                    if kind == "B" and b.scatter_each:
                        from .units import unit_curve
                        curve, settle = unit_curve(b, name, curve)
                        for nbytes, start, end, before in units:
                            if before and settle is not None:
                                # pending: settled where the block completes
                                # its unit, which waits for its reduce-scatter
                                entries.append((k, settle, 0, nbytes, start, start, end))
                            else:     # the block's own, or held through it
                                entries.append((k + 1, 0, 0, nbytes, start, start, start))
                    unit = unit_shape(b, kind, name, curve)
            # what the communication stream takes before the block's
            # collectives (none per group: theirs is the tensor-parallel
            # group's stream, the gathers and reduce-scatters on the
            # data-parallel one)
            comm_free = -math.inf if b.tl.per_group else max(
                [end for _, _, _, groups in issued for _, _, end in groups]
                + [end for nbytes, end in held or ()]
                + [end for _, _, end, before in units if before], default=-math.inf)
            # the op-by-op backward: its compute runs where the timeline ran them
            marks = [(tau, ends[i] - time_s) for i, tau, time_s in runs] if runs else None
            spans = point_spans(b, curve, name_of(issued, k)) if curve.points else None
            got = b.memo.block_peaks[sig] = block_peak(curve, k, t0, entries, wait_all, unit,
                                                       comm_free, marks, spans)
        note_again(b, key, k, got)
    drop = 0
    while drop < len(issued) and issued[drop][0] <= k:
        drop += 1
    del issued[:drop]
    return got


def name_of(issued: List[Issued], k: int) -> Optional[str]:
    """The name of block ``k`` among the gathers ``issued``."""
    return next((block for owner, block, _, _ in issued if owner == k), None)


def point_spans(b: StepContext, curve: GatherCurve, block: Optional[str]) -> Optional[np.ndarray]:
    """Per point of ``block``'s backward curve, how long what it counts
    stays once its op ends (:func:`block_peak`): the flattening of its
    parameter's gradient into the copy its reduce-scatter reads (0 for a
    point where no op ends)."""
    if block is None or not any(curve.point_ends):
        return None
    key = (block, id(curve))
    hit = b.memo.point_spans.get(key)
    if hit is None:
        hit = b.memo.point_spans[key] = np.array(
            [b.param_cost(block, i).flat[0] if end else 0.0
             for (i, _, _), end in zip(curve.points, curve.point_ends)])
    return hit


def run_offsets(b: StepContext, curve: GatherCurve, ran: tuple) -> List[Tuple[int, float, float]]:
    """The compute runs of a block's op-by-op backward (``ran``: the
    block's name, whether its entries are the first micro-batch's
    (:attr:`.blocks.Block.only`) or the last's, the entries' ends, their
    plan (:meth:`.backward.OpByOpBackward._segment_plan`)): per run, its
    position among the entries, its start's offset on ``curve`` and its
    time; the timeline's end of each entry, by position, gives where it
    ran (:func:`note_peak`; the runs of a block run one after another)."""
    name, only = ran[0], ran[1]
    key = (name, only, id(curve))
    runs = b.memo.run_offsets.get(key)
    if runs is None:
        blk = b.profile.blocks[name]
        plan = ran[3]
        runs = b.memo.run_offsets[key] = [
            (i, seg.at - curve.start, entry[1])
            for i, (seg, entry) in enumerate(zip(blk.only if only else blk.last, plan))
            if entry[0] == "c"]
    return runs


def note_again(b: StepContext, key: tuple, k: int, got: Optional[tuple]) -> None:
    """Note ``got`` (:func:`block_peak`'s) for block ``k`` of ``key``."""
    if got is None:
        return
    held = b.memo.gather_peaks.setdefault(key, {})
    peak, extra = got
    old = held.get(k)
    if old is None:
        held[k] = (peak, dict(extra))
        return
    best = old[1]
    for i, v in extra.items():
        if v > best.get(i, -math.inf):
            best[i] = v
    if peak > old[0]:
        held[k] = (peak, best)
