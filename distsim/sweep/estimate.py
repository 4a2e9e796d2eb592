"""A fast estimate of a GPT training step: milliseconds instead of a build
and a simulation.

    from distsim.sweep.estimate import estimate
    row = estimate({"model": "gpt3-175b", "topology": "dgx-a100-x128",
                    "tp": 8, "pp": 16, "micro_batch": 1})
    row["step_time_s"], row["max_peak_memory_bytes"], row["oom"]

:func:`estimate` takes the options of ``distsim simulate`` and returns the
columns of a sweep row (:data:`distsim.sweep.point.METRICS` and the
resolved batch sizes). It never builds the whole program:

1. **Per-layer times** (:mod:`.estimate_profile`): a two-layer copy of the
   model on one tensor-parallel group, lowered and simulated for real
   (cost model, tensor-parallel collectives on the topology, analytical
   network), cached per model shape / tp / sp / recompute / micro-batch.
2. **The pipeline** (:mod:`.estimate_engine`): one rank per stage, its
   compute and communication streams, and the items :class:`LowerSPMD`
   would emit, in the same program order (the same
   :func:`~distsim.transforms.pipeline.schedule_tasks` and
   :func:`~distsim.transforms.pipeline.merge_tasks`, sends flushed the same
   way): each forward / backward task as one item (holding the
   communication stream when it has tensor-parallel collectives), the last
   backward of each chunk op by op with the data-parallel gradient sync
   emitted where LowerSPMD emits it (per gradient, in buckets, or after the
   backward; all-reduce or ZeRO reduce-scatter), the tied-embedding
   all-reduce, the optimizer per parameter (ZeRO shards, the all-gather
   after the update), ZeRO-3 parameter gathers per layer and task, and
   pipeline send/receives. Collective times are the simulator's
   analytical ones on the real teams (:func:`run_collective` on an
   analytical :class:`~distsim.sim.network.Network`).
3. **Memory** (:func:`estimate_memory`): weights, gradients and optimizer
   state per rank from the parameter shapes and the ZeRO stage, plus the
   saved activations of the micro-batches in flight on each stage
   (:func:`~distsim.transforms.memory_model.saved_activation_bytes` of the
   template) and the template's transient peak.

How close it comes to the full simulation is measured by
``tests/sweep/test_estimate.py`` (see the README's "Sweeps and search").
Only the ``gpt`` family is supported; other models are a ConfigError.
"""
from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import simpy

from ..cost.model import CostModel
from ..errors import ConfigError
from ..ir.comm import CollectiveType
from ..ir.core import Op, Value
from ..ir.types import DType, TensorType
from ..models import load_model_config
from ..models.gpt import GPTConfig
from ..models.gpt_family import gpt_config, resolve_batch, validate
from ..report.training_metrics import model_flops_per_step
from ..sim.collectives import run_collective
from ..sim.network import Network
from ..topology import Topology, load_topology
from ..transforms.pipeline import merge_tasks, partition_layers, schedule_tasks
from ..transforms.strategy import Strategy
from .estimate_engine import Item, Timeline
from .estimate_profile import EMB, HEAD, LAYER, LayerProfile, Param, layer_profile

MB = 1 << 20
#: Options the estimate ignores (they change how a simulation is run, not
#: what it computes).
IGNORED = ("network_mode", "max_trace_records", "max_ops", "symmetry", "coarsen", "fidelity")
_MODEL_FIELDS = ("layers", "hidden", "batch", "dtype", "seq", "heads", "kv_heads", "ffn", "vocab")


# -- resolving the options ---------------------------------------------------------
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


