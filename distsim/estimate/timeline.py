"""The estimator's step timeline: the items LowerSPMD would emit, in its
program order, on one rank per pipeline stage (see :mod:`.point`).

:class:`Builder` walks the pipeline schedule as
:meth:`~distsim.transforms.spmd.LowerSPMD._lower` does (the same schedules,
:func:`program_order`: merge_tasks' order, sends flushed by estimated end)
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

from collections import Counter
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Dict, List, Optional, Tuple

from ..ir.comm import CollectiveType
from ..ir.types import DType
from ..models.gpt import GPTConfig
from ..topology import Topology
from ..transforms.pipeline import (merge_tasks, partition_balanced, partition_layers,
                                  schedule_tasks)
from ..transforms.strategy import Strategy
from ..transforms.sync_policy import prefetch_window
from .costs import collectives, op_costs
from .engine import Timeline
from .replay import ReplayedBackward
from .gates import chain, emit_chain, gather_plan, gather_time
from .gathered import note_peak
from .notes import MemoryNotes
from .params import ParamLayout
from .profile import EMB, HEAD, LAYER, LayerProfile
from .state import Memo, ScatterTerms, Walk, shared_prefix
from .sync import StepSync

__all__ = ["Builder", "Case", "Memo", "ScatterTerms", "Walk", "program_order",
           "shared_prefix"]

MB = 1 << 20


@dataclass
class Case:
    """One configuration, resolved: the GPT config with its batch sizes,
    the strategy (dp filled in), micro-batches per step, the topology."""

    model: Dict[str, Any]
    config: GPTConfig
    strategy: Strategy
    microbatches: int
    topology: Topology
    topology_name: str
    collective_algo: str


# -- the timeline -------------------------------------------------------------------
@lru_cache(maxsize=256)
def program_order(schedule: str, pp: int, microbatches: int, chunks: int,
                  work: Tuple[Tuple[str, int, float], ...]
                  ) -> List[Tuple[int, Tuple[str, int, int], float, float]]:
    """:func:`~distsim.transforms.pipeline.merge_tasks` of the schedule's
    tasks, LowerSPMD's program
    order, with ``work`` (kind, chunk, cost) the cost of a task; the same
    for configurations that differ only in what happens after the backward
    (the ZeRO stage, buckets): kept (do not modify the list)."""
    cost = {(k, c): w for k, c, w in work}
    return merge_tasks(schedule_tasks(schedule, pp, microbatches, chunks), pp * chunks,
                       lambda task: cost.get((task[0], task[2]), 1.0))


class Builder(MemoryNotes, ReplayedBackward, ParamLayout):
    """Emits the items of one configuration in LowerSPMD's program order
    on a :class:`~.engine.Timeline`, which settles each as it
    comes: an item is its end time here, and ``ready`` (the latest end
    among an item's dependencies) is what the next one waits for."""

    #: whether :meth:`complete` notes the values a pipeline stage receives
    #: ahead of the tasks reading them (the shorter of two extrapolation
    #: walks need not: the longer has the same tasks, one micro-batch more)
    note_received = True

    def __init__(self, case: Case, profile: LayerProfile, memo: Optional["Memo"] = None
                 ) -> None:
        self.case = case
        self.profile = profile
        S = self.strategy = case.strategy
        self.dp, self.tp, self.pp = S.dp, S.tp, S.pp
        self.microbatches = case.microbatches
        self.chunks = S.pp * S.chunks
        if S.partition == "balanced":     # as LowerSPMD balances (by roofline time)
            costs = profile.partition_costs
            self.ranges = partition_balanced([costs.get(LAYER, 0.0)] * case.config.layers,
                                             self.chunks, first=costs.get(EMB, 0.0),
                                             last=costs.get(HEAD, 0.0))
        else:
            self.ranges = partition_layers(case.config.layers, self.chunks)
        self.chunk_of_layer = [c for c, (start, end) in enumerate(self.ranges)
                               for _ in range(start, end)]
        #: What a task's costs depend on in each chunk: whether it holds the
        #: embedding, the head, and how many layers (chunks alike cost alike).
        self.shapes = [(c == 0, c == self.chunks - 1, end - start)
                       for c, (start, end) in enumerate(self.ranges)]
        #: how many chunks have each shape
        self.shape_chunks = Counter(self.shapes)
        self.tl = Timeline(S.pp)
        self.colls = collectives(case.topology_name, case.collective_algo)
        self.costs = op_costs(case.topology_name)
        # every stage's data-parallel team sits on the hardware as stage 0's does
        self.dp_team = tuple(S.rank(d, 0, 0) for d in range(self.dp))
        self.zero = S.zero
        self.zero3 = self.zero == 3 and self.dp > 1
        #: ZeRO-3 by layer (``zero3_unit: layer``): a block's gathers, and
        #: with a reduce-scatter per micro-batch its gradients', as one
        self.by_layer = self.zero3 and S.zero3_unit == "layer"
        self.master = DType.parse(str(case.config.master_dtype))
        self.flops = [0.0] * S.pp
        # memos: what is the same for every task / layer of the step
        self.memo = Memo() if memo is None else memo
        self.sync = StepSync(self)
        #: the lowering's decisions (:class:`~distsim.transforms.sync_policy.SyncPolicy`):
        #: how a final gradient is synchronised, and whether ZeRO 2/3
        #: reduce-scatter every micro-batch's gradients as they are made
        self.route = self.sync.policy.route
        self.scatter_each = self.sync.policy.scatter_each
        #: per stage, the flat gradient copies (bytes, end of their
        #: reduce-scatter) that may outlive the backward that made them
        self.flats: Dict[int, List[Tuple[int, float]]] = {}
        #: ZeRO-3's backward past the first micro-batch, recorded relative to
        #: its start, per (chunk shape, last micro-batch or not)
        #: (:meth:`_accumulating_backward`); this walk's own (a replay is
        #: exact to rounding, not to the bit: two walks that share a start
        #: share its records, and no others, so that a forked walk is two
        #: walks to the bit)
        self.replays: Dict[tuple, tuple] = {}
        #: ZeRO-3 by layer: per stage, the units reduce-scattered and not
        #: yet settled (:meth:`settle_units`); when each unit gradient was
        #: made, until its unit is reduce-scattered; each unit's
        #: reduce-scatter end, in order (:meth:`scatter_unit`)
        self.unit_pending: Dict[int, list] = {}
        self.unit_made_at: Dict[tuple, float] = {}
        self.unit_ends: List[float] = []

    def close(self) -> None:
        """Drop the step sync, which refers back to this builder, and its
        policy, which refers back to it (its sink): without this every
        estimate's builders are reference cycles left to the cyclic
        collector (about a quarter of a sweep's time went to its passes).
        The builder is not used after."""
        self._drop_sync()

    def _drop_sync(self) -> None:
        if self.sync is not None:
            self.sync.policy = None
        self.sync = None

    # -- helpers ---------------------------------------------------------
    def stage_of(self, c: int) -> int:
        return c % self.pp

    def dp_time(self, kind: CollectiveType, nbytes: float) -> float:
        """A collective of every stage's data-parallel team (:attr:`dp_team`),
        memoised here: the shared cache's key would hash the whole team."""
        key = (kind, nbytes)
        hit = self.memo.dp_times.get(key)
        if hit is None:
            hit = self.memo.dp_times[key] = self.colls.time(kind, self.dp_team, nbytes)
        return hit

    def rank0(self, stage: int) -> int:
        return self.strategy.rank(0, stage, 0)

    def blocks_of(self, kind: str, c: int) -> List[Tuple[str, Optional[int]]]:
        """The blocks of chunk ``c`` in a forward / backward task's order
        (the same list every call: do not modify it)."""
        hit = self.memo.blocks.get((kind, c))
        if hit is not None:
            return hit
        start, end = self.ranges[c]
        out: List[Tuple[str, Optional[int]]] = []
        if c == 0:
            out.append((EMB, None))
        out.extend((LAYER, layer) for layer in range(start, end))
        if c == self.chunks - 1:
            out.append((HEAD, None))
        out = self.memo.blocks[(kind, c)] = out if kind == "F" else out[::-1]
        return out

    def small(self, stage: int, op_type: str, ins, outs, ready: float) -> float:
        t, f = self.costs.cost(op_type, ins, outs)
        self.flops[stage] += f
        return self.tl.compute(stage, t, ready)

    # -- tasks -------------------------------------------------------------
    def task_work(self, kind: str, c: int) -> float:
        blocks = self.profile.blocks
        total = 1.0
        for name, _ in self.blocks_of(kind, c):
            total += blocks[name].step_f_flops if kind == "F" else blocks[name].step_b_flops
        return total

    def _block_scatter(self, name: str, ops: Tuple[str, ...]) -> "ScatterTerms":
        """ZeRO 2/3 with a reduce-scatter per micro-batch: one block's terms,
        in the order they are added, per parameter: flattening its
        gradient; the accumulation ``ops`` of its micro-batch
        (:func:`~distsim.transforms.sync_policy.accumulation_ops`) on the
        shard (:meth:`_shard_ops`), and the same on the whole gradient,
        which the template does and the lowered program does not; FLOPs;
        its reduce-scatter."""
        memo = (name, ops)
        hit = self.memo.scatter_terms.get(memo)
        if hit is not None:
            return hit
        terms = ScatterTerms()
        for i in range(len(self.profile.params[name])):
            pc = self.sync.cost(name, i)
            n, d, shard = pc.numel, pc.dtype, pc.shard
            terms.flat.append(pc.flat[0])
            terms.flops.append(pc.flat[1])
            terms.rs.append(self.dp_time(CollectiveType.REDUCE_SCATTER, pc.nbytes))
            for op in ops:
                ins = [(n, d), (n, d)] if op == "add" else [(n, d)]
                full = self.costs.cost(op, ins, [(n, d)])
                part = self.costs.cost(op, [(shard, d)] * len(ins), [(shard, d)])
                terms.whole.append(full[0])
                terms.on_shard.append(part[0])
                terms.shard_flops.append(part[1])
                terms.flops.append(part[1] - full[1])
        hit = self.memo.scatter_terms[memo] = terms
        return hit

    def emit_task(self, stage: int, kind: str, mb: int, c: int, ready: float) -> float:
        flats = self.flats.get(stage)
        if flats:
            # the flat copies still waiting for their reduce-scatters when
            # the task peaks: a backward's start (its saved activations go
            # as it runs), a forward's end (they come)
            start = max(ready, self.tl.free[2 * stage])
            flats = self.flats[stage] = [x for x in flats if x[1] > start]
            if flats and kind == "B":
                self._note_blocks(stage, mb, c, start, flats)
            elif flats:
                end = self._emit_task(stage, kind, mb, c, ready)
                self._note_flats(stage, kind, mb, c, [x for x in flats if x[1] > end])
                return end
        return self._emit_task(stage, kind, mb, c, ready)

    def _emit_task(self, stage: int, kind: str, mb: int, c: int, ready: float) -> float:
        last_b = kind == "B" and mb == self.microbatches - 1
        if last_b and not self.scatter_each:
            return self._last_backward(stage, c, ready)
        if kind == "B" and mb == 0 and self.scatter_each:
            # ZeRO 2/3 reduce-scatter each gradient of the first micro-batch
            # as it is produced (flattened right after it): op by op, as the
            # last backward without a reduce-scatter per micro-batch
            return self._first_backward(stage, c, ready)
        if kind == "B" and self.scatter_each:
            # ZeRO 2/3 past the first micro-batch: the same, and each shard's
            # accumulation (an op of the backward, in its program order)
            # waits for its reduce-scatter, which waits on the comm stream
            # behind the reduce-scatters (and ZeRO-3's gathers) before it
            return self._accumulating_backward(stage, c, mb, ready)
        cls = 0 if kind == "F" or mb == 0 else (1 if last_b else 2)
        plan = self.memo.plans.get((kind, self.shapes[c], cls))
        if plan is None:
            plan = self.memo.plans[(kind, self.shapes[c], cls)] = self._task_plan(kind, c, mb)
        tl, flops = self.tl, self.flops
        if self.zero3:
            # A task whose start finds the stage's communication stream idle
            # depends only on that start (the later of its input and the
            # compute stream's end): the first such task of its plan is
            # recorded, the next ones replay it (:meth:`Timeline.replay`)
            s = 2 * stage
            origin = max(ready, tl.free[s], 0.0)
            key = ("task", kind, self.shapes[c], cls)
            clean = tl.free[s + 1] <= origin
            record = self.replays.get(key) if clean else None
            if record is not None:
                items, fls, last = record
                tl.replay(stage, items, origin)
                for fl in fls:
                    flops[stage] += fl
                end = origin + last
            else:
                mark = tl.mark(stage) if clean else None
                end = self._emit_gathered(stage, plan, ready, kind, c, mb)
                items = tl.since(stage, mark, origin) if mark is not None else None
                if items is not None:
                    self.replays[key] = (items, tuple(block[1] for block in plan), end - origin)
        else:
            fl, lead, pieces = plan
            flops[stage] += fl
            if lead:             # the recomputation the task starts with: no wait
                tl.compute_pieces(stage, lead, 0.0)
            end = tl.compute_pieces(stage, pieces, ready)
        if kind == "B":          # block by block: the input gradient before its tail
            self.out_at = end - self.out_tail(c, mb)
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
        (:func:`.gathered.note_peak`; ``kind``, ``c``, ``mb``: the task)."""
        tl, flops = self.tl, self.flops
        prev = max(ready, tl.free[2 * stage])
        issued: List[float] = []
        end = ready
        order = self.blocks_of(kind, c)
        # each all-gather's gate, start and end (:data:`.gathered.Issued`)
        entries: List[tuple] = []
        first = kind == "B" and mb == 0
        key = (kind, self.shapes[c], first)
        blocks = self.profile.blocks
        #: the block before's trailing wait (the plan's), not yet emitted
        wait: Optional[List[tuple]] = None
        for i, (gathers, fl, lead, pieces, reads, tail) in enumerate(plan):
            # by layer, the unit's shards concatenated first (compute), where
            # the gate is: after the compute before, not after a collective
            # that ends the block before (the embedding's forward), which
            # the gather queues behind on the communication stream
            starts = [tl.compute(stage, copy_in, prev) if copy_in else prev
                      for copy_in, _ in gathers]
            if wait is not None:
                tl.compute_pieces(stage, wait, prev)
            for start, (_, t) in zip(starts, gathers):
                j = len(issued)
                issued.append(tl.comm_on(stage, t, start))
                entries.append((j, order[j][0], start,
                                ((t, len(gather_plan(self, kind, order[j][0]).items) - 1,
                                  issued[j]),)))
            flops[stage] += fl
            # the block's compute starts after its copy-ins (by layer)
            t0 = max(prev, tl.free[2 * stage])
            if reads is not None:
                # its first piece waits for each gather where it reads it
                end = emit_chain(self, stage, reads, issued[i], ready if i == 0 else 0.0)
            elif i:
                end = issued[i]
            else:
                if lead:     # the first block's recomputation: no wait for the input
                    tl.compute_pieces(stage, lead, issued[0])
                end = max(issued[0], ready)
            end = prev = tl.compute_pieces(stage, pieces, end)
            wait = tail
            blk = blocks[order[i][0]]
            curve = blk.f_curve if kind == "F" else blk.b_curve if first else blk.b_curve_later
            note_peak(self, key, i, curve, t0, entries, kind, wait_all=reads is None)
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
        blocks = self.profile.blocks
        order = self.blocks_of(kind, c)
        head = blocks[order[0][0]]
        # a backward starting with recomputation: that part is an item of its
        # own, which does not wait for the task's input (the gradient from
        # the next stage), as in the simulator
        split = kind == "B" and head.b_lead > 0.0
        lead = [(head.b_lead, head.b_lead_busy, self.tp > 1 and head.b_lead_comm)] \
            if split else []
        if self.zero3:
            plan = []
            issued = 0
            for i, (name, _) in enumerate(order):
                upto = prefetch_window(i, len(order), self.strategy.prefetch).stop
                gathers = [(gather_plan(self, kind, order[j][0]).copy_in,
                            gather_time(self, kind, order[j][0])) for j in range(issued, upto)]
                issued = max(issued, upto)
                t, busy, fl = self._block_time(blocks[name], kind, mb)
                # by layer the unit's copy-out instead of its reshapes, at
                # its first read (:func:`.gates.split_change`)
                unit = gather_plan(self, kind, name) if self.by_layer else None
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
                                      post_shift=unit.copy_out_post if unit else 0.0)
                reads = None if cut else chain(self, kind, name, pieces[0])
                plan.append([gathers, fl, lead if cut else [],
                             pieces if reads is None else pieces[1:], reads, None])
            # a block that ends waiting for a collective before a block with
            # copy-ins: that wait goes after those copy-ins (:meth:`_emit_gathered`)
            for block, after in zip(plan, plan[1:]):
                if any(copy_in for copy_in, _ in after[0]):
                    block[3], block[5] = _trailing_wait(block[3])
            return [tuple(block) for block in plan]
        total = busy = fl = 0.0
        for name, _ in order:
            t, b, f = self._block_time(blocks[name], kind, mb)
            total += t
            busy += b
            fl += f
        if split:
            total, busy = total - head.b_lead, busy - head.b_lead_busy
        return fl, lead, self._pieces(kind, order, total, busy, rest=split)

    def _pieces(self, kind: str, order, total: float, busy: float, rest: bool = False,
                pre_shift: float = 0.0, post_shift: float = 0.0) -> List[tuple]:
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
        reshapes)."""
        blocks = self.profile.blocks
        first, last = blocks[order[0][0]], blocks[order[-1][0]]
        pre = first.f_pre if kind == "F" else (first.b_rest_pre if rest else first.b_pre)
        if pre is not None and pre_shift:
            pre = max(0.0, pre + pre_shift)
        post = last.f_post if kind == "F" else last.b_post
        if post is not None and post_shift:
            post = max(0.0, post + post_shift)
        holds = self.tp > 1
        if not holds or pre is None or post is None or pre + post > busy * (1.0 + 1e-9):
            return [(total, busy, holds)]
        return [(pre, None, False), (total - pre - post, max(0.0, busy - pre - post), True),
                (post, None, False)]

    def _block_time(self, blk, kind: str, mb: int) -> Tuple[float, float, float]:
        if kind == "F":
            return blk.f, blk.f_busy, blk.f_flops
        if mb == 0:
            return blk.b_first, blk.b_first_busy, blk.b_flops
        if mb == self.microbatches - 1:
            return blk.b_last, blk.b_last_busy, blk.b_flops
        return blk.b_mid, blk.b_mid_busy, blk.b_flops

    # -- the whole step ----------------------------------------------------------
    def sends(self, kind: str, c: int) -> Optional[Tuple[int, Tuple[int, int], List[float]]]:
        """Where a task of chunk ``c`` sends its outputs: ``(the chunk that
        reads them, (this stage, its stage), the time of each send)``, or
        None (the first / last chunk, or the reader on the same stage)."""
        if kind == "F" and c < self.chunks - 1:
            dst_c, sizes = c + 1, self.profile.forward_crossing
        elif kind == "B" and c > 0:
            dst_c, sizes = c - 1, self.profile.backward_crossing
        else:
            return None
        src, dst = self.stage_of(c), self.stage_of(dst_c)
        if dst == src:
            return None
        pair = (self.rank0(src), self.rank0(dst))
        return dst_c, (src, dst), [self.colls.time(CollectiveType.SEND_RECV, pair, nbytes)
                                   for nbytes in sizes]

    def walk(self) -> "Walk":
        """The start of this configuration's walk through LowerSPMD's
        program order (:meth:`advance`, :meth:`complete`)."""
        S, C, M = self.strategy, self.chunks, self.microbatches
        work = tuple((k, c, self.task_work(k, c)) for k in ("F", "B") for c in range(C))
        self._routes = {k: [self.sends(k, c) for c in range(C)] for k in ("F", "B")}
        return Walk(program_order(S.schedule, S.pp, M, S.chunks, work))

    def _send(self, w: "Walk", task: Tuple[str, int, int]) -> None:
        """The sends of a task's outputs (``task``: kind, micro-batch, chunk)
        to the next stage, gated on where they are made: a forward's end, a
        backward's input gradient (:attr:`Walk.outs`)."""
        kind, mb, c = task
        route = self._routes[kind][c]
        if route is None:
            return
        dst_c, (src, dst), times = route
        key = (kind, mb, dst_c)
        at = w.outs.get(task)
        w.recv[key] = self.tl.p2p_chain(src, dst, times, w.ends[task] or 0.0 if at is None else at,
                                        w.recv.get(key, 0.0))

    def out_tail(self, c: int, mb: int) -> float:
        """A block-level backward task of chunk ``c`` (micro-batch ``mb``:
        the first, or a middle one): its compute after it makes the input
        gradient it sends to the stage before (that of its last block, the
        chunk's first layer)."""
        blk = self.profile.blocks[self.blocks_of("B", c)[-1][0]]
        return blk.out_tail_first if mb == 0 else blk.out_tail_mid

    def advance(self, w: "Walk", stop: int) -> None:
        """Emit the tasks of the program order up to position ``stop``
        (sends flushed when the schedule's clock passes their task's end,
        as LowerSPMD flushes them)."""
        ends, outs, recv, pending, emit = w.ends, w.outs, w.recv, w.pending, self.emit_task
        order = w.order
        # most tasks (ZeRO 0/1 but each chunk's last backward) are their
        # plan's compute pieces: :meth:`_emit_task`'s last branch, inlined
        # (a 32-stage pipeline's timeline walks thousands)
        plain = not (self.zero3 or self.scatter_each)
        plans, shapes, flops, last_mb = self.memo.plans, self.shapes, self.flops, self.microbatches - 1
        pieces_on, p2p, routes = self.tl.compute_pieces, self.tl.p2p_chain, self._routes
        # a backward's compute after its input gradient, per chunk (first
        # micro-batch, a middle one)
        tails = [(self.out_tail(c, 0), self.out_tail(c, 1)) for c in range(self.chunks)]
        for i in range(w.pos, stop):
            stage, task, start, end = order[i]
            for sent in pending.due(start):
                # :meth:`_send`, inlined (a 32-stage pipeline sends thousands)
                route = routes[sent[0]][sent[2]]
                if route is not None:
                    dst_c, (src, dst), times = route
                    key = (sent[0], sent[1], dst_c)
                    at = outs.get(sent)
                    recv[key] = p2p(src, dst, times, ends[sent] or 0.0 if at is None else at,
                                    recv.get(key, 0.0))
            kind, mb, c = task
            ready = recv.get(task, 0.0)
            if kind == "B":
                f_end = ends[("F", mb, c)] or 0.0
                if f_end > ready:
                    ready = f_end
                plan = plans.get(("B", shapes[c], 0 if mb == 0 else 2)) \
                    if plain and mb != last_mb else None
            else:
                plan = plans.get(("F", shapes[c], 0)) if plain else None
            if plan is None:
                ends[task] = emit(stage, kind, mb, c, ready)
                if kind == "B":      # where it made its input gradient
                    outs[task], self.out_at = self.out_at, None
            else:
                fl, lead, pieces = plan
                flops[stage] += fl
                if lead:             # the recomputation the task starts with: no wait
                    pieces_on(stage, lead, 0.0)
                ends[task] = end_at = pieces_on(stage, pieces, ready)
                if kind == "B":
                    outs[task] = end_at - tails[c][mb != 0]
            pending.add(end, task)
        w.pos = stop

    def complete(self, w: "Walk") -> Timeline:
        """The rest of the walk, the last sends, the gradient sync and the
        optimizer: the whole step's timeline."""
        self.advance(w, len(w.order))
        for sent in w.pending.rest():
            self._send(w, sent)
        if self.pp > 1 and self.note_received:
            self._note_received(w)
        self.sync.finish()
        return self.tl

    def build(self) -> Timeline:
        return self.complete(self.walk())

    def resume(self, other: "Builder", w: "Walk", mine: "Walk") -> "Walk":
        """Continue ``mine`` (this builder's walk) from where ``other`` is
        in its walk ``w``: the state of ``other`` is copied (timeline,
        FLOPs, task ends, arrivals, pending sends). Exact when the two
        configurations emitted the same items up to there, which
        :func:`shared_prefix` finds; no gradient has been synchronised yet."""
        sync = other.sync
        if sync.final or sync.policy.deferred or sync.policy.pending or sync.unpack:
            raise ValueError("resume: the walk being copied has synchronised gradients")
        self.tl = other.tl.copy()
        self.flops = list(other.flops)
        self.replays = dict(other.replays)
        self.unit_pending = {s: list(v) for s, v in other.unit_pending.items()}
        self.unit_made_at = dict(other.unit_made_at)
        self.unit_ends = list(other.unit_ends)
        self._drop_sync()
        self.sync = StepSync(self)
        mine.pos = w.pos
        mine.ends, mine.recv, mine.pending = dict(w.ends), dict(w.recv), w.pending.copy()
        mine.outs = dict(w.outs)
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
