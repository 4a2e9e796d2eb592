"""The estimator's gradient synchronisation and optimizer step: the
timeline sink of the lowering's own decisions
(:class:`~distsim.transforms.sync_policy.SyncPolicy`, whose other sink,
:class:`~distsim.transforms.zero.GradientSync`, emits them as ops). See
:mod:`.timeline`, whose :class:`~.timeline.Builder` owns a
:class:`StepSync`.

As each parameter's last gradient becomes final (:meth:`StepSync.ready`),
the policy decides how it is synchronised over the data-parallel team
(all-reduce, ZeRO 2/3 reduce-scatter, in buckets, or after the backward
pass) and what the end of the step does (the tied-embedding all-reduce,
per parameter the optimizer as :func:`~distsim.transforms.sync_policy.update_plan`
says); :class:`StepSync` advances the timeline by what each of those
costs. What the step charges a parameter is the same for that parameter
in every layer, so it is worked out once per configuration
(:class:`ParamCost`).
"""
from __future__ import annotations

from functools import reduce
from operator import add
from typing import TYPE_CHECKING, Dict, List, Optional, Tuple

from ..ir.comm import CollectiveType
from ..transforms.sync_policy import SyncPolicy, update_plan
from .profile import EMB, HEAD

if TYPE_CHECKING:     # pragma: no cover - for the annotations only
    from .timeline import Builder

ParamKey = Tuple[str, Optional[int], int]      # (block, layer, index in the block)


