"""The estimator's gradient synchronisation and optimizer step, as
:class:`~distsim.transforms.zero.GradientSync` emits them (see
:mod:`.timeline`, whose :class:`~.timeline.Builder` owns a
:class:`StepSync`).

As each parameter's last gradient becomes final (:meth:`StepSync.ready`),
it is synchronised over the data-parallel team as
:func:`~distsim.transforms.zero.sync_route` says (all-reduce, ZeRO 2/3
reduce-scatter, in buckets, or after the backward pass); after the backward
pass come the tied-embedding all-reduce and, per parameter, the optimizer
(the ZeRO shard sliced out, the update, the new parameter all-gathered).
What the step charges a parameter is the same for that parameter in every
layer, so it is worked out once per configuration (:class:`ParamCost`).
"""
from __future__ import annotations

from functools import reduce
from operator import add
from typing import TYPE_CHECKING, Dict, List, Optional, Tuple

from ..ir.comm import CollectiveType
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
        p = b.prof.params[block][index]
        n, d = p.numel, p.dtype
        self.numel, self.dtype = n, d
        self.nbytes = n * d.itemsize
        self.shard = shard_size(n, b.dp) if b.zero >= 1 else n
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
            if b.zero >= 1 and b.dp > 1 else (0.0, 0.0)
        self.sync: Optional[float] = None
        self.plan: Optional[tuple] = None


