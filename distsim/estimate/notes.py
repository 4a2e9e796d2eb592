"""What the estimator's walk (:class:`~.timeline.Builder`) notes for
the memory estimate as it goes (kept in its
:class:`~.state.Memo`, read by :func:`.memory.estimate_memory`):
the flat gradient copies of ZeRO 2/3 still waiting for their
reduce-scatters when later tasks run or inside the backward that made them,
and the flat buckets of ZeRO 0/1 (``bucket_mb``) flushed during a backward,
held until they are unpacked after the backward pass.
"""
from __future__ import annotations

from bisect import bisect_right
from itertools import accumulate
from typing import Dict, List, Optional, Tuple

from .context import StepContext
from .state import Walk


class MemoryNotes:
    """The memory notes of one walk, kept in its context's memo (the most
    over the walks of a configuration)."""

    def __init__(self, ctx: StepContext) -> None:
        self.ctx = ctx
        self.memo = ctx.memo

    def blocks(self, stage: int, mb: int, c: int, start: float,
                     flats: List[Tuple[int, float]], kind: str = "B") -> None:
        """The flat copies still waiting as each block of a backward task
        (``kind``: "B", or a split backward's "W") starting at ``start``
        peaks (the blocks' times summed up to its start, and its
        :attr:`~.blocks.Block.b_peak_s` or ``b0_peak_s`` after it, as the
        memory estimate takes its ``b_excess`` or ``b0_excess``: a copy
        whose reduce-scatter ends during the first block is not held through
        the last, nor through the head's float32 loss before its peak), kept
        per block position as :attr:`Memo.flat_pending` keeps a scalar."""
        key = (stage, kind, mb, c)
        held = self.memo.flat_pending.setdefault(key, {})
        blocks = self.ctx.part(kind)
        bare = self.ctx.scatter_each or mb == 0 or self.ctx.microbatches == 1
        t = start
        for k, (name, _) in enumerate(self.ctx.blocks_of(kind, c)):
            blk = blocks[name]
            time = self.ctx.block_time(blk, "B", mb)[0]
            at = t + min(blk.b0_peak_s if bare else blk.b_peak_s, time)
            pending = sum(nbytes for nbytes, end in flats if end > at)
            if not pending:
                break
            if pending > held.get(k, 0):
                held[k] = pending
            t += time

    def later(self, stage: int, mb: int, c: int, later: Dict[Tuple[int, int], int],
              part: str = "B") -> None:
        """A backward (``part``: "B", or a split backward's "W") past the
        first (micro-batch ``mb``): per gradient, the bytes of the flat
        copies earlier tasks left waiting that are still waiting when it is
        made (:attr:`Memo.flat_later`, the most over the walks)."""
        held = self.memo.flat_later.setdefault((stage, mb, c, part), {})
        for k, nbytes in later.items():
            if nbytes > held.get(k, 0):
                held[k] = nbytes

    def received(self, w: Walk, sends: Dict[str, List[Optional[tuple]]]) -> None:
        """A pipeline's received values, for the memory estimate: each lives
        from its transfer's start, while the receiving stage may still run
        earlier tasks (1F1B's next input arrives during a backward), until
        the task reading it starts (a forward's input: through that task,
        after which its chunk keeps it; a backward's gradient: the
        template's backward holds it); and on its sender, a value sent
        only after the sender's next tasks (the interleaved schedule's
        forward output goes with the backward after it) lives through
        those that end before its transfer starts. Per stage and class of task (kind,
        chunk, first backward or not) the most such bytes while a task
        runs (:attr:`Memo.recv_ahead`, the most over the walks); ``sends``:
        per task kind and chunk, where it sends (:class:`.routes.Route`)."""
        prof = self.ctx.profile
        sizes = {"F": sum(prof.forward_crossing), "B": sum(prof.backward_crossing)}
        # per sending chunk and kind: the receiving stage, the transfer's
        # time, the bytes, the bytes on the wire (under ``p2p_scatter`` the
        # pieces held until the reader gathers them as it starts)
        routes = {}
        for kind in ("F", "B"):
            for c, route in enumerate(sends[kind]):
                if route is not None and sizes[kind]:
                    routes[(kind, route.reader)] = (route.stages[1], sum(route.times),
                                                    sizes[kind], sum(route.sizes))
        if not routes:
            return
        # per receiving stage: its tasks in program order, each one's end
        # and place, and where the bytes live change (each value: from the
        # first task ending after its transfer starts, to the last starting
        # before its reader does; a forward's input: its reader too)
        tasks: Dict[int, List[tuple]] = {stage: [] for stage in range(self.ctx.pp)}
        # each sent task's sender and how many of the sender's tasks precede its send
        sent_at: List[Tuple[tuple, int, int]] = []
        for i, sends_before in enumerate(w.sends):
            for sent in sends_before:
                stage = self.ctx.stage_of(sent[2])
                sent_at.append((sent, stage, len(tasks[stage])))
            if i < len(w.order):
                tasks[w.order[i][0]].append(w.order[i][1])
        ends = w.ends
        t1 = {stage: [ends[task] or 0.0 for task in order] for stage, order in tasks.items()}
        place = {stage: dict(zip(order, range(len(order)))) for stage, order in tasks.items()}
        change = {stage: [0] * (len(order) + 1) for stage, order in tasks.items()}
        for task, arrived in w.recv.items():
            hit = routes.get((task[0], task[2]))
            if hit is not None:
                stage, time_s, nbytes, wire = hit
                reader = place[stage][task]
                lo = bisect_right(t1[stage], arrived - time_s)
                at = change[stage]
                if lo < reader:         # waiting: what came over the wire
                    at[lo] += wire
                    at[reader] -= wire
                if task[0] == "F" and lo <= reader:     # whole, through its reader
                    at[reader] += nbytes
                    at[reader + 1] -= nbytes
        for sent, stage, hi in sent_at:
            hit = routes.get((sent[0], sent[2]))
            arrived = w.recv.get((sent[0], sent[1], sent[2] + (1 if sent[0] == "F" else -1)))
            if hit is None or arrived is None:
                continue
            _, time_s, nbytes, _ = hit
            # through the sender's tasks that end before the transfer starts
            # (stream order holds it behind them; by inputs it goes at once)
            lo = place[stage][sent] + 1
            hi = min(hi, bisect_right(t1[stage], arrived - time_s))
            if lo < hi:
                change[stage][lo] += nbytes
                change[stage][hi] -= nbytes
        held = self.memo.recv_ahead
        for stage, order in tasks.items():
            best: Dict[tuple, int] = {}
            for task, live in zip(order, accumulate(change[stage])):
                if live:
                    key = (task[0], task[2], task[0] == "B" and task[1] == 0)
                    if live > best.get(key, 0):
                        best[key] = live
            for (kind, c, first), nbytes in best.items():
                key = (stage, kind, c, first)
                if nbytes > held.get(key, 0):
                    held[key] = nbytes

    def inside(self, stage: int, c: int, inside: Dict[Tuple[int, int], int],
               part: str = "B") -> None:
        """Keep the most of :meth:`emit_last_backward`'s ``inside`` over the
        walks (:attr:`Memo.flat_inside`)."""
        held = self.memo.flat_inside.setdefault((stage, c, part), {})
        for k, nbytes in inside.items():
            if nbytes > held.get(k, 0):
                held[k] = nbytes

    def flats(self, stage: int, kind: str, mb: int, c: int,
                    flats: List[Tuple[int, float]]) -> None:
        key = (stage, kind, mb, c)
        pending = sum(nbytes for nbytes, _ in flats)
        if pending and pending > self.memo.flat_pending.get(key, 0):
            self.memo.flat_pending[key] = pending

    def forward(self, stage: int, mb: int, c: int, end: float,
                flats: List[Tuple[int, float]]) -> None:
        """The flat copies still waiting as each block of a forward task
        ending at ``end`` peaks (:attr:`~.blocks.Block.f_peak_s` after the
        block's start, the blocks' times counted back from ``end``), kept
        per block position as :meth:`blocks` keeps a backward's: a copy
        whose reduce-scatter ends during the head's loss, after the cast
        of its logits to float32, is held at that cast."""
        held = self.memo.flat_pending.setdefault((stage, "F", mb, c), {})
        blocks = self.ctx.profile.blocks
        t = end
        for k, (name, _) in reversed(list(enumerate(self.ctx.blocks_of("F", c)))):
            blk = blocks[name]
            t -= blk.f
            at = t + min(blk.f_peak_s, blk.f)
            pending = sum(nbytes for nbytes, done in flats if done > at)
            if pending > held.get(k, 0):
                held[k] = pending

    def copy_in(self, stage: int, kind: str, mb: int, c: int, nbytes: int, at: float) -> None:
        """ZeRO-3 by layer: a task's first copy-in (``nbytes``, its
        concatenated shards) made from ``at``, the end of the stage's
        compute so far, before the task's input is there: with the flat
        copies still waiting at ``at`` (the last backward's, its last
        unit's concatenated gradients among them), the most over the
        walks (:attr:`Memo.copy_ins`)."""
        key = (stage, kind, mb, c)
        held = nbytes + sum(n for n, end in self.ctx.flats.get(stage, ()) if end > at)
        if held > self.memo.copy_ins.get(key, 0):
            self.memo.copy_ins[key] = held

    def buckets(self, stage: int, c: int, held: Dict[int, int], part: str = "B",
                flushed: Optional[Dict[Tuple[int, int], int]] = None) -> None:
        """ZeRO 0/1 with ``bucket_mb``: the bytes of the stage's flat buckets
        (:meth:`~distsim.transforms.sync_policy.SyncPolicy.flush`) held as
        each block of chunk ``c``'s last backward starts (by position; those
        flushed by the chunk's earlier blocks and by earlier tasks), live
        until they are unpacked after the backward pass:
        :attr:`Memo.flat_pending` keyed
        ``(stage, "last", 0, c)``, the most over the walks (``part`` "W": a
        split backward's last W task's, keyed ``"lastW"``); ``flushed``:
        those held where a gradient's sync flushes one inside its block, by
        (block position, the gradient's index): :attr:`Memo.bucket_inside`."""
        key = (stage, "last" if part == "B" else "last" + part, 0, c)
        pending = self.memo.flat_pending.setdefault(key, {})
        for k, nbytes in held.items():
            if nbytes > pending.get(k, 0):
                pending[k] = nbytes
        inside = self.memo.bucket_inside.setdefault(key, {})
        for at, nbytes in (flushed or {}).items():
            if nbytes > inside.get(at, 0):
                inside[at] = nbytes