def shard_size(n: int, parts: int) -> int:
    """Rank 0's ZeRO shard of ``n`` elements over ``parts`` ranks: the first
    (largest) of :func:`distsim.ir.ops_comm.split_sizes`."""
    return -(-n // parts)


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


class ParamCost:
    """What the step charges one parameter of a block (per rank, in this
    configuration): its size, the ZeRO shard, flattening its gradient
    (``flat``: time, FLOPs), the update ops on the shard (``update``),
    slicing the shard out of the gradient (``slice``, ZeRO 1), its
    data-parallel sync time and its optimizer's items
    (:meth:`StepSync.update_plan`), both filled when first needed: a
    collective not needed is not timed."""

    __slots__ = ("numel", "dtype", "nbytes", "shard", "flat", "update", "slice", "sync",
                 "plan")

    def __init__(self, b: "Builder", block: str, index: int) -> None:
        p = b.profile.params[block][index]
        n, d = p.numel, p.dtype
        self.numel, self.dtype = n, d
        self.nbytes = n * d.itemsize
        plan = update_plan(b.zero, b.dp)
        self.shard = shard_size(n, b.dp) if plan.on_shard else n
        self.flat = b.costs.cost("reshape", [(n, d)], [(n, d)])
        # the update ops shrink to the shard: their time beyond the launch
        # overhead scales with the elements
        ratio = self.shard / n if n else 1.0
        launch = b.case.topology.device_spec.launch_overhead_s
        t = fl = 0.0
        for time_s, flops in p.opt_update:
            t += launch + max(0.0, time_s - launch) * ratio if time_s > 0 else 0.0
            fl += flops * ratio
        self.update = (t, fl)
        self.slice = b.costs.cost("slice", [(n, d)], [(self.shard, d)]) \
            if plan.slice else (0.0, 0.0)
        self.sync: Optional[float] = None
        self.plan: Optional[tuple] = None


class StepSync:
    """Gradient sync state of one step: each gradient's end time when
    final and when synchronised, the buckets all-reduced and waiting to be
    unpacked; what waits in which bucket and what is deferred is the
    policy's (:attr:`policy`). The timeline sink of a
    :class:`~distsim.transforms.sync_policy.SyncPolicy`."""

    def __init__(self, b: "Builder") -> None:
        self.b = b
        self.tl = b.tl
        self.zero, self.dp = b.zero, b.dp
        self.final: Dict[ParamKey, Optional[float]] = {}
        self.synced: Dict[ParamKey, Optional[float]] = {}
        self.unpack: List[tuple] = []
        self.buckets: Dict[int, List[int]] = {}     # stage -> bytes of each flat bucket
        self._costs: Dict[Tuple[str, int], ParamCost] = b.memo.param_costs
        self.policy: SyncPolicy[ParamKey] = SyncPolicy(
            b.strategy, self, lambda key: self.cost(key[0], key[2]).nbytes)
        #: each gradient all-reduced on its own (ZeRO 0/1, no buckets): the
        #: op-by-op backward's common case (:meth:`ready_and_synced`)
        self._each_all_reduce = (self.policy.route == "each"
                                 and self.policy.kind is CollectiveType.ALL_REDUCE)
        #: ZeRO 2/3 with ``bucket_mb 0``: per stage, what each deferred
        #: sync holds (:func:`queued_peak`)
        self._queued: Dict[int, List[Tuple[float, float, float, int, int]]] = {}

    def cost(self, block: str, index: int) -> ParamCost:
        hit = self._costs.get((block, index))
        if hit is None:
            hit = self._costs[(block, index)] = ParamCost(self.b, block, index)
        return hit

    def ready(self, key: ParamKey, stage: int, end: Optional[float]) -> None:
        """The gradient ``key`` is final at ``end``: the policy synchronises it."""
        self.final[key] = end
        self.policy.final(key, stage)

    def ready_and_synced(self, key: ParamKey, stage: int, end: Optional[float]) -> float:
        """:meth:`ready`, then the gradient's synchronised end (0.0 while it
        waits for a bucket or the backward pass's end). Where the policy
        all-reduces each gradient on its own at once, a gradient whose
        collective is timed takes :meth:`sync_one`'s steps without the
        calls between (an estimate syncs every gradient of the model this
        way)."""
        if self._each_all_reduce:
            pc = self._costs.get((key[0], key[2]))
            if pc is not None and pc.sync is not None:
                self.final[key] = end
                synced = self.synced[key] = self.tl.comm_on(stage, pc.sync, end or 0.0)
                return synced
        self.ready(key, stage, end)
        return self.synced.get(key) or 0.0

    # -- the sink of the sync policy ---------------------------------------------
    def keep_local(self, key: ParamKey, stage: int) -> None:
        self.synced[key] = self.final[key]

    def sync_one(self, key: ParamKey, stage: int,
                 kind: CollectiveType = CollectiveType.ALL_REDUCE) -> None:
        end = self.synced[key] = self.scatter((key[0], key[2]), stage, self.final[key], kind)
        if self.policy.route == "deferred":
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
            pc.sync = self.b.dp_time(kind, pc.nbytes)
        if kind is CollectiveType.REDUCE_SCATTER:
            t, f = pc.flat
            self.b.flops[stage] += f
            final = self.tl.compute(stage, t, final)
        return self.tl.comm_on(stage, pc.sync, final)

    def sync_bucket(self, bucket: List[ParamKey], stage: int) -> None:
        b = self.b
        costs = [self.cost(k[0], k[2]) for k in bucket]
        flats = [b.small(stage, "reshape", [(pc.numel, pc.dtype)], [(pc.numel, pc.dtype)],
                         self.final[k] or 0.0) for k, pc in zip(bucket, costs)]
        dtype = costs[0].dtype
        total = sum(pc.numel for pc in costs)
        cat = b.small(stage, "concat", [(pc.numel, dtype) for pc in costs],
                      [(total, dtype)], max(flats))
        ar = self.tl.comm_on(stage, b.dp_time(CollectiveType.ALL_REDUCE,
                                              total * dtype.itemsize), cat)
        self.buckets.setdefault(stage, []).append(total * dtype.itemsize)
        self.unpack.append((bucket, stage, ar, total, dtype))

    def settle_units(self, stage: int) -> None:
        self.b.settle_units(stage)

    def reduce_scatter_unit(self, unit: Tuple[ParamKey, ...], stage: int,
                            microbatch: int) -> None:
        self.b.scatter_unit(unit, stage, microbatch)

    def unpack_buckets(self) -> None:
        """After the backward pass: the buckets unpacked (the memory walk's
        notes of what they and the deferred syncs held)."""
        b = self.b
        for stage, queued in self._queued.items():
            held = queued_peak(queued)
            if held > b.memo.flat_queued.get(stage, 0):
                b.memo.flat_queued[stage] = held
        b.memo.buckets = {s: tuple(v) for s, v in self.buckets.items()}
        b.memo.bucketed = bucketed = {}
        for bucket, stage, ar, total, dtype in self.unpack:
            held = bucketed.setdefault(stage, {})
            for k in bucket:
                held[k] = self.cost(k[0], k[2]).nbytes
            split = b.small(stage, "split", [(total, dtype)],
                            [(b.param(k).numel, dtype) for k in bucket], ar)
            for k in bucket:
                p = b.param(k)
                self.synced[k] = b.small(stage, "reshape", [(p.numel, p.dtype)],
                                         [(p.numel, p.dtype)], split)
        self.unpack = []

    def tie(self, emb: ParamKey, head: ParamKey) -> None:
        b = self.b
        s0, s1 = b.stage_of(0), b.stage_of(b.chunks - 1)
        p = b.param(emb)
        n = shard_size(p.numel, self.dp) if self.zero >= 2 and self.dp > 1 else p.numel
        t = b.colls.time(CollectiveType.ALL_REDUCE, (b.rank0(s0), b.rank0(s1)),
                         n * p.dtype.itemsize)     # the synced gradient: a shard past ZeRO-1
        end = self.tl.comm((s0, s1), t, max(self.synced[emb] or 0.0, self.synced[head] or 0.0))
        self.synced[emb] = self.synced[head] = end

    def update(self, params) -> None:
        """The optimizer step of every parameter (``params``: the builder's
        :meth:`~.timeline.Builder.all_params`, in order), as runs of one
        stage's parameters (:meth:`optimizer_steps`)."""
        flops, synced = self.b.flops, self.synced
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

    def finish(self) -> None:
        """After the backward pass: the policy's end of the step (the
        deferred syncs, the last buckets, unpacking them, the tied
        embedding, the optimizer)."""
        b = self.b
        self.policy.finish(b.pp, b.all_params(), self.tied_pairs())

    def tied_pairs(self) -> List[Tuple[ParamKey, int, ParamKey, int]]:
        """The tied embedding and head, each with its stage (none if the
        model unties them)."""
        b = self.b
        prof = b.profile
        if not prof.tied:
            return []
        emb = next(((EMB, None, i) for i, p in enumerate(prof.params[EMB])
                    if p.name == "wte"), None)
        head = next(((HEAD, None, i) for i, p in enumerate(prof.params[HEAD])
                     if p.name != "lnf_g" and p.name != "lnf_b" and
                     p.numel == prof.params[EMB][emb[2]].numel), None) if emb else None
        if emb is None or head is None:
            return []
        return [(emb, b.stage_of(0), head, b.stage_of(b.chunks - 1))]

    def optimizer_steps(self) -> List[tuple]:
        """The parameters in the order the optimizer updates them
        (:meth:`Builder.all_params`) as runs of consecutive ones of one
        stage, ``(update alone, stage, keys, items, FLOPs in the order they
        are added)``: where a parameter's optimizer is the update alone
        (ZeRO 0 and 3), ``items`` are the update times
        (:meth:`.engine.Timeline.compute_each`); else, per
        parameter, its items in order (:meth:`update_plan`: the template's
        ops before the update, the shard's slice, the update, the
        all-gather, the ops after) as :meth:`.engine.Timeline.chain`
        takes them. The same for every walk of a configuration: worked out
        once (:attr:`.state.Memo.optimizer_steps`)."""
        memo = self.b.memo
        if memo.optimizer_steps is not None:
            return memo.optimizer_steps
        steps: List[tuple] = []
        run: Optional[tuple] = None
        entries: Dict[Tuple[str, int], tuple] = {}      # the same in every layer
        for key, stage in self.b.all_params():
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
        b = self.b
        p = b.param(key)
        plan = update_plan(self.zero, self.dp)
        pre = p.opt_pre if plan.flatten else None
        cut = pc.slice if plan.slice else None
        gather = b.dp_time(CollectiveType.ALL_GATHER, pc.nbytes) if plan.gather else None
        post = p.opt_post if plan.reshape else None
        pc.plan = (pre, cut, pc.update, gather, post)
        return pc.plan
