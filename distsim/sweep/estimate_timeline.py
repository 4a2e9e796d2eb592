"""The estimator's step timeline: the items LowerSPMD would emit, in its
program order, on one rank per pipeline stage (see :mod:`.estimate`).

:class:`Builder` walks the pipeline schedule as
:meth:`~distsim.transforms.spmd.LowerSPMD._lower` does (the same schedules,
:func:`merge_order` for merge_tasks' order, sends flushed by estimated end)
and emits, per task, the per-layer times of a :class:`.estimate_profile.LayerProfile`
as items of a :class:`.estimate_engine.Timeline`, then the gradient sync,
tied-embedding all-reduce and optimizer as
:class:`~distsim.transforms.zero.GradientSync` emits them. Collectives are
timed by the simulator's analytical network, the small ops LowerSPMD adds by
the cost model (:mod:`.estimate_costs`). What is the same for every task or
layer (a chunk's summed block times, a block's gathers and reduce-scatters,
a parameter's update) is computed once per configuration.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

from ..errors import ConfigError
from ..ir.comm import CollectiveType
from ..ir.types import DType
from ..models.gpt import GPTConfig
from ..topology import Topology
from ..transforms.pipeline import (partition_balanced, partition_layers, schedule_tasks,
                                  task_dependencies)
from ..transforms.strategy import Strategy
from ..transforms.zero import scatters_each_microbatch, sync_route
from .estimate_costs import collectives, op_costs
from .estimate_engine import Timeline
from .estimate_profile import EMB, HEAD, LAYER, LayerProfile, Param

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
def merge_order(per_rank: List[List[Tuple[str, int, int]]], chunks: int,
                cost: Any) -> List[Tuple[int, Tuple[str, int, int], float, float]]:
    """The same order as :func:`distsim.transforms.pipeline.merge_tasks`
    (list scheduling: the rank whose next task can start earliest goes
    next, ties to the lowest rank), with a heap instead of a scan of every
    rank per task: O(tasks log ranks) for the long schedules of a search."""
    pos = [0] * len(per_rank)
    free = [0.0] * len(per_rank)
    done: Dict[Tuple[str, int, int], float] = {}
    waiting: Dict[Tuple[str, int, int], List[int]] = {}
    heap: List[Tuple[float, int]] = []
    out: List[Tuple[int, Tuple[str, int, int], float, float]] = []

    def offer(r: int) -> None:
        if pos[r] == len(per_rank[r]):
            return
        kind, mb, c = per_rank[r][pos[r]]
        deps = task_dependencies(kind, mb, c, chunks)
        start = free[r]
        for d in deps:
            end = done.get(d)
            if end is None:
                waiting.setdefault(d, []).append(r)
                return
            if end > start:
                start = end
        heapq.heappush(heap, (start, r))

    for r in range(len(per_rank)):
        offer(r)
    while heap:
        start, r = heapq.heappop(heap)
        task = per_rank[r][pos[r]]
        pos[r] += 1
        free[r] = done[task] = start + cost(task)
        out.append((r, task, start, done[task]))
        offer(r)
        for w in waiting.pop(task, ()):
            offer(w)
    if any(pos[r] < len(per_rank[r]) for r in range(len(per_rank))):
        raise ConfigError("pipeline schedule deadlocks (a task waits for one that never runs)")
    return out


def shard_size(n: int, parts: int) -> int:
    """Rank 0's ZeRO shard of ``n`` elements over ``parts`` ranks: the first
    (largest) of :func:`distsim.ir.ops_comm.split_sizes`."""
    return -(-n // parts)


class Builder:
    """Emits the items of one configuration in LowerSPMD's program order
    on a :class:`~.estimate_engine.Timeline`, which settles each as it
    comes: an item is its end time here, and ``ready`` (the latest end
    among an item's dependencies) is what the next one waits for."""

    def __init__(self, case: Case, profile: LayerProfile) -> None:
        self.case = case
        self.prof = profile
        S = self.S = case.strategy
        self.dp, self.tp, self.pp = S.dp, S.tp, S.pp
        self.M = case.microbatches
        self.C = S.pp * S.chunks
        if S.partition == "balanced":     # as LowerSPMD balances (by roofline time)
            costs = profile.partition_costs
            self.ranges = partition_balanced([costs.get(LAYER, 0.0)] * case.config.layers,
                                             self.C, first=costs.get(EMB, 0.0),
                                             last=costs.get(HEAD, 0.0))
        else:
            self.ranges = partition_layers(case.config.layers, self.C)
        self.chunk_of_layer = [c for c, (start, end) in enumerate(self.ranges)
                               for _ in range(start, end)]
        self.tl = Timeline(S.pp)
        self.colls = collectives(case.topology_name, case.collective_algo)
        self.costs = op_costs(case.topology_name)
        # every stage's data-parallel team sits on the hardware as stage 0's does
        self.dp_team = tuple(S.rank(d, 0, 0) for d in range(self.dp))
        self.zero = S.zero
        self.zero3 = self.zero == 3 and self.dp > 1
        self.bucket = None if S.bucket_mb is None else float(S.bucket_mb) * MB
        self.route = sync_route(self.zero, self.dp, self.bucket)   # as GradientSync._ready
        #: As GradientSync: see :func:`scatters_each_microbatch`.
        self.scatter_each = scatters_each_microbatch(self.zero, self.dp, self.bucket)
        self.master = DType.parse(str(case.config.master_dtype))
        self.flops = [0.0] * S.pp
        # memos: what is the same for every task / layer of the step
        self._dp_times: Dict[Tuple[CollectiveType, float], float] = {}
        self._blocks: Dict[Tuple[str, int], List[Tuple[str, Optional[int]]]] = {}
        self._task_times: Dict[tuple, Tuple[float, float, float]] = {}
        self._gathers: Dict[Tuple[str, str], float] = {}
        self._scatter: Dict[tuple, Tuple[float, float, float]] = {}
        self._updates: Dict[Tuple[str, int], Tuple[int, float, float]] = {}
        self._segments: Dict[str, list] = {}
        # gradient sync state (as GradientSync): end times of each gradient
        # when final and when synchronised
        self.final: Dict[tuple, float] = {}
        self.synced: Dict[tuple, float] = {}
        self.pending: Dict[int, List[tuple]] = {}
        self.pending_bytes: Dict[int, int] = {}
        self.deferred: Dict[int, List[tuple]] = {}
        self.unpack: List[tuple] = []

    # -- helpers ---------------------------------------------------------
    def stage_of(self, c: int) -> int:
        return c % self.pp

    def dp_time(self, kind: CollectiveType, nbytes: float) -> float:
        """A collective of every stage's data-parallel team (:attr:`dp_team`),
        memoised here: the shared cache's key would hash the whole team."""
        key = (kind, nbytes)
        hit = self._dp_times.get(key)
        if hit is None:
            hit = self._dp_times[key] = self.colls.time(kind, self.dp_team, nbytes)
        return hit

    def rank0(self, stage: int) -> int:
        return self.S.rank(0, stage, 0)

    def blocks_of(self, kind: str, c: int) -> List[Tuple[str, Optional[int]]]:
        """The blocks of chunk ``c`` in a forward / backward task's order
        (the same list every call: do not modify it)."""
        hit = self._blocks.get((kind, c))
        if hit is not None:
            return hit
        start, end = self.ranges[c]
        out: List[Tuple[str, Optional[int]]] = []
        if c == 0:
            out.append((EMB, None))
        out.extend((LAYER, layer) for layer in range(start, end))
        if c == self.C - 1:
            out.append((HEAD, None))
        out = self._blocks[(kind, c)] = out if kind == "F" else out[::-1]
        return out

    def small(self, stage: int, op_type: str, ins, outs, ready: float) -> float:
        t, f = self.costs.cost(op_type, ins, outs)
        self.flops[stage] += f
        return self.tl.compute(stage, t, ready)

    # -- tasks -------------------------------------------------------------
    def task_work(self, kind: str, c: int) -> float:
        blocks = self.prof.blocks
        total = 1.0
        for name, _ in self.blocks_of(kind, c):
            total += blocks[name].step_f_flops if kind == "F" else blocks[name].step_b_flops
        return total

    def gathers(self, stage: int, kind: str, block: str, ready: float) -> float:
        """ZeRO-3: the all-gathers of the parameters a block reads first in
        a forward / backward task (one item: they run back to back)."""
        t = self._gathers.get((kind, block))
        if t is None:
            blk = self.prof.blocks[block]
            t = 0.0
            for owner, i in (blk.f_gather if kind == "F" else blk.b_gather):
                p = self.prof.params[owner][i]
                t += self.dp_time(CollectiveType.ALL_GATHER, p.numel * p.dtype.itemsize)
            self._gathers[(kind, block)] = t
        return self.tl.comm((stage,), t, ready)

    def block_grads(self, block: str, layer: Optional[int]) -> List[tuple]:
        return [(block, layer, i) for i in range(len(self.prof.params[block]))]

    def scatter_costs(self, order, mb: int) -> Tuple[float, float, float]:
        """ZeRO 2/3 with a reduce-scatter per micro-batch: per task, (compute
        added: flattening each gradient, and accumulating into the 1/dp
        shard instead of the whole buffer; reduce-scatter time; their FLOPs).
        The same for every task over the same blocks in the same class of
        micro-batch (the first, a middle one, the last): computed once."""
        final = mb == self.M - 1 and self.M > 1
        memo = (tuple(name for name, _ in order), mb > 0, final)
        hit = self._scatter.get(memo)
        if hit is not None:
            return hit
        extra = flops = rs = 0.0
        for name, layer in order:
            for key in self.block_grads(name, layer):
                p = self.param(key)
                n, d = p.numel, p.dtype
                shard = shard_size(n, self.dp)
                t, f = self.costs.cost("reshape", [(n, d)], [(n, d)])
                extra += t
                flops += f
                rs += self.dp_time(CollectiveType.REDUCE_SCATTER, n * d.itemsize)
                ops = (["add"] if mb > 0 else []) + (["scale"] if final else [])
                for op in ops:        # on the shard, not the whole gradient
                    ins = [(n, d), (n, d)] if op == "add" else [(n, d)]
                    full = self.costs.cost(op, ins, [(n, d)])
                    part = self.costs.cost(op, [(shard, d)] * len(ins), [(shard, d)])
                    extra += part[0] - full[0]
                    flops += part[1] - full[1]
        hit = self._scatter[memo] = (extra, rs, flops)
        return hit

    def emit_task(self, stage: int, kind: str, mb: int, c: int, ready: float) -> float:
        order = self.blocks_of(kind, c)
        last_b = kind == "B" and mb == self.M - 1
        if last_b and not self.scatter_each:
            return self.emit_last_backward(stage, c, order, ready)
        if self.zero3:
            end = self._zero3_task(stage, kind, mb, order, ready)
        else:
            total, busy, fl = self._chunk_time(kind, c, mb)
            end = self._task(stage, kind, order, total, busy, fl, ready, self.tp > 1)
        if kind == "B" and self.scatter_each:
            extra, rs, extra_flops = self.scatter_costs(order, mb)
            self.flops[stage] += extra_flops
            if mb == 0:
                # nothing reads the first micro-batch's shards before the next
                # one: the reduce-scatters overlap the backward, in program order
                # on the communication stream
                end = self.tl.compute(stage, extra, end)
                synced = self.tl.comm((stage,), rs, ready)
            else:
                # each accumulation reads its reduce-scatter: the compute waits
                end = synced = self.tl.compute(stage, extra + rs, end, extra, holds_comm=True)
            if last_b:
                for name, layer in order:
                    for key in self.block_grads(name, layer):
                        self.final[key] = self.synced[key] = synced
        return end

    def _chunk_time(self, kind: str, c: int, mb: int) -> Tuple[float, float, float]:
        """A task's (time, busy time, FLOPs): its blocks' summed, once per
        chunk and class of micro-batch."""
        cls = 0 if kind == "F" or mb == 0 else (1 if mb == self.M - 1 else 2)
        hit = self._task_times.get((kind, c, cls))
        if hit is None:
            blocks = self.prof.blocks
            total = busy = fl = 0.0
            for name, _ in self.blocks_of(kind, c):
                t, b, f = self._block_time(blocks[name], kind, mb)
                total += t
                busy += b
                fl += f
            hit = self._task_times[(kind, c, cls)] = (total, busy, fl)
        return hit

    def _task(self, stage: int, kind: str, order, total: float, busy: float, fl: float,
              ready: float, holds: bool) -> float:
        self.flops[stage] += fl
        blocks = self.prof.blocks
        first, last = blocks[order[0][0]], blocks[order[-1][0]]
        pre = first.f_pre if kind == "F" else first.b_pre
        post = last.f_post if kind == "F" else last.b_post
        tl = self.tl
        if not holds or pre is None or post is None or pre + post >= busy:
            return tl.compute(stage, total, ready, busy, holds)
        # tensor-parallel collectives hold the communication stream from the
        # first to the last of them; the compute before and after runs alone
        head = tl.compute(stage, pre, ready)
        body = tl.compute(stage, total - pre - post, head, busy - pre - post, True)
        return tl.compute(stage, post, body)

    def _zero3_task(self, stage: int, kind: str, mb: int, order, ready: float) -> float:
        """ZeRO-3 (dp > 1): per block, its compute waits for its gathers;
        entering a block issues the gathers of it and of the next
        ``prefetch`` blocks not issued yet, gated on the compute before."""
        gathered: Dict[int, float] = {}
        prev = ready
        blocks = self.prof.blocks
        n = len(order)
        for i, (name, _) in enumerate(order):
            for j in range(i, min(n, i + 1 + self.S.prefetch)):
                if j not in gathered:
                    gathered[j] = self.gathers(stage, kind, order[j][0], prev)
            t, busy, fl = self._block_time(blocks[name], kind, mb)
            gate = gathered[i] if i else max(gathered[0], ready)
            prev = self._task(stage, kind, order[i:i + 1], t, busy, fl, gate, self.tp > 1)
        return prev

    def _block_time(self, blk, kind: str, mb: int) -> Tuple[float, float, float]:
        if kind == "F":
            return blk.f, blk.f_busy, blk.f_flops
        if mb == 0:
            return blk.b_first, blk.b_first_busy, blk.b_flops
        if mb == self.M - 1:
            return blk.b_last, blk.b_last_busy, blk.b_flops
        return blk.b_mid, blk.b_mid_busy, blk.b_flops

    def _segment_plan(self, name: str) -> list:
        """A block's op-level last backward as (kind, time, FLOPs, the
        entries it waits for, the entry a collective reads (-1: the last
        compute run before it), the parameter index of a final gradient)."""
        plan = self._segments.get(name)
        if plan is None:
            blk = self.prof.blocks[name]
            segs = blk.last if self.M > 1 else blk.only
            ctime = sum(s.time_s for s in segs if s.kind == "c") or 1.0
            index = {p.name: i for i, p in enumerate(self.prof.params[name])}
            plan = []
            for seg in segs:
                if seg.kind == "c":
                    plan.append(("c", seg.time_s, blk.b_flops * seg.time_s / ctime,
                                 tuple(d for d in seg.deps if d is not None), None, None))
                elif seg.kind == "t":
                    d = seg.deps[0] if seg.deps else None
                    plan.append(("t", seg.time_s, 0.0, (), -1 if d is None else d, None))
                else:
                    plan.append(("g", 0.0, 0.0, (), seg.deps[0] if seg.deps else -1,
                                 index[seg.param]))
            self._segments[name] = plan
        return plan

    def emit_last_backward(self, stage: int, c: int, order, ready: float) -> Optional[float]:
        """The last micro-batch's backward op by op, with the data-parallel
        sync of each gradient emitted where it becomes final."""
        tl = self.tl
        last: Optional[float] = None
        first = True
        gathered: Dict[int, float] = {}
        n = len(order)
        for k, (name, layer) in enumerate(order):
            g = 0.0
            if self.zero3:
                gate = last if last is not None else ready
                for j in range(k, min(n, k + 1 + self.S.prefetch)):
                    if j not in gathered:
                        gathered[j] = self.gathers(stage, "B", order[j][0], gate)
                g = gathered[k]
            local: Dict[int, float] = {}
            for i, (kind, time_s, fl, waits, src, param) in enumerate(self._segment_plan(name)):
                extra = g
                if first and ready > extra:
                    extra = ready
                if kind == "c":
                    self.flops[stage] += fl
                    for d in waits:
                        if local[d] > extra:
                            extra = local[d]
                    local[i] = last = tl.compute(stage, time_s, extra)
                    first = False
                elif kind == "t":
                    dep = local.get(src, 0.0) if src >= 0 else last
                    if dep is not None and dep > extra:
                        extra = dep
                    local[i] = tl.comm((stage,), time_s, extra)
                    first = False
                else:
                    self.ready((name, layer, param), stage,
                               local.get(src) if src >= 0 else last)
        return last

    # -- gradient sync (GradientSync) -----------------------------------------
    def param(self, key: tuple) -> Param:
        return self.prof.params[key[0]][key[2]]

    def grad_bytes(self, key: tuple) -> int:
        p = self.param(key)
        return p.numel * p.dtype.itemsize

    def ready(self, key: tuple, stage: int, end: Optional[float]) -> None:
        self.final[key] = end
        route = self.route
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
        held = self.pending_bytes[stage] = self.pending_bytes.get(stage, 0) + self.grad_bytes(key)
        if held >= self.bucket:
            self.flush(stage)

    def sync_one(self, key: tuple, stage: int) -> None:
        p = self.param(key)
        nbytes = self.grad_bytes(key)
        final = self.final[key] or 0.0
        if self.zero >= 2:
            flat = self.small(stage, "reshape", [(p.numel, p.dtype)], [(p.numel, p.dtype)],
                              final)
            self.synced[key] = self.tl.comm(
                (stage,), self.dp_time(CollectiveType.REDUCE_SCATTER, nbytes), flat)
        else:
            self.synced[key] = self.tl.comm(
                (stage,), self.dp_time(CollectiveType.ALL_REDUCE, nbytes), final)

    def flush(self, stage: int) -> None:
        bucket = self.pending.pop(stage, [])
        self.pending_bytes.pop(stage, None)
        if not bucket:
            return
        if len(bucket) == 1:
            self.sync_one(bucket[0], stage)
            return
        params = [self.param(k) for k in bucket]
        flats = [self.small(stage, "reshape", [(p.numel, p.dtype)], [(p.numel, p.dtype)],
                            self.final[k] or 0.0) for k, p in zip(bucket, params)]
        dtype = params[0].dtype
        total = sum(p.numel for p in params)
        cat = self.small(stage, "concat", [(p.numel, dtype) for p in params],
                         [(total, dtype)], max(flats))
        ar = self.tl.comm((stage,), self.dp_time(CollectiveType.ALL_REDUCE,
                                                 total * dtype.itemsize), cat)
        self.unpack.append((bucket, stage, ar, total, dtype))

    def finish(self) -> None:
        for stage in range(self.pp):
            for key in self.deferred.pop(stage, []):
                if self.zero >= 2:
                    self.sync_one(key, stage)
                else:
                    self.pending.setdefault(stage, []).append(key)
            self.flush(stage)
        for bucket, stage, ar, total, dtype in self.unpack:
            split = self.small(stage, "split", [(total, dtype)],
                               [(self.param(k).numel, dtype) for k in bucket], ar)
            for k in bucket:
                p = self.param(k)
                self.synced[k] = self.small(stage, "reshape", [(p.numel, p.dtype)],
                                            [(p.numel, p.dtype)], split)
        self.unpack = []
        self.tie()
        for key, stage in self.all_params():
            self.update(key, stage)

    def all_params(self) -> List[Tuple[tuple, int]]:
        """Every parameter with its stage, in the step's parameter order."""
        out = []
        L = self.case.config.layers
        for block, i in self.prof.param_order:
            if block == LAYER:
                continue
            if block == EMB:
                out.append(((EMB, None, i), self.stage_of(0)))
        for layer in range(L):
            c = self.chunk_of_layer[layer]
            for i in range(len(self.prof.params[LAYER])):
                out.append(((LAYER, layer, i), self.stage_of(c)))
        for block, i in self.prof.param_order:
            if block == HEAD:
                out.append(((HEAD, None, i), self.stage_of(self.C - 1)))
        return out

    def tie(self) -> None:
        if not self.prof.tied or self.pp == 1:
            return
        emb = next(((EMB, None, i) for i, p in enumerate(self.prof.params[EMB])
                    if p.name == "wte"), None)
        head = next(((HEAD, None, i) for i, p in enumerate(self.prof.params[HEAD])
                     if p.name != "lnf_g" and p.name != "lnf_b" and
                     p.numel == self.prof.params[EMB][emb[2]].numel), None) if emb else None
        if emb is None or head is None:
            return
        s0, s1 = self.stage_of(0), self.stage_of(self.C - 1)
        p = self.param(emb)
        n = shard_size(p.numel, self.dp) if self.zero >= 2 and self.dp > 1 else p.numel
        t = self.colls.time(CollectiveType.ALL_REDUCE, (self.rank0(s0), self.rank0(s1)),
                            n * p.dtype.itemsize)     # the synced gradient: a shard past ZeRO-1
        end = self.tl.comm((s0, s1), t, max(self.synced[emb] or 0.0, self.synced[head] or 0.0))
        self.synced[emb] = self.synced[head] = end

    def update_cost(self, block: str, index: int) -> Tuple[int, float, float]:
        """A parameter's ZeRO shard and its update ops' time and FLOPs on
        the shard (the same for the parameter in every layer: computed once)."""
        hit = self._updates.get((block, index))
        if hit is not None:
            return hit
        p = self.prof.params[block][index]
        n = p.numel
        shard = shard_size(n, self.dp) if self.zero >= 1 else n
        ratio = shard / n if n else 1.0
        launch = self.case.topology.device_spec.launch_overhead_s
        t = fl = 0.0
        for time_s, flops in p.opt_update:
            t += launch + max(0.0, time_s - launch) * ratio if time_s > 0 else 0.0
            fl += flops * ratio
        hit = self._updates[(block, index)] = (shard, t, fl)
        return hit

    def update(self, key: tuple, stage: int) -> None:
        """The optimizer of one parameter (GradientSync._update): the
        template's ops, the update ops shrunk to the ZeRO shard (their time
        beyond the launch overhead scales with the elements), the shard
        sliced out of the gradient and the new parameter all-gathered."""
        p = self.param(key)
        dp, zero = self.dp, self.zero
        n = p.numel
        shard, t, fl = self.update_cost(key[0], key[2])
        g = self.synced[key] or 0.0
        if zero >= 1 and not (zero >= 2 and dp > 1):
            g = self.tl.compute(stage, p.opt_pre, g)
            if dp > 1:
                g = self.small(stage, "slice", [(n, p.dtype)], [(shard, p.dtype)], g)
        self.flops[stage] += fl
        new = self.tl.compute(stage, t, g)
        if zero in (1, 2):
            if dp > 1:
                new = self.tl.comm((stage,), self.dp_time(CollectiveType.ALL_GATHER,
                                                          n * p.dtype.itemsize), new)
            self.tl.compute(stage, p.opt_post, new)

    # -- the whole step ----------------------------------------------------------
    def send_time(self, src: int, dst: int, nbytes: int) -> float:
        return self.colls.time(CollectiveType.SEND_RECV, (self.rank0(src), self.rank0(dst)), nbytes)

    def build(self) -> Timeline:
        S, C, M = self.S, self.C, self.M
        per_rank = schedule_tasks(S.schedule, S.pp, M, S.chunks)
        work = {(k, c): self.task_work(k, c) for k in ("F", "B") for c in range(C)}
        order = merge_order(per_rank, C, lambda task: work.get((task[0], task[2]), 1.0))
        ends: Dict[tuple, float] = {}
        recv: Dict[tuple, float] = {}     # the last arrival of a task's inputs
        pending: List[tuple] = []
        seq = 0

        def send(stage: int, kind: str, mb: int, c: int) -> None:
            if kind == "F" and c < C - 1:
                dst_c, sizes = c + 1, self.prof.forward_crossing
            elif kind == "B" and c > 0:
                dst_c, sizes = c - 1, self.prof.backward_crossing
            else:
                return
            dst = self.stage_of(dst_c)
            if dst == stage:
                return
            key = (kind, mb, dst_c)
            arrived = recv.get(key, 0.0)
            done = ends[(kind, mb, c)] or 0.0
            for nbytes in sizes:
                end = self.tl.comm((stage, dst), self.send_time(stage, dst, nbytes), done)
                if end > arrived:
                    arrived = end
            recv[key] = arrived

        for stage, (kind, mb, c), start, end in order:
            while pending and pending[0][0] <= start:
                _, _, args = heapq.heappop(pending)
                send(*args)
            ready = recv.get((kind, mb, c), 0.0)
            if kind == "B":
                f_end = ends[("F", mb, c)] or 0.0
                if f_end > ready:
                    ready = f_end
            ends[(kind, mb, c)] = self.emit_task(stage, kind, mb, c, ready)
            seq += 1
            heapq.heappush(pending, (end, seq, (stage, kind, mb, c)))
        while pending:
            _, _, args = heapq.heappop(pending)
            send(*args)
        self.finish()
        return self.tl
