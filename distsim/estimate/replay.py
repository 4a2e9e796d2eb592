"""Which op-by-op backwards (:mod:`.backward`) the estimator
records once and replays, and how: a task that starts with its stage's
communication stream idle depends only on where it starts (or, where a
recomputation leads and the input comes after it, on where the
recomputation starts and where the input comes), so its items are
recorded relative to that start and replayed, shifted, by the next task
of the same kind: the same chunk shape on another stage, or the same
stage in the next timeline of an extrapolated estimate.

* :meth:`ReplayedBackward.last_backward`: each chunk's last backward
  (ZeRO 0/1), with its gradient syncs;
* :meth:`ReplayedBackward.first_backward`: ZeRO 2/3's first micro-batch,
  each gradient flattened and reduce-scattered where it is made;
* :meth:`ReplayedBackward.accumulating_backward`: ZeRO 2/3's backwards
  past the first, each shard then accumulated; inside one emitted, block by
  block (:meth:`ReplayedBackward._block_replay`: a block that starts with
  both streams free depends only on where it starts).
"""
from __future__ import annotations

from itertools import islice
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from ..transforms.sync_policy import prefetch_window
from .backward import OpByOpBackward
from .state import (AccumulatingRecord, BlockRecord, FirstBackwardRecord,
                    LastBackwardRecord)


def _by_place(entries: List[Tuple[tuple, Optional[float]]],
              place: Dict[Tuple[str, Optional[int]], int], origin: float
              ) -> Optional[Tuple[List[Tuple[int, int]], np.ndarray]]:
    """``((block, layer, index), time)`` pairs as (each one's (place of its
    block in a chunk, index), their times less ``origin``), or None where a
    time is None."""
    if not entries:
        return [], np.zeros(0)
    keys, times = zip(*entries)
    if None in times:
        return None
    return ([(place[key[:2]], key[2]) for key in keys],
            np.array(times, dtype=float) - origin)


#: The fewest blocks the replays of a last backward's record must stand
#: for in all (the replays expected times the chunk's blocks) for
#: :meth:`ReplayedBackward.last_backward` to record it: recording one and
#: replaying it once cost about what emitting three blocks does.
_MIN_BLOCKS = 4


def _offset(at: Optional[float], origin: float) -> Optional[float]:
    """``at`` relative to ``origin`` (None stays None)."""
    return None if at is None else at - origin