def resolve(options: Mapping[str, Any]) -> Case:
    """Resolve ``distsim simulate`` options as :func:`distsim.api.build_program`
    does, and check them as the GPT family does (a ConfigError otherwise)."""
    opts = {k: v for k, v in options.items() if k not in IGNORED}
    model = opts.pop("model", "gpt")
    topology = opts.pop("topology", "dgx-a100")
    algo = str(opts.pop("collective_algo", "auto") or "auto")
    config = load_model_config(model)
    if config.get("family") != "gpt":
        raise ConfigError(f"estimate: model '{config.get('name')}' is of the "
                          f"'{config.get('family')}' family; the estimator covers GPT models "
                          "(use fidelity: simulate)")
    for key in _MODEL_FIELDS:
        value = opts.pop(key, None)
        if value is not None:
            if key == "batch":
                key = "global_batch"
            elif key == "dtype":
                value = DType.parse(str(value)).value
            config[key] = value
    for key in ("train", "input_shapes"):
        opts.pop(key, None)
    unknown = set(opts) - set(Strategy.__dataclass_fields__)
    if unknown:
        raise ConfigError(f"estimate: unknown option(s) {', '.join(sorted(unknown))}")
    if not isinstance(topology, str):
        raise ConfigError("estimate: topology must be a name or a .yaml path")
    topo = load_topology(topology)
    strategy = Strategy.from_mapping(opts).resolved(topo.num_devices)
    if strategy.num_devices != topo.num_devices:
        raise ConfigError(f"dp x tp x pp = {strategy.dp} x {strategy.tp} x {strategy.pp} = "
                          f"{strategy.num_devices} does not match the {topo.num_devices} devices "
                          f"of topology '{topo.name}'")
    c = gpt_config(config)
    m = validate(c, strategy)
    c, _ = resolve_batch(c, strategy)
    return Case(config, c, strategy, m, topo, topology, algo)


# -- costs ----------------------------------------------------------------------------
class _Collectives:
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
def _collectives(topology: str, algorithm: str) -> _Collectives:
    return _Collectives(load_topology(topology), algorithm)


