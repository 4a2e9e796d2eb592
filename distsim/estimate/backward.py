"""The op-by-op backward of the estimator's walk (:class:`~.timeline.Builder`):
a backward task emitted entry by entry from the template's
segments (:attr:`.profile.Block.only` / ``last``: compute runs,
tensor-parallel collectives, gradients becoming final) with the
data-parallel sync of each gradient where LowerSPMD emits it. Used for
each chunk's last backward (without a reduce-scatter per micro-batch), the
first micro-batch's backward with ZeRO 2/3 (each gradient flattened and
reduce-scattered where it is made), and ZeRO 2/3's backwards past the
first (the same, each shard then accumulated, the compute waiting for it).
Which of those are recorded once and replayed: :mod:`.replay`.
"""
from __future__ import annotations

from bisect import bisect_right
from typing import Callable, Dict, List, Optional, Tuple

from ..ir.comm import CollectiveType
from ..transforms.sync_policy import SyncPolicy, prefetch_window

from .context import StepContext
from .gates import gather_plan
from .gathered_walk import note_again, note_peak
from .notes import MemoryNotes
from .sync import ParamKey, StepSync
from .units import held_units


class FlatCopies:
    """A backward's flat gradient copies still waiting for their
    reduce-scatters, ``(bytes, end of the reduce-scatter)`` in the order
    issued. One stream takes the reduce-scatters in that order, so their
    ends come in order and the copies still waiting at a time are a
    suffix: found by bisection, their bytes by a running sum (integers:
    the same sums as a loop over them), however many wait (per group a
    backward's compute runs ahead of its reduce-scatters: thousands). An
    end out of order (none is known) turns to a loop over the copies."""

    __slots__ = ("items", "ends", "total", "lo", "ordered")

    def __init__(self) -> None:
        self.items: List[Tuple[int, float]] = []
        self.ends: List[float] = []
        #: bytes of ``items[:i]`` at ``total[i]``
        self.total: List[int] = [0]
        self.lo = 0                 # the first copy still waiting
        self.ordered = True

    def __bool__(self) -> bool:
        return self.lo < len(self.items)

    def waiting(self) -> List[Tuple[int, float]]:
        """The copies still waiting."""
        return self.items[self.lo:]

    def append(self, nbytes: int, end: float) -> None:
        if self.ends and end < self.ends[-1]:
            self.ordered = False
        self.items.append((nbytes, end))
        self.ends.append(end)
        self.total.append(self.total[-1] + nbytes)

    def held(self, start: float, made: float) -> Tuple[int, int]:
        """The bytes of the copies waiting past ``start`` and past ``made``
        (``start <= made``: where the op making a gradient starts and
        ends); those done by ``made`` stop waiting."""
        if not self.ordered:
            held_start = held = 0
            waiting = []
            for x in self.items[self.lo:]:
                if x[1] > start:
                    held_start += x[0]
                if x[1] > made:
                    waiting.append(x)
                    held += x[0]
            self.items, self.lo = waiting, 0
            self.ends = [end for _, end in waiting]
            self.total = [0]
            for nbytes, _ in waiting:
                self.total.append(self.total[-1] + nbytes)
            self.ordered = all(a <= b for a, b in zip(self.ends, self.ends[1:]))
            return held_start, held
        ends, total, lo = self.ends, self.total, self.lo
        last = total[-1]
        held_start = last - total[bisect_right(ends, start, lo)]
        lo = self.lo = bisect_right(ends, made, lo)
        return held_start, last - total[lo]