class ReplayedBackward(OpByOpBackward):
    """The op-by-op backward tasks (:class:`~.backward.OpByOpBackward`)
    recorded once and replayed where they can be (see the module
    docstring): its hooks for blocks (:meth:`_block_replay`,
    :meth:`_block_record`) filled in, and the three kinds of task."""

    def _start(self, stage: int, name: str, only: bool, ready: float
               ) -> Tuple[float, bool, bool, bool]:
        """Where an op-by-op backward whose first block is ``name``
        (``only``: :meth:`_segment_plan`'s) starts if its items depend only
        on that: ``(origin, input there, communication idle, opens with
        compute)``. The origin is the compute stream's end, or the task's
        input where it comes later and no recomputation leads (a leading
        recomputation runs from the stream's end, the rest from the input:
        emit_last_backward's ``first``); the task is clean when its input is
        there by then and the stage's communication stream idle (where only
        the input comes later, a recomputation leads: :meth:`_emit_from`).
        (A task opening with a collective would start it from its input or
        the stream's end, not from the origin.)"""
        tl = self.ctx.tl
        s = 2 * stage
        free = tl.free[s] if tl.free[s] > 0.0 else 0.0
        plan = self._segment_plan(name, only)
        lead = bool(plan) and plan[0][6]
        origin = free if lead else max(ready, free)
        return (origin, ready <= origin, tl.idle_by(stage, origin),
                bool(plan) and plan[0][0] == "c")

    def _opens(self, name: str) -> Tuple[bool, bool]:
        """Whether the first micro-batch's op-by-op plan of block ``name``
        opens with a leading recomputation, and with compute (see
        :meth:`_start`)."""
        ctx = self.ctx
        hit = ctx.memo.opens.get((self.part, name))
        if hit is None:
            plan = self._segment_plan(name, True)
            hit = ctx.memo.opens[(self.part, name)] = (bool(plan) and plan[0][6],
                                           bool(plan) and plan[0][0] == "c")
        return hit

    def first_backward(self, stage: int, c: int, ready: float) -> Optional[float]:
        """:meth:`emit_last_backward` of chunk ``c``'s first micro-batch with
        ZeRO 2/3 (each gradient flattened and reduce-scattered where it is
        made), replayed where it can be. Each stage runs one such task; one
        that starts with the stage's communication stream idle (and the
        task's input there, unless a recomputation leads) depends only on
        where it starts, so the first of a chunk shape is recorded relative
        to its start and the same shape's on the other stages replay it
        (one whose leading recomputation is over before its input comes,
        in two parts: :meth:`_emit_from`): its items, FLOPs, memory notes
        (bytes, the same) and the flat copies it leaves waiting for their
        reduce-scatters (shifted). Not
        by layer (its units wait across tasks), nor with one micro-batch
        (that backward is the last, which synchronises its gradients), nor
        with gradient buckets (what a task holds depends on the stage's
        earlier flushes)."""
        ctx = self.ctx
        order = ctx.blocks_of(self.part, c)
        if ctx.by_layer or ctx.microbatches == 1 or ctx.route == "bucket" or not order:
            return self.emit_last_backward(stage, c, order, ready, first_microbatch=True)
        origin, input_there, idle, compute_first = self._start(stage, order[0][0], True, ready)
        if not (compute_first and idle):
            return self.emit_last_backward(stage, c, order, ready, first_microbatch=True)
        tl = ctx.tl
        split = not input_there    # a leading recomputation, the input later
        key = ("first", self.part, ctx.shapes[c], split)
        record = ctx.replays.get(key)
        if record is not None:
            start = self._replay_lead(stage, record.lead, origin, ready) if split else origin
            if start is None:
                return self.emit_last_backward(stage, c, order, ready, first_microbatch=True)
            return self._replay_first(record, stage, c, start)
        mark, flops = tl.mark(stage), ctx.flops[stage]
        last, lead, mark = self._emit_from(stage, c, order, ready, origin, mark, split,
                                           first_microbatch=True)
        if lead is not False:
            start = ready if split else origin
            items = tl.since(stage, mark, start) if last is not None else None
            if items is not None:
                inside, flats = self.last_notes
                ctx.replays[key] = FirstBackwardRecord(
                    items, ctx.flops[stage] - flops, last - start, dict(inside),
                    [(nbytes, end - start) for nbytes, end in flats or ()], lead,
                    _offset(ctx.out_at, start))
        return last

    def _emit_from(self, stage: int, c: int, order, ready: float, origin: float, mark: tuple,
                   split: bool, **kinds) -> Tuple[Optional[float], Any, tuple]:
        """:meth:`emit_last_backward` of a task being recorded from ``mark``
        (``kinds``: its keywords): ``(its end, the lead, the mark the rest
        is recorded from)``. With ``split`` (a leading recomputation from
        ``origin``, the input later at ``ready``) the lead is the
        recomputation's record and where its streams end, relative to
        ``origin``, and the rest is recorded from the mark taken when the
        first entry that waits for the input comes, if the recomputation
        is over by then; False where it is not (nothing to record).
        Without, the lead is None and the mark ``mark``."""
        if not split:
            return self.emit_last_backward(stage, c, order, ready, **kinds), None, mark
        tl = self.ctx.tl
        found: List[tuple] = []

        def lead_over(kind: str) -> None:
            # the recomputation's items, and the rest's start: the input
            # (not a gradient made here: none is made by a recomputation)
            over = max(tl.free[2 * stage], tl.free[2 * stage + 1])
            if kind != "g" and over <= ready:
                found.append(((tl.since(stage, mark, origin), over - origin), tl.mark(stage)))

        last = self.emit_last_backward(stage, c, order, ready, at_input=lead_over, **kinds)
        if not found or found[0][0][0] is None:
            return last, False, mark
        return last, found[0][0], found[0][1]

    def _replay_lead(self, stage: int, lead: tuple, origin: float, ready: float
                     ) -> Optional[float]:
        """The recorded recomputation ``lead`` (:meth:`_emit_from`) replayed
        from ``origin``, where it is over by the input at ``ready``; returns
        where the rest starts (``ready``), or None (nothing replayed)."""
        items, end = lead
        if origin + end > ready:
            return None
        self.ctx.tl.replay(stage, items, origin)
        return ready

    def _replay_first(self, record: FirstBackwardRecord, stage: int, c: int,
                      origin: float) -> float:
        """A recorded first backward (:meth:`first_backward`) of chunk ``c``
        on ``stage`` from ``origin``."""
        ctx = self.ctx
        ctx.tl.replay(stage, record.items, origin)
        ctx.flops[stage] += record.flops
        self._replay_out(record.out, origin)
        self._leave_flats(stage, c, record.inside,
                          [(nbytes, origin + end) for nbytes, end in record.flats])
        return origin + record.last

    def last_backward(self, stage: int, c: int, ready: float) -> Optional[float]:
        """:meth:`emit_last_backward` of chunk ``c``'s last micro-batch
        without a reduce-scatter per micro-batch (ZeRO 0/1), replayed where
        it can be. A task that starts with the stage's communication stream
        idle and no gradient of the stage waiting for a bucket depends only
        on where it starts (and on the buckets the stage flushed before it,
        part of the key), so it is recorded relative to its start and
        replayed: the same items and gradient syncs, shifted (to rounding),
        its gradients' times by their place in the chunk. A task that opens
        with a recomputation (which need not wait for the task's input)
        and whose input comes later depends on two times instead: the
        recomputation on where it starts, the rest, if the recomputation
        is over by then, on the input: it is recorded in two parts. Where each
        gradient is synchronised on its own (or not at all), the syncs are
        the same on every stage (one data-parallel team's times), so the
        record stands for every chunk of its shape: the other stages
        replay it. Otherwise (buckets, syncs deferred to the backward
        pass's end) it stands for its own stage's chunk in a later
        timeline: the two timelines an estimate extrapolates from
        (:attr:`.state.Memo.last_backwards`) end with the same
        last backwards, one micro-batch apart. Its memory notes are the
        first's (the same bytes; each gradient synchronised on its own,
        there are none)."""
        ctx = self.ctx
        order = ctx.blocks_of("B", c)
        sync = self.sync
        if ctx.zero3 or self.policy.pending.get(stage) or not order or ctx.experts_held:
            return self.emit_last_backward(stage, c, order, ready)
        only = ctx.microbatches == 1
        origin, input_there, idle, compute_first = self._start(stage, order[0][0], only, ready)
        if not (compute_first and idle):
            return self.emit_last_backward(stage, c, order, ready)
        tl = ctx.tl
        split = not input_there    # a leading recomputation from ``origin``, the input later
        shared = ctx.route in ("each", "local")
        key = (("last", ctx.shapes[c], only, split) if shared
               else (stage, c, tuple(sync.buckets.get(stage, ())), split))
        record = ctx.memo.last_backwards.get(key)
        if record is not None:
            start = self._replay_lead(stage, record.lead, origin, ready) if split else origin
            if start is None:
                return self.emit_last_backward(stage, c, order, ready)
            return self._replay_last(record, stage, order, start)
        # recording and replaying costs about what emitting three blocks
        # does: worth it where the replays emit no fewer blocks
        replays = ((ctx.shape_chunks[ctx.shapes[c]] - 1 if shared else 0)
                   + (1 if ctx.memo.record_last_backwards else 0))
        if replays * len(order) < _MIN_BLOCKS:
            return self.emit_last_backward(stage, c, order, ready)
        mark, flops = tl.mark(stage), ctx.flops[stage]
        policy = self.policy
        sizes = (len(sync.final), len(sync.synced), len(sync.buckets.get(stage, ())),
                 len(sync.unpack), len(policy.deferred.get(stage, ())))
        last, lead, mark = self._emit_from(stage, c, order, ready, origin, mark, split)
        if lead is False:
            return last
        if split:
            origin = ready
        items = tl.since(stage, mark, origin)
        # the task's gradients became final (and some synchronised): new
        # entries of those tables, in the order they were made
        final = list(islice(sync.final.items(), sizes[0], None))
        synced = list(islice(sync.synced.items(), sizes[1], None))
        if (items is None or last is None
                or len(final) != sum(len(ctx.profile.params[name]) for name, _ in order)):
            return last
        place = {block: k for k, block in enumerate(order)}
        made = [_by_place(entries, place, origin) for entries in (final, synced)]
        if None in made:
            return last
        ctx.memo.last_backwards[key] = LastBackwardRecord(
            items, ctx.flops[stage] - flops, last - origin, made[0], made[1],
            tuple(policy.pending.get(stage, ())), policy.pending_bytes.get(stage),
            tuple(sync.buckets.get(stage, ())[sizes[2]:]),
            [(bucket, ar - origin, total, dtype)
             for bucket, _, ar, total, dtype in sync.unpack[sizes[3]:]],
            tuple(policy.deferred.get(stage, ())[sizes[4]:]), lead, _offset(ctx.out_at, origin))
        return last

    def _replay_last(self, record: LastBackwardRecord, stage: int,
                     order: List[Tuple[str, Optional[int]]], origin: float) -> float:
        """A recorded last backward (:meth:`last_backward`) on ``stage``
        from ``origin``, of a chunk whose blocks are ``order``."""
        ctx = self.ctx
        ctx.tl.replay(stage, record.items, origin)
        ctx.flops[stage] += record.flops
        self._replay_out(record.out, origin)
        sync = self.sync
        for table, (places, at) in ((sync.final, record.final), (sync.synced, record.synced)):
            if places:
                table.update(zip([order[k] + (i,) for k, i in places], (at + origin).tolist()))
        if record.pending:
            self.policy.pending[stage] = list(record.pending)
            self.policy.pending_bytes[stage] = record.pending_bytes
        if record.buckets:
            sync.buckets.setdefault(stage, []).extend(record.buckets)
        sync.unpack.extend((bucket, stage, origin + ar, total, dtype)
                           for bucket, ar, total, dtype in record.unpack)
        if record.deferred:
            self.policy.deferred.setdefault(stage, []).extend(record.deferred)
        return origin + record.last

    def accumulating_backward(self, stage: int, c: int, mb: int, ready: float) -> float:
        """:meth:`emit_last_backward` of a ZeRO 2/3 backward past the first
        micro-batch, replayed where it can be. Once the pipeline is steady
        most such tasks start with the stage's communication stream idle:
        their items then depend only on where they start (the compute
        stream's end, or the task's input where it comes later and no
        recomputation leads; where one leads and the input comes after it,
        on both: recorded in two parts, :meth:`_emit_from`), so the first
        such task of a chunk shape and micro-batch class is emitted op by
        op and recorded relative to its start, and the next ones are that
        record shifted (the same items, to rounding). Any other start is
        emitted op by op."""
        ctx = self.ctx
        tl = ctx.tl
        order = ctx.blocks_of(self.part, c)
        # :meth:`_start`, inlined (a steady pipeline replays thousands)
        lead, compute_first = self._opens(order[0][0])
        s = 2 * stage
        free = tl.free[s] if tl.free[s] > 0.0 else 0.0
        origin = free if lead or free > ready else ready
        input_there = ready <= origin
        # a leading recomputation from ``origin``, the input later (not by
        # layer: there the unit the task finds pending depends on both)
        split = not input_there and compute_first and not ctx.by_layer
        clean = tl.idle_by(stage, origin) and (input_there or split)
        key = (self.part, ctx.shapes[c], mb == ctx.microbatches - 1, split)
        if ctx.by_layer:
            # by layer a task first settles the unit the stage's previous
            # backward left (its reduce-scatter long done when the task is
            # clean): part of what the task's items depend on
            left = self._left_unit(stage, origin)
            # a split backward makes a unit's gradients in two tasks (its
            # norms' in B, the rest in W): no task leaves its own unit
            # alone, as a record stands for: emitted op by op
            clean = clean and left is not False and not ctx.profile.weight
            key = key + (left,)
        record = ctx.replays.get(key) if clean else None
        if record is not None:
            start = self._replay_lead(stage, record.lead, origin, ready) if split else origin
            if start is not None:
                return self._replay(record, stage, order, start, mb)
            clean = False
        # emitted with its blocks replayed where they can be (a stage of
        # one to four has tens of identical blocks), and recorded whole with
        # them (their runs' spans in the record)
        mark, flops = tl.mark(stage), ctx.flops[stage]
        kinds = dict(first_microbatch=True, accumulating=mb, block_replays=True)
        if clean and split:
            last, lead, mark = self._emit_from(stage, c, order, ready, origin, mark, True,
                                               **kinds)
            if lead is False:
                return last
            start = ready
        else:
            last, lead = self.emit_last_backward(stage, c, order, ready, **kinds), None
            start = origin
        items = tl.since(stage, mark, start, with_runs=True) \
            if clean and last is not None else None
        if items is not None:
            final = self._finals_of(order, start) if mb == ctx.microbatches - 1 else []
            leaves = None
            if ctx.by_layer:
                pending = ctx.unit_pending.get(stage, [])
                if len(pending) != 1:
                    return last
                name, layer, unit, _, rs_end = pending[0]
                leaves = (order.index((name, layer)), unit, rs_end - start)
            ctx.replays[key] = AccumulatingRecord(
                items, ctx.flops[stage] - flops, last - start, final, leaves, lead,
                _offset(ctx.out_at, start))
        return last

    def _block_replay(self, stage: int, order, k: int, origin: float,
                      gathered: Dict[int, Dict[Optional[int], float]], last_mb: bool
                      ) -> Tuple[Optional[float], Optional[tuple]]:
        """A block of ZeRO 2/3's accumulating backward that starts with both
        streams of its stage free (the compute stream's end is ``origin``,
        the communication stream done by then: the gathers issued before it
        are over) depends only on ``origin``, its name, whether its
        micro-batch is the last, and which blocks' gathers it issues
        (prefetch: none near the task's end): the first such block is
        recorded, the next ones replay it (the same items shifted, to
        rounding), with its gathers' ends and its gradients' final times."""
        ctx = self.ctx
        free = ctx.tl.free
        if free[2 * stage] != origin or not ctx.tl.idle_by(stage, origin):
            return None, None
        if self.part in ctx.gathering:
            window = prefetch_window(k, len(order), ctx.strategy.prefetch)
            issued = tuple([j - k for j in window if j not in gathered])
            key = (self.part, order[k][0], last_mb,
                   tuple([order[k + j][0] for j in issued]))
        else:       # ZeRO 2, or a task gathering nothing
            issued = ()
            key = (self.part, order[k][0], last_mb, ())
        record = ctx.memo.block_records.get(key)
        if record is None:
            return None, (key, issued, ctx.tl.mark(stage), ctx.flops[stage], origin)
        ctx.block_got = record.got
        ctx.tl.replay(stage, record.items, origin)
        ctx.flops[stage] += record.flops
        self._replay_out(record.out, origin)
        for j, at in zip(issued, record.ends):
            gathered[k + j] = {upto: origin + t for upto, t in at}
        if record.final:
            self._set_finals(order[k:k + 1], record.final, origin)
        return origin + record.last, None

    def _block_record(self, recording: tuple, stage: int, order, k: int, last: float,
                      gathered: Dict[int, Dict[Optional[int], float]]) -> None:
        """Record block ``k``, just emitted (:meth:`_block_replay`)."""
        ctx = self.ctx
        key, issued, mark, flops, origin = recording
        items = ctx.tl.since(stage, mark, origin)
        if items is None:
            return
        final = self._finals_of(order[k:k + 1], origin) if key[2] else []
        ends = [[(upto, t - origin) for upto, t in gathered[k + j].items()] for j in issued]
        # a layer makes its input gradient (sent where it is the chunk's first)
        out = ctx.out_at if any(entry[0] == "o" for entry in
                                 self._segment_plan(key[1], True)) else None
        ctx.memo.block_records[key] = BlockRecord(
            items, ctx.flops[stage] - flops, last - origin, ends, final,
            _offset(out, origin), ctx.block_got)

    def _replay_out(self, out: Optional[float], origin: float) -> None:
        """A record's input gradient made ``out`` after ``origin`` (None: the
        record made none)."""
        if out is not None:
            self.ctx.out_at = origin + out

    def _finals_of(self, order: List[Tuple[str, Optional[int]]], origin: float
                   ) -> List[Tuple[int, int, float]]:
        """The gradients of the blocks ``order`` made final so far, as (the
        block's place in ``order``, the parameter's index, the time less
        ``origin``): by place, so that a record stands for blocks of other
        layers (:meth:`_set_finals`)."""
        table = self.sync.final
        return [(k, i, table[(name, layer, i)] - origin)
                for k, (name, layer) in enumerate(order)
                for i in range(len(self.ctx.profile.params[name])) if (name, layer, i) in table]

    def _set_finals(self, order: List[Tuple[str, Optional[int]]],
                    final: List[Tuple[int, int, float]], origin: float) -> None:
        """A record's final gradients (:meth:`_finals_of`) for the blocks
        ``order``, from ``origin``: final and synchronised then (ZeRO-3's
        last micro-batch: its shard accumulated and averaged)."""
        # one comprehension and two dict updates (the same keys in the same
        # order as a store each: thousands of gradients per replayed task)
        at_origin = {order[k] + (i,): origin + at for k, i, at in final}
        self.sync.final.update(at_origin)
        self.sync.synced.update(at_origin)

    def _left_unit(self, stage: int, origin: float):
        """By layer, what a backward starting at ``origin`` finds pending on
        ``stage``: None (nothing), the unit's (block, members, whether its
        micro-batch was the first), or False where a replay cannot stand
        for the task (more than one unit, one whose reduce-scatter ends
        after ``origin``, or the last micro-batch's, whose settling makes
        its gradients final). A unit done by ``origin`` is settled where the
        task's compute stream is (past ``origin`` by then), whenever it
        ended."""
        ctx = self.ctx
        pending = ctx.unit_pending.get(stage)
        if not pending:
            return None
        if len(pending) > 1:
            return False
        name, _, unit, mb, rs_end = pending[0]
        if rs_end > origin or mb == ctx.microbatches - 1:
            return False
        return (name, unit, mb == 0)

    def _replay(self, record: AccumulatingRecord, stage: int, order, origin: float,
                mb: int) -> float:
        """A recorded task (:meth:`accumulating_backward`) of a chunk whose
        blocks are ``order``, micro-batch ``mb``, from ``origin``."""
        ctx = self.ctx
        ctx.tl.replay(stage, record.items, origin)
        ctx.flops[stage] += record.flops
        self._replay_out(record.out, origin)
        final, leaves, last = record.final, record.leaves, record.last
        if final:
            self._set_finals(order, final, origin)
        if leaves is not None:
            # by layer: the unit found pending was settled in the items;
            # the task's own last unit is left pending
            k, unit, rs_end = leaves
            ctx.unit_pending[stage] = [(order[k][0], order[k][1], unit, mb, origin + rs_end)]
        return origin + last