class _OpCosts:
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
def _split_sizes(n: int, parts: int) -> List[int]:
    base, extra = divmod(n, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


class _Builder:
    """Emits the items of one configuration in LowerSPMD's program order."""

    def __init__(self, case: Case, profile: LayerProfile) -> None:
        self.case = case
        self.prof = profile
        S = self.S = case.strategy
        self.dp, self.tp, self.pp = S.dp, S.tp, S.pp
        self.M = case.microbatches
        self.C = S.pp * S.chunks
        self.ranges = partition_layers(case.config.layers, self.C)
        self.tl = Timeline(S.pp)
        self.colls = _collectives(case.topology_name, case.collective_algo)
        self.costs = _OpCosts(CostModel(case.topology.device_spec))
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
                deps) -> Optional[Item]:
        """ZeRO-3: the all-gathers of the parameters a block reads first in
        a forward / backward task (one item: they run back to back, each
        exposed)."""
        if self.zero != 3 or self.dp == 1:
            return None
        blk = self.prof.blocks[block]
        team = self.team_dp(stage)
        t = 0.0
        for owner, i in (blk.f_gather if kind == "F" else blk.b_gather):
            p = self.prof.params[owner][i]
            t += self.colls.time(CollectiveType.ALL_GATHER, team, p.numel * p.dtype.itemsize)
        return self.tl.comm([stage], t, deps, label=f"zero3 gather {block}{layer}")

    def emit_task(self, stage: int, kind: str, mb: int, c: int, deps: List[Item]) -> Item:
        blocks = self.prof.blocks
        order = self.blocks_of(kind, c)
        holds = self.tp > 1
        if kind == "B" and mb == self.M - 1:
            return self.emit_last_backward(stage, c, order, deps)
        if self.zero == 3 and self.dp > 1:
            # each gather waits for a "depend" op that LowerSPMD places on the
            # compute stream right before the parameter's first use: it starts
            # when the compute reaches the block, and the compute waits for it
            made: List[Item] = []
            for i, (name, layer) in enumerate(order):
                blk = blocks[name]
                g = self.gathers(stage, kind, name, layer, [made[-1]] if made else deps)
                t, busy, fl = self._block_time(blk, kind, mb)
                self.flops[stage] += fl
                made.append(self.tl.compute(stage, t, [g] + (deps if i == 0 else []), busy,
                                            fl, f"{kind}{mb} c{c} {name}", holds))
            return made[-1]
        total = busy = fl = 0.0
        for name, _ in order:
            t, b, f = self._block_time(blocks[name], kind, mb)
            total += t
            busy += b
            fl += f
        self.flops[stage] += fl
        label = f"{kind}{mb} c{c}"
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

    def _block_time(self, blk, kind: str, mb: int) -> Tuple[float, float, float]:
        if kind == "F":
            return blk.f, blk.f_busy, blk.f_flops
        if mb == 0:
            return blk.b_first, blk.b_first_busy, blk.b_flops
        return blk.b_mid, blk.b_mid_busy, blk.b_flops

    def emit_last_backward(self, stage: int, c: int, order, deps: List[Item]) -> Item:
        """The last micro-batch's backward op by op, with the data-parallel
        sync of each gradient emitted where it becomes final."""
        tl = self.tl
        last: Optional[Item] = None
        first = True
        for name, layer in order:
            blk = self.prof.blocks[name]
            segs = blk.last if self.M > 1 else blk.only
            ctime = sum(s.time_s for s in segs if s.kind == "c") or 1.0
            g = self.gathers(stage, "B", name, layer, [last] if last is not None else deps)
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
        if self.dp == 1:
            self.synced[key] = item
            return
        if self.bucket == 0:
            self.deferred.setdefault(stage, []).append(key)
            return
        if self.zero >= 2 or self.bucket is None:
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
        n = _split_sizes(p.numel, self.dp)[0] if self.zero >= 2 and self.dp > 1 else p.numel
        t = self.colls.time(CollectiveType.ALL_REDUCE, (self.rank0(s0), self.rank0(s1)),
                            n * p.dtype.itemsize)     # the synced gradient: a shard past ZeRO-1
        item = self.tl.comm([s0, s1], t, [self.synced[emb], self.synced[head]],
                            label="tied embedding all-reduce")
        self.synced[emb] = self.synced[head] = item

    def update(self, key: tuple, stage: int) -> None:
        p = self.param(key)
        dp, zero = self.dp, self.zero
        n = p.numel
        shard = _split_sizes(n, dp)[0] if zero >= 1 else n
        g = self.synced[key]
        deps = [g]
        if zero >= 1 and not (zero >= 2 and dp > 1):
            g = self.small(stage, "reshape", [(n, p.dtype)], [(n, p.dtype)], deps, "opt flat")
            if dp > 1:
                g = self.small(stage, "slice", [(n, p.dtype)], [(shard, p.dtype)], [g], "opt shard")
            deps = [g]
        m = self.master
        adam = self.small(stage, "adamw", [(shard, m), (shard, p.dtype), (shard, m), (shard, m)],
                          [(shard, m)] * 3, deps, "adamw")
        cast = self.small(stage, "cast", [(shard, m)], [(shard, p.dtype)], [adam], "cast")
        if zero in (1, 2):
            if dp > 1:
                ag = self.tl.comm([stage], self.colls.time(CollectiveType.ALL_GATHER,
                                                           self.team_dp(stage),
                                                           n * p.dtype.itemsize),
                                  [cast], label="param all-gather")
                self.small(stage, "reshape", [(n, p.dtype)], [(n, p.dtype)], [ag], "param")
            else:
                self.small(stage, "reshape", [(n, p.dtype)], [(n, p.dtype)], [cast], "param")

    # -- the whole step ----------------------------------------------------------
    def send_time(self, src: int, dst: int, nbytes: int) -> float:
        return self.colls.time(CollectiveType.SEND_RECV, (self.rank0(src), self.rank0(dst)), nbytes)

    def build(self) -> Timeline:
        S, C, M = self.S, self.C, self.M
        per_rank = schedule_tasks(S.schedule, S.pp, M, S.chunks)
        work = {(k, c): self.task_work(k, c) for k in ("F", "B") for c in range(C)}
        order = merge_tasks(per_rank, C, lambda task: work.get((task[0], task[2]), 1.0))
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


