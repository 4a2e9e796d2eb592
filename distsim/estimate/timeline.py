"""The estimator's step timeline: the items LowerSPMD would emit, in its
program order, on one rank per pipeline stage (see :mod:`.point`).

:class:`Builder` walks the pipeline schedule as
:meth:`~distsim.transforms.spmd.LowerSPMD._lower` does (the same schedules,
:func:`program_order`: the schedule's tasks and sends)
and emits, per task, the per-layer times of a :class:`.profile.LayerProfile`
as items of a :class:`.engine.Timeline`, then the gradient sync,
tied-embedding all-reduce and optimizer as
:class:`~distsim.transforms.zero.GradientSync` emits them. Collectives are
timed by the simulator's analytical network, the small ops LowerSPMD adds by
the cost model (:mod:`.costs`). What is the same for every task or
layer (a chunk's summed block times, a block's gathers and reduce-scatters,
a parameter's update) is computed once per configuration.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from ..transforms.pipeline import Program
from ..transforms.pipeline import program_order as pipeline_program
from ..transforms.sync_policy import SyncPolicy, prefetch_window
from .blocks import LayerProfile
from .context import Case, StepContext
from .engine import Timeline
from .gates import (chain, emit_chain, emit_entries, entry_plan, entrywise, gather_pieces,
                    gather_plan)
from .gathered_walk import item_bytes, note_peak
from .notes import MemoryNotes
from .replay import ReplayedBackward
from .routes import gather_times, route as route_of
from .state import Memo, ScatterTerms, TaskRecord, Walk, shared_prefix
from .sync import StepSync
from .experts import bare_edges, sync_policy

__all__ = ["Builder", "Case", "Memo", "ScatterTerms", "Walk", "program_order",
           "shared_prefix"]


# -- the timeline -------------------------------------------------------------------
@lru_cache(maxsize=256)
def program_order(schedule: str, pp: int, microbatches: int, chunks: int,
                  work: Tuple[Tuple[str, int, float], ...]) -> Program:
    """:func:`~distsim.transforms.pipeline.program_order` of the schedule,
    LowerSPMD's program order of tasks and sends, with ``work`` (kind,
    chunk, cost) the cost of a task; the same for configurations that
    differ only in what happens after the backward (the ZeRO stage,
    buckets): kept (do not modify the lists)."""
    cost = {(k, c): w for k, c, w in work}
    return pipeline_program(schedule, pp, microbatches, chunks,
                            lambda task: cost.get((task[0], task[2]), 1.0))


class Builder:
    """Emits the items of one configuration in LowerSPMD's program order
    on a :class:`~.engine.Timeline`, which settles each as it
    comes: an item is its end time here, and ``ready`` (the latest end
    among an item's dependencies) is what the next one waits for. Its
    parts share the walk's :class:`~.context.StepContext` (:attr:`ctx`):
    the memory notes, the gradient sync (the timeline sink of the
    lowering's :class:`~distsim.transforms.sync_policy.SyncPolicy`) and the
    op-by-op backward tasks with their replays."""

    #: whether :meth:`complete` notes the values a pipeline stage receives
    #: ahead of the tasks reading them (the shorter of two extrapolation
    #: walks need not: the longer has the same tasks, one micro-batch more)
    note_received = True

    def __init__(self, case: Case, profile: LayerProfile, memo: Optional[Memo] = None
                 ) -> None:
        self.ctx = StepContext(case, profile, memo)
        self.notes = MemoryNotes(self.ctx)
        #: per stage, the last task emitted (kind, chunk)
        self._last: Dict[int, Tuple[str, int]] = {}
        self._start_sync()

    def _start_sync(self) -> None:
        """A fresh gradient sync (and the backward tasks that drive it) on
        the context's timeline."""
        ctx = self.ctx
        self.sync = StepSync(ctx)
        self.policy: SyncPolicy = sync_policy(ctx, self.sync)  # type: ignore[assignment]
        self.backward = ReplayedBackward(ctx, self.sync, self.policy, self.notes)
        #: a split backward's (ZB-H1) weight-gradient tasks, op by op where
        #: they make final gradients (the last micro-batch's; with ZeRO 2/3
        #: reduce-scattering each micro-batch, every micro-batch's)
        self.weights = ReplayedBackward(ctx, self.sync, self.policy, self.notes)
        self.weights.part = "W"

    def emit_task(self, stage: int, kind: str, mb: int, c: int, ready: float) -> float:
        ctx = self.ctx
        if ctx.by_layer and kind in ctx.gathering:
            self._lead_copy_ins(stage, kind, mb, c, ready)
        flats = ctx.flats.get(stage)
        if flats:
            # the flat copies still waiting for their reduce-scatters when
            # the task peaks: a backward's start (its saved activations go
            # as it runs), each forward block's peak (they come)
            start = max(ready, ctx.tl.free[2 * stage])
            flats = ctx.flats[stage] = [x for x in flats if x[1] > start]
            if flats and kind != "F":
                self.notes.blocks(stage, mb, c, start, flats, kind)
            elif flats:
                end = self._emit_task(stage, kind, mb, c, ready)
                self.notes.forward(stage, mb, c, end, flats)
                return end
        return self._emit_task(stage, kind, mb, c, ready)

    def _lead_copy_ins(self, stage: int, kind: str, mb: int, c: int, ready: float) -> None:
        """ZeRO-3 by layer: the copy-ins a task makes before its compute,
        noted for the memory estimate with what the stage still holds then
        (:meth:`.notes.MemoryNotes.copy_in`). Its first unit of shards is
        concatenated where the stage's compute so far ends: LowerSPMD
        gates the gather after it on the task's input, not the
        concatenation (emitted here; the emitters issue the first block's
        own gathers without it). The units it prefetches are concatenated
        after that gate (:meth:`_emit_gathered`). The stage's last result,
        the gates' token, is live until the last of those gates."""
        ctx = self.ctx
        order = ctx.blocks_of(kind, c)
        first = order[0][0]
        copy_in = gather_pieces(ctx, kind, first)[0][0]      # (the first unit's)
        token = self._gate_token(stage)
        held = 0
        if copy_in:
            held = item_bytes(ctx, kind, first)[0][1]
            self.notes.copy_in(stage, kind, mb, c, held + token,
                               max(ctx.tl.free[2 * stage], 0.0))
            ctx.tl.compute(stage, copy_in, 0.0)
        # past the first gate (each gather's gated shard, or concatenated
        # unit, from there to its gather's end), the most at a prefetched
        # unit's copy-in, while the token is still live
        gates, most = held, 0
        for j in prefetch_window(0, len(order), ctx.strategy.prefetch):
            name = order[j][0]
            unit = gather_plan(ctx, kind, name).copy_in > 0.0
            for g, (_, nbytes, _) in enumerate(item_bytes(ctx, kind, name)):
                if j or g or not unit:     # (the first unit's: ``held``)
                    gates += nbytes
                    if unit and g == 0:
                        most = gates
        if most:
            self.notes.copy_in(stage, kind, mb, c, most + token,
                               max(ready, ctx.tl.free[2 * stage], 0.0))
        self._last[stage] = (kind, c)

    def _gate_token(self, stage: int) -> int:
        """ZeRO-3 by layer: the bytes of the stage's last result that gates
        the next task's gathers, live until the gate (after that task's
        first copy-in): a backward's last gradient
        (:attr:`.profile.Block.b_held`), or 0."""
        last = self._last.get(stage)
        if last is None or last[0] != "B":
            return 0
        name = self.ctx.blocks_of("B", last[1])[-1][0]
        i = self.ctx.profile.blocks[name].b_held
        if i is None:
            return 0
        p = self.ctx.profile.params[name][i]
        return p.numel * p.dtype.itemsize

    def _emit_task(self, stage: int, kind: str, mb: int, c: int, ready: float) -> float:
        ctx = self.ctx
        if kind == "W" and mb == ctx.microbatches - 1 and not ctx.scatter_each:
            # a split backward's last weight gradients: op by op, each
            # gradient's sync emitted where it becomes final
            return self.weights.emit_last_backward(stage, c, ctx.blocks_of("W", c), ready)
        last_b = kind == "B" and mb == ctx.microbatches - 1
        if last_b and not ctx.scatter_each:
            return self.backward.last_backward(stage, c, ready)
        # (a split backward's B and W tasks each make some of the gradients)
        making = self.weights if kind == "W" else self.backward
        if kind != "F" and mb == 0 and ctx.scatter_each:
            # ZeRO 2/3 reduce-scatter each gradient of the first micro-batch
            # as it is produced (flattened right after it): op by op, as the
            # last backward without a reduce-scatter per micro-batch
            return making.first_backward(stage, c, ready)
        if kind != "F" and ctx.scatter_each:
            # ZeRO 2/3 past the first micro-batch: the same, and each shard's
            # accumulation (an op of the backward, in its program order)
            # waits for its reduce-scatter, which waits on the comm stream
            # behind the reduce-scatters (and ZeRO-3's gathers) before it
            return making.accumulating_backward(stage, c, mb, ready)
        cls = 0 if kind == "F" or mb == 0 else (1 if last_b else 2)
        plan = ctx.memo.plans.get((kind, ctx.shapes[c], cls))
        if plan is None:
            plan = ctx.memo.plans[(kind, ctx.shapes[c], cls)] = self._task_plan(kind, c, mb)
        tl, flops = ctx.tl, ctx.flops
        if kind in ctx.gathering:
            # A task whose start finds the stage's communication streams idle
            # depends only on that start (the later of its input and the
            # compute stream's end): the first such task of its plan is
            # recorded, the next ones replay it (:meth:`Timeline.replay`)
            s = 2 * stage
            origin = max(ready, tl.free[s], 0.0)
            key = ("task", kind, ctx.shapes[c], cls)
            clean = tl.idle_by(stage, origin)
            record = ctx.replays.get(key) if clean else None
            if record is not None:
                tl.replay(stage, record.items, origin)
                for fl in record.flops:
                    flops[stage] += fl
                end = origin + record.last
            else:
                mark = tl.mark(stage) if clean else None
                end = self._emit_gathered(stage, plan, ready, kind, c, mb)
                items = tl.since(stage, mark, origin, with_runs=True) \
                    if mark is not None else None
                if items is not None:
                    ctx.replays[key] = TaskRecord(items, tuple(block[1] for block in plan),
                                                       end - origin)
        else:
            fl, lead, pieces, spans = plan
            flops[stage] += fl
            if kind == "B":      # its early gathers, behind the collectives before
                tl.free[2 * stage + 1] += ctx.lead_in(c, mb)[1]
            if lead:             # the recomputation the task starts with: no wait
                tl.compute_pieces(stage, lead, 0.0)
            end = tl.compute_pieces(stage, pieces, ready)
            if spans is not None:
                placed = ctx.tp_at.setdefault(stage, {})
                hit = placed.get(id(spans))
                if hit is None:
                    hit = placed[id(spans)] = (spans, [])
                hit[1].append(end)
            if kind != "F":      # its last collectives, outlasting its compute
                tl.free[2 * stage + 1] = max(tl.free[2 * stage + 1],
                                             end + ctx.comm_tail(c, mb, kind))
        if kind == "B":          # block by block: the input gradient before its tail
            ctx.out_at = end - ctx.out_tail(c, mb)
        return end

    def _emit_gathered(self, stage: int, plan: list, ready: float, kind: str = "F", c: int = 0,
                       mb: int = 0) -> float:
        """A ZeRO-3 task of :meth:`_task_plan`'s ``plan`` from ``ready``: per
        block, its compute waits for its gathers; entering a block issues
        the gathers of it and of the next ``prefetch`` blocks not issued
        yet, gated on the compute before (the first block's: on the
        stage's compute so far too, the previous task's). Returns its end.
        By parameter, each block's memory with its gathered parameters
        placed in time is noted for the memory estimate
        (:func:`.gathered_walk.note_peak`; ``kind``, ``c``, ``mb``: the task)."""
        ctx = self.ctx
        tl, flops = ctx.tl, ctx.flops
        prev = max(ready, tl.free[2 * stage])
        issued: List[float] = []
        end = ready
        order = ctx.blocks_of(kind, c)
        # each all-gather's gate, start and end (:data:`.gathered_walk.Issued`)
        entries: List[tuple] = []
        first = kind == "B" and mb == 0
        key = (kind, ctx.shapes[c], first)
        blocks = ctx.profile.blocks
        #: the block before's trailing wait (the plan's), not yet emitted
        wait: Optional[List[tuple]] = None
        #: per group with tensor parallelism: each block entry by entry
        entries_of = entrywise(ctx)
        for i, (gathers, fl, lead, pieces, reads, tail) in enumerate(plan):
            # by layer, the unit's shards concatenated first (compute), where
            # the gate is: after the compute before, not after a collective
            # that ends the block before (the embedding's forward), which
            # the gather queues behind on the communication stream
            # (the task's first, the first block's own: :meth:`emit_task`)
            # Each gather right after its copy-in, as LowerSPMD emits them
            # (under stream order a gather waits for the compute issued
            # before it: its own copy-in, not the next one's), but behind
            # the block before's trailing collective, whose wait comes
            # after the copy-ins
            # (a block's runs: :func:`.gates.gather_pieces`, each gather
            # after its own copy-in)
            starts: List[Optional[List[float]]] = [None] * len(gathers)
            if wait is not None:
                starts = [[tl.compute(stage, copy_in, prev) if copy_in and (i or j or k) else prev
                           for k, (copy_in, _, _) in enumerate(runs)]
                          for j, runs in enumerate(gathers)]
                tl.compute_pieces(stage, wait, prev)
            for g, runs in enumerate(gathers):
                given = starts[g]
                groups = []
                begin = prev
                for k, (copy_in, t, last) in enumerate(runs):
                    # (under stream order a gather waits for the copy-ins
                    # issued before it, not for those after it)
                    if given is not None:
                        start = given[k]
                    elif copy_in and (i or g or k):
                        start = tl.compute(stage, copy_in, prev)
                    else:
                        start = prev
                    if k == 0:
                        begin = start
                    groups.append((t, last, tl.comm_on(stage, t, start)))
                j = len(issued)
                issued.append(groups[-1][2])
                entries.append((j, order[j][0], begin, tuple(groups)))
            flops[stage] += fl
            # the block's compute starts after its copy-ins (by layer)
            t0 = max(prev, tl.free[2 * stage])
            if entries_of:
                end = prev = emit_entries(ctx, stage, entry_plan(ctx, kind, order[i][0], mb),
                                          issued[i], ready if i == 0 else 0.0, t0)
            elif reads is not None:
                # its first piece waits for each gather where it reads it
                end = emit_chain(self.ctx, stage, reads, issued[i], ready if i == 0 else 0.0)
            elif i:
                end = issued[i]
            else:
                if lead:     # the first block's recomputation: no wait for the input
                    tl.compute_pieces(stage, lead, issued[0])
                end = max(issued[0], ready)
            if not entries_of:
                end = prev = tl.compute_pieces(stage, pieces, end)
                wait = tail
            blk = blocks[order[i][0]]
            curve = blk.f_curve if kind == "F" else blk.b_curve if first else blk.b_curve_later
            note_peak(self.ctx, key, i, curve, t0, entries, kind,
                      wait_all=reads is None and not entries_of)
        return end

    def _task_plan(self, kind: str, c: int, mb: int) -> Any:
        """How a task of chunk ``c`` (of ``mb``'s class: the first, a middle,
        the last micro-batch) is emitted, the same for every such task of a
        chunk of the same shape:
        ``(FLOPs, pieces)``, or with ZeRO-3 one ``(gathers issued, FLOPs,
        leading recomputation, pieces, the forward's first piece cut at its
        reads of gathered parameters (:func:`.gates.chain`) or
        None, the block's trailing wait emitted after the next block's
        copy-ins or None)`` per block; a piece is a compute item ``(time, busy time,
        holds the communication stream)``."""
        ctx = self.ctx
        blocks = ctx.part(kind)
        order = ctx.blocks_of(kind, c)
        head = blocks[order[0][0]]
        # a backward starting with recomputation: that part is an item of its
        # own, which does not wait for the task's input (the gradient from
        # the next stage), as in the simulator
        split = kind == "B" and head.b_lead > 0.0
        lead = [(head.b_lead, head.b_lead_busy, ctx.block_comm and head.b_lead_comm)] \
            if split else []
        if lead and lead[0][2] and 0.0 < head.b_lead_pre < head.b_lead:
            # its compute before its first collective waits for no collective
            # before it on the communication stream (a gather of what the task
            # received split: ``p2p_scatter``), as in the simulator
            pre = head.b_lead_pre
            lead = [(pre, None, False), (head.b_lead - pre, head.b_lead_busy - pre, True)]
        if kind in ctx.gathering:
            plan = []
            issued = 0
            for i, (name, _) in enumerate(order):
                upto = prefetch_window(i, len(order), ctx.strategy.prefetch).stop
                gathers = [gather_pieces(self.ctx, kind, order[j][0])
                           for j in range(issued, upto)]
                issued = max(issued, upto)
                t, busy, fl = ctx.block_time(blocks[name], kind, mb)
                # by layer the unit's copy-out instead of its reshapes, at
                # its first read (:func:`.gates.split_change`)
                unit = gather_plan(self.ctx, kind, name) if ctx.by_layer else None
                copy_out = unit.copy_out if unit else 0.0
                cut = split and i == 0
                if cut:
                    t, busy = t - head.b_lead, busy - head.b_lead_busy
                # (the forward's first piece is cut at its reads:
                # :func:`.gates.chain`)
                pieces = self._pieces(kind, order[i:i + 1],
                                      t + (unit.copy_out_time if unit else 0.0),
                                      busy + copy_out, rest=cut,
                                      pre_shift=unit.copy_out_pre(kind) if unit else 0.0,
                                      post_shift=unit.copy_out_post if unit else 0.0, mb=mb)
                reads = None if cut else chain(self.ctx, kind, name, pieces[0])
                plan.append([gathers, fl, lead if cut else [],
                             pieces if reads is None else pieces[1:], reads, None])
            # a block that ends waiting for a collective before a block with
            # copy-ins: that wait goes after those copy-ins (:meth:`_emit_gathered`)
            for block, after in zip(plan, plan[1:]):
                if any(copy_in for runs in after[0] for copy_in, _, _ in runs):
                    block[3], block[5] = _trailing_wait(block[3])
            return [tuple(block) for block in plan]
        total = busy = fl = 0.0
        for name, _ in order:
            t, b, f = ctx.block_time(blocks[name], kind, mb)
            total += t
            busy += b
            fl += f
        if split:
            total, busy = total - head.b_lead, busy - head.b_lead_busy
        wait, early = ctx.lead_in(c, mb) if kind == "B" else (0.0, 0.0)
        total -= wait
        pieces = self._pieces(kind, order, total, busy, rest=split, mb=mb)
        spans = None if split or early else self._tp_spans(kind, order, mb)
        return fl, lead, pieces, spans

    def _tp_spans(self, kind: str, order, mb: int) -> Optional[np.ndarray]:
        """Where a task's tensor-parallel collectives fall, from its end
        (negative), as on the template: each block's from the block's
        start (:attr:`.blocks.Block.f_tp_spans`), the blocks back to back
        and the last ending with the task (a backward's first block takes
        its template wait off its start, not off its collectives). Only
        with a pipeline, whose transfers they may overlap
        (``communication_s``: :func:`.time_split.figures`); None: none."""
        ctx = self.ctx
        if ctx.pp == 1:
            return None
        blocks = ctx.part(kind)
        cls = 0 if mb == 0 else (2 if mb == ctx.microbatches - 1 else 1)
        out = []
        end = 0.0
        for name, _ in reversed(order):
            blk = blocks[name]
            start = end - ctx.block_time(blk, kind, mb)[0]
            out.extend((start + a, start + b)
                       for a, b in (blk.f_tp_spans if kind == "F" else blk.b_tp_spans[cls]))
            end = start
        return np.array(out) if out else None

    def _pieces(self, kind: str, order, total: float, busy: float, rest: bool = False,
                pre_shift: float = 0.0, post_shift: float = 0.0,
                mb: Optional[int] = None) -> List[tuple]:
        """The compute items of a task over the blocks ``order``: one, or with
        tensor-parallel collectives, which hold the communication stream from
        the first to the last of them, the compute before and after alone
        (``rest``: a backward less its leading recomputation). A block with
        no compute between its collectives (the embedding's forward: one
        reduce-scatter) is split too: its compute before the collective runs
        while the communication stream is still busy (ZeRO-3's prefetched
        gathers), as in the simulator. ``pre_shift`` / ``post_shift``: a
        change of the compute before the first collective / after the last
        (ZeRO-3 by layer: the unit's copy-out in place of the template's
        reshapes). ``mb`` (the task's micro-batch): where blocks with no
        collectives of their own lead or end the task (expert parallelism
        without tensor parallelism: the embedding, the head, dense layers
        beside MoE layers with all-to-alls), their compute runs alone too."""
        ctx = self.ctx
        blocks = ctx.part(kind)
        first, last = blocks[order[0][0]], blocks[order[-1][0]]
        pre = first.f_pre if kind == "F" else (first.b_rest_pre if rest else first.b_pre)
        post = last.f_post if kind == "F" else last.b_post
        holds = ctx.block_comm
        if holds and mb is not None and (pre is None or post is None):
            pre, post = bare_edges(ctx, kind, order, mb, rest, pre, post)
            holds = pre is not None          # else no block of the task has any
        if pre is not None and pre_shift:
            pre = max(0.0, pre + pre_shift)
        if post is not None and post_shift:
            post = max(0.0, post + post_shift)
        if not holds or pre is None or post is None or pre + post > busy * (1.0 + 1e-9):
            return [(total, busy, holds)]
        return [(pre, None, False), (total - pre - post, max(0.0, busy - pre - post), True),
                (post, None, False)]

    # -- the whole step ----------------------------------------------------------
    def walk(self) -> "Walk":
        """The start of this configuration's walk through LowerSPMD's
        program order (:meth:`advance`, :meth:`complete`)."""
        ctx = self.ctx
        S, C, M = ctx.strategy, ctx.chunks, ctx.microbatches
        kinds = ("F", "B", "W") if ctx.profile.weight else ("F", "B")
        work = tuple((k, c, ctx.task_work(k, c)) for k in kinds for c in range(C))
        # where each kind of task of each chunk sends (:func:`.routes.route`)
        self._routes = {k: [route_of(ctx, k, c) for c in range(C)] for k in kinds}
        self._gathers = gather_times(self._routes, C)
        w = Walk(*program_order(S.schedule, S.pp, M, S.chunks, work))
        if ctx.tl.links is not None:        # its transfers' arrivals, moved when shared
            ctx.tl.links.recv = w.recv
        return w

    def _send_all(self, w: "Walk", group: List[Tuple[str, int, int]]) -> None:
        """The sends of the tasks the schedule places here (``group``: kind,
        micro-batch, chunk of each), gated on where their values are made:
        a forward's end, a backward's input gradient (:attr:`Walk.outs`);
        the pieces of split values sliced first, then every transfer, as
        LowerSPMD emits them."""
        routes, tl = self._routes, self.ctx.tl
        made = []
        for sent in group:
            route = routes[sent[0]][sent[2]]
            if route is None:
                continue
            at = w.outs.get(sent)
            t = w.ends[sent] or 0.0 if at is None else at
            if route.slice_s:       # the pieces sliced on the sending stage
                t = tl.compute(route.stages[0], route.slice_s, t)
            made.append((sent, route, t))
        for sent, (dst_c, (src, dst), times, sizes, _, _), t in made:
            key = (sent[0], sent[1], dst_c)
            w.recv[key] = tl.p2p_chain(src, dst, times, t, w.recv.get(key, 0.0), sizes, key)

    def advance(self, w: "Walk", stop: int) -> None:
        """Emit the tasks of the program order up to position ``stop``,
        each task's sends where the schedule places them (as LowerSPMD
        emits them)."""
        ctx = self.ctx
        ends, outs, recv, emit = w.ends, w.outs, w.recv, self.emit_task
        order, sends = w.order, w.sends
        # most tasks (ZeRO 0/1 but each chunk's last backward) are their
        # plan's compute pieces: :meth:`_emit_task`'s last branch, inlined
        # (a 32-stage pipeline's timeline walks thousands)
        plain = not (ctx.zero3 or ctx.scatter_each)
        plans, shapes, flops, last_mb = ctx.memo.plans, ctx.shapes, ctx.flops, ctx.microbatches - 1
        pieces_on, p2p, routes = ctx.tl.compute_pieces, ctx.tl.p2p_chain, self._routes
        # a backward's compute after its input gradient, per chunk (first
        # micro-batch, a middle one)
        tails = [(ctx.out_tail(c, 0), ctx.out_tail(c, 1)) for c in range(ctx.chunks)]
        # ... how long its last collectives outlast its compute, and the
        # time of its early gathers (:meth:`StepContext.lead_in`)
        comm_tails = [(ctx.comm_tail(c, 0), ctx.comm_tail(c, 1)) for c in range(ctx.chunks)]
        early = [(ctx.lead_in(c, 0)[1], ctx.lead_in(c, 1)[1]) for c in range(ctx.chunks)]
        free = ctx.tl.free
        tp_at = ctx.tp_at
        # the plans' keys, per chunk: a forward's, a first and a middle
        # backward's (made once here, not per task)
        f_keys = [("F", shape, 0) for shape in shapes]
        b_keys = [(("B", shape, 0), ("B", shape, 2)) for shape in shapes]
        gathers = self._gathers
        for i in range(w.pos, stop):
            stage, task, _, _ = order[i]
            if gathers is not None:
                self._send_all(w, sends[i])
            else:
                for sent in sends[i]:
                    # :meth:`_send_all`, inlined (a 32-stage pipeline sends thousands)
                    route = routes[sent[0]][sent[2]]
                    if route is not None:
                        dst_c, (src, dst), times, sizes, _, _ = route
                        key = (sent[0], sent[1], dst_c)
                        at = outs.get(sent)
                        recv[key] = p2p(src, dst, times, ends[sent] or 0.0 if at is None else at,
                                        recv.get(key, 0.0), sizes, key)
            kind, mb, c = task
            ready = recv.get(task, 0.0)
            if gathers is not None and gathers[kind][c] and task in recv:
                # what it received split, gathered as it starts
                ready = ctx.tl.comm_on(stage, gathers[kind][c], ready, tp=True)
            if kind == "W":          # after its own input-gradient task
                ready = ends[("B", mb, c)] or 0.0
                plan = None
            elif kind == "B":
                f_end = ends[("F", mb, c)] or 0.0
                if f_end > ready:
                    ready = f_end
                plan = plans.get(b_keys[c][mb != 0]) if plain and mb != last_mb else None
            else:
                plan = plans.get(f_keys[c]) if plain else None
            if plan is None:
                ends[task] = emit(stage, kind, mb, c, ready)
                if kind == "B":      # where it made its input gradient
                    outs[task], ctx.out_at = ctx.out_at, None
            else:
                fl, lead, pieces, spans = plan
                flops[stage] += fl
                if kind == "B":      # its early gathers, behind the collectives before
                    free[2 * stage + 1] += early[c][mb != 0]
                if lead:             # the recomputation the task starts with: no wait
                    pieces_on(stage, lead, 0.0)
                ends[task] = end_at = pieces_on(stage, pieces, ready)
                if spans is not None:
                    placed = tp_at.get(stage)
                    if placed is None:
                        placed = tp_at[stage] = {}
                    hit = placed.get(id(spans))
                    if hit is None:
                        hit = placed[id(spans)] = (spans, [])
                    hit[1].append(end_at)
                if kind == "B":
                    outs[task] = end_at - tails[c][mb != 0]
                    held = end_at + comm_tails[c][mb != 0]
                    if held > free[2 * stage + 1]:
                        free[2 * stage + 1] = held
        w.pos = stop

    def complete(self, w: "Walk") -> Timeline:
        """The rest of the walk, the last sends, the gradient sync and the
        optimizer: the whole step's timeline."""
        self.advance(w, len(w.order))
        self._send_all(w, w.sends[-1])
        ctx = self.ctx
        if ctx.pp > 1 and self.note_received:
            self.notes.received(w, self._routes)
        # the end of the step, as the lowering's policy orders it
        self.policy.finish(ctx.pp, ctx.all_params(), self.sync.tied_pairs())
        return ctx.tl

    def build(self) -> Timeline:
        return self.complete(self.walk())

    def resume(self, other: "Builder", w: "Walk", mine: "Walk") -> "Walk":
        """Continue ``mine`` (this builder's walk) from where ``other`` is
        in its walk ``w``: the state of ``other`` is copied (timeline,
        FLOPs, task ends, arrivals, pending sends). Exact when the two
        configurations emitted the same items up to there, which
        :func:`shared_prefix` finds; no gradient has been synchronised yet."""
        if other.sync.final or other.policy.deferred or other.policy.pending \
                or other.sync.unpack:
            raise ValueError("resume: the walk being copied has synchronised gradients")
        self.ctx.resume(other.ctx)
        self._last = dict(other._last)
        self._start_sync()
        self.policy.units_made_from(other.policy)
        mine.pos = w.pos
        mine.ends, mine.recv = dict(w.ends), dict(w.recv)
        mine.outs = dict(w.outs)
        if self.ctx.tl.links is not None:
            self.ctx.tl.links.recv = mine.recv
        return mine


def _trailing_wait(pieces: List[tuple]) -> Tuple[List[tuple], Optional[List[tuple]]]:
    """A block's compute pieces split before a trailing wait for a
    tensor-parallel collective (a piece holding the communication stream
    with nothing busy in it, and nothing computed after it): (the pieces
    before, the wait), or (the pieces, None)."""
    k = len(pieces)
    while k and pieces[k - 1][0] == 0.0:
        k -= 1
    if k and pieces[k - 1][2] and pieces[k - 1][1] == 0.0:
        return pieces[:k - 1], pieces[k - 1:]
    return pieces, None
