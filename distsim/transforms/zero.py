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
  gradient of the op that just produced one;
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

ZeRO-3's gathers and by-layer units live in :mod:`.zero3`;
:mod:`.zero_numbers` moves numbers between the global (single-device)
parameters and a lowered program.
"""
from __future__ import annotations

from typing import (TYPE_CHECKING, Any, Dict, Iterable, List, Mapping, Optional, Sequence,
                    Tuple)


from ..errors import PassPreconditionError
from ..ir.comm import CollectiveType
from ..ir.core import Function, Value
from ..ir.ops_comm import split_sizes
from ..ir.types import TensorType
from .adam import adamw_update
from .buffer_bundles import BufferBundles, accumulation_meta
from .optimizer import SGDHyper, sgd_update
from .zero3 import ParamGathers

if TYPE_CHECKING:  # pragma: no cover
    from .coarsen import Segment
    from .spmd import LowerSPMD

MB = 1 << 20


def shard_bounds(numel: int, n: int, i: int) -> Tuple[int, int]:
    sizes = split_sizes(numel, n)
    start = sum(sizes[:i])
    return start, start + sizes[i]


def scatters_each_microbatch(zero: int, dp: int, bucket_bytes: Optional[float]) -> bool:
    """ZeRO 2/3 reduce-scatter every micro-batch's gradients as they are
    produced (bucket 0: once, after the backward pass, from a whole local
    accumulation)."""
    return zero >= 2 and dp > 1 and bucket_bytes != 0


def sync_route(zero: int, dp: int, bucket_bytes: Optional[float]) -> str:
    """How a parameter's last gradient is synchronised once ready:
    ``"local"`` (no data parallelism), ``"deferred"`` (bucket 0: after the
    backward pass), ``"each"`` (on its own: ZeRO 2/3 or no buckets) or
    ``"bucket"`` (into the stage's pending bucket, flushed when it holds
    ``bucket_bytes``)."""
    if dp == 1:
        return "local"
    if bucket_bytes == 0:
        return "deferred"
    if zero >= 2 or bucket_bytes is None:
        return "each"
    return "bucket"


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


class GradientSync(ParamGathers):
    """Per-parameter gradient buffers, accumulation, data-parallel sync,
    ZeRO sharding and the optimizer of a step lowered by LowerSPMD (see
    the module docstring)."""

    def __init__(self, lower: "LowerSPMD", step: Function) -> None:
        self.L = lower
        self.S = lower.S
        self.step = step
        self.zero = self.S.zero
        self.hyper = lower.hyper
        self.param_in: Dict[Tuple[Value, int], Value] = {}
        self.grad_in: Dict[Tuple[Value, int], Value] = {}
        self.state_in: Dict[Tuple[Value, int], Tuple[Value, ...]] = {}
        self.acc: Dict[Tuple[Value, int], Value] = {}
        #: buffers that fused segments carry as one bundle (out of ``acc`` meanwhile)
        self.bundles = BufferBundles(self)
        self.count: Dict[Value, int] = {}
        self.synced: Dict[Tuple[Value, int], Value] = {}
        self.pending: Dict[int, List[Value]] = {}
        self.deferred: Dict[int, List[Value]] = {}
        self.last_out: Dict[int, Value] = {}
        self.gathered: set = set()
        # ZeRO-3: the task whose gathers are being issued, and per rank the
        # inputs it received from another stage (gates of its first gathers)
        self._task: Optional[Tuple[str, int, int, int]] = None
        self._received: Dict[int, List[Value]] = {}
        self._crossing_in: Dict[Tuple[str, int, int], List[Value]] = {}
        # ZeRO-3 by layer: each parameter's unit, and the gradients of a
        # unit's micro-batch that wait for the rest of it
        self._units: Optional[Dict[Value, Tuple[Value, ...]]] = None
        self._unit_grads: Dict[Tuple[Tuple[Value, ...], int, int], Dict[Value, Dict[int, Value]]] = {}
        #: per stage, the units reduce-scattered whose shards are not yet in
        #: their buffers: (unit, micro-batch, per rank its reduce-scatter's result)
        self._unsettled: Dict[int, List[Tuple[Tuple[Value, ...], int, Dict[int, Value]]]] = {}
        self.updates: Dict[str, str] = {}
        #: the same updates as (old, new) values, in the order made (for the
        #: build log: the simulator numbers them without reading every name)
        self.updated: List[Tuple[Value, Value]] = []
        self.outputs: List[Value] = []
        self.unpack: List[tuple] = []
        bucket = self.S.bucket_mb
        self.bucket_bytes = None if bucket is None else float(bucket) * MB
        self.tied = dict(step.meta.get("tied", {}))
        self.scatter_each = scatters_each_microbatch(self.zero, self.S.dp, self.bucket_bytes)

    def note_update(self, old: Value, new: Value) -> None:
        """``new`` is ``old`` updated in place (``meta["updates"]``)."""
        self.updates[old.name] = new.name
        self.updated.append((old, new))

    # -- inputs ------------------------------------------------------------
    def stage(self, p: Value) -> int:
        return self.L.stage_of_chunk(self.L.param_chunk[p])

    def _check_shardable(self) -> None:
        check_shardable(self.zero, self.S.dp,
                        ((p.name, p.type.numel) for p in self.L.params),
                        self.L.representatives)

    def create_inputs(self) -> None:
        self._check_shardable()
        em, S = self.L.em, self.S
        master = self.L.master_dtype
        states = self.hyper.states
        for p in self.L.params:
            s = self.stage(p)
            numel = p.type.numel
            for d, t, r in self.L.group(s):
                lo, hi = shard_bounds(numel, S.dp, d)
                info = dict(name=p.name, dp_rank=d, tp_rank=t, stage=s)
                flat = TensorType((hi - lo,), p.type.dtype, r)
                whole = p.type.with_device(r)
                if self.zero == 3:
                    self.param_in[(p, r)] = em.input(f"{p.name}_r{r}", flat, "param", flat=[lo, hi],
                                                     **info)
                else:
                    self.param_in[(p, r)] = em.input(f"{p.name}_r{r}", whole, "param", **info)
                shard_grads = self.scatter_each
                self.grad_in[(p, r)] = em.input(
                    f"{p.name}.grad_r{r}", flat if shard_grads else whole, "grad_buffer",
                    state="grad", **({"flat": [lo, hi]} if shard_grads else {}), **info)
                st = (flat if self.zero >= 1 else whole).with_dtype(master)
                bounds = {"flat": [lo, hi]} if self.zero >= 1 else {}
                role = {"master": "master"}
                self.state_in[(p, r)] = tuple(
                    em.input(f"{p.name}.{k}_r{r}", st, role.get(k, "optimizer"), state=k,
                             **bounds, **info)
                    for k in ("master",) + states)

    def note_layer_output(self, rank: int, layer: Any, value: Value) -> None:
        """``value`` is the latest compute result emitted on ``rank``."""
        self.last_out[rank] = value

    # -- gradients ---------------------------------------------------------
    def after_backward(self, stage: int, mb: int, grads: Sequence[Value]) -> None:
        for g in grads:
            p = self.L.grad_of[g]
            fresh = {r: self.L.menv[(r, mb)][g] for _, _, r in self.L.group(stage)}
            unit = self._grad_units().get(p) if self.scatter_each else None
            if unit is None:
                if self.scatter_each:
                    fresh = self._reduce_scatter(p, stage, mb, fresh)
                self._settle(p, stage, mb, fresh)
                continue
            # the layer's gradients wait for each other (FSDP reduce-scatters
            # a unit's gradients when its backward has made them all)
            waiting = self._unit_grads.setdefault((unit, stage, mb), {})
            waiting[p] = fresh
            if len(waiting) == len(unit):
                del self._unit_grads[(unit, stage, mb)]
                # the stage's previous unit first (FSDP2 waits for a unit's
                # reduce-scatter at the next unit's): its shards into their
                # buffers, before this one's copy-in
                self._settle_units(stage)
                outs = self._reduce_scatter_unit(unit, stage, mb, waiting)
                self._unsettled.setdefault(stage, []).append((unit, mb, outs))

    def _settle(self, p: Value, stage: int, mb: int, fresh: Mapping[int, Value]) -> None:
        """Micro-batch ``mb``'s gradient of ``p`` (synchronised where ZeRO
        2/3 reduce-scatter each) into its buffer, and its sync once final."""
        n = self.count.get(p, 0) + 1
        final = n == self.L.M
        for r, local in fresh.items():
            self._accumulate(p, r, local, final, stage, mb)
        self.count[p] = n
        if final:
            if self.scatter_each:
                for r in fresh:
                    self.synced[(p, r)] = self.acc[(p, r)]
            else:
                self._ready(p, stage)

    def accumulated(self, stage: int, mb: int, seg: "Segment") -> None:
        """The fused segment ``seg`` (LowerSPMD with ``coarsen``) has added
        micro-batch ``mb``'s gradients into the buffers of its parameters,
        taken and given as one bundle (:mod:`.buffer_bundles`) or one value
        per buffer; never the last micro-batch, whose gradients feed the sync (see
        ``Coarsening._grad_mode``)."""
        L, count = self.L, self.count
        for p in seg.acc_params:
            n = count.get(p, 0) + 1
            if n >= L.M:
                raise AssertionError(f"fused accumulation of %{p.name} at the last micro-batch")
            count[p] = n
        for _, _, r in L.group(stage):
            env = L.menv[(r, mb)]
            if seg.bundled:
                self.bundles.advanced(seg, r, env[seg.acc_out])
                continue
            for p, (_, out) in zip(seg.acc_params, seg.acc_each.values()):
                new = env[out]
                self.note_update(self.acc[(p, r)], new)
                self.acc[(p, r)] = new

    def _accumulate(self, p: Value, r: int, local: Value, final: bool, stage: int,
                    mb: int) -> None:
        """Add ``local`` into the gradient buffer of ``p`` on ``r``, in place
        (the first micro-batch's gradient is written into the buffer)."""
        em = self.L.em
        meta = accumulation_meta(stage, mb)
        self.bundles.release(p, r, stage, mb)
        if (p, r) in self.acc:
            old = self.acc[(p, r)]
            local = em.one("add", [old, local], None, f"{p.name}_gacc_r{r}", meta)
            self.note_update(old, local)
        else:
            self.note_update(self.grad_in[(p, r)], local)
        if final and self.L.M > 1:
            old = local
            local = em.one("scale", [local], {"factor": 1.0 / self.L.M},
                           f"{p.name}_gmean_r{r}", meta)
            self.note_update(old, local)
        self.acc[(p, r)] = local

    def _reduce_scatter(self, p: Value, stage: int, mb: int,
                        fresh: Mapping[int, Value]) -> Dict[int, Value]:
        """Average one micro-batch's gradient of ``p`` over the dp ranks,
        each keeping its flat shard (ZeRO 2/3)."""
        meta = {"stage": stage, "microbatch": mb, "role": "grad_sync", "category": "gradients"}
        return self._dp_collective(
            CollectiveType.REDUCE_SCATTER, stage, f"{p.name}_gshard",
            lambda r: self._flat_grad(p, fresh[r], r, meta) if r in fresh else None,
            dict(meta), dim=0, reduce_op="avg")

    def _flat_grad(self, p: Value, grad: Value, r: int, meta: Dict[str, Any]) -> Value:
        """``p``'s gradient ``grad`` on ``r`` flattened for its reduce-scatter."""
        return self.L.em.one("reshape", [grad], {"shape": [p.type.numel]}, f"{p.name}_gflat_r{r}",
                             dict(meta))

    def _ready(self, p: Value, stage: int) -> None:
        route = sync_route(self.zero, self.S.dp, self.bucket_bytes)
        if route == "local":
            for _, _, r in self.L.group(stage):
                self.synced[(p, r)] = self.acc[(p, r)]
            return
        if route == "deferred":
            self.deferred.setdefault(stage, []).append(p)
            return
        if route == "each":
            self._sync_one(p, stage)
            return
        bucket = self.pending.setdefault(stage, [])
        bucket.append(p)
        if sum(q.type.size_bytes for q in bucket) >= self.bucket_bytes:
            self._flush(stage)

    def _sync_one(self, p: Value, stage: int) -> None:
        meta = {"stage": stage, "role": "grad_sync", "category": "gradients"}
        acc = self.acc
        if self.zero >= 2:
            outs = self._dp_collective(
                CollectiveType.REDUCE_SCATTER, stage, f"{p.name}_gshard",
                lambda r: self._flat_grad(p, acc[(p, r)], r, meta) if (p, r) in acc else None,
                dict(meta), dim=0, reduce_op="avg")
        else:
            # None: not in a reduced program
            outs = self._dp_collective(CollectiveType.ALL_REDUCE, stage, f"{p.name}_gavg",
                                       lambda r: acc.get((p, r)), dict(meta), reduce_op="avg")
            for r, o in outs.items():  # NCCL all-reduces in place
                self.note_update(acc[(p, r)], o)
        for r, o in outs.items():
            self.synced[(p, r)] = o

    def _flush(self, stage: int) -> None:
        """All-reduce the pending bucket of ``stage`` as one flat buffer."""
        bucket = self.pending.pop(stage, [])
        if not bucket:
            return
        if len(bucket) == 1:
            self._sync_one(bucket[0], stage)
            return
        em, S = self.L.em, self.S
        meta = {"stage": stage, "role": "grad_sync", "category": "gradients", "detail": "bucket"}
        sizes = [p.type.numel for p in bucket]
        for t in self.L.tp_indices():
            ranks = [S.rank(d, stage, t) for d in range(S.dp)]
            flats = []
            for r in ranks:
                if not self.L.present(r):
                    flats.append(None)
                    continue
                parts = [em.one("reshape", [self.acc[(p, r)]], {"shape": [p.type.numel]},
                                f"{p.name}_gflat_r{r}", dict(meta)) for p in bucket]
                flats.append(em.one("concat", parts, {"axis": 0}, f"bucket_r{r}", dict(meta)))
            outs = em.collective(CollectiveType.ALL_REDUCE, flats, ranks,
                                 [f"bucket_avg_r{r}" for r in ranks], dict(meta), reduce_op="avg")
            for x, o in zip(flats, outs):  # NCCL all-reduces in place
                if o is not None:
                    self.note_update(x, o)
            # Unpacked at the end of the step: a compute op reading the
            # result now would stall the backward pass behind the all-reduce.
            self.unpack.append((bucket, sizes, ranks, outs, meta))

    def _unpack(self) -> None:
        em = self.L.em
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

    # -- the end of the step -------------------------------------------------
    def finish(self) -> None:
        S = self.S
        for stage in range(S.pp):
            self._settle_units(stage)
            for p in self.deferred.pop(stage, []):
                if self.zero >= 2:
                    self._sync_one(p, stage)
                else:
                    self.pending.setdefault(stage, []).append(p)
            # bucket_mb 0: no overlap, all of the stage's gradients in one
            # bucket, which fills only when the backward pass has ended
            self._flush(stage)
        self._unpack()
        self._tie()
        for p in self.L.params:
            self._update(p)

    def _tie(self) -> None:
        em, S = self.L.em, self.S
        by_name = {p.name: p for p in self.L.params}
        for head, emb in self.tied.items():
            ph, pe = by_name[head], by_name[emb]
            sh, se = self.stage(ph), self.stage(pe)
            if sh == se:
                continue
            for d in self.L.dp_indices():
                for t in self.L.tp_indices():
                    re_, rh = S.rank(d, se, t), S.rank(d, sh, t)
                    ins = [self.synced[(pe, re_)], self.synced[(ph, rh)]]
                    outs = em.collective(CollectiveType.ALL_REDUCE, ins,
                                         [re_, rh], [f"{emb}_gtied_r{re_}", f"{head}_gtied_r{rh}"],
                                         {"role": "grad_sync", "category": "gradients",
                                          "detail": "tied embedding"})
                    for x, o in zip(ins, outs):  # NCCL all-reduces in place
                        self.note_update(x, o)
                    self.synced[(pe, re_)], self.synced[(ph, rh)] = outs

    def _update(self, p: Value) -> None:
        em, S = self.L.em, self.S
        stage = self.stage(p)
        numel = p.type.numel
        meta = {"stage": stage}
        new_params: Dict[int, Value] = {}
        for d, t, r in self.L.group(stage):
            g = self.synced[(p, r)]
            if self.zero >= 1 and not (self.zero >= 2 and S.dp > 1):
                g = em.one("reshape", [g], {"shape": [numel]}, f"{p.name}_gflat_r{r}",
                           dict(meta, phase="optimizer", category="gradients"))
                if S.dp > 1:
                    lo, hi = shard_bounds(numel, S.dp, d)
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
                self.note_update(old, new)
                em.io[new.name] = dict(em.io[old.name], role="updated")
                self.outputs.append(new)
        if self.zero in (1, 2):
            for t in self.L.tp_indices():
                ranks = [S.rank(d, stage, t) for d in range(S.dp)]
                shards = [new_params.get(r) for r in ranks]  # None: not in a reduced program
                if S.dp > 1:
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
        for d, t, r in self.L.group(stage):
            old = self.param_in[(p, r)]
            new = new_params[r]
            self.note_update(old, new)
            em.io[new.name] = dict(em.io[old.name], role="updated")
            self.outputs.append(new)


class _BuilderShim:
    """The small FunctionBuilder surface :func:`adamw_update` and
    :func:`sgd_update` need."""

    def __init__(self, em) -> None:
        self.em = em

    def op(self, op_type, inputs, attrs=None, name=None, meta=None):
        names = [name] if isinstance(name, str) else list(name)
        outs = self.em.op(op_type, inputs, attrs, names, meta)
        return outs[0] if len(outs) == 1 else tuple(outs)


def em_builder(em) -> _BuilderShim:
    return _BuilderShim(em)
