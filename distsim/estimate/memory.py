"""The sweep estimator's memory (:mod:`.point`): the peak bytes per
rank of each pipeline stage, walking each stage's schedule over the
per-layer profile's memory (:mod:`.profile_memory`) and what the
timeline walks noted (:class:`~.state.Memo`), the simulator's
accounting (a value lives from its op's start to its last reader's end).
"""
from __future__ import annotations

import math
from functools import lru_cache
from typing import Dict, List, Optional, Tuple

import numpy as np

from ..models.gpt_family import hyper_of
from ..transforms.pipeline import schedule_tasks
from ..transforms.sync_policy import resident_layout
from .profile_memory import prefetched_bytes
from .costs import shard_size
from .context import StepContext
from .units import copy_out_excess, pending_shard_bytes, unit_backward_excess

def estimate_memory(b: StepContext) -> List[int]:
    """Peak bytes per rank of each stage, the simulator's accounting
    (a value lives from its op's start to its last reader's end):
    weights and optimizer state (sharded as the ZeRO stage says) and the
    resident gradient buffers (the whole parameter, or the 1/dp shard when
    ZeRO 2/3 reduce-scatter every micro-batch), plus the saved activations
    (:func:`~distsim.transforms.memory_model.saved_activation_bytes`) of the
    chunks in flight, walking the stage's schedule, plus each block's
    transient excess measured on the template. The largest candidate over
    the forward and backward blocks and the optimizer is the peak."""
    prof, S = b.profile, b.strategy
    zero = S.zero
    master = b.master.itemsize
    # fp32 master weights and the optimizer's moments: AdamW m, v; SGD momentum
    hyper = hyper_of(b.case.config, S.optimizer)
    states = 1 + len(hyper.states)
    # bytes per parameter of each block (whole numbers, summed exactly)
    # as the lowering makes them (:func:`~distsim.transforms.sync_policy.resident_layout`)
    # (an expert's weights over their team of dp / ep ranks: :meth:`~.context.StepContext.team`)
    per: Dict[Tuple[str, int], Tuple[int, int]] = {}
    for block, params in prof.params.items():
        for i, p in enumerate(params):
            n, size = p.numel, p.dtype.itemsize
            layout = resident_layout(zero, b.team(p), b.bucket_bytes)
            shard = shard_size(n, b.team(p))
            per[(block, i)] = ((shard if layout.param else n) * size
                               + states * (shard if layout.state else n) * master,
                               (shard if layout.grad else n) * size)
    static_bytes = [0] * S.pp
    grad_bytes = [0] * S.pp
    for stage, counts in enumerate(b.param_counts()):
        for key, n in counts.items():
            weights, grad = per[key]
            static_bytes[stage] += n * weights
            grad_bytes[stage] += n * grad
    static = [float(x) for x in static_bytes]
    grads = [float(x) for x in grad_bytes]
    blocks = prof.blocks
    chunk_blocks = {c: b.blocks_of("F", c) for c in range(b.chunks)}
    chunk_saved = {c: float(sum(blocks[n].saved_bytes for n, _ in chunk_blocks[c]))
                   for c in range(b.chunks)}
    # a split backward (ZB-H1): what each block's W reads from its forward
    # and B lives from the B task to the W task (B frees the rest)
    weight = prof.weight
    kept_w = {name: float(w.saved_bytes) for name, w in weight.items()} if weight \
        else dict.fromkeys(blocks, 0.0)
    chunk_w = np.array([sum(kept_w[n] for n, _ in chunk_blocks[c]) for c in range(b.chunks)])
    # a chunk after another stage's holds the activation it received (the
    # residual stream its first layer's backward reads) until its backward;
    # the chunk that sent it, counted in its last layer's saved bytes,
    # freed its copy once sent
    kept = float(prof.forward_crossing_saved)
    #: per chunk, the bytes of its output sent to the next stage and freed
    #: there: its last layer's backward (the first in a backward task)
    #: counts them back, as the template's measure of that layer takes
    #: them off (the template's layer output is gone by its backward too)
    sent = {}
    for c in range(b.chunks):
        if c > 0 and (c - 1) % S.pp != c % S.pp:
            chunk_saved[c] += kept
        if c < b.chunks - 1 and (c + 1) % S.pp != c % S.pp:
            chunk_saved[c] -= kept
            sent[c] = kept
    prefetch = S.prefetch if zero == 3 else 0
    units = b.by_layer
    ahead = {(kind, c): prefetched_bytes(prof, b.blocks_of(kind, c), kind, prefetch)
             for c in range(b.chunks) for kind in "FB"}
    # by layer, at a block's copy-out (its own gather just ended) only the
    # next block's gather has started on the communication stream
    next_one = {(kind, c): prefetched_bytes(prof, b.blocks_of(kind, c), kind, min(prefetch, 1))
                for c in range(b.chunks) for kind in "FB"} if units else ahead

    #: the most of a block's gradient candidates (by the dict's id: the
    #: profile's and the notes' dicts live through the walk)
    grads_top: Dict[int, float] = {}

    def task_peak(base: float, kind: str, c: int, flight: float,
                  inside: Optional[Dict[Tuple[int, int], int]] = None,
                  by_block: Optional[Dict[int, int]] = None, first: bool = False,
                  after: bool = True, hold: bool = False, early: float = 0.0) -> float:
        """The largest candidate of one task, with ``flight`` bytes of saved
        activations held when it starts (``inside``: bytes added at the
        backward's gradients, :attr:`Memo.flat_inside` or ``flat_later``;
        ``by_block``: to its blocks by position, the task's
        :attr:`Memo.flat_pending` (in a backward with ZeRO 2/3
        reduce-scattering each gradient, to the block's peak apart from its
        gradients);
        ``first``: the chunk's first backward, micro-batch 0, whose bare
        gradients become the buffers (``b0_excess``) where the later ones
        make a gradient beside the buffer and add it in (``b_excess``));
        ``after``: a backward of the stage ran before the task (by layer,
        the unit of shards it left pending). A block whose gathers are
        placed in time (ZeRO-3: :func:`.gathered_walk.note_peak`) has the flat
        copies (``inside``, ``by_block``) and by layer the units of shards
        pending placed in time too. ``hold``: a later task of the stage gates its ZeRO-3
        gathers on this backward's last result (:attr:`.profile.Block.b_held`:
        a backward past the first holds that gradient beside its flat copy
        and the reduce-scatter's result); ``early``: the bytes the next
        task, a backward, makes from its leading collectives once this
        one's last collective has ended (:attr:`.profile.Block.b_early`)."""
        peak = -math.inf
        backward = b.blocks_of("B", c)
        if kind == "F":
            before = 0.0
            # by layer: the stage's last backward's last unit of shards
            pending = pending_shard_bytes(b, backward, len(backward)) if units and after \
                else 0.0
            # ZeRO-3: each block with its gathers placed in time
            placed = b.memo.gather_peaks.get(("F", b.shapes[c], False), {})
            for k, ((name, _), gathered, started) in enumerate(zip(
                    chunk_blocks[c], ahead[("F", c)], next_one[("F", c)])):
                now = base + flight + before + pending + (by_block.get(k, 0) if by_block
                                                          else 0)
                at = placed.get(k)
                peak = max(peak, now + (gathered + blocks[name].f_excess if at is None
                                        else at[0]))
                split = copy_out_excess(b, "F", name) if units and at is None else None
                if split is not None:
                    peak = max(peak, now + started + split)
                before += blocks[name].saved_bytes
        else:
            held = flight
            placed = b.memo.gather_peaks.get(("B", b.shapes[c], first or b.microbatches == 1), {})
            # what is the same for every block of the task
            scatter_each = b.scatter_each
            each = scatter_each and not units
            bare = scatter_each or first or b.microbatches == 1    # b0_excess, b0_tail
            last = len(backward) - 1
            for k, ((name, _), gathered) in enumerate(zip(backward, ahead[("B", c)])):
                blk = blocks[name]
                grads_at = blk.bs_grads
                at = placed.get(k)
                if at is not None:
                    # ZeRO-3, its gathers placed in time (by layer with a
                    # reduce-scatter per micro-batch, its unit's gradients
                    # held: :func:`.units.unit_curve`)
                    excess, gathered = at[0], 0.0
                    if scatter_each:
                        grads_at = at[1]
                        if units and grads_at:
                            top = grads_top.get(id(grads_at))
                            if top is None:
                                top = grads_top[id(grads_at)] = max(grads_at.values())
                            excess = max(excess, top)
                elif units and scatter_each:
                    excess, grads_at = unit_backward_excess(b, name)
                else:
                    # ZeRO 2/3 reduce-scattering each gradient: the block's
                    # peak apart from its gradients, and at each gradient
                    # (its op, then it and its flat copy) below
                    excess = blk.b0_excess if bare else blk.b_excess
                if by_block is not None and at is None:
                    excess += by_block.get(k, 0)
                now = base + held + gathered + (sent.get(c, 0.0) if k == 0 else 0.0)
                if units:     # the previous unit's shards, and this one's copy-out
                    pending = 0.0 if at is not None and scatter_each \
                        else pending_shard_bytes(b, backward, k, after)
                    now += pending
                    split = copy_out_excess(b, "B", name) if at is None else None
                    if split is not None:
                        peak = max(peak, base + held + pending + next_one[("B", c)][k] + split)
                peak = max(peak, now + excess)
                if early and k == last:
                    tail = blk.b0_tail if bare else blk.b_tail
                    if tail is not None:
                        peak = max(peak, now + tail + early)
                i = blk.b_held
                if hold and i is not None and k == last and not first \
                        and scatter_each and i in grads_at:
                    # its gradient, its flat copy and the reduce-scatter's result
                    p = prof.params[name][i]
                    peak = max(peak, now + grads_at[i]
                               + shard_size(p.numel, b.team(p)) * p.dtype.itemsize)
                if inside and at is None:
                    # at each gradient's flat copy, and as its op starts
                    ops = blk.bs_ops if grads_at is blk.bs_grads else {}
                    for i, at in grads_at.items():
                        peak = max(peak, now + at + inside.get((k, i), 0))
                        during = ops.get(i)
                        if during is not None:
                            peak = max(peak, now + during + inside.get((k, i, True), 0))
                elif each and grads_at:
                    top = grads_top.get(id(grads_at))
                    if top is None:
                        top = grads_top[id(grads_at)] = max(grads_at.values())
                    peak = max(peak, now + top)
                held -= blk.saved_bytes - kept_w[name]
        return peak

    def weight_peak(base: float, c: int, held: float, first: bool,
                    by_block: Optional[Dict[int, int]] = None,
                    inside: Optional[Dict[tuple, int]] = None) -> float:
        """The largest candidate of a split backward's W task of chunk
        ``c`` (``first``: micro-batch 0's) with ``held`` bytes in flight when
        it starts: block by block, its W part's excess over what the W parts
        not run yet hold (``by_block``: bytes held beside each block, by
        position: the buckets flushed before it; a bucket flushed inside a
        block is made, with the reshaped gradients its concat copies, while
        what the block's W holds may still be live: both on top of those;
        with ZeRO 2 reduce-scattering each micro-batch, the flat copies
        waiting as each block starts). With ZeRO 2 reduce-scattering each
        micro-batch there is no whole buffer to add into (the first
        micro-batch's excess), and at each gradient it and its flat copy
        (:attr:`.blocks.Block.bs_grads`, ``bs_ops`` as its op starts) beside
        the flat copies still waiting then (``inside``, keyed as
        :attr:`.state.Memo.flat_inside`)."""
        peak = -math.inf
        each = b.scatter_each
        inside = inside or {}
        for k, (name, _) in enumerate(b.blocks_of("W", c)):
            w = weight[name]
            extra = by_block.get(k, 0) if by_block else 0
            now = base + held + extra
            peak = max(peak, now + (w.b0_excess if first or each else w.b_excess))
            if each:
                for i, at in w.bs_grads.items():
                    peak = max(peak, base + held + at + inside.get((k, i), 0))
                    during = w.bs_ops.get(i)
                    if during is not None:
                        peak = max(peak, base + held + during + inside.get((k, i, True), 0))
            held -= kept_w[name]
            flushed = (by_block.get(k + 1, extra) - extra) if by_block else 0
            if flushed > 0:
                peak = max(peak, base + held + extra + 2 * flushed)
        return peak

    per_param = _param_optimizer_excess(b)
    opt = optimizer_excess(b, per_param)
    saved_by_chunk = np.array([chunk_saved[c] for c in range(b.chunks)])
    chunks_of: Dict[int, List[int]] = {}
    for c in range(b.chunks):
        chunks_of.setdefault(b.stage_of(c), []).append(c)
    # what the timeline walks noted, by stage (in the order noted)
    pending_of: Dict[int, list] = {}
    for (s, kind, mb, c), pending in b.memo.flat_pending.items():
        pending_of.setdefault(s, []).append((kind, mb, c, pending))
    copy_ins_of: Dict[int, list] = {}
    for (s, kind, mb, c), nbytes in b.memo.copy_ins.items():
        copy_ins_of.setdefault(s, []).append((kind, mb, c, nbytes))
    inside_of: Dict[int, list] = {}
    for (s, c, part), inside in b.memo.flat_inside.items():
        inside_of.setdefault(s, []).append((c, part, inside))
    out = []
    stage_tasks = _stage_tasks(S.schedule, S.pp, b.microbatches, S.chunks)
    for stage, (forward, chunk, weights) in enumerate(stage_tasks):
        base = static[stage] + grads[stage]
        best = base + max(_after_backward(b, stage, per_param, opt[stage]),
                          b.memo.flat_queued.get(stage, 0))
        # the bytes in flight before each task: saved activations are whole
        # numbers, so the running sum is exact in any order (numpy's too).
        # A task's peak only grows with the bytes in flight before it (each
        # candidate adds them, and rounding is monotone), so of the tasks of
        # one kind, chunk and first-backward-or-not only the one starting
        # with the most in flight is costed
        saved = saved_by_chunk[chunk]
        delta = np.where(forward, saved, np.where(weights, -chunk_w[chunk],
                                                  chunk_w[chunk] - saved))
        flight = np.concatenate(([0.0], np.cumsum(delta)[:-1]))
        # each micro-batch's data (token ids on the embedding's stage,
        # labels on the head's), live from the step's start until the
        # backward (or a split one's W) that reads them ends
        for c_data, per, name in ((0, prof.data_emb, "emb"),
                                  (b.chunks - 1, prof.data_head, "head")):
            if per and b.stage_of(c_data) == stage:
                by_w = bool(weight) and weight[name].reads_data
                read = (weights if by_w else ~forward & ~weights) & (chunk == c_data)
                flight = flight + per * (b.microbatches
                                         - np.concatenate(([0], np.cumsum(read)[:-1])))
        if weight:
            # the W tasks' candidates; the rest of the walk is the F and B tasks'
            received = b.memo.recv_ahead
            for c in np.unique(chunk[weights]).tolist():
                at = np.flatnonzero(weights & (chunk == c))
                extra = received.get((stage, "W", c, False), 0)
                best = max(best, weight_peak(base, c, float(flight[at[0]]) + extra, True))
                if len(at) > 1:
                    best = max(best, weight_peak(base, c, float(flight[at[1:]].max()) + extra,
                                                 False))
            w_chunk, w_flight = chunk[weights], flight[weights]
            forward, chunk, flight = forward[~weights], chunk[~weights], flight[~weights]
        # each chunk's first backward task (micro-batch 0: tasks of a chunk
        # run in micro-batch order), by chunk
        first_back = {}
        for c in chunks_of[stage]:
            at = np.flatnonzero(~forward & (chunk == c))
            if len(at):
                first_back[c] = int(at[0])
        first_b = np.zeros(len(forward), dtype=bool)
        first_b[list(first_back.values())] = True
        kinds = chunk * 4 + forward * 2 + first_b
        # by layer, whether a backward ran on the stage before each task
        # (the unit of gradient shards it left pending until the next)
        after_b = np.concatenate(([False], np.cumsum(~forward)[:-1] > 0)) if units \
            else np.ones(len(forward), dtype=bool)
        if units:
            kinds = kinds + after_b * (4 * b.chunks)
        # ZeRO-3 reducing each gradient: the stage's last task, whose last
        # result gates no later gathers
        holds = np.zeros(len(forward), dtype=bool)
        if b.zero3 and b.scatter_each:
            holds[:-1] = True
            kinds = kinds + holds * (8 * b.chunks)
        # a backward followed by a backward whose leading collectives need
        # only what the forward made: those run once this one's have
        # (without ZeRO-3's gathers, gated on the compute, nor gradient
        # syncs on the communication stream: a backward of the chunk's
        # last micro-batch with data parallelism synchronises)
        early = _early_next(b, forward, chunk)
        levels = np.unique(early).tolist() if early is not None else [0.0]
        if len(levels) > 1:
            kinds = kinds + np.searchsorted(levels, early) * (16 * b.chunks)
        received = b.memo.recv_ahead
        for key in np.unique(kinds).tolist():
            held = float(flight[kinds == key].max())
            level, key = levels[key // (16 * b.chunks)], key % (16 * b.chunks)
            hold, key = key >= 8 * b.chunks, key % (8 * b.chunks)
            after, key = key >= 4 * b.chunks, key % (4 * b.chunks)
            c, is_f, first = key // 4, key & 2, key & 1
            kind = "F" if is_f else "B"
            # a pipeline's values received for later tasks (and a forward's input)
            held += received.get((stage, kind, c, bool(first)), 0)
            best = max(best, task_peak(base, kind, c, held, first=bool(first),
                                       after=bool(after), hold=bool(hold), early=level))
        # ZeRO 2/3, a reduce-scatter per micro-batch: the flat gradient
        # copies of a chunk's first backward still waiting for their
        # reduce-scatters when it ends, when later backwards start (where
        # they peak) and when later forwards end (likewise); ZeRO 0/1, the
        # buckets flushed before each block of a chunk's last backward
        # ("last": held until they are unpacked)
        for kind, mb, c, pending in pending_of.get(stage, ()):
            if kind == "end":
                best = max(best, base + pending)
                continue
            if kind == "lastW":       # a split backward's last W task, likewise
                at = np.flatnonzero(w_chunk == c)
                best = max(best, weight_peak(
                    base, c, float(w_flight[at[-1]]) + received.get((stage, "W", c, False), 0),
                    len(at) == 1, pending))
                continue
            if kind == "W":           # a split backward's W task of micro-batch mb
                at = np.flatnonzero(w_chunk == c)
                if mb < len(at):
                    best = max(best, weight_peak(
                        base, c, float(w_flight[at[mb]]) + received.get((stage, "W", c, False), 0),
                        mb == 0, pending, b.memo.flat_later.get((stage, mb, c, "W"))))
                continue
            at = np.flatnonzero((forward == (kind == "F")) & (chunk == c))
            if kind == "last":        # ZeRO 0/1 buckets: the chunk's last backward
                mb = len(at) - 1
            if mb >= len(at) or mb < 0:
                continue
            if kind != "F":
                best = max(best, task_peak(base, kind, c, float(flight[at[mb]]),
                                           b.memo.flat_later.get((stage, mb, c, "B")),
                                           by_block=pending, first=mb == 0,
                                           after=bool(after_b[at[mb]]),
                                           hold=bool(holds[at[mb]])))
            else:
                # (with the values received for it, as the walk above)
                held = float(flight[at[mb]]) + received.get((stage, kind, c, False), 0)
                best = max(best, task_peak(base, kind, c, held, by_block=pending,
                                           after=bool(after_b[at[mb]])))
        # ZeRO-3 by layer: a task's first copy-in, made where the stage's
        # compute so far ends, the task's input still to come: beside the
        # activations in flight, the unit of shards the last backward left
        # pending and the flat copies still waiting
        places: Dict[Tuple[str, int], np.ndarray] = {}     # each task class's positions
        for kind, mb, c, nbytes in copy_ins_of.get(stage, ()):
            at = places.get((kind, c))
            if at is None:
                at = places[(kind, c)] = np.flatnonzero((forward == (kind == "F"))
                                                        & (chunk == c))
            if mb < len(at):
                backward = b.blocks_of("B", c)
                pending = pending_shard_bytes(b, backward, len(backward)) \
                    if after_b[at[mb]] else 0.0
                best = max(best, base + float(flight[at[mb]]) + pending + nbytes)
        # and inside that first backward, the copies of its earlier
        # gradients still waiting when each block makes its own
        for c, part, inside in inside_of.get(stage, ()):
            if part == "W":
                at = np.flatnonzero(w_chunk == c)
                best = max(best, weight_peak(
                    base, c, float(w_flight[at[0]]) + received.get((stage, "W", c, False), 0),
                    True, inside=inside))
            elif c in first_back:
                best = max(best, task_peak(base, "B", c, float(flight[first_back[c]]), inside,
                                           after=bool(after_b[first_back[c]]),
                                           first=True))
        out.append(int(best))
    return out


def optimizer_excess(b: StepContext, per: Optional[Dict[Tuple[str, int], float]] = None
                     ) -> List[float]:
    """Per stage, the optimizer's transient above weights, optimizer state
    and gradient buffers, the most over the stage's parameters
    (:func:`_param_optimizer_excess`, or ``per`` when given)."""
    per = _param_optimizer_excess(b) if per is None else per
    out = [0.0] * b.strategy.pp
    for stage, counts in enumerate(b.param_counts()):
        for key in counts:
            if per[key] > out[stage]:
                out[stage] = per[key]
    return out


def _param_optimizer_excess(b: StepContext) -> Dict[Tuple[str, int], float]:
    """Per parameter (block, index), the optimizer's transient above
    weights, optimizer state and gradient buffers, as GradientSync._update
    emits it (the update ops run one parameter after another). The
    template (dp 1) updates whole parameters: with
    ZeRO and dp > 1 the update ops work on the 1/dp shard, so their memory
    (:attr:`~.profile.Param.opt_with`, ``opt_after``) shrinks by
    shard / whole, and around them:

    * ZeRO 1: the flat copy of the whole gradient and the shard sliced
      from it (both live at the slice), the shard read by the update in
      place of the template's flat copy;
    * ZeRO 2/3: the gradient is already a shard: the resident buffer
      (a reduce-scatter per micro-batch), or the reduce-scatter's output
      (``bucket_mb 0``), live until the update;
    * ZeRO 1/2: the new shard (the update's cast) and the whole parameter
      all-gathered from it, both live during the all-gather.

    Without ZeRO or data parallelism the template's own measure stands
    (``dp``: the parameter's team, :meth:`~.context.StepContext.team`)."""
    prof, zero = b.profile, b.strategy.zero
    per: Dict[Tuple[str, int], float] = {}
    for block, params in prof.params.items():
        for i, p in enumerate(params):
            dp = b.team(p)
            if zero == 0 or dp == 1:
                per[(block, i)] = max(p.opt_flat + p.opt_with, p.opt_after)
                continue
            n, size = p.numel, p.dtype.itemsize
            shard = shard_size(n, dp)
            ratio = shard / n if n else 1.0
            if zero == 1:
                grad, pre = shard * size, (n + shard) * size
            else:
                grad, pre = (0 if b.scatter_each else shard * size), 0
            worst = max(pre, grad + p.opt_with * ratio, p.opt_after * ratio)
            if zero in (1, 2):
                worst = max(worst, (n + shard) * size)
            per[(block, i)] = worst
    return per


def _after_backward(b: StepContext, stage: int, per: Dict[Tuple[str, int], float],
                    opt_excess: float) -> float:
    """A stage's peak after its backward pass, above its weights, optimizer
    state and gradient buffers: the optimizer's transient measured on the
    template (``per``: by parameter; ``opt_excess``: the stage's most),
    and, when gradients are all-reduced in flat buckets of several (ZeRO
    0/1 with ``bucket_mb``: :attr:`Memo.buckets`, their bytes, and
    :attr:`Memo.bucketed`, the gradients in them, as :meth:`.StepSync.flush`
    records them), the buckets' copies. Every flushed bucket lives until
    its all-reduce ends; a bucket's ``concat`` holds the bucket and the
    reshaped gradients it copies, and its unpacking ``split``, after the
    all-reduce, the reduced bucket and its pieces, with the other buckets
    still held or unpacked: the buckets' bytes so far and one bucket more
    (:attr:`Memo.bucket_peak`: all of them but under expert parallelism,
    whose experts' buckets are unpacked before the others' last).
    Each unpacked gradient is a copy that lives until its parameter's
    update; the optimizer runs after the stage's buckets are unpacked (its
    first parameter's gradient is the backward's last), one parameter after
    another, so a parameter's transient is on top of the unpacked copies
    of the parameters not yet updated (its own among them), not of the
    buckets. ZeRO 1 first flattens the gradient into a copy (the template
    measures it), which frees the unpacked one: both live during that
    copy, then the template's measure less the unpacked copy. The buckets
    flushed during the backward pass, held while activations still are,
    are counted at the blocks of the backward tasks after them
    (:meth:`.notes.MemoryNotes.buckets`); ZeRO 2/3 with
    ``bucket_mb 0``, the flat copies queued for their reduce-scatters
    after the backward pass, by the caller (:attr:`Memo.flat_queued`)."""
    buckets = b.memo.buckets.get(stage, ())
    if not buckets:
        return opt_excess
    bucketed = b.memo.bucketed.get(stage, {})
    held = float(sum(buckets))
    best = float(b.memo.bucket_peak.get(stage, 0))
    flat_first = b.strategy.zero >= 1 and b.strategy.dp > 1
    for key, s in b.all_params():
        if s != stage:
            continue
        excess = per[(key[0], key[2])]
        nbytes = bucketed.get(key)
        if nbytes is None:
            best = max(best, held + excess)
            continue
        best = max(best, held + (max(nbytes, excess - nbytes) if flat_first else excess))
        held -= nbytes
    return best


def _early_next(b: StepContext, forward: np.ndarray, chunk: np.ndarray) -> Optional[np.ndarray]:
    """Per task of a stage (``forward``, ``chunk``: its tasks in order),
    the bytes the next task makes early (:attr:`.profile.Block.b_early`
    of its first block) where both are backwards and this one's
    communication stream runs nothing else (no ZeRO-3 gathers, gated on
    the compute; no reduce-scatter per micro-batch; no gradient sync at
    the chunk's last micro-batch, with data parallelism); None: none."""
    if b.zero3 or b.scatter_each or len(forward) < 2:
        return None
    by_chunk = np.array([float(b.profile.blocks[b.blocks_of("B", c)[0][0]].b_early)
                         for c in range(b.chunks)])
    if not by_chunk.any():
        return None
    out = np.zeros(len(forward))
    both = ~forward[:-1] & ~forward[1:]
    out[:-1] = np.where(both, by_chunk[chunk[1:]], 0.0)
    if b.dp > 1:
        # each chunk's last backward synchronises its gradients
        for c in np.unique(chunk).tolist():
            at = np.flatnonzero(~forward & (chunk == c))
            if len(at):
                out[at[-1]] = 0.0
    return out


@lru_cache(maxsize=256)
def _stage_tasks(schedule: str, pp: int, microbatches: int, chunks: int
                 ) -> Tuple[Tuple[np.ndarray, np.ndarray, np.ndarray], ...]:
    """Per stage, its tasks in schedule order as (is a forward, chunk,
    is a split backward's W task) arrays (the same for every point with
    the same schedule; kept: do not modify)."""
    out = []
    for tasks in schedule_tasks(schedule, pp, microbatches, chunks):
        out.append((np.array([kind == "F" for kind, _, _ in tasks], dtype=bool),
                    np.array([c for _, _, c in tasks], dtype=np.int64),
                    np.array([kind == "W" for kind, _, _ in tasks], dtype=bool)))
    return tuple(out)


