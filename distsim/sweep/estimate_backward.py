"""The op-by-op backward of the estimator's :class:`~.estimate_timeline.Builder`
(a mixin): a backward task emitted entry by entry from the template's
segments (:attr:`.estimate_profile.Block.only` / ``last``: compute runs,
tensor-parallel collectives, gradients becoming final) with the
data-parallel sync of each gradient where LowerSPMD emits it. Used for
each chunk's last backward (without a reduce-scatter per micro-batch), the
first micro-batch's backward with ZeRO 2/3 (each gradient flattened and
reduce-scattered where it is made), and ZeRO-3's backwards past the first
(the same, each shard then accumulated, the compute waiting for it),
those recorded once and replayed (:meth:`OpByOpBackward._replay`).
"""
from __future__ import annotations

from itertools import islice
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from ..ir.comm import CollectiveType
from ..transforms.zero3 import unit_indices

from .estimate_gates import gather_plan

if TYPE_CHECKING:     # pragma: no cover - for the annotations only
    from ..transforms.strategy import Strategy
    from .estimate_engine import Timeline
    from .estimate_profile import LayerProfile
    from .estimate_state import Memo
    from .estimate_sync import StepSync


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


#: The fewest blocks a last backward has for :meth:`OpByOpBackward._last_backward`
#: to record and replay it: recording and replaying one costs about what
#: emitting three blocks does.
_MIN_BLOCKS = 4