class OpByOpBackward:
    """The op-by-op backward tasks of one walk (see the module docstring),
    on its context, with its gradient sync (``sync``, the timeline sink of
    ``policy``) and memory notes."""

    #: which part of the backward its tasks are: "B" (all of it, or a split
    #: backward's input-gradient part) or "W" (a split backward's weight
    #: gradients: :attr:`.blocks.LayerProfile.weight`)
    part = "B"

    def __init__(self, ctx: StepContext, sync: StepSync, policy: SyncPolicy,
                 notes: MemoryNotes) -> None:
        self.ctx = ctx
        self.sync = sync
        self.policy = policy
        self.notes = notes
        #: what the last :meth:`emit_last_backward` noted: its flat copies'
        #: bytes within the task (``inside``) and those it left waiting (for
        #: a recorder)
        self.last_notes: Tuple[Dict[Tuple[int, int], int], Optional[List[Tuple[int, float]]]] = \
            ({}, None)

    def synced_at(self, key: ParamKey, stage: int, made: Optional[float]) -> float:
        """The gradient ``key`` is final at ``made``: the policy synchronises
        it (:meth:`~distsim.transforms.sync_policy.SyncPolicy.final`);
        returns its synchronised end (0.0 while it waits for a bucket or
        the backward pass's end). Where the policy all-reduces each
        gradient on its own at once, a gradient whose collective is timed
        takes :meth:`.sync.StepSync.sync_one`'s steps without the calls
        between (an estimate syncs every gradient of the model this way)."""
        sync = self.sync
        if sync.each_all_reduce:
            pc = sync._costs.get((key[0], key[2]))
            if pc is not None and pc.sync is not None:
                sync.final[key] = made
                synced = sync.synced[key] = sync.tl.comm_on(stage, pc.sync, made or 0.0)
                return synced
        sync.final[key] = made
        self.policy.final(key, stage)
        return sync.synced.get(key) or 0.0

    def _segment_plan(self, name: str, only: bool) -> list:
        """A block's op-level last backward (``only``: the first micro-batch's,
        which does not accumulate) as (kind, time, FLOPs, the
        entries it waits for, the entry a collective reads (-1: the last
        compute run before it; -2: none, it reads what the forward kept),
        the parameter index of a final gradient,
        a leading recomputation, whether it waits for the block's ZeRO-3
        gathers up to: :attr:`.profile.Segment.gate`)."""
        ctx = self.ctx
        plan = ctx.memo.segments.get((name, only, self.part))
        if plan is None:
            blk = ctx.part(self.part)[name]
            segs = blk.only if only else blk.last
            ctime = sum(s.time_s for s in segs if s.kind == "c") or 1.0
            index = {p.name: i for i, p in enumerate(ctx.profile.params[name])}
            gp = gather_plan(self.ctx, "B", name) if self.part in ctx.gathering else None
            # by layer: the unit's copy-out in the run where the unit is
            # first read, each reshape it replaces off the run that read
            # its parameter first (the reads so far: positions up to the gate)
            by_layer = gp is not None and gp.first is not None
            read = -1
            plan = []
            for seg in segs:
                gate = seg.gate
                if gp is not None and gate is not None and gate >= 0:
                    gate = gp.upto[gate]          # the gathers issued up to that read
                if seg.kind == "c":
                    t = seg.time_s
                    if by_layer and seg.gate is not None and seg.gate > read:
                        t = max(0.0, t + gp.read_change(read, seg.gate))
                        read = seg.gate
                    plan.append(("c", t, blk.b_flops * seg.time_s / ctime,
                                 tuple(d for d in seg.deps if d is not None), None, None,
                                 seg.lead, gate))
                elif seg.kind == "t":
                    # -1: waits for the compute before it; -2: for none
                    d = seg.deps[0] if seg.deps else None
                    # a ring step ("p"): its queue in the parameter's place
                    plan.append(("p" if seg.p2p else "t", seg.time_s, 0.0, (),
                                 -2 if not seg.deps else -1 if d is None else d,
                                 seg.p2p or None, seg.lead, gate))
                elif seg.kind == "o":
                    plan.append(("o", 0.0, 0.0, (), seg.deps[0] if seg.deps else -1, None,
                                 False, None))
                else:
                    # its time: the op making the gradient's (the run's last)
                    plan.append(("g", seg.op_s, 0.0, (), seg.deps[0] if seg.deps else -1,
                                 index[seg.param], False, gate))
            ctx.memo.segments[(name, only, self.part)] = plan
        return plan

    def emit_last_backward(self, stage: int, c: int, order, ready: float,
                           first_microbatch: bool = False,
                           accumulating: Optional[int] = None,
                           at_input: Optional[Callable[[str], None]] = None,
                           block_replays: bool = False) -> Optional[float]:
        """The last micro-batch's backward op by op, with the data-parallel
        sync of each gradient emitted where it becomes final
        (``first_microbatch``: ZeRO 2/3's first micro-batch, each gradient
        flattened and reduce-scattered where it is produced; with one
        micro-batch that is its sync; ``accumulating``: ZeRO 2/3's
        micro-batch past the first, likewise, each reduce-scatter followed
        by the accumulation (at the last micro-batch, and the average) of
        its shard, which the compute stream waits for, as LowerSPMD emits
        it; its memory is not noted here: no copy outlives its reduce-
        scatter). ``at_input`` is called once, with the entry's kind,
        before the first entry that waits for the task's input (the first
        past a leading recomputation). ``block_replays`` (``accumulating``
        only): a block may be a recorded block's items again
        (:meth:`_block_replay`)."""
        ctx = self.ctx
        tl, flops = ctx.tl, ctx.flops
        only = first_microbatch or ctx.microbatches == 1
        scatter = first_microbatch and ctx.microbatches > 1
        shard_ops = ctx.shard_ops(accumulating) if accumulating else None
        #: ZeRO 2 past the first micro-batch without a block's collectives
        #: (:attr:`~.context.StepContext.block_comm`): each gradient's
        #: reduce-scatter and accumulation as one item (below; decided once,
        #: not per gradient), where the reduce-scatters share the one
        #: communication stream (not per group: theirs is the data-parallel
        #: stream)
        fused = (scatter and shard_ops is not None and not ctx.zero3 and not ctx.block_comm
                 and not ctx.tl.per_group)
        #: the parameters' costs, for the sync of each gradient here
        #: (reduce-scatters: ZeRO 2/3 only)
        timed_costs = ctx.memo.param_costs if scatter and self.sync.zero >= 2 else {}
        last: Optional[float] = None
        #: where the task's last ring attention step on each p2p queue
        #: ends: they take it in program order
        ring: Dict[int, float] = {}
        first = True
        #: ZeRO-3, per block position: where its gathers end, by the
        #: position of the last parameter gathered (None: all of them)
        gathered: Dict[int, Dict[Optional[int], float]] = {}
        n = len(order)
        # ZeRO 2/3 reduce-scattering here: each flat copy's (bytes, the end
        # of its reduce-scatter)
        flats: Optional[FlatCopies] = FlatCopies() if (ctx.scatter_each and only
                                                       and not accumulating) else None
        #: per gradient (its block's position in ``order``, its index in
        #: the block), the bytes of the task's earlier flat copies still
        #: waiting when it is made
        inside: Dict[Tuple[int, int], int] = {}
        #: a backward past the first: the flat copies earlier tasks of the
        #: stage left waiting for their reduce-scatters (bytes, end), and
        #: per gradient the bytes of them still waiting when it is made
        earlier = ctx.flats.get(stage) if accumulating else None
        later: Dict[Tuple[int, int], int] = {}
        #: ZeRO 0/1 buckets: per block, the bytes of the stage's buckets
        #: flushed before it starts (held until they are unpacked)
        in_buckets: Dict[int, int] = {}
        by_stage = self.sync.buckets if ctx.route == "bucket" else {}
        #: and per gradient (block position, index) whose sync flushes a
        #: bucket inside its block, the bytes of them all then
        flushed: Dict[Tuple[int, int], int] = {}
        block_replays = block_replays and accumulating is not None \
            and not ctx.by_layer and not by_stage
        # ZeRO-3: each block's memory with its gathered parameters placed
        # in time, noted for the memory estimate
        entries: Optional[List[tuple]] = None
        own = None
        if self.part in ctx.gathering:
            entries = []
            ctx.peak_key = ("B", ctx.shapes[c],
                             (first_microbatch and not accumulating) or ctx.microbatches == 1)
        for k, (name, layer) in enumerate(order):
            if by_stage.get(stage):       # flushed so far, this task's too
                in_buckets[k] = sum(by_stage[stage])
            count = len(by_stage.get(stage, ()))
            recording = None
            if block_replays and not first and last is not None:
                origin_of_replay = last
                done, recording = self._block_replay(stage, order, k, last, gathered,
                                                     accumulating == ctx.microbatches - 1)
                if done is not None:
                    last = done
                    if entries is not None:
                        note_again(self.ctx, ctx.peak_key, k, ctx.block_got)
                        # the gathers the replayed block issued, and its own read
                        for j in range(k + 1, min(n, k + 1 + ctx.strategy.prefetch)):
                            if j in gathered and not any(e[0] == j for e in entries):
                                groups = self._gather_groups(order[j][0], only)
                                entries.append((j, order[j][0], origin_of_replay, tuple(
                                    (t, upto, gathered[j][upto]) for t, upto in groups)))
                        while entries and entries[0][0] <= k:
                            del entries[0]
                    continue
            ends: Dict[Optional[int], float] = {}
            if self.part in ctx.gathering:
                gate = last if last is not None else max(ready, tl.free[2 * stage])
                for j in prefetch_window(k, n, ctx.strategy.prefetch):
                    if j not in gathered:
                        gathered[j] = at_end = {}
                        # each unit's gathers after its copy-in (the first
                        # block's first: :meth:`.timeline.Builder.emit_task`)
                        copy_ins = gather_plan(self.ctx, "B", order[j][0]).item_copy_ins
                        groups, begin, start = [], None, gate
                        for t, upto in self._gather_groups(order[j][0], only):
                            copy_in = copy_ins[groups[-1][1] + 1 if groups else 0] \
                                if copy_ins and (j or groups) else 0.0
                            if copy_in:
                                start = tl.compute(stage, copy_in, gate)
                            begin = start if begin is None else begin
                            at_end[upto] = at_end[None] = tl.comm_on(stage, t, start)
                            groups.append((t, upto, at_end[upto]))
                        if entries is not None:
                            entries.append((j, order[j][0], gate if begin is None else begin,
                                            tuple(groups)))
                ends = gathered[k]
                gate = max(gate, tl.free[2 * stage])     # after its copy-ins (by layer)
                units_before = tuple(ctx.unit_pending.get(stage, ())) if ctx.by_layer else ()
                # this task's flat copies: those waiting as the block starts,
                # and the block's own (bytes, start, end of the reduce-scatter)
                own = (flats.waiting(), []) if flats is not None else None
            local: Dict[int, float] = {}
            units = ctx.grad_units(name)
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
                    flops[stage] += fl
                    for d in waits:
                        if local[d] > extra:
                            extra = local[d]
                    local[i] = last = tl.compute(stage, time_s, extra)
                    first = first and lead
                elif kind in ("t", "p"):
                    dep = local.get(src, 0.0) if src >= 0 else last if src == -1 else None
                    if dep is not None and dep > extra:
                        extra = dep
                    if kind == "t":
                        local[i] = tl.comm_on(stage, time_s, extra, tp=True)
                    else:       # a ring attention step: on its own p2p queue
                        start = tl.issued((stage,), extra)
                        local[i] = ring[param] = max(start, ring.get(param, 0.0)) + time_s
                    first = first and lead
                elif kind == "o":     # the block's input gradient: sent from here
                    ctx.out_at = local.get(src) if src >= 0 else last
                else:
                    made = local.get(src) if src >= 0 else last
                    if earlier:
                        held = sum(nbytes for nbytes, end in earlier if end > (made or 0.0))
                        if held > later.get((k, param), 0):
                            later[(k, param)] = held
                    if flats:
                        # those still waiting as the op making it starts
                        # (its output is live from there; key (k, param,
                        # True)) and as it ends (its flat copy's; (k, param)):
                        # one pass, each sum in the list's order (a few
                        # copies, a hundred thousand gradients a grid)
                        made_at = made or 0.0
                        held_start, held = flats.held(made_at - time_s, made_at)
                        if held_start > inside.get((k, param, True), 0):
                            inside[(k, param, True)] = held_start
                        if held > inside.get((k, param), 0):
                            inside[(k, param)] = held
                    unit = ctx.grad_unit(name, param) if units else None
                    if unit is not None:
                        # by layer: reduce-scattered with the rest of its
                        # unit once all are made (the policy's rule)
                        key = (name, layer, param)
                        ctx.unit_made_at[(key, accumulating or 0)] = made or 0.0
                        scattered = len(ctx.unit_ends)
                        self.policy.unit_gradient(tuple((name, layer, i) for i in unit),
                                                       key, stage, accumulating or 0)
                        if flats is not None and len(ctx.unit_ends) > scattered:
                            nbytes = ctx.unit_bytes(name, unit)
                            flats.append(nbytes, ctx.unit_ends[-1])
                            if own is not None:     # from the concatenation's end
                                own[1].append((nbytes, tl.free[2 * stage], ctx.unit_ends[-1]))
                        continue
                    # an expert's gradient on a team of one rank (ep = dp):
                    # kept whole, neither flattened nor reduce-scattered
                    # (no flat copy); accumulated in place past the first
                    # micro-batch
                    whole = ctx.scatter_each and not ctx.scatters(name, param)
                    if fused and not whole:
                        # ZeRO 2 past the first micro-batch, without
                        # tensor-parallel collectives (nothing else on the
                        # communication stream): flattened, then the
                        # shard's accumulation, which waits for the
                        # reduce-scatter, as one item holding the
                        # communication stream from the reduce-scatter's
                        # start (its time a wait; the same times as the two
                        # items, half the spans for the time split)
                        pc = ctx.param_cost(name, param)
                        if pc.sync is None:
                            pc.sync = ctx.dp_time(CollectiveType.REDUCE_SCATTER, pc.nbytes,
                                                  pc.expert)
                        t, fl = pc.flat
                        ts, fls = shard_ops[(name, param)]
                        flops[stage] += fl
                        flops[stage] += fls
                        end = last = tl.compute(stage, pc.sync + ts,
                                                tl.compute(stage, t, made or 0.0), ts,
                                                holds_comm=True)
                        if accumulating == ctx.microbatches - 1:
                            key = (name, layer, param)
                            self.sync.final[key] = self.sync.synced[key] = end
                    elif scatter:
                        pc = timed_costs.get((name, param))
                        if whole:
                            end = made or 0.0
                        elif pc is not None and pc.sync is not None:
                            # StepSync.scatter's steps, its collective timed
                            # (ZeRO 2/3: thousands of gradients a step)
                            t, fl = pc.flat
                            flops[stage] += fl
                            end = tl.comm_on(stage, pc.sync, tl.compute(stage, t, made or 0.0))
                        else:
                            end = self.sync.scatter((name, param), stage, made,
                                                    CollectiveType.REDUCE_SCATTER)
                        if shard_ops is not None:
                            t, fl = shard_ops[(name, param)]
                            flops[stage] += fl
                            end = last = tl.compute(stage, t, end)
                            if accumulating == ctx.microbatches - 1:
                                key = (name, layer, param)
                                self.sync.final[key] = self.sync.synced[key] = end
                    else:
                        scale = ctx.one_microbatch_scale(name, param)
                        if scale is not None and not ctx.scatter_each:
                            # one micro-batch: an expert's gradient averaged
                            # over its ep ranks' tokens before its sync
                            flops[stage] += scale[1]
                            made = tl.compute(stage, scale[0], made or 0.0)
                        end = self.synced_at((name, layer, param), stage, made)
                        if scale is not None and ctx.scatter_each:
                            # ... on its shard, after its reduce-scatter
                            flops[stage] += scale[1]
                            end = last = tl.compute(stage, scale[0], end)
                            self.sync.synced[(name, layer, param)] = end
                    if by_stage and len(by_stage.get(stage, ())) > count:
                        count = len(by_stage[stage])
                        flushed[(k, param)] = sum(by_stage[stage])
                    if flats is not None and not whole:
                        pc = ctx.param_cost(name, param)
                        flats.append(pc.nbytes, end)
                        if own is not None:         # from the flattening's end
                            own[1].append((pc.nbytes, (made or 0.0) + pc.flat[0], end))
            if entries is not None:
                blk = ctx.profile.blocks[name]
                ctx.block_got = note_peak(self.ctx, ctx.peak_key, k,
                                          blk.b_curve if only else blk.b_curve_later, gate,
                                          entries, "B", held=ctx.flats.get(stage),
                                          units=held_units(ctx, stage, units_before, gate),
                                          ran=(name, only, local, self._segment_plan(name, only)),
                                          own=own)
            if recording is not None:
                self._block_record(recording, stage, order, k, last, gathered)
        if in_buckets or flushed:
            self.notes.buckets(stage, c, in_buckets, self.part, flushed)
        if later:
            self.notes.later(stage, accumulating, c, later, self.part)
        left: Optional[List[Tuple[int, float]]] = None
        if last is not None and flats is not None:
            left = [(nbytes, end) for nbytes, end in flats.waiting() if end > last]
        self._leave_flats(stage, c, inside, left)
        self.last_notes = (inside, left)
        return last

    def _block_replay(self, stage: int, order, k: int, origin: float,
                      gathered: Dict[int, Dict[Optional[int], float]], last_mb: bool
                      ) -> Tuple[Optional[float], Optional[tuple]]:
        """Block ``k`` of ``order``, whose entries come after the compute
        end ``origin`` (the block before's last): (its last compute end if
        it was replayed from a record, else None; what :meth:`_block_record`
        needs to record it once emitted, or None). Here: never replayed nor
        recorded (see :class:`.replay.ReplayedBackward`)."""
        return None, None

    def _block_record(self, recording: tuple, stage: int, order, k: int, last: float,
                      gathered: Dict[int, Dict[Optional[int], float]]) -> None:
        """Record block ``k`` just emitted (see :meth:`_block_replay`)."""

    def _leave_flats(self, stage: int, c: int, inside: Dict[Tuple[int, int], int],
                     flats: Optional[List[Tuple[int, float]]]) -> None:
        """What a backward that flattens its gradients leaves: the most
        bytes of flat copies waiting at each gradient (``inside``) and the
        copies still waiting for their reduce-scatters when it ends
        (``flats``: bytes, end), noted for the memory walk and kept for the
        stage's next tasks."""
        ctx = self.ctx
        if inside:
            self.notes.inside(stage, c, inside, self.part)
        if flats:
            self.notes.flats(stage, "end", 0, c, flats)
            ctx.flats[stage] = ctx.flats.get(stage, []) + flats

    def _gather_groups(self, name: str, only: bool) -> List[Tuple[float, int]]:
        """ZeRO-3, a block's op-by-op backward: its all-gathers (which run
        back to back) as the fewest items its entries can wait for: (summed
        time, position of the group's last parameter) each, cut after each
        position an entry of :meth:`_segment_plan` waits up to."""
        ctx = self.ctx
        hit = ctx.memo.gather_groups.get((name, only))
        if hit is None:
            plan = gather_plan(self.ctx, "B", name)
            times = plan.items
            # (and before each unit's gather past the first: its copy-in
            # comes first, :func:`.gates.gather_pieces`)
            cuts = sorted({entry[7] for entry in self._segment_plan(name, only)
                           if entry[7] is not None and entry[7] >= 0}
                          | {g - 1 for g, copy_in in enumerate(plan.item_copy_ins)
                             if copy_in and g})
            hit, start = [], 0
            for upto in cuts + [len(times) - 1]:
                if upto >= start:
                    hit.append((sum(times[start:upto + 1]), upto))
                    start = upto + 1
            ctx.memo.gather_groups[(name, only)] = hit
        return hit
