"""The estimator's gradient synchronisation and optimizer step: the
timeline sink of the lowering's own decisions
(:class:`~distsim.transforms.sync_policy.SyncPolicy`, whose other sink,
:class:`~distsim.transforms.zero.GradientSync`, emits them as ops). See
:mod:`.timeline`, whose :class:`~.timeline.Builder` owns a
:class:`StepSync`.

As each parameter's last gradient becomes final, the policy decides how
it is synchronised over the data-parallel team (all-reduce, ZeRO 2/3
reduce-scatter, in buckets, or after the backward pass) and what the end
of the step does (the tied-embedding all-reduce,
per parameter the optimizer as :func:`~distsim.transforms.sync_policy.update_plan`
says); :class:`StepSync` advances the timeline by what each of those
costs. What the step charges a parameter is the same for that parameter
in every layer, so it is worked out once per configuration
(:class:`~.costs.ParamCost`).
"""
from __future__ import annotations

from functools import reduce
from operator import add
from typing import Dict, List, Optional, Tuple

from ..ir.comm import CollectiveType
from ..transforms.sync_policy import sync_kind, update_plan
from .blocks import EMB, HEAD
from .context import StepContext
from .costs import ParamCost, shard_size

ParamKey = Tuple[str, Optional[int], int]      # (block, layer, index in the block)


def queued_peak(queued: List[Tuple[float, float, float, int, int]]) -> int:
    """ZeRO 2/3 with ``bucket_mb 0``: the most bytes held by the flat
    gradient copies and reduce-scatter outputs of a stage's syncs after the
    backward pass (``queued``: per gradient, its copy's start, its
    reduce-scatter's start and end, the copy's bytes, the shard's). The
    copies are made one after another on the compute stream while their
    reduce-scatters queue on the communication stream: each copy lives
    until its reduce-scatter ends, each shard from its reduce-scatter's
    start to its update (after all of them)."""
    events: List[Tuple[float, int]] = []
    for flat, start, end, nbytes, shard in queued:
        events.append((flat, nbytes))
        events.append((end, -nbytes))
        events.append((start, shard))
    events.sort()          # at one time, a copy freed before one made
    held = peak = 0
    for _, delta in events:
        held += delta
        if held > peak:
            peak = held
    return peak


