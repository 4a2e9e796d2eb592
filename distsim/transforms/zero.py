"""Gradients, data parallelism, ZeRO and the optimizer of a lowered step.

Used by :class:`~distsim.transforms.spmd.LowerSPMD`. Per parameter, on
every rank that holds it:

- *gradient buffer*: an input (role ``grad_buffer``, resident for the
  whole step, as PyTorch's ``.grad`` / Megatron's ``main_grad`` persist
  between steps) that the step's gradients are written into in place: the
  first micro-batch's gradient *is* the buffer (``meta["updates"]``), the
  later ones are added to it. It holds the whole (tensor-parallel)
  parameter for ZeRO 0/1 and this rank's ``1/dp`` flat shard for ZeRO 2/3,
  so a device's gradient memory is 2 bytes per parameter (bf16), divided
  by ``dp`` from ZeRO 2 on, at every moment of the step, plus the fresh
  gradient of the op that just produced one. With ``Strategy.fp32_grads``
  the buffer is fp32 (4 bytes per parameter) and each gradient is cast to
  it before it is added, as DeepSpeed's BF16_Optimizer does;
- *accumulation*: the micro-batches' gradients are summed in the backward
  tasks and divided by their number after the last one;
- *data-parallel synchronisation*, as soon as a gradient is final (so that
  it overlaps the rest of the backward pass): ZeRO 0/1 average it with an
  all-reduce (``bucket_mb``: gradients grouped into buckets of that many MB
  as PyTorch DDP does, flattened, concatenated and all-reduced together;
  0: no overlap, one bucket of all gradients after the backward pass);
  ZeRO 2/3 reduce-scatter each micro-batch's gradient (flattened) as soon
  as it is produced and accumulate the ``1/dp`` shard, as DeepSpeed ZeRO-2
  and FSDP do (``bucket_mb`` 0: accumulate the whole gradient locally and
  reduce-scatter it once after the backward pass);
- *tied embeddings* split across pipeline stages are summed between the
  first and the last stage;
- *the optimizer* (AdamW, or SGD with optional momentum) with fp32 master
  weights: ZeRO 0 on the whole (tensor-parallel) parameter; ZeRO >= 1 on
  this rank's flat shard (``numpy.array_split`` of the flattened parameter
  over the dp ranks), followed for ZeRO 1/2 by an all-gather of the new
  bf16 parameter; ZeRO 3 keeps only the shard: parameters are inputs as
  shards and are all-gathered before use in each task (FSDP). Prefetch
  (``Strategy.prefetch``, default 1): when a task starts layer ``L`` the
  gathers of the next ``prefetch`` layers of the task are issued, before
  ``L``'s compute in program order (the communication stream takes its
  ops in program order) and gated only on the compute that precedes ``L``
  (a ``depend`` on the last op before it), so layer ``L+1``'s gather runs
  while ``L`` computes and at most ``prefetch + 1`` layers are gathered at
  once. The gathers of a task's first layer are gated on the task's start
  too: on the inputs it receives from another pipeline stage (a backward
  gathers when the gradient from the next stage is there, not as soon as
  the stage's previous compute ends). With ``prefetch`` 0 each layer's
  gather is issued when the layer starts and the compute waits for it.
  The unit of communication (``Strategy.zero3_unit``) is each parameter
  (``param``) or, as FSDP wraps each block, a layer (``layer``): its
  parameters' shards concatenated (copy-in) and all-gathered at once, the
  buffer split into the parameters at the layer's first use (copy-out,
  ``chunk_split``, the op the compute waits on), and a micro-batch's
  gradients of the layer reduce-scattered together once its backward has
  made them all (``chunk_cat``), its result split into the shards and
  settled into their buffers at the stage's next unit or the step's end
  (where FSDP2 waits for a unit's reduce-scatter: right after it, the
  compute stream would wait for it). A parameter whose size dp does not
  divide travels alone; with ``bucket_mb`` 0 the one deferred
  reduce-scatter per parameter stays per parameter.

Under expert parallelism an expert's weights (``LoweringContext.expert``)
are synchronised and ZeRO-sharded over their expert-data-parallel team of
``dp / ep`` ranks rather than the data-parallel team, by a policy of their
own (their gradients divided by ``ep`` too: :func:`~.sync_policy.gradient_share`).

What happens when (routes, buckets, the order of the step's end, what an
update consists of) is decided by :class:`~.sync_policy.SyncPolicy`, which
the sweep's fast tier shares; :class:`GradientSync` carries the decisions
out as ops (a :class:`~.sync_policy.SyncSink`). ZeRO-3's gathers live in
:mod:`.zero3`; :mod:`.zero_numbers` moves numbers between the global
(single-device) parameters and a lowered program.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

from ..errors import PassPreconditionError
from ..ir.comm import CollectiveType
from ..ir.core import Function, Value
from ..ir.ops_comm import split_sizes
from ..ir.types import DType, TensorType
from .adam import AdamHyper, adamw_update
from .buffer_bundles import BufferBundles, accumulation_meta
from .coarsen import Segment
from .emitter import em_builder
from .lowering_context import LoweringContext
from .optimizer import SGDHyper, sgd_update
from .sync_policy import (SyncPolicy, accumulation_ops, grad_buffer_dtype, gradient_share,
                          resident_layout, sync_team, unit_indices, update_plan)
from .zero3 import ParamGathers


def shard_bounds(numel: int, n: int, i: int) -> Tuple[int, int]:
    sizes = split_sizes(numel, n)
    start = sum(sizes[:i])
    return start, start + sizes[i]


def check_shardable(zero: int, dp: int, params: Iterable[Tuple[str, int]],
                    symmetric: bool) -> None:
    """ZeRO's flat shards need every rank to hold a piece (ZeRO 2/3
    reduce-scatter each gradient over dp), and a reduced program
    (``symmetric``: representatives only) needs the pieces equal: raise
    :class:`PassPreconditionError` naming the first parameter (``params``:
    ``(name, elements)`` per rank-local parameter, in step order) that is
    not. The simulator's lowering and the sweep estimator both call this,
    so they refuse the same points."""
    if zero == 0 or dp == 1:
        return
    for name, numel in params:
        if zero >= 2 and numel < dp:
            raise PassPreconditionError(
                f"ZeRO {zero}: parameter '{name}' has {numel} elements, fewer than "
                f"the {dp} data-parallel ranks to shard it over (use --zero 1 or a "
                f"smaller --dp)")
        if symmetric and numel % dp:
            raise PassPreconditionError(
                f"ZeRO {zero} with symmetry: parameter '{name}' ({numel} elements) "
                f"does not split evenly over dp {dp}, so the ranks' shards differ "
                f"(simulate without --symmetry)")


class GradientSync:
    """Per-parameter gradient buffers, accumulation, data-parallel sync,
    ZeRO sharding and the optimizer of a step lowered by LowerSPMD, as ops
    (see the module docstring): the DistIR sink of a
    :class:`~.sync_policy.SyncPolicy`."""

    def __init__(self, ctx: LoweringContext, step: Function,
                 hyper: Union[AdamHyper, SGDHyper], master_dtype: DType,
                 local: bool = False) -> None:
        self.ctx = ctx
        #: ``local``: every rank keeps its gradients and whole optimizer
        #: state, as at dp 1 (no sync, no ZeRO shards over the dp x cp
        #: ranks): the estimator's per-layer template on a tp x cp group,
        #: or on an expert-parallel group under ZeRO 3
        #: (:mod:`distsim.estimate.profile`), which times the gradient sync
        #: and the gathers on the real teams itself
        self.local = local
        self.strategy = replace(ctx.strategy, dp=1, ep=1) if local else ctx.strategy
        self.step = step
        self.zero = self.strategy.zero
        self.hyper = hyper
        self.master_dtype = master_dtype
        self.param_in: Dict[Tuple[Value, int], Value] = {}
        self.grad_in: Dict[Tuple[Value, int], Value] = {}
        self.state_in: Dict[Tuple[Value, int], Tuple[Value, ...]] = {}
        #: each gradient buffer's current value, per (parameter, rank)
        self.acc: Dict[Tuple[Value, int], Value] = {}
        #: buffers that fused segments carry as one bundle (out of ``acc`` meanwhile)
        self.bundles = BufferBundles(ctx, self.acc)
        self.policy: SyncPolicy[Value] = SyncPolicy(self.strategy, self, self._buffer_bytes)
        self.scatter_each = self.policy.scatter_each
        #: an expert's weights (expert parallelism) synchronise over the
        #: expert-data-parallel team of dp / ep ranks: a policy of that size
        self.expert_policy: Optional[SyncPolicy[Value]] = SyncPolicy(
            replace(self.strategy, dp=sync_team(self.strategy, True), ep=1), self,
            self._buffer_bytes) if ctx.expert else None
        #: ZeRO-3's gathers of the parameters before their use
        self.gathers = ParamGathers(ctx, self.param_in, self.strategy)
        self.count: Dict[Value, int] = {}
        self.synced: Dict[Tuple[Value, int], Value] = {}
        self.outputs: List[Value] = []
        self.unpack: List[tuple] = []
        self.tied = dict(step.meta.get("tied", {}))
        # ZeRO-3 by layer: each parameter's unit of gradients, the fresh
        # gradients of a unit's micro-batch waiting for the rest of it, and
        # per stage the units reduce-scattered whose shards are not yet in
        # their buffers: (unit, micro-batch, per rank its reduce-scatter's result)
        self._units: Optional[Dict[Value, Tuple[Value, ...]]] = None
        self._unit_fresh: Dict[Tuple[Value, int], Dict[int, Value]] = {}
        self._unsettled: Dict[int, List[Tuple[Tuple[Value, ...], int, Dict[int, Value]]]] = {}

    # -- inputs ------------------------------------------------------------
    def buffer_dtype(self, p: Value) -> DType:
        """The dtype of ``p``'s gradient buffer (:func:`~.sync_policy.grad_buffer_dtype`)."""
        return grad_buffer_dtype(self.strategy, p.type.dtype)

    def _buffer_bytes(self, p: Value) -> int:
        """The bytes of ``p``'s gradient buffer (what a DDP bucket counts)."""
        return p.type.with_dtype(self.buffer_dtype(p)).size_bytes

    def stage(self, p: Value) -> int:
        return self.ctx.param_stage[p]

    def policy_of(self, p: Value) -> SyncPolicy[Value]:
        """The sync policy of ``p``: the expert policy for an expert's weights."""
        return self.expert_policy if p in self.ctx.expert else self.policy  # type: ignore

    def team_size(self, p: Value) -> int:
        """The ranks ``p``'s gradient is synchronised (and ZeRO-sharded) over."""
        return self.policy_of(p).dp

    def team_index(self, p: Value, d: int) -> int:
        """Data-parallel rank ``d``'s place in ``p``'s team."""
        if self.local:
            return 0
        return d // self.strategy.ep if p in self.ctx.expert else d

    def _check_shardable(self) -> None:
        for expert in (False, True):
            params = [p for p in self.ctx.params if (p in self.ctx.expert) == expert]
            if params:
                check_shardable(self.zero, self.team_size(params[0]),
                                ((p.name, p.type.numel) for p in params),
                                self.ctx.placement.representatives)

    def create_inputs(self) -> None:
        self._check_shardable()
        em, S = self.ctx.emitter, self.strategy
        master = self.master_dtype
        states = self.hyper.states
        for p in self.ctx.params:
            s = self.stage(p)
            numel = p.type.numel
            n = self.team_size(p)
            layout = resident_layout(self.zero, n, self.policy.bucket_bytes)
            for d, t, r in self.ctx.placement.group(s):
                lo, hi = shard_bounds(numel, n, self.team_index(p, d))
                info = dict(name=p.name, dp_rank=d, tp_rank=t, stage=s)
                if p in self.ctx.expert:
                    info["ep_rank"] = d % S.ep
                flat = TensorType((hi - lo,), p.type.dtype, r)
                whole = p.type.with_device(r)
                if layout.param:
                    self.param_in[(p, r)] = em.input(f"{p.name}_r{r}", flat, "param", flat=[lo, hi],
                                                     **info)
                else:
                    self.param_in[(p, r)] = em.input(f"{p.name}_r{r}", whole, "param", **info)
                buf = (flat if layout.grad else whole).with_dtype(self.buffer_dtype(p))
                self.grad_in[(p, r)] = em.input(
                    f"{p.name}.grad_r{r}", buf, "grad_buffer",
                    state="grad", **({"flat": [lo, hi]} if layout.grad else {}), **info)
                st = (flat if layout.state else whole).with_dtype(master)
                bounds = {"flat": [lo, hi]} if layout.state else {}
                role = {"master": "master"}
                self.state_in[(p, r)] = tuple(
                    em.input(f"{p.name}.{k}_r{r}", st, role.get(k, "optimizer"), state=k,
                             **bounds, **info)
                    for k in ("master",) + states)

    # -- gradients ---------------------------------------------------------
    def after_backward(self, stage: int, mb: int, grads: Sequence[Value]) -> None:
        ctx = self.ctx
        units = self._grad_units() if self.scatter_each else {}
        for g in grads:
            p = ctx.grad_of[g]
            fresh = {r: ctx.values[(r, mb)][g] for _, _, r in ctx.placement.group(stage)}
            unit = units.get(p)
            if unit is None:
                if self.policy_of(p).scatter_each:
                    fresh = self._reduce_scatter(p, stage, mb, fresh)
                self._settle(p, stage, mb, fresh)
                continue
            # the layer's gradients wait for each other (FSDP reduce-scatters
            # a unit's gradients when its backward has made them all)
            self._unit_fresh[(p, mb)] = fresh
            self.policy.unit_gradient(unit, p, stage, mb)

    def _settle(self, p: Value, stage: int, mb: int, fresh: Mapping[int, Value]) -> None:
        """Micro-batch ``mb``'s gradient of ``p`` (synchronised where ZeRO
        2/3 reduce-scatter each) into its buffer, and its sync once final."""
        n = self.count.get(p, 0) + 1
        final = n == self.ctx.microbatches
        for r, local in fresh.items():
            self._accumulate(p, r, local, stage, mb)
        self.count[p] = n
        if final:
            policy = self.policy_of(p)
            if policy.scatter_each:
                for r in fresh:
                    self.synced[(p, r)] = self.acc[(p, r)]
            else:
                policy.final(p, stage)

    def accumulated(self, stage: int, mb: int, seg: Segment) -> None:
        """The fused segment ``seg`` (LowerSPMD with ``coarsen``) has added
        micro-batch ``mb``'s gradients into the buffers of its parameters,
        taken and given as one bundle (:mod:`.buffer_bundles`) or one value
        per buffer; never the last micro-batch, whose gradients feed the sync (see
        ``Coarsening._grad_mode``)."""
        ctx, count = self.ctx, self.count
        for p in seg.acc_params:
            n = count.get(p, 0) + 1
            if n >= ctx.microbatches:
                raise AssertionError(f"fused accumulation of %{p.name} at the last micro-batch")
            count[p] = n
        for _, _, r in ctx.placement.group(stage):
            env = ctx.values[(r, mb)]
            if seg.bundled:
                self.bundles.advanced(seg, r, env[seg.acc_out])
                continue
            for p, (_, out) in zip(seg.acc_params, seg.acc_each.values()):
                new = env[out]
                ctx.note_update(self.acc[(p, r)], new)
                self.acc[(p, r)] = new

    def _accumulate(self, p: Value, r: int, local: Value, stage: int, mb: int) -> None:
        """Add ``local`` into the gradient buffer of ``p`` on ``r``, in place,
        with :func:`~.sync_policy.accumulation_ops` (the first micro-batch's
        gradient is written into the buffer)."""
        ctx = self.ctx
        em = ctx.emitter
        meta = accumulation_meta(stage, mb, ctx.kind)
        self.bundles.release(p, r, stage, mb)
        # an expert's share of tokens is the mesh's, kept local or not
        share = gradient_share(ctx.strategy, p in ctx.expert)
        dtype = self.buffer_dtype(p)
        ops = accumulation_ops(mb, ctx.microbatches, share, cast=local.type.dtype != dtype)
        if "cast" in ops:
            local = em.one("cast", [local], {"dtype": dtype.value}, f"{p.name}_gcast_r{r}", meta)
        if "add" in ops:
            old = self.acc[(p, r)]
            local = em.one("add", [old, local], None, f"{p.name}_gacc_r{r}", meta)
            ctx.note_update(old, local)
        else:
            ctx.note_update(self.grad_in[(p, r)], local)
        if "scale" in ops:
            old = local
            local = em.one("scale", [local], {"factor": 1.0 / (ctx.microbatches * share)},
                           f"{p.name}_gmean_r{r}", meta)
            ctx.note_update(old, local)
        self.acc[(p, r)] = local

    def _reduce_scatter(self, p: Value, stage: int, mb: int,
                        fresh: Mapping[int, Value]) -> Dict[int, Value]:
        """Average one micro-batch's gradient of ``p`` over the dp ranks,
        each keeping its flat shard (ZeRO 2/3)."""
        meta = {"stage": stage, "microbatch": mb, "role": "grad_sync", "category": "gradients"}
        return self.ctx.dp_collective(
            CollectiveType.REDUCE_SCATTER, stage, f"{p.name}_gshard",
            lambda r: self._flat_grad(p, fresh[r], r, meta) if r in fresh else None,
            dict(meta), p in self.ctx.expert, dim=0, reduce_op="avg")

    def _flat_grad(self, p: Value, grad: Value, r: int, meta: Dict[str, Any]) -> Value:
        """``p``'s gradient ``grad`` on ``r`` flattened for its reduce-scatter."""
        return self.ctx.emitter.one("reshape", [grad], {"shape": [p.type.numel]},
                                    f"{p.name}_gflat_r{r}", dict(meta))

    # -- the sink of the sync policy ---------------------------------------------
    def keep_local(self, p: Value, stage: int) -> None:
        for _, _, r in self.ctx.placement.group(stage):
            self.synced[(p, r)] = self.acc[(p, r)]

    def sync_one(self, p: Value, stage: int, kind: CollectiveType) -> None:
        meta = {"stage": stage, "role": "grad_sync", "category": "gradients"}
        acc = self.acc
        if kind is CollectiveType.REDUCE_SCATTER:
            outs = self.ctx.dp_collective(
                kind, stage, f"{p.name}_gshard",
                lambda r: self._flat_grad(p, acc[(p, r)], r, meta) if (p, r) in acc else None,
                dict(meta), p in self.ctx.expert, dim=0, reduce_op="avg")
        else:
            # None: not in a reduced program
            outs = self.ctx.dp_collective(kind, stage, f"{p.name}_gavg",
                                          lambda r: acc.get((p, r)), dict(meta),
                                          p in self.ctx.expert, reduce_op="avg")
            for r, o in outs.items():  # NCCL all-reduces in place
                self.ctx.note_update(acc[(p, r)], o)
        for r, o in outs.items():
            self.synced[(p, r)] = o

    def sync_bucket(self, bucket: List[Value], stage: int) -> None:
        """All-reduce a bucket of final gradients as one flat buffer."""
        ctx = self.ctx
        em, placement = ctx.emitter, ctx.placement
        meta = {"stage": stage, "role": "grad_sync", "category": "gradients", "detail": "bucket"}
        sizes = [p.type.numel for p in bucket]
        for ranks in placement.sync_teams(stage, bucket[0] in ctx.expert):
            flats = []
            for r in ranks:
                if not placement.present(r):
                    flats.append(None)
                    continue
                parts = [em.one("reshape", [self.acc[(p, r)]], {"shape": [p.type.numel]},
                                f"{p.name}_gflat_r{r}", dict(meta)) for p in bucket]
                flats.append(em.one("concat", parts, {"axis": 0}, f"bucket_r{r}", dict(meta)))
            outs = em.collective(CollectiveType.ALL_REDUCE, flats, ranks,
                                 [f"bucket_avg_r{r}" for r in ranks], dict(meta), reduce_op="avg")
            for x, o in zip(flats, outs):  # NCCL all-reduces in place
                if o is not None:
                    ctx.note_update(x, o)
            # Unpacked at the end of the step: a compute op reading the
            # result now would stall the backward pass behind the all-reduce.
            self.unpack.append((bucket, sizes, ranks, outs, meta))

    def unpack_buckets(self) -> None:
        em = self.ctx.emitter
        for bucket, sizes, ranks, outs, meta in self.unpack:
            for r, o in zip(ranks, outs):
                if o is None:
                    continue
                pieces = em.op("split", [o], {"axis": 0, "sizes": sizes},
                               [f"{p.name}_gavg_flat_r{r}" for p in bucket], dict(meta))
                for p, piece in zip(bucket, pieces):
                    self.synced[(p, r)] = em.one("reshape", [piece],
                                                 {"shape": list(p.type.shape)},
                                                 f"{p.name}_gavg_r{r}", dict(meta))
        self.unpack = []

    def tie(self, pe: Value, ph: Value) -> None:
        """All-reduce the synchronised gradients of the tied embedding
        ``pe`` (first stage) and head ``ph`` (last stage)."""
        ctx = self.ctx
        em, S = ctx.emitter, self.strategy
        se, sh = self.stage(pe), self.stage(ph)
        for d in ctx.placement.dp_indices():
            for t in ctx.placement.tp_indices():
                re_, rh = S.rank(d, se, t), S.rank(d, sh, t)
                ins = [self.synced[(pe, re_)], self.synced[(ph, rh)]]
                outs = em.collective(CollectiveType.ALL_REDUCE, ins,
                                     [re_, rh],
                                     [f"{pe.name}_gtied_r{re_}", f"{ph.name}_gtied_r{rh}"],
                                     {"role": "grad_sync", "category": "gradients",
                                      "detail": "tied embedding"})
                for x, o in zip(ins, outs):  # NCCL all-reduces in place
                    ctx.note_update(x, o)
                self.synced[(pe, re_)], self.synced[(ph, rh)] = outs

    def update(self, params: Sequence[Value]) -> None:
        for p in params:
            self._update(p, update_plan(self.zero, self.team_size(p)))

    def _update(self, p: Value, plan) -> None:
        ctx = self.ctx
        em = ctx.emitter
        stage = self.stage(p)
        numel = p.type.numel
        meta = {"stage": stage}
        new_params: Dict[int, Value] = {}
        for d, t, r in ctx.placement.group(stage):
            g = self.synced[(p, r)]
            if plan.flatten:
                g = em.one("reshape", [g], {"shape": [numel]}, f"{p.name}_gflat_r{r}",
                           dict(meta, phase="optimizer", category="gradients"))
                if plan.slice:
                    lo, hi = shard_bounds(numel, self.team_size(p), self.team_index(p, d))
                    g = em.one("slice", [g], {"axis": 0, "start": lo, "stop": hi},
                               f"{p.name}_gshard_r{r}",
                               dict(meta, phase="optimizer", category="gradients"))
            states = self.state_in[(p, r)]
            if isinstance(self.hyper, SGDHyper):
                outs = sgd_update(em_builder(em), f"{p.name}_r{r}", states[0], g,
                                  states[1] if len(states) > 1 else None, self.hyper,
                                  p.type.dtype, meta)
            else:
                outs = adamw_update(em_builder(em), f"{p.name}_r{r}", states[0], g, states[1],
                                    states[2], self.hyper, p.type.dtype, meta)
            new_params[r] = outs[0]
            for old, new in zip(states, outs[1:]):
                ctx.note_update(old, new)
                em.io[new.name] = dict(em.io[old.name], role="updated")
                self.outputs.append(new)
        if plan.reshape:
            for ranks in ctx.placement.sync_teams(stage, p in ctx.expert):
                shards = [new_params.get(r) for r in ranks]  # None: not in a reduced program
                if plan.gather:
                    full = em.collective(CollectiveType.ALL_GATHER, shards, ranks,
                                         [f"{p.name}_gathered_r{r}" for r in ranks],
                                         {"stage": stage, "phase": "optimizer",
                                          "role": "zero_gather", "category": "weights"}, dim=0)
                else:
                    full = shards
                for r, x in zip(ranks, full):
                    if x is None:
                        continue
                    new_params[r] = em.one("reshape", [x], {"shape": list(p.type.shape)},
                                           f"{p.name}_new_r{r}", dict(meta, phase="optimizer"))
        for d, t, r in ctx.placement.group(stage):
            old = self.param_in[(p, r)]
            new = new_params[r]
            ctx.note_update(old, new)
            em.io[new.name] = dict(em.io[old.name], role="updated")
            self.outputs.append(new)

    # -- ZeRO-3 by layer: a layer's gradients reduce-scattered as one ---------
    def _grad_units(self) -> Dict[Value, Tuple[Value, ...]]:
        """ZeRO 2/3 with ``zero3_unit: layer``: per parameter, the
        parameters whose gradients the same layer of the same backward task
        makes (reduce-scattered together); a parameter alone is in none."""
        if self._units is not None:
            return self._units
        self._units = {}
        if self.zero != 3 or self.strategy.zero3_unit != "layer":
            return self._units
        ctx = self.ctx
        by_layer: Dict[Tuple[Any, Any], List[Value]] = {}
        for (kind, chunk), ops in ctx.tasks.task_ops.items():
            for op in ops:
                layer = op.meta.get("layer")
                if not isinstance(layer, int):
                    continue
                for o in op.outputs:
                    p = ctx.grad_of.get(o)
                    if p is not None:
                        made = by_layer.setdefault((chunk, layer), [])
                        if p not in made:
                            made.append(p)
        for made in by_layer.values():
            for expert in (False, True):     # an expert's weights: units of their own team
                own = [p for p in made if (p in ctx.expert) == expert]
                if not own:
                    continue
                unit = tuple(own[i] for i in unit_indices([p.type.numel for p in own],
                                                          self.team_size(own[0])))
                for p in unit:
                    self._units[p] = unit
        return self._units

    def reduce_scatter_unit(self, unit: Tuple[Value, ...], stage: int, mb: int) -> None:
        """Average one micro-batch's gradients of a layer's parameters over
        the dp ranks in one reduce-scatter: the gradients concatenated row
        by row (``chunk_cat``: row ``d`` holds each one's ``d``-th shard,
        FSDP2's copy-in) and reduce-scattered; per rank, the result (the
        unit's shards, split by :meth:`settle_units`)."""
        fresh = {p: self._unit_fresh.pop((p, mb)) for p in unit}
        em = self.ctx.emitter
        meta = {"stage": stage, "microbatch": mb, "role": "grad_sync", "category": "gradients"}
        name = f"{unit[0].name}_gunit{len(unit)}"
        outs = self.ctx.dp_collective(
            CollectiveType.REDUCE_SCATTER, stage, f"{name}_shard",
            lambda r: em.one("chunk_cat", [fresh[p][r] for p in unit],
                             {"rows": self.team_size(unit[0])},
                             f"{name}_in_r{r}", dict(meta, detail="zero3 copy-in"))
            if r in fresh[unit[0]] else None, dict(meta), unit[0] in self.ctx.expert, dim=0,
            reduce_op="avg")
        self._unsettled.setdefault(stage, []).append((unit, mb, outs))

    def settle_units(self, stage: int) -> None:
        """The units of ``stage`` reduce-scattered and not settled yet: each
        result split into its parameters' shards, which go into their
        buffers (:meth:`_settle`). Emitted at the stage's next unit (or the
        step's end), not right after the reduce-scatter: the compute
        stream would wait for it there, where FSDP2 waits for a unit's
        reduce-scatter at the next unit's post-backward."""
        for unit, mb, outs in self._unsettled.pop(stage, []):
            widths = [p.type.numel // self.team_size(p) for p in unit]
            shards: Dict[Value, Dict[int, Value]] = {p: {} for p in unit}
            for r, o in outs.items():
                pieces = self.ctx.emitter.op("split", [o], {"axis": 0, "sizes": widths},
                                             [f"{p.name}_gshard_r{r}" for p in unit],
                                             {"stage": stage, "microbatch": mb,
                                              "role": "grad_sync", "category": "gradients"})
                for p, piece in zip(unit, pieces):
                    shards[p][r] = piece
            for p in unit:
                self._settle(p, stage, mb, shards[p])

    # -- the end of the step -------------------------------------------------
    def finish(self) -> None:
        """After the last task: the policy's end of the step (deferred syncs,
        last buckets, tied embeddings, the optimizer)."""
        by_name = {p.name: p for p in self.ctx.params}
        tied = [(by_name[emb], self.stage(by_name[emb]), by_name[head], self.stage(by_name[head]))
                for head, emb in self.tied.items()]
        if self.expert_policy is not None:   # its buckets flushed; updates all below
            self.expert_policy.finish(self.strategy.pp, [])
        self.policy.finish(self.strategy.pp, self.ctx.params, tied)