class OpByOpBackward:
    """The op-by-op backward of :class:`~.estimate_timeline.Builder` (a
    mixin: it uses the builder's timeline, sync, profile, memo, FLOPs,
    ``blocks_of`` and ``_block_scatter``)."""

    tl: "Timeline"
    sync: "StepSync"
    prof: "LayerProfile"
    memo: "Memo"
    S: "Strategy"
    M: int
    flops: List[float]
    flats: Dict[int, List[Tuple[int, float]]]
    #: what the last :meth:`emit_last_backward` noted: its flat copies' bytes
    #: within the task (``inside``) and those it left waiting (for a recorder)
    notes: Tuple[Dict[Tuple[int, int], int], Optional[List[Tuple[int, float]]]]
    replays: Dict[tuple, tuple]
    shapes: List[Tuple[bool, bool, int]]
    route: str
    scatter_each: bool
    zero3: bool
    by_layer: bool
    unit_pending: Dict[int, list]

    def _segment_plan(self, name: str, only: bool) -> list:
        """A block's op-level last backward (``only``: the first micro-batch's,
        which does not accumulate) as (kind, time, FLOPs, the
        entries it waits for, the entry a collective reads (-1: the last
        compute run before it), the parameter index of a final gradient,
        a leading recomputation, whether it waits for the block's ZeRO-3
        gathers up to: :attr:`.estimate_profile.Segment.gate`)."""
        plan = self.memo.segments.get((name, only))
        if plan is None:
            blk = self.prof.blocks[name]
            segs = blk.only if only else blk.last
            ctime = sum(s.time_s for s in segs if s.kind == "c") or 1.0
            index = {p.name: i for i, p in enumerate(self.prof.params[name])}
            gp = gather_plan(self, "B", name) if self.zero3 else None
            # by layer: the unit's copy-out in the run where the unit is
            # first read, each reshape it replaces off the run that read
            # its parameter first (the reads so far: positions up to the gate)
            by_layer = gp is not None and gp.first is not None
            read, split = -1, False
            plan = []
            for seg in segs:
                gate = seg.gate
                if gp is not None and gate is not None and gate >= 0:
                    gate = gp.upto[gate]          # the gathers issued up to that read
                if seg.kind == "c":
                    t = seg.time_s
                    if by_layer and seg.gate is not None and seg.gate > read:
                        t -= sum(gp.reshape_s[read + 1:seg.gate + 1])
                        read = seg.gate
                        if not split and read >= gp.first:
                            t, split = t + gp.split_s, True
                        t = max(0.0, t)
                    plan.append(("c", t, blk.b_flops * seg.time_s / ctime,
                                 tuple(d for d in seg.deps if d is not None), None, None,
                                 seg.lead, gate))
                elif seg.kind == "t":
                    d = seg.deps[0] if seg.deps else None
                    plan.append(("t", seg.time_s, 0.0, (), -1 if d is None else d, None,
                                 seg.lead, gate))
                else:
                    plan.append(("g", 0.0, 0.0, (), seg.deps[0] if seg.deps else -1,
                                 index[seg.param], False, gate))
            self.memo.segments[(name, only)] = plan
        return plan

    def emit_last_backward(self, stage: int, c: int, order, ready: float,
                           first_microbatch: bool = False,
                           accumulating: Optional[int] = None,
                           at_input: Optional[Callable[[str], None]] = None
                           ) -> Optional[float]:
        """The last micro-batch's backward op by op, with the data-parallel
        sync of each gradient emitted where it becomes final
        (``first_microbatch``: ZeRO 2/3's first micro-batch, each gradient
        flattened and reduce-scattered where it is produced; with one
        micro-batch that is its sync; ``accumulating``: ZeRO-3's
        micro-batch past the first, likewise, each reduce-scatter followed
        by the accumulation (at the last micro-batch, and the average) of
        its shard, which the compute stream waits for, as LowerSPMD emits
        it; its memory is not noted here: no copy outlives its reduce-
        scatter). ``at_input`` is called once, with the entry's kind,
        before the first entry that waits for the task's input (the first
        past a leading recomputation)."""
        tl = self.tl
        only = first_microbatch or self.M == 1
        scatter = first_microbatch and self.M > 1
        shard_ops = self._shard_ops(accumulating) if accumulating else None
        last: Optional[float] = None
        first = True
        #: ZeRO-3, per block position: where its gathers end, by the
        #: position of the last parameter gathered (None: all of them)
        gathered: Dict[int, Dict[Optional[int], float]] = {}
        n = len(order)
        # ZeRO 2/3 reduce-scattering here: each flat copy's (bytes, the end
        # of its reduce-scatter)
        flats: Optional[List[Tuple[int, float]]] = [] if (self.scatter_each and only
                                                          and not accumulating) else None
        #: per gradient (its block's position in ``order``, its index in
        #: the block), the bytes of the task's earlier flat copies still
        #: waiting when it is made
        inside: Dict[Tuple[int, int], int] = {}
        #: ZeRO 0/1 buckets: per block, the bytes of the stage's buckets
        #: flushed before it starts (held until they are unpacked)
        in_buckets: Dict[int, int] = {}
        by_stage = self.sync.buckets if self.route == "bucket" else {}
        #: by layer: per block position, its unit's gradients made so far
        unit_made: Dict[int, Dict[int, float]] = {}
        for k, (name, layer) in enumerate(order):
            if by_stage.get(stage):       # flushed so far, this task's too
                in_buckets[k] = sum(by_stage[stage])
            ends: Dict[Optional[int], float] = {}
            if self.zero3:
                gate = last if last is not None else max(ready, tl.free[2 * stage])
                for j in range(k, min(n, k + 1 + self.S.prefetch)):
                    if j not in gathered:
                        gathered[j] = at_end = {}
                        copy_in = gather_plan(self, "B", order[j][0]).copy_in
                        start = tl.compute(stage, copy_in, gate) if copy_in else gate
                        for t, upto in self._gather_groups(order[j][0], only):
                            at_end[upto] = at_end[None] = tl.comm_on(stage, t, start)
                ends = gathered[k]
            local: Dict[int, float] = {}
            unit = self._grad_unit(name)
            for i, (kind, time_s, fl, waits, src, param, lead, at) in enumerate(
                    self._segment_plan(name, only)):
                # ZeRO-3: an entry waits for the block's gathers up to the
                # last parameter it (or an entry before it) reads; before
                # the first read, for none
                extra = 0.0 if not ends or at == -1 else ends[at]
                # the recomputation a task starts with need not wait for its input
                if first and not lead:
                    if at_input is not None:     # the first entry that waits for the input
                        at_input(kind)
                        at_input = None
                    if ready > extra:
                        extra = ready
                if kind == "c":
                    self.flops[stage] += fl
                    for d in waits:
                        if local[d] > extra:
                            extra = local[d]
                    local[i] = last = tl.compute(stage, time_s, extra)
                    first = first and lead
                elif kind == "t":
                    dep = local.get(src, 0.0) if src >= 0 else last
                    if dep is not None and dep > extra:
                        extra = dep
                    local[i] = tl.comm_on(stage, time_s, extra, tp=True)
                    first = first and lead
                else:
                    made = local.get(src) if src >= 0 else last
                    if flats:
                        flats = [x for x in flats if x[1] > (made or 0.0)]
                        held = sum(nbytes for nbytes, _ in flats)
                        if held > inside.get((k, param), 0):
                            inside[(k, param)] = held
                    if unit is not None and param in unit:
                        # by layer: reduce-scattered with the rest of the
                        # block's unit once all are made
                        got = unit_made.setdefault(k, {})
                        got[param] = made or 0.0
                        if len(got) == len(unit):
                            end = self._scatter_unit(stage, name, layer, unit,
                                                     max(got.values()), accumulating or 0)
                            if flats is not None:
                                flats.append((self._unit_bytes(name), end))
                        continue
                    if scatter:
                        end = self.sync.scatter((name, param), stage, made)
                        if shard_ops is not None:
                            t, fl = shard_ops[(name, param)]
                            self.flops[stage] += fl
                            end = last = tl.compute(stage, t, end)
                            if accumulating == self.M - 1:
                                key = (name, layer, param)
                                self.sync.final[key] = self.sync.synced[key] = end
                    else:
                        end = self.sync.ready_and_synced((name, layer, param), stage, made)
                    if flats is not None:
                        flats.append((self.sync.cost(name, param).nbytes, end))
        if in_buckets:
            self._note_buckets(stage, c, in_buckets)
        if last is None:
            flats = None
        elif flats:
            flats = [(nbytes, end) for nbytes, end in flats if end > last]
        self._leave_flats(stage, c, inside, flats)
        self.notes = (inside, flats)
        return last

    def _leave_flats(self, stage: int, c: int, inside: Dict[Tuple[int, int], int],
                     flats: Optional[List[Tuple[int, float]]]) -> None:
        """What a backward that flattens its gradients leaves: the most
        bytes of flat copies waiting at each gradient (``inside``) and the
        copies still waiting for their reduce-scatters when it ends
        (``flats``: bytes, end), noted for the memory walk and kept for the
        stage's next tasks."""
        if inside:
            self._note_inside(stage, c, inside)
        if flats:
            self._note_flats(stage, "end", 0, c, flats)
            self.flats[stage] = self.flats.get(stage, []) + flats

    def _start(self, stage: int, name: str, only: bool, ready: float
               ) -> Tuple[float, bool, bool]:
        """Where an op-by-op backward whose first block is ``name``
        (``only``: :meth:`_segment_plan`'s) starts if its items depend only
        on that: ``(origin, clean, opens with compute)``. The origin is the
        compute stream's end, or the task's input where it comes later and
        no recomputation leads (a leading recomputation runs from the
        stream's end, the rest from the input: emit_last_backward's
        ``first``); clean when the input is there by then and the stage's
        communication stream idle. (A task opening with a collective would
        start it from its input or the stream's end, not from the origin.)"""
        tl = self.tl
        s = 2 * stage
        free = tl.free[s] if tl.free[s] > 0.0 else 0.0
        plan = self._segment_plan(name, only)
        lead = bool(plan) and plan[0][6]
        origin = free if lead else max(ready, free)
        return (origin, ready <= origin and tl.free[s + 1] <= origin,
                bool(plan) and plan[0][0] == "c")

    def _first_backward(self, stage: int, c: int, ready: float) -> Optional[float]:
        """:meth:`emit_last_backward` of chunk ``c``'s first micro-batch with
        ZeRO 2/3 (each gradient flattened and reduce-scattered where it is
        made), replayed where it can be. Each stage runs one such task; one
        that starts with the stage's communication stream idle (and the
        task's input there, unless a recomputation leads) depends only on
        where it starts, so the first of a chunk shape is recorded relative
        to its start and the same shape's on the other stages replay it
        (one whose leading recomputation is over before its input comes,
        in two parts: :meth:`_emit_from`): its items, FLOPs, memory notes (bytes, the same) and the flat
        copies it leaves waiting for their reduce-scatters (shifted). Not
        by layer (its units wait across tasks), nor with one micro-batch
        (that backward is the last, which synchronises its gradients), nor
        with gradient buckets (what a task holds depends on the stage's
        earlier flushes)."""
        order = self.blocks_of("B", c)
        if self.by_layer or self.M == 1 or self.route == "bucket" or not order:
            return self.emit_last_backward(stage, c, order, ready, first_microbatch=True)
        origin, clean, compute_first = self._start(stage, order[0][0], True, ready)
        tl = self.tl
        if not compute_first or tl.free[2 * stage + 1] > origin:
            return self.emit_last_backward(stage, c, order, ready, first_microbatch=True)
        split = not clean          # a leading recomputation, the input later
        key = ("first", self.shapes[c], split)
        record = self.replays.get(key)
        if record is not None:
            start = self._replay_lead(stage, record[5], origin, ready) if split else origin
            if start is None:
                return self.emit_last_backward(stage, c, order, ready, first_microbatch=True)
            return self._replay_first(record, stage, c, start)
        mark, flops = tl.mark(stage), self.flops[stage]
        last, lead, mark = self._emit_from(stage, c, order, ready, origin, mark, split,
                                           first_microbatch=True)
        if lead is not False:
            start = ready if split else origin
            items = tl.since(stage, mark, start) if last is not None else None
            if items is not None:
                inside, flats = self.notes
                self.replays[key] = (items, self.flops[stage] - flops, last - start, dict(inside),
                                     [(nbytes, end - start) for nbytes, end in flats or ()], lead)
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
        tl = self.tl
        found: List[tuple] = []

        def lead_over(kind: str) -> None:
            # the recomputation's items, and the rest's start: the input
            s = 2 * stage
            if kind != "g" and max(tl.free[s], tl.free[s + 1]) <= ready:
                found.append(((tl.since(stage, mark, origin),
                               max(tl.free[s], tl.free[s + 1]) - origin), tl.mark(stage)))

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
        self.tl.replay(stage, items, origin)
        return ready

    def _replay_first(self, record: tuple, stage: int, c: int, origin: float) -> float:
        """A recorded first backward (:meth:`_first_backward`) of chunk ``c``
        on ``stage`` from ``origin``."""
        items, flops, last, inside, flats, _ = record
        self.tl.replay(stage, items, origin)
        self.flops[stage] += flops
        self._leave_flats(stage, c, inside, [(nbytes, origin + end) for nbytes, end in flats])
        return origin + last

    def _last_backward(self, stage: int, c: int, ready: float) -> Optional[float]:
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
        (:attr:`.estimate_state.Memo.last_backwards`) end with the same
        last backwards, one micro-batch apart. Its memory notes are the
        first's (the same bytes; each gradient synchronised on its own,
        there are none)."""
        order = self.blocks_of("B", c)
        sync = self.sync
        if self.zero3 or sync.pending.get(stage) or not order:
            return self.emit_last_backward(stage, c, order, ready)
        only = self.M == 1
        origin, clean, compute_first = self._start(stage, order[0][0], only, ready)
        tl = self.tl
        if not compute_first or tl.free[2 * stage + 1] > origin:
            return self.emit_last_backward(stage, c, order, ready)
        # not clean with the communication stream idle: a leading
        # recomputation from ``origin``, the input later
        split = not clean
        shared = self.route in ("each", "local")
        key = (("last", self.shapes[c], only, split) if shared
               else (stage, c, tuple(sync.buckets.get(stage, ())), split))
        record = self.memo.last_backwards.get(key)
        if record is not None:
            start = self._replay_lead(stage, record[10], origin, ready) if split else origin
            if start is None:
                return self.emit_last_backward(stage, c, order, ready)
            return self._replay_last(record, stage, order, start)
        # recording and replaying costs about what emitting three blocks
        # does: worth it where the replays emit no fewer blocks
        replays = ((self.shape_chunks[self.shapes[c]] - 1 if shared else 0)
                   + (1 if self.memo.record_last_backwards else 0))
        if replays * len(order) < _MIN_BLOCKS:
            return self.emit_last_backward(stage, c, order, ready)
        mark, flops = tl.mark(stage), self.flops[stage]
        sizes = (len(sync.final), len(sync.synced), len(sync.buckets.get(stage, ())),
                 len(sync.unpack), len(sync.deferred.get(stage, ())))
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
                or len(final) != sum(len(self.prof.params[name]) for name, _ in order)):
            return last
        place = {block: k for k, block in enumerate(order)}
        made = [_by_place(entries, place, origin) for entries in (final, synced)]
        if None in made:
            return last
        self.memo.last_backwards[key] = (
            items, self.flops[stage] - flops, last - origin, made[0], made[1],
            tuple(sync.pending.get(stage, ())), sync.pending_bytes.get(stage),
            tuple(sync.buckets.get(stage, ())[sizes[2]:]),
            [(bucket, ar - origin, total, dtype)
             for bucket, _, ar, total, dtype in sync.unpack[sizes[3]:]],
            tuple(sync.deferred.get(stage, ())[sizes[4]:]), lead)
        return last

    def _replay_last(self, record: tuple, stage: int, order: List[Tuple[str, Optional[int]]],
                     origin: float) -> float:
        """A recorded last backward (:meth:`_last_backward`) on ``stage``
        from ``origin``, of a chunk whose blocks are ``order``."""
        (items, flops, last, final, synced, pending, pending_bytes, buckets, unpack,
         deferred, _) = record
        self.tl.replay(stage, items, origin)
        self.flops[stage] += flops
        sync = self.sync
        for table, (places, at) in ((sync.final, final), (sync.synced, synced)):
            if places:
                table.update(zip([order[k] + (i,) for k, i in places], (at + origin).tolist()))
        if pending:
            sync.pending[stage] = list(pending)
            sync.pending_bytes[stage] = pending_bytes
        if buckets:
            sync.buckets.setdefault(stage, []).extend(buckets)
        sync.unpack.extend((bucket, stage, origin + ar, total, dtype)
                           for bucket, ar, total, dtype in unpack)
        if deferred:
            sync.deferred.setdefault(stage, []).extend(deferred)
        return origin + last

    def _accumulating_backward(self, stage: int, c: int, mb: int, ready: float) -> float:
        """:meth:`emit_last_backward` of a ZeRO-3 backward past the first
        micro-batch, replayed where it can be. Once the pipeline is steady
        most such tasks start with the stage's communication stream idle:
        their items then depend only on where they start (the compute
        stream's end, or the task's input where it comes later and no
        recomputation leads), so the first such task of a chunk shape and
        micro-batch class is emitted op by op and recorded relative to its
        start, and the next ones are that record shifted (the same items,
        to rounding). Any other start is emitted op by op."""
        tl = self.tl
        order = self.blocks_of("B", c)
        origin, clean, _ = self._start(stage, order[0][0], True, ready)
        key = (self.shapes[c], mb == self.M - 1)
        if self.by_layer:
            # by layer a task first settles the unit the stage's previous
            # backward left (its reduce-scatter long done when the task is
            # clean): part of what the task's items depend on
            left = self._left_unit(stage, origin)
            clean = clean and left is not False
            key = key + (left,)
        record = self.replays.get(key) if clean else None
        if record is not None:
            return self._replay(record, stage, order, origin, mb)
        mark, flops = tl.mark(stage), self.flops[stage]
        last = self.emit_last_backward(stage, c, order, ready, first_microbatch=True,
                                       accumulating=mb)
        items = tl.since(stage, mark, origin) if clean and last is not None else None
        if items is not None:
            final = []       # by position in the chunk's blocks: chunks differ in layers
            if mb == self.M - 1:
                final = [(k, i, self.sync.final[(name, layer, i)] - origin)
                         for k, (name, layer) in enumerate(order)
                         for i in range(len(self.prof.params[name]))
                         if (name, layer, i) in self.sync.final]
            leaves = None
            if self.by_layer:
                pending = self.unit_pending.get(stage, [])
                if len(pending) != 1:
                    return last
                name, layer, unit, _, rs_end = pending[0]
                leaves = (order.index((name, layer)), unit, rs_end - origin)
            self.replays[key] = (items, self.flops[stage] - flops, last - origin, final, leaves)
        return last

    def _left_unit(self, stage: int, origin: float):
        """By layer, what a backward starting at ``origin`` finds pending on
        ``stage``: None (nothing), the unit's (block, members, whether its
        micro-batch was the first), or False where a replay cannot stand
        for the task (more than one unit, one whose reduce-scatter ends
        after ``origin``, or the last micro-batch's, whose settling makes
        its gradients final). A unit done by ``origin`` is settled where the
        task's compute stream is (past ``origin`` by then), whenever it
        ended."""
        pending = self.unit_pending.get(stage)
        if not pending:
            return None
        if len(pending) > 1:
            return False
        name, _, unit, mb, rs_end = pending[0]
        if rs_end > origin or mb == self.M - 1:
            return False
        return (name, unit, mb == 0)

    def _replay(self, record, stage: int, order, origin: float, mb: int) -> float:
        """A recorded task (:meth:`_accumulating_backward`) of a chunk whose
        blocks are ``order``, micro-batch ``mb``, from ``origin``."""
        items, flops, last, final, leaves = record
        self.tl.replay(stage, items, origin)
        self.flops[stage] += flops
        sync = self.sync
        for k, i, at in final:
            key = (order[k][0], order[k][1], i)
            sync.final[key] = sync.synced[key] = origin + at
        if leaves is not None:
            # by layer: the unit found pending was settled in the items;
            # the task's own last unit is left pending
            k, unit, rs_end = leaves
            self.unit_pending[stage] = [(order[k][0], order[k][1], unit, mb, origin + rs_end)]
        return origin + last

    def _gather_groups(self, name: str, only: bool) -> List[Tuple[float, int]]:
        """ZeRO-3, a block's op-by-op backward: its all-gathers (which run
        back to back) as the fewest items its entries can wait for: (summed
        time, position of the group's last parameter) each, cut after each
        position an entry of :meth:`_segment_plan` waits up to."""
        hit = self.memo.gather_groups.get((name, only))
        if hit is None:
            times = gather_plan(self, "B", name).items
            cuts = sorted({entry[7] for entry in self._segment_plan(name, only)
                           if entry[7] is not None and entry[7] >= 0})
            hit, start = [], 0
            for upto in cuts + [len(times) - 1]:
                if upto >= start:
                    hit.append((sum(times[start:upto + 1]), upto))
                    start = upto + 1
            self.memo.gather_groups[(name, only)] = hit
        return hit

    def _shard_ops(self, mb: int) -> Dict[Tuple[str, int], Tuple[float, float]]:
        """ZeRO-3's backward of micro-batch ``mb`` (past the first) op by op:
        per parameter (block, index), the time and FLOPs of the ops on its
        shard after its reduce-scatter (accumulate; at the last micro-batch
        average too)."""
        final = mb == self.M - 1
        hit = self.memo.shard_ops.get(final)
        if hit is None:
            hit = self.memo.shard_ops[final] = {}
            per = 2 if final else 1          # ops per parameter in the terms
            for name, params in self.prof.params.items():
                terms = self._block_scatter(name, True, final)
                for i in range(len(params)):
                    at = slice(i * per, (i + 1) * per)
                    hit[(name, i)] = (sum(terms.on_shard[at]), sum(terms.shard_flops[at]))
        return hit

    # -- ZeRO-3 by layer: a block's gradients reduce-scattered as one --------
    def _grad_unit(self, name: str) -> Optional[Tuple[int, ...]]:
        """By layer with a reduce-scatter per micro-batch: the indices of
        the block's parameters whose gradients travel as one (those dp
        divides, when more than one), or None."""
        if not (self.by_layer and self.scatter_each):
            return None
        return self._grad_unit_of(name)[0]

    def _unit_bytes(self, name: str) -> int:
        """The bytes of the block's unit of gradients (its parameters whole)."""
        return self._grad_unit_of(name)[1]

    def _grad_unit_of(self, name: str) -> Tuple[Optional[Tuple[int, ...]], int]:
        hit = self.memo.grad_units.get(name)
        if hit is None:
            params = self.prof.params[name]
            members = unit_indices([p.numel for p in params], self.S.dp)
            hit = self.memo.grad_units[name] = (
                members or None, sum(params[i].numel * params[i].dtype.itemsize for i in members))
        return hit

    def _scatter_unit(self, stage: int, name: str, layer, unit: Tuple[int, ...], made: float,
                      mb: int) -> float:
        """A block's unit of gradients, all made by ``made``: the stage's
        previous unit settled first (:meth:`settle_units`), then the
        gradients concatenated row by row (compute) and reduce-scattered
        (its end returned); settled at the stage's next unit."""
        self.settle_units(stage)
        params = self.prof.params[name]
        d = params[unit[0]].dtype
        t_cat = self.costs.cost("chunk_cat", [(params[i].numel, d) for i in unit],
                                [(sum(params[i].numel for i in unit), d)])[0]
        end = self.tl.compute(stage, t_cat, made)
        end = self.tl.comm_on(stage, self.dp_time(CollectiveType.REDUCE_SCATTER,
                                                  self._unit_bytes(name)), end)
        self.unit_pending.setdefault(stage, []).append((name, layer, unit, mb, end))
        return end

    def settle_units(self, stage: int) -> None:
        """The units of ``stage`` reduce-scattered and not settled: each
        result split into the shards (compute, after its reduce-scatter),
        then, past the first micro-batch, each shard's accumulation (and at
        the last, its average); a gradient is synchronised where its shard
        is settled at the last micro-batch (as GradientSync._settle_units)."""
        tl, sync = self.tl, self.sync
        for name, layer, unit, mb, rs_end in self.unit_pending.pop(stage, []):
            params = self.prof.params[name]
            d = params[unit[0]].dtype
            shards = [params[i].numel // self.S.dp for i in unit]
            t_split = self.costs.cost("split", [(sum(shards), d)], [(n, d) for n in shards])[0]
            end = tl.compute(stage, t_split, rs_end)
            ops = self._shard_ops(mb) if mb else None
            for i in unit:
                if ops is not None:
                    t, fl = ops[(name, i)]
                    self.flops[stage] += fl
                    end = tl.compute(stage, t, end)
                if mb == self.M - 1:
                    key = (name, layer, i)
                    sync.final[key] = sync.synced[key] = end