# -- memory -------------------------------------------------------------------------
def estimate_memory(b: _Builder) -> List[int]:
    """Peak bytes per rank of each stage, the simulator's accounting
    (a value lives from its op's start to its last reader's end):
    weights and optimizer state (sharded as the ZeRO stage says) and the
    gradient buffers (full size until the sync: micro-batches accumulate
    into them), plus the saved activations
    (:func:`~distsim.transforms.memory_model.saved_activation_bytes`) of the
    chunks in flight, walking the stage's schedule, plus each block's
    transient excess measured on the template. The largest candidate over
    the forward and backward blocks and the optimizer is the peak."""
    prof, S = b.prof, b.S
    dp, zero = S.dp, S.zero
    master = b.master.itemsize
    static = [0.0] * S.pp
    grads = [0.0] * S.pp
    for key, stage in b.all_params():
        p = b.param(key)
        n = p.numel
        shard = _split_sizes(n, dp)[0]
        static[stage] += (shard if zero == 3 else n) * p.dtype.itemsize
        static[stage] += 3 * (shard if zero >= 1 else n) * master
        grads[stage] += n * p.dtype.itemsize
    blocks = prof.blocks
    chunk_blocks = {c: b.blocks_of("F", c) for c in range(b.C)}
    chunk_saved = {c: float(sum(blocks[n].saved_bytes for n, _ in chunk_blocks[c]))
                   for c in range(b.C)}
    out = []
    tasks = schedule_tasks(S.schedule, S.pp, b.M, S.chunks)
    for stage in range(S.pp):
        best = static[stage] + grads[stage] + prof.opt_excess
        flight = 0.0
        backward_seen = False
        for kind, mb, c in tasks[stage]:
            base = static[stage] + (grads[stage] if backward_seen or kind == "B" else 0.0)
            if kind == "F":
                before = 0.0
                for name, _ in chunk_blocks[c]:
                    best = max(best, base + flight + before + blocks[name].f_excess)
                    before += blocks[name].saved_bytes
                flight += chunk_saved[c]
            elif b.M == 1:     # the gradient buffers appear during the one backward
                held = flight
                for name, _ in chunk_blocks[c][::-1]:
                    best = max(best, static[stage] + held + blocks[name].b0_excess)
                    held -= blocks[name].saved_bytes
                flight -= chunk_saved[c]
            else:
                held = flight
                for name, _ in chunk_blocks[c][::-1]:
                    best = max(best, base + held + blocks[name].b_excess)
                    held -= blocks[name].saved_bytes
                flight -= chunk_saved[c]
                backward_seen = True
        out.append(int(best))
    return out


# -- the public function ---------------------------------------------------------
def _profile_for(case: Case) -> LayerProfile:
    c, S = case.config, case.strategy
    items = tuple(sorted(replace(c, global_batch=c.micro_batch).to_dict().items()))
    zero_kind = 3 if S.zero == 3 else (1 if S.zero else 0)
    return layer_profile(items, S.tp, S.sp, S.recompute, zero_kind, c.micro_batch, S.pp > 1,
                         case.topology_name, case.collective_algo)


def estimate(config: Mapping[str, Any]) -> Dict[str, Any]:
    """Estimate one configuration (``distsim simulate`` options, e.g.
    ``{"model": "gpt3-175b", "topology": "dgx-a100-x128", "tp": 8, "pp": 16}``).

    Returns the columns of a sweep row: ``step_time_s``, ``samples_per_s``,
    ``tokens_per_s``, ``mfu``, ``max_peak_memory_bytes``,
    ``memory_capacity_bytes``, ``oom``, ``bubble_fraction``, ``bubble_s``,
    ``compute_s``, ``communication_s``, ``exposed_communication_s``,
    ``idle_s``, ``num_devices``, ``total_flops``, and the resolved
    ``dp``, ``global_batch``, ``micro_batch``, ``microbatches``. Invalid
    options raise :class:`ConfigError`, as :func:`distsim.simulate` does."""
    case = resolve(config)
    b = _Builder(case, _profile_for(case))
    tl = b.build()
    step = tl.run()
    S = case.strategy
    parts = [tl.stage_breakdown(s, step) for s in range(S.pp)]
    mean = {k: sum(p[k] for p in parts) / len(parts)
            for k in ("compute_s", "communication_s", "exposed_communication_s", "idle_s")}
    per_stage_ranks = S.dp * S.tp
    memory = estimate_memory(b)
    capacity = float(case.topology.device_spec.memory_bytes)
    peak = float(max(memory))
    n = S.num_devices
    gb, seq = case.config.global_batch, case.config.seq
    dtype = DType.parse(str(case.config.dtype))
    peak_flops = case.topology.device_spec.peak_flops_for(dtype)
    mflops = model_flops_per_step({**case.config.to_dict()})
    bubble = mean["idle_s"] / step if S.pp > 1 and step > 0 else 0.0
    return {
        "step_time_s": step,
        "samples_per_s": gb / step if step > 0 else math.nan,
        "tokens_per_s": gb * seq / step if step > 0 else math.nan,
        "mfu": mflops / (step * n * peak_flops) if mflops and step > 0 else math.nan,
        "max_peak_memory_bytes": peak,
        "memory_capacity_bytes": capacity,
        "oom": bool(peak > capacity),
        "bubble_fraction": bubble,
        "bubble_s": bubble * step,
        **mean,
        "num_devices": float(n),
        "total_flops": float(sum(b.flops) * per_stage_ranks),
        "dp": S.dp, "global_batch": gb, "micro_batch": case.config.micro_batch,
        "microbatches": case.microbatches,
    }
