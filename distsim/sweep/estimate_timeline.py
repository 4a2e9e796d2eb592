"""The estimator's step timeline: the items LowerSPMD would emit, in its
program order, on one rank per pipeline stage (see :mod:`.estimate`).

:class:`Builder` walks the pipeline schedule as
:meth:`~distsim.transforms.spmd.LowerSPMD._lower` does (the same schedules,
:func:`merge_order` for merge_tasks' order, sends flushed by estimated end)
and emits, per task, the per-layer times of a :class:`.estimate_profile.LayerProfile`
as :class:`.estimate_engine.Item` s, then the gradient sync, tied-embedding
all-reduce and optimizer as :class:`~distsim.transforms.zero.GradientSync`
emits them. Collectives are timed by the simulator's analytical network
(:class:`Collectives`), the small ops LowerSPMD adds by the cost model
(:class:`OpCosts`).
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Dict, List, Optional, Sequence, Tuple

import simpy

from ..cost.model import CostModel
from ..errors import ConfigError
from ..ir.comm import CollectiveType
from ..ir.core import Op, Value
from ..ir.types import DType, TensorType
from ..models.gpt import GPTConfig
from ..sim.collectives import run_collective
from ..sim.network import Network
from ..topology import Topology, load_topology
from ..transforms.pipeline import (partition_balanced, partition_layers, schedule_tasks,
                                  task_dependencies)
from ..transforms.strategy import Strategy
from ..transforms.zero import scatters_each_microbatch, sync_route
from .estimate_engine import Item, Timeline
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


# -- costs ----------------------------------------------------------------------------
class Collectives:
    """Analytical collective times on one topology, the simulator's own:
    each collective runs alone on an analytical network (no contention)."""

    def __init__(self, topology: Topology, algorithm: str) -> None:
        self.env = simpy.Environment()
        self.network = Network(self.env, topology, mode="analytical")
        self.algorithm = algorithm
        self.cache: Dict[tuple, float] = {}

    def time(self, kind: CollectiveType, ranks: Tuple[int, ...], nbytes: float) -> float:
        if len(ranks) < 2 or nbytes <= 0:
            return 0.0
        key = (kind, ranks, float(nbytes))
        hit = self.cache.get(key)
        if hit is None:
            start = self.env.now
            root = ranks[0] if kind is CollectiveType.SEND_RECV else None
            self.env.process(run_collective(self.env, self.network, kind, ranks, nbytes,
                                            root=root, algorithm=self.algorithm))
            self.env.run()
            hit = self.cache[key] = float(self.env.now - start)
        return hit


@lru_cache(maxsize=32)
def _collectives(topology: str, algorithm: str) -> Collectives:
    return Collectives(load_topology(topology), algorithm)


class OpCosts:
    """Costs of the small ops LowerSPMD adds around a step (reshape, slice,
    concat, split, AdamW, cast), from the cost model on stand-in ops of
    the same types and shapes."""

    def __init__(self, model: CostModel) -> None:
        self.model = model
        self.cache: Dict[tuple, Tuple[float, float]] = {}

    def cost(self, op_type: str, ins: Sequence[Tuple[int, DType]],
             outs: Sequence[Tuple[int, DType]], attrs: Optional[Dict[str, Any]] = None
             ) -> Tuple[float, float]:
        key = (op_type, tuple(ins), tuple(outs))
        hit = self.cache.get(key)
        if hit is None:
            vin = [Value(f"i{i}", TensorType((max(n, 1),), d, 0)) for i, (n, d) in enumerate(ins)]
            vout = [Value(f"o{i}", TensorType((max(n, 1),), d, 0))
                    for i, (n, d) in enumerate(outs)]
            c = self.model.op_cost(Op(op_type, vin, vout, dict(attrs or {})))
            hit = self.cache[key] = (c.time_s, c.flops)
        return hit


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


def split_sizes(n: int, parts: int) -> List[int]:
    base, extra = divmod(n, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


class Builder:
    """Emits the items of one configuration in LowerSPMD's program order."""

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
        self.tl = Timeline(S.pp)
        self.colls = _collectives(case.topology_name, case.collective_algo)
        self.costs = OpCosts(CostModel(case.topology.device_spec))
        self.zero = S.zero
        self.bucket = None if S.bucket_mb is None else float(S.bucket_mb) * MB
        self.master = DType.parse(str(case.config.master_dtype))
        self.flops = [0.0] * S.pp
        # gradient sync state (as GradientSync)
        self.final: Dict[tuple, Item] = {}
        self.synced: Dict[tuple, Item] = {}
        self.pending: Dict[int, List[tuple]] = {}
        self.deferred: Dict[int, List[tuple]] = {}
        self.unpack: List[tuple] = []

    # -- helpers ---------------------------------------------------------
    def stage_of(self, c: int) -> int:
        return c % self.pp

    def team_dp(self, stage: int) -> Tuple[int, ...]:
        # every stage's data-parallel team sits on the hardware as stage 0's does
        return tuple(self.S.rank(d, 0, 0) for d in range(self.dp))

    def rank0(self, stage: int) -> int:
        return self.S.rank(0, stage, 0)

    def blocks_of(self, kind: str, c: int) -> List[Tuple[str, Optional[int]]]:
        start, end = self.ranges[c]
        out: List[Tuple[str, Optional[int]]] = []
        if c == 0:
            out.append((EMB, None))
        out.extend((LAYER, layer) for layer in range(start, end))
        if c == self.C - 1:
            out.append((HEAD, None))
        return out if kind == "F" else out[::-1]

    def params_of(self, block: str, layer: Optional[int]) -> List[Tuple[tuple, Param]]:
        return [((block, layer, i), p) for i, p in enumerate(self.prof.params[block])]

    def small(self, stage: int, op_type: str, ins, outs, deps, label: str) -> Item:
        t, f = self.costs.cost(op_type, ins, outs)
        self.flops[stage] += f
        return self.tl.compute(stage, t, deps, flops=f, label=label)

    # -- tasks -------------------------------------------------------------
    def task_work(self, kind: str, c: int) -> float:
        blocks = self.prof.blocks
        total = 1.0
        for name, _ in self.blocks_of(kind, c):
            total += blocks[name].step_f_flops if kind == "F" else blocks[name].step_b_flops
        return total

    def gathers(self, stage: int, kind: str, block: str, layer: Optional[int],
                deps) -> Item:
        """ZeRO-3: the all-gathers of the parameters a block reads first in
        a forward / backward task (one item: they run back to back)."""
        blk = self.prof.blocks[block]
        team = self.team_dp(stage)
        t = 0.0
        for owner, i in (blk.f_gather if kind == "F" else blk.b_gather):
            p = self.prof.params[owner][i]
            t += self.colls.time(CollectiveType.ALL_GATHER, team, p.numel * p.dtype.itemsize)
        return self.tl.comm([stage], t, deps, label=f"zero3 gather {block}{layer}")

    @property
    def scatter_each(self) -> bool:
        """As GradientSync: see :func:`scatters_each_microbatch`."""
        return scatters_each_microbatch(self.zero, self.dp, self.bucket)

    def block_grads(self, block: str, layer: Optional[int]) -> List[tuple]:
        return [(block, layer, i) for i in range(len(self.prof.params[block]))]

    def scatter_costs(self, stage: int, order, mb: int) -> Tuple[float, float, float]:
        """ZeRO 2/3 with a reduce-scatter per micro-batch: per task, (compute
        added: flattening each gradient, and accumulating into the 1/dp
        shard instead of the whole buffer; reduce-scatter time; their FLOPs)."""
        extra = flops = rs = 0.0
        team = self.team_dp(stage)
        final = mb == self.M - 1 and self.M > 1
        for name, layer in order:
            for key in self.block_grads(name, layer):
                p = self.param(key)
                n, d = p.numel, p.dtype
                shard = split_sizes(n, self.dp)[0]
                t, f = self.costs.cost("reshape", [(n, d)], [(n, d)])
                extra += t
                flops += f
                rs += self.colls.time(CollectiveType.REDUCE_SCATTER, team, n * d.itemsize)
                ops = (["add"] if mb > 0 else []) + (["scale"] if final else [])
                for op in ops:        # on the shard, not the whole gradient
                    ins = [(n, d), (n, d)] if op == "add" else [(n, d)]
                    full = self.costs.cost(op, ins, [(n, d)])
                    part = self.costs.cost(op, [(shard, d)] * len(ins), [(shard, d)])
                    extra += part[0] - full[0]
                    flops += part[1] - full[1]
        return extra, rs, flops

    def emit_task(self, stage: int, kind: str, mb: int, c: int, deps: List[Item]) -> Item:
        blocks = self.prof.blocks
        order = self.blocks_of(kind, c)
        holds = self.tp > 1
        last_b = kind == "B" and mb == self.M - 1
        if last_b and not self.scatter_each:
            return self.emit_last_backward(stage, c, order, deps)
        label = f"{kind}{mb} c{c}"
        scatter = kind == "B" and self.scatter_each
        extra = rs = extra_flops = 0.0
        if scatter:
            extra, rs, extra_flops = self.scatter_costs(stage, order, mb)
        if self.zero == 3 and self.dp > 1:
            item = self._zero3_task(stage, kind, mb, c, order, deps, label)
        else:
            total = busy = fl = 0.0
            for name, _ in order:
                t, b, f = self._block_time(blocks[name], kind, mb)
                total += t
                busy += b
                fl += f
            item = self._task(stage, kind, order, total, busy, fl, deps, label, holds)
        if scatter:
            self.flops[stage] += extra_flops
            ready = item
            if mb == 0:
                # nothing reads the first micro-batch's shards before the next
                # one: the reduce-scatters overlap the backward, in program order
                # on the communication stream
                item = self.tl.compute(stage, extra, [item], flops=extra_flops, label=label)
                ready = self.tl.comm([stage], rs, deps, label=f"{label} grad reduce-scatter")
            else:
                # each accumulation reads its reduce-scatter: the compute waits
                item = ready = self.tl.compute(stage, extra + rs, [item], extra, extra_flops,
                                               label, holds_comm=True)
            if last_b:
                for name, layer in order:
                    for key in self.block_grads(name, layer):
                        self.final[key] = self.synced[key] = ready
        return item

    def _task(self, stage: int, kind: str, order, total: float, busy: float, fl: float,
              deps, label: str, holds: bool) -> Item:
        self.flops[stage] += fl
        blocks = self.prof.blocks
        first, last = blocks[order[0][0]], blocks[order[-1][0]]
        pre = first.f_pre if kind == "F" else first.b_pre
        post = last.f_post if kind == "F" else last.b_post
        if not holds or pre is None or post is None or pre + post >= busy:
            return self.tl.compute(stage, total, deps, busy, fl, label, holds)
        # tensor-parallel collectives hold the communication stream from the
        # first to the last of them; the compute before and after runs alone
        share = fl / busy if busy else 0.0
        head = self.tl.compute(stage, pre, deps, flops=pre * share, label=label)
        body = self.tl.compute(stage, total - pre - post, [head], busy - pre - post,
                               (busy - pre - post) * share, label, True)
        return self.tl.compute(stage, post, [body], flops=post * share, label=label)

    def _zero3_task(self, stage: int, kind: str, mb: int, c: int, order, deps,
                    label: str) -> Item:
        """ZeRO-3 (dp > 1): per block, its compute waits for its gathers;
        entering a block issues the gathers of it and of the next
        ``prefetch`` blocks not issued yet, gated on the compute before."""
        items: List[Item] = []
        gathered: Dict[int, Item] = {}
        prev: Optional[Item] = None
        for i, (name, layer) in enumerate(order):
            gate = [prev] if prev is not None else deps
            for j in range(i, min(len(order), i + 1 + self.S.prefetch)):
                if j not in gathered:
                    gathered[j] = self.gathers(stage, kind, order[j][0], order[j][1], gate)
            t, busy, fl = self._block_time(self.prof.blocks[name], kind, mb)
            prev = self._task(stage, kind, [(name, layer)], t, busy, fl,
                              [gathered[i]] + (deps if i == 0 else []), f"{label} {name}",
                              self.tp > 1)
            items.append(prev)
        return prev

    def _block_time(self, blk, kind: str, mb: int) -> Tuple[float, float, float]:
        if kind == "F":
            return blk.f, blk.f_busy, blk.f_flops
        if mb == 0:
            return blk.b_first, blk.b_first_busy, blk.b_flops
        if mb == self.M - 1:
            return blk.b_last, blk.b_last_busy, blk.b_flops
        return blk.b_mid, blk.b_mid_busy, blk.b_flops

    def emit_last_backward(self, stage: int, c: int, order, deps: List[Item]) -> Item:
        """The last micro-batch's backward op by op, with the data-parallel
        sync of each gradient emitted where it becomes final."""
        tl = self.tl
        last: Optional[Item] = None
        first = True
        zero3 = self.zero == 3 and self.dp > 1
        gathered: Dict[int, Item] = {}
        for k, (name, layer) in enumerate(order):
            blk = self.prof.blocks[name]
            segs = blk.last if self.M > 1 else blk.only
            ctime = sum(s.time_s for s in segs if s.kind == "c") or 1.0
            g = None
            if zero3:
                gate = [last] if last is not None else deps
                for j in range(k, min(len(order), k + 1 + self.S.prefetch)):
                    if j not in gathered:
                        gathered[j] = self.gathers(stage, "B", order[j][0], order[j][1], gate)
                g = gathered[k]
            index = {p.name: i for i, p in enumerate(self.prof.params[name])}
            local: Dict[int, Item] = {}
            for i, seg in enumerate(segs):
                extra = (deps if first else []) + ([g] if g is not None else [])
                if seg.kind == "c":
                    fl = blk.b_flops * seg.time_s / ctime
                    self.flops[stage] += fl
                    item = tl.compute(stage, seg.time_s,
                                      [local[d] for d in seg.deps if d is not None] + extra,
                                      flops=fl, label=f"B{self.M - 1} c{c} {name}{layer}")
                    local[i] = last = item
                    first = False
                elif seg.kind == "t":
                    d = seg.deps[0] if seg.deps else None
                    src = local.get(d) if d is not None else last
                    local[i] = tl.comm([stage], seg.time_s, [src] + extra,
                                       label=f"tp {name}{layer}")
                    first = False
                else:
                    key = (name, layer, index[seg.param])
                    self.ready(key, stage, local.get(seg.deps[0]) if seg.deps else last)
        return last

    # -- gradient sync (GradientSync) -----------------------------------------
    def param(self, key: tuple) -> Param:
        return self.prof.params[key[0]][key[2]]

    def grad_bytes(self, key: tuple) -> int:
        p = self.param(key)
        return p.numel * p.dtype.itemsize

    def ready(self, key: tuple, stage: int, item: Optional[Item]) -> None:
        self.final[key] = item
        route = sync_route(self.zero, self.dp, self.bucket)   # as GradientSync._ready
        if route == "local":
            self.synced[key] = item
            return
        if route == "deferred":
            self.deferred.setdefault(stage, []).append(key)
            return
        if route == "each":
            self.sync_one(key, stage)
            return
        bucket = self.pending.setdefault(stage, [])
        bucket.append(key)
        if sum(self.grad_bytes(k) for k in bucket) >= self.bucket:
            self.flush(stage)

    def sync_one(self, key: tuple, stage: int) -> None:
        p = self.param(key)
        nbytes = self.grad_bytes(key)
        team = self.team_dp(stage)
        if self.zero >= 2:
            flat = self.small(stage, "reshape", [(p.numel, p.dtype)], [(p.numel, p.dtype)],
                              [self.final[key]], "grad flat")
            self.synced[key] = self.tl.comm(
                [stage], self.colls.time(CollectiveType.REDUCE_SCATTER, team, nbytes), [flat],
                label="grad reduce-scatter")
        else:
            self.synced[key] = self.tl.comm(
                [stage], self.colls.time(CollectiveType.ALL_REDUCE, team, nbytes),
                [self.final[key]], label="grad all-reduce")

    def flush(self, stage: int) -> None:
        bucket = self.pending.pop(stage, [])
        if not bucket:
            return
        if len(bucket) == 1:
            self.sync_one(bucket[0], stage)
            return
        flats = [self.small(stage, "reshape", [(self.param(k).numel, self.param(k).dtype)],
                            [(self.param(k).numel, self.param(k).dtype)], [self.final[k]],
                            "bucket flat") for k in bucket]
        dtype = self.param(bucket[0]).dtype
        total = sum(self.param(k).numel for k in bucket)
        cat = self.small(stage, "concat", [(self.param(k).numel, dtype) for k in bucket],
                         [(total, dtype)], flats, "bucket concat")
        ar = self.tl.comm([stage], self.colls.time(CollectiveType.ALL_REDUCE, self.team_dp(stage),
                                                   total * dtype.itemsize), [cat],
                          label="bucket all-reduce")
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
                               [(self.param(k).numel, dtype) for k in bucket], [ar], "unpack")
            for k in bucket:
                p = self.param(k)
                self.synced[k] = self.small(stage, "reshape", [(p.numel, p.dtype)],
                                            [(p.numel, p.dtype)], [split], "unpack")
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
            c = next(k for k, (s, e) in enumerate(self.ranges) if s <= layer < e)
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
        n = split_sizes(p.numel, self.dp)[0] if self.zero >= 2 and self.dp > 1 else p.numel
        t = self.colls.time(CollectiveType.ALL_REDUCE, (self.rank0(s0), self.rank0(s1)),
                            n * p.dtype.itemsize)     # the synced gradient: a shard past ZeRO-1
        item = self.tl.comm([s0, s1], t, [self.synced[emb], self.synced[head]],
                            label="tied embedding all-reduce")
        self.synced[emb] = self.synced[head] = item

    def update(self, key: tuple, stage: int) -> None:
        """The optimizer of one parameter (GradientSync._update): the
        template's ops, the update ops shrunk to the ZeRO shard (their time
        beyond the launch overhead scales with the elements), the shard
        sliced out of the gradient and the new parameter all-gathered."""
        p = self.param(key)
        dp, zero = self.dp, self.zero
        n = p.numel
        shard = split_sizes(n, dp)[0] if zero >= 1 else n
        ratio = shard / n if n else 1.0
        launch = self.case.topology.device_spec.launch_overhead_s
        g = self.synced[key]
        if zero >= 1 and not (zero >= 2 and dp > 1):
            g = self.tl.compute(stage, p.opt_pre, [g], label="opt flat")
            if dp > 1:
                g = self.small(stage, "slice", [(n, p.dtype)], [(shard, p.dtype)], [g],
                               "opt shard")
        t = fl = 0.0
        for time_s, flops in p.opt_update:
            t += launch + max(0.0, time_s - launch) * ratio if time_s > 0 else 0.0
            fl += flops * ratio
        self.flops[stage] += fl
        new = self.tl.compute(stage, t, [g], flops=fl, label="optimizer")
        if zero in (1, 2):
            if dp > 1:
                new = self.tl.comm([stage], self.colls.time(CollectiveType.ALL_GATHER,
                                                            self.team_dp(stage),
                                                            n * p.dtype.itemsize),
                                   [new], label="param all-gather")
            self.tl.compute(stage, p.opt_post, [new], label="param")

    # -- the whole step ----------------------------------------------------------
    def send_time(self, src: int, dst: int, nbytes: int) -> float:
        return self.colls.time(CollectiveType.SEND_RECV, (self.rank0(src), self.rank0(dst)), nbytes)

    def build(self) -> Timeline:
        S, C, M = self.S, self.C, self.M
        per_rank = schedule_tasks(S.schedule, S.pp, M, S.chunks)
        work = {(k, c): self.task_work(k, c) for k in ("F", "B") for c in range(C)}
        order = merge_order(per_rank, C, lambda task: work.get((task[0], task[2]), 1.0))
        ends: Dict[tuple, Item] = {}
        recv: Dict[tuple, List[Item]] = {}
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
            items = recv.setdefault((kind, mb, dst_c), [])
            for nbytes in sizes:
                items.append(self.tl.comm([stage, dst], self.send_time(stage, dst, nbytes),
                                          [ends[(kind, mb, c)]], label=f"send {kind}{mb} c{c}"))

        for stage, (kind, mb, c), start, end in order:
            while pending and pending[0][0] <= start:
                _, _, args = heapq.heappop(pending)
                send(*args)
            deps = list(recv.get((kind, mb, c), []))
            if kind == "B":
                deps.append(ends[("F", mb, c)])
            ends[(kind, mb, c)] = self.emit_task(stage, kind, mb, c, deps)
            seq += 1
            heapq.heappush(pending, (end, seq, (stage, kind, mb, c)))
        while pending:
            _, _, args = heapq.heappop(pending)
            send(*args)
        self.finish()
        return self.tl