class StepSync:
    """Gradient sync state of one step on a :class:`~.context.StepContext`:
    each gradient's end time when final and when synchronised, the buckets
    all-reduced and waiting to be unpacked. The timeline sink of a
    :class:`~distsim.transforms.sync_policy.SyncPolicy` (which holds this
    sink: what waits in which bucket and what is deferred is the
    policy's)."""

    def __init__(self, ctx: StepContext) -> None:
        self.ctx = ctx
        self.tl = ctx.tl
        self.zero, self.dp = ctx.zero, ctx.dp
        self.final: Dict[ParamKey, Optional[float]] = {}
        self.synced: Dict[ParamKey, Optional[float]] = {}
        self.unpack: List[tuple] = []
        self.buckets: Dict[int, List[int]] = {}     # stage -> bytes of each flat bucket
        self._costs: Dict[Tuple[str, int], ParamCost] = ctx.memo.param_costs
        #: each gradient all-reduced on its own at once (ZeRO 0/1, no
        #: buckets): the op-by-op backward's common case (:meth:`synced_at`)
        self.each_all_reduce = (ctx.route == "each"
                                and sync_kind(ctx.zero) is CollectiveType.ALL_REDUCE)
        #: ZeRO 2/3 with ``bucket_mb 0``: per stage, what each deferred
        #: sync holds (:func:`queued_peak`)
        self._deferred = ctx.route == "deferred"
        self._queued: Dict[int, List[Tuple[float, float, float, int, int]]] = {}
        #: whether this step has unpacked buckets yet (twice under expert
        #: parallelism: :class:`.experts.ExpertSyncPolicy`)
        self._unpacked = False

    def cost(self, block: str, index: int) -> ParamCost:
        hit = self._costs.get((block, index))
        if hit is None:
            hit = self.ctx.param_cost(block, index)
        return hit

    def nbytes(self, key: ParamKey) -> int:
        """The bytes of a parameter's gradient buffer (what fills a bucket)."""
        return self.cost(key[0], key[2]).gbytes

    # -- the sink of the sync policy ---------------------------------------------
    def keep_local(self, key: ParamKey, stage: int) -> None:
        self.synced[key] = self.final[key]

    def sync_one(self, key: ParamKey, stage: int,
                 kind: CollectiveType = CollectiveType.ALL_REDUCE) -> None:
        end = self.synced[key] = self.scatter((key[0], key[2]), stage, self.final[key], kind)
        if self._deferred:
            # after the backward pass: the flat copies made one after another
            # on the compute stream while their reduce-scatters queue
            pc = self.cost(key[0], key[2])
            flat_end = self.tl.free[2 * stage]
            self._queued.setdefault(stage, []).append(
                (flat_end - pc.flat[0], end - pc.sync, end, pc.nbytes,
                 pc.shard * pc.dtype.itemsize))

    def scatter(self, param: Tuple[str, int], stage: int, end: Optional[float],
                kind: CollectiveType) -> float:
        """The data-parallel sync of one gradient produced at ``end``
        (``param``: block, index) by ``kind``: a reduce-scatter of its
        flattened copy, or an all-reduce; returns the sync's end."""
        pc = self.cost(*param)
        final = end or 0.0
        if pc.sync is None:
            pc.sync = self.ctx.dp_time(kind, pc.gbytes, pc.expert)
        if kind is CollectiveType.REDUCE_SCATTER:
            t, f = pc.flat
            self.ctx.flops[stage] += f
            final = self.tl.compute(stage, t, final)
        return self.tl.comm_on(stage, pc.sync, final)

    def sync_bucket(self, bucket: List[ParamKey], stage: int) -> None:
        ctx = self.ctx
        costs = [self.cost(k[0], k[2]) for k in bucket]
        flats = [ctx.small(stage, "reshape", [(pc.numel, pc.gdtype)], [(pc.numel, pc.gdtype)],
                           self.final[k] or 0.0) for k, pc in zip(bucket, costs)]
        dtype = costs[0].gdtype
        total = sum(pc.numel for pc in costs)
        cat = ctx.small(stage, "concat", [(pc.numel, dtype) for pc in costs],
                        [(total, dtype)], max(flats))
        # (a bucket holds an expert's weights or none: each policy its own)
        ar = self.tl.comm_on(stage, ctx.dp_time(CollectiveType.ALL_REDUCE, total * dtype.itemsize,
                                                ctx.param(bucket[0]).expert), cat)
        self.buckets.setdefault(stage, []).append(total * dtype.itemsize)
        self.unpack.append((bucket, stage, ar, total, dtype))

    def reduce_scatter_unit(self, unit: Tuple[ParamKey, ...], stage: int, mb: int) -> None:
        """A block's unit of gradients (``unit``: their parameter keys), all
        made (:attr:`.context.StepContext.unit_made_at`): concatenated row
        by row (compute) and reduce-scattered (its end noted in
        :attr:`~.context.StepContext.unit_ends`); settled at the stage's
        next unit (the policy settles the stage's previous unit first)."""
        ctx = self.ctx
        name, layer = unit[0][0], unit[0][1]
        indices = tuple(key[2] for key in unit)
        made = max(ctx.unit_made_at.pop((key, mb)) for key in unit)
        params = ctx.profile.params[name]
        d = params[indices[0]].dtype
        t_cat = ctx.costs.cost("chunk_cat", [(params[i].numel, d) for i in indices],
                               [(sum(params[i].numel for i in indices), d)])[0]
        end = self.tl.compute(stage, t_cat, made)
        # (over the unit's team: the experts' over dp / ep)
        end = self.tl.comm_on(stage, ctx.dp_time(CollectiveType.REDUCE_SCATTER,
                                                 ctx.unit_bytes(name, indices),
                                                 params[indices[0]].expert), end)
        ctx.unit_pending.setdefault(stage, []).append((name, layer, indices, mb, end))
        ctx.unit_ends.append(end)

    def settle_units(self, stage: int) -> None:
        """The units of ``stage`` reduce-scattered and not settled: each
        result split into the shards (compute, after its reduce-scatter),
        then, past the first micro-batch, each shard's accumulation (and at
        the last, its average; with one micro-batch an expert's shard's
        average over its ep ranks' tokens); a gradient is synchronised where its shard
        is settled at the last micro-batch (as GradientSync.settle_units)."""
        ctx, tl = self.ctx, self.tl
        for name, layer, unit, mb, rs_end in ctx.unit_pending.pop(stage, []):
            params = ctx.profile.params[name]
            d = params[unit[0]].dtype
            shards = [params[i].numel // ctx.unit_team(name, unit) for i in unit]
            t_split = ctx.costs.cost("split", [(sum(shards), d)], [(n, d) for n in shards])[0]
            end = tl.compute(stage, t_split, rs_end)
            ops = ctx.shard_ops(mb) if mb else None
            for i in unit:
                # one micro-batch: an expert's shard averaged over its ep
                # ranks' tokens (the lowering's ``scale``), else none
                got = ops[(name, i)] if ops is not None else ctx.one_microbatch_scale(name, i)
                if got is not None:
                    t, fl = got
                    ctx.flops[stage] += fl
                    end = tl.compute(stage, t, end)
                if mb == ctx.microbatches - 1:
                    key = (name, layer, i)
                    self.final[key] = self.synced[key] = end

    def unpack_buckets(self) -> None:
        """After the backward pass: the buckets unpacked (the memory walk's
        notes of what they and the deferred syncs held)."""
        ctx = self.ctx
        memo = ctx.memo
        for stage, queued in self._queued.items():
            held = queued_peak(queued)
            if held > memo.flat_queued.get(stage, 0):
                memo.flat_queued[stage] = held
        memo.buckets = {s: tuple(v) for s, v in self.buckets.items()}
        if not self._unpacked:      # (the experts' policy unpacks first: both count)
            memo.bucketed, memo.bucket_peak = {}, {}
        self._unpacked = True
        bucketed = memo.bucketed
        for bucket, stage, ar, total, dtype in self.unpack:
            peak = sum(self.buckets.get(stage, ())) + total * dtype.itemsize
            if peak > memo.bucket_peak.get(stage, 0):
                memo.bucket_peak[stage] = peak
        for bucket, stage, ar, total, dtype in self.unpack:
            held = bucketed.setdefault(stage, {})
            for k in bucket:
                held[k] = self.cost(k[0], k[2]).gbytes
            split = ctx.small(stage, "split", [(total, dtype)],
                              [(ctx.param(k).numel, dtype) for k in bucket], ar)
            for k in bucket:
                p = ctx.param(k)
                self.synced[k] = ctx.small(stage, "reshape", [(p.numel, dtype)],
                                           [(p.numel, dtype)], split)
        self.unpack = []

    def tie(self, emb: ParamKey, head: ParamKey) -> None:
        ctx = self.ctx
        s0, s1 = ctx.stage_of(0), ctx.stage_of(ctx.chunks - 1)
        p = ctx.param(emb)
        team = ctx.team(p)
        n = shard_size(p.numel, team) if self.zero >= 2 and team > 1 else p.numel
        # the synced gradient (its buffer's dtype): a shard past ZeRO-1
        t = ctx.colls.time(CollectiveType.ALL_REDUCE, (ctx.rank0(s0), ctx.rank0(s1)),
                           n * ctx.grad_dtype(p).itemsize)
        end = self.tl.comm((s0, s1), t, max(self.synced[emb] or 0.0, self.synced[head] or 0.0))
        self.synced[emb] = self.synced[head] = end

    def update(self, params) -> None:
        """The optimizer step of every parameter (``params``: the context's
        :meth:`~.context.StepContext.all_params`, in order), as runs of one
        stage's parameters (:meth:`optimizer_steps`); none where ``params``
        is empty (the experts' policy updates none of its own)."""
        if not params:
            return
        flops, synced = self.ctx.flops, self.synced
        compute_each, chain = self.tl.compute_each, self.tl.chain
        for update_alone, stage, keys, items, fls in self.optimizer_steps():
            # a run of one stage's parameters: one call; FLOPs added one by
            # one, in order
            flops[stage] = reduce(add, fls, flops[stage])
            readies = [synced[key] or 0.0 for key in keys]
            if update_alone:
                compute_each(stage, items, readies)
            else:
                chain(stage, items, readies)

    def tied_pairs(self) -> List[Tuple[ParamKey, int, ParamKey, int]]:
        """The tied embedding and head, each with its stage (none if the
        model unties them)."""
        ctx = self.ctx
        prof = ctx.profile
        if not prof.tied:
            return []
        emb = next(((EMB, None, i) for i, p in enumerate(prof.params[EMB])
                    if p.name == "wte"), None)
        head = next(((HEAD, None, i) for i, p in enumerate(prof.params[HEAD])
                     if p.name != "lnf_g" and p.name != "lnf_b" and
                     p.numel == prof.params[EMB][emb[2]].numel), None) if emb else None
        if emb is None or head is None:
            return []
        return [(emb, ctx.stage_of(0), head, ctx.stage_of(ctx.chunks - 1))]

    def optimizer_steps(self) -> List[tuple]:
        """The parameters in the order the optimizer updates them
        (:meth:`.context.StepContext.all_params`) as runs of consecutive ones of one
        stage, ``(update alone, stage, keys, items, FLOPs in the order they
        are added)``: where a parameter's optimizer is the update alone
        (ZeRO 0 and 3), ``items`` are the update times
        (:meth:`.engine.Timeline.compute_each`); else, per
        parameter, its items in order (:meth:`update_plan`: the template's
        ops before the update, the shard's slice, the update, the
        all-gather, the ops after) as :meth:`.engine.Timeline.chain`
        takes them. The same for every walk of a configuration: worked out
        once (:attr:`.state.Memo.optimizer_steps`)."""
        memo = self.ctx.memo
        if memo.optimizer_steps is not None:
            return memo.optimizer_steps
        steps: List[tuple] = []
        run: Optional[tuple] = None
        entries: Dict[Tuple[str, int], tuple] = {}      # the same in every layer
        for key, stage in self.ctx.all_params():
            entry = entries.get((key[0], key[2]))
            if entry is None:
                entry = entries[(key[0], key[2])] = self._optimizer_entry(key)
            alone, item, fls = entry
            if run is None or run[0] != alone or run[1] != stage:
                run = (alone, stage, [], [], [])
                steps.append(run)
            run[2].append(key)
            run[3].append(item)
            run[4].extend(fls)
        memo.optimizer_steps = steps
        return steps

    def _optimizer_entry(self, key: ParamKey) -> tuple:
        """A parameter's part of :meth:`optimizer_steps`: (its optimizer is
        the update alone, the update's time or its items, its FLOPs in the
        order they are added)."""
        pc = self.cost(key[0], key[2])
        pre, cut, (t, fl), gather, post = pc.plan or self.update_plan(key, pc)
        if pre is None and post is None:
            return True, t, (fl,)
        items: List[Tuple[bool, float]] = []
        fls = []
        if pre is not None:
            items.append((False, pre))
            if cut is not None:
                items.append((False, cut[0]))
                fls.append(cut[1])
        items.append((False, t))
        fls.append(fl)
        if post is not None:
            if gather is not None:
                items.append((True, gather))
            items.append((False, post))
        return False, tuple(items), tuple(fls)

    def update_plan(self, key: ParamKey, pc: ParamCost) -> tuple:
        """The optimizer of one parameter, as
        :func:`~distsim.transforms.sync_policy.update_plan` says:
        ``(the template's ops before the update (flattening), or None;
        slicing the shard out of the gradient (time, FLOPs), or None; the
        update ops on the ZeRO shard or the whole parameter (time, FLOPs);
        the all-gather of the new parameter, or None; the template's ops
        after it (the reshape back), or None)``. The same for a parameter
        in every layer: kept in its :class:`ParamCost` (``pc``)."""
        ctx = self.ctx
        p = ctx.param(key)
        plan = update_plan(self.zero, ctx.team(p))
        pre = p.opt_pre if plan.flatten else None
        cut = pc.slice if plan.slice else None
        gather = ctx.dp_time(CollectiveType.ALL_GATHER, pc.nbytes, pc.expert) \
            if plan.gather else None
        post = p.opt_post if plan.reshape else None
        pc.plan = (pre, cut, pc.update, gather, post)
        return pc.plan