class StepSync:
    """Gradient sync state of one step (as GradientSync): each gradient's
    end time when final and when synchronised, the buckets pending per
    stage, the syncs deferred to after the backward pass."""

    def __init__(self, b: "Builder") -> None:
        self.b = b
        self.tl = b.tl
        self.zero, self.dp = b.zero, b.dp
        self.final: Dict[ParamKey, Optional[float]] = {}
        self.synced: Dict[ParamKey, Optional[float]] = {}
        self.pending: Dict[int, List[ParamKey]] = {}
        self.pending_bytes: Dict[int, int] = {}
        self.deferred: Dict[int, List[ParamKey]] = {}
        self.unpack: List[tuple] = []
        self.buckets: Dict[int, List[int]] = {}     # stage -> bytes of each flat bucket
        self._costs: Dict[Tuple[str, int], ParamCost] = b.memo.param_costs
        #: each gradient all-reduced on its own (ZeRO 0/1, no buckets): the
        #: op-by-op backward's common case (:meth:`ready_and_synced`)
        self._each_all_reduce = b.route == "each" and self.zero < 2

    def cost(self, block: str, index: int) -> ParamCost:
        hit = self._costs.get((block, index))
        if hit is None:
            hit = self._costs[(block, index)] = ParamCost(self.b, block, index)
        return hit

    def ready(self, key: ParamKey, stage: int, end: Optional[float]) -> None:
        """The gradient ``key`` is final at ``end``: synchronise it as
        GradientSync._ready routes it."""
        self.final[key] = end
        route = self.b.route
        if route == "local":
            self.synced[key] = end
            return
        if route == "deferred":
            self.deferred.setdefault(stage, []).append(key)
            return
        if route == "each":
            self.sync_one(key, stage)
            return
        self.pending.setdefault(stage, []).append(key)
        held = self.pending_bytes.get(stage, 0) + self.cost(key[0], key[2]).nbytes
        self.pending_bytes[stage] = held
        if held >= self.b.bucket:
            self.flush(stage)

    def ready_and_synced(self, key: ParamKey, stage: int, end: Optional[float]) -> float:
        """:meth:`ready`, then the gradient's synchronised end (0.0 while it
        waits for a bucket or the backward pass's end). Each gradient
        all-reduced on its own, once its collective is timed, takes the
        same steps as :meth:`scatter` without the calls between (an
        estimate syncs every gradient of the model this way)."""
        if self._each_all_reduce:
            pc = self._costs.get((key[0], key[2]))
            if pc is not None and pc.sync is not None:
                self.final[key] = end
                synced = self.synced[key] = self.tl.comm_on(stage, pc.sync, end or 0.0)
                return synced
        self.ready(key, stage, end)
        return self.synced.get(key) or 0.0

    def sync_one(self, key: ParamKey, stage: int) -> None:
        self.synced[key] = self.scatter((key[0], key[2]), stage, self.final[key])

    def scatter(self, param: Tuple[str, int], stage: int, end: Optional[float]) -> float:
        """The data-parallel sync of one gradient produced at ``end``
        (``param``: block, index): ZeRO 2/3 flatten it and reduce-scatter
        it, the others all-reduce it; returns the sync's end."""
        pc = self.cost(*param)
        final = end or 0.0
        if pc.sync is None:
            kind = CollectiveType.REDUCE_SCATTER if self.zero >= 2 else CollectiveType.ALL_REDUCE
            pc.sync = self.b.dp_time(kind, pc.nbytes)
        if self.zero >= 2:
            t, f = pc.flat
            self.b.flops[stage] += f
            final = self.tl.compute(stage, t, final)
        return self.tl.comm_on(stage, pc.sync, final)

    def flush(self, stage: int) -> None:
        bucket = self.pending.pop(stage, [])
        self.pending_bytes.pop(stage, None)
        if not bucket:
            return
        if len(bucket) == 1:
            self.sync_one(bucket[0], stage)
            return
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

    def finish(self) -> None:
        """After the backward pass: the deferred syncs, the last buckets,
        unpacking the buckets, the tied embedding, the optimizer."""
        b = self.b
        for stage in range(b.pp):
            b.settle_units(stage)
            queued: List[Tuple[float, float, float, int, int]] = []
            for key in self.deferred.pop(stage, []):
                if self.zero >= 2:
                    self.sync_one(key, stage)
                    pc = self.cost(key[0], key[2])
                    end = self.synced[key] or 0.0
                    flat_end = self.tl.free[2 * stage]
                    queued.append((flat_end - pc.flat[0], end - pc.sync, end, pc.nbytes,
                                   pc.shard * pc.dtype.itemsize))
                else:
                    self.pending.setdefault(stage, []).append(key)
            if queued:
                held = queued_peak(queued)
                if held > b.memo.flat_queued.get(stage, 0):
                    b.memo.flat_queued[stage] = held
            self.flush(stage)
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
        self.tie()
        flops, synced = b.flops, self.synced
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

    def tie(self) -> None:
        b = self.b
        prof = b.prof
        if not prof.tied or b.pp == 1:
            return
        emb = next(((EMB, None, i) for i, p in enumerate(prof.params[EMB])
                    if p.name == "wte"), None)
        head = next(((HEAD, None, i) for i, p in enumerate(prof.params[HEAD])
                     if p.name != "lnf_g" and p.name != "lnf_b" and
                     p.numel == prof.params[EMB][emb[2]].numel), None) if emb else None
        if emb is None or head is None:
            return
        s0, s1 = b.stage_of(0), b.stage_of(b.C - 1)
        p = b.param(emb)
        n = shard_size(p.numel, self.dp) if self.zero >= 2 and self.dp > 1 else p.numel
        t = b.colls.time(CollectiveType.ALL_REDUCE, (b.rank0(s0), b.rank0(s1)),
                         n * p.dtype.itemsize)     # the synced gradient: a shard past ZeRO-1
        end = self.tl.comm((s0, s1), t, max(self.synced[emb] or 0.0, self.synced[head] or 0.0))
        self.synced[emb] = self.synced[head] = end

    def update_plan(self, key: ParamKey, pc: ParamCost) -> tuple:
        """The optimizer of one parameter, as GradientSync._update emits it:
        ``(the template's ops before the update, or None (ZeRO-1, or ZeRO 2/3
        without data parallelism); slicing the shard out of the gradient
        (time, FLOPs), or None; the update ops shrunk to the ZeRO shard
        (time, FLOPs); the all-gather of the new parameter, or None; the
        template's ops after it, or None (ZeRO 0 and 3))``. The same for a
        parameter in every layer: kept in its :class:`ParamCost` (``pc``)."""
        b = self.b
        p = b.param(key)
        dp, zero = self.dp, self.zero
        pre = cut = gather = post = None
        if zero >= 1 and not (zero >= 2 and dp > 1):
            pre = p.opt_pre
            if dp > 1:
                cut = pc.slice
        if zero in (1, 2):
            if dp > 1:
                gather = b.dp_time(CollectiveType.ALL_GATHER, pc.nbytes)
            post = p.opt_post
        pc.plan = (pre, cut, pc.update, gather, post)
        return pc.plan
