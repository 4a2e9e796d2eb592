"""Gradients, data parallelism, ZeRO and the optimizer of a lowered step.

Used by :class:`~distsim.transforms.spmd.LowerSPMD`. Per parameter, on
every rank that holds it:

- *accumulation*: the micro-batches' gradients are summed in the backward
  tasks and divided by their number after the last one;
- *data-parallel synchronisation*, as soon as a gradient is final (so that
  it overlaps the rest of the backward pass): ZeRO 0/1 average it with an
  all-reduce (``bucket_mb``: gradients grouped into buckets of that many MB
  as PyTorch DDP does, flattened, concatenated and all-reduced together;
  0: no overlap, one bucket of all gradients after the backward pass); ZeRO 2/3
  reduce-scatter its flattened form, so each data-parallel rank keeps
  ``1/dp``;
- *tied embeddings* split across pipeline stages are summed between the
  first and the last stage;
- *AdamW* with fp32 master weights and moments: ZeRO 0 on the whole
  (tensor-parallel) parameter; ZeRO >= 1 on this rank's flat shard
  (``numpy.array_split`` of the flattened parameter over the dp ranks),
  followed for ZeRO 1/2 by an all-gather of the new bf16 parameter;
  ZeRO 3 keeps only the shard: parameters are inputs as shards and are
  all-gathered before each use in each task (FSDP), the gather for a layer
  ordered after the end of the layer two before it (prefetch one layer
  ahead).

:func:`local_inputs` and :func:`global_updates` move numbers between the
global (single-device) parameters and a lowered program.
"""
from __future__ import annotations

from math import prod
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from ..ir.comm import CollectiveType
from ..ir.core import Function, Value
from ..ir.ops_comm import split_sizes
from ..ir.types import TensorType
from .adam import adamw_update

if TYPE_CHECKING:  # pragma: no cover
    from .spmd import LowerSPMD

MB = 1 << 20


def shard_bounds(numel: int, n: int, i: int) -> Tuple[int, int]:
    sizes = split_sizes(numel, n)
    start = sum(sizes[:i])
    return start, start + sizes[i]


def tp_shard(array: np.ndarray, spec: Optional[Tuple[int, Sequence[int]]], tp: int,
             t: int) -> np.ndarray:
    """Rank ``t``'s part of a global parameter (see ``param_shards`` in
    :mod:`distsim.models.gpt`)."""
    if spec is None or tp == 1:
        return array
    dim, blocks = spec
    parts, start = [], 0
    for size in blocks:
        block = np.take(array, range(start, start + size), axis=dim)
        parts.append(np.array_split(block, tp, axis=dim)[t])
        start += size
    return np.concatenate(parts, axis=dim)


def tp_unshard(pieces: Sequence[np.ndarray], spec: Optional[Tuple[int, Sequence[int]]]
               ) -> np.ndarray:
    """Inverse of :func:`tp_shard` over all ranks' pieces."""
    if spec is None or len(pieces) == 1:
        return pieces[0]
    dim, blocks = spec
    tp = len(pieces)
    out, offset = [], 0
    for size in blocks:
        part = size // tp
        out.extend(np.take(p, range(offset, offset + part), axis=dim) for p in pieces)
        offset += part
    return np.concatenate(out, axis=dim)


class GradientSync:
    def __init__(self, lower: "LowerSPMD", step: Function) -> None:
        self.L = lower
        self.S = lower.S
        self.step = step
        self.zero = self.S.zero
        self.compute_dtype = None
        self.param_in: Dict[Tuple[Value, int], Value] = {}
        self.state_in: Dict[Tuple[Value, int], Tuple[Value, Value, Value]] = {}
        self.acc: Dict[Tuple[Value, int], Value] = {}
        self.count: Dict[Value, int] = {}
        self.synced: Dict[Tuple[Value, int], Value] = {}
        self.pending: Dict[int, List[Value]] = {}
        self.deferred: Dict[int, List[Value]] = {}
        self.layer_out: Dict[int, Dict[Any, Value]] = {}
        self.updates: Dict[str, str] = {}
        self.outputs: List[Value] = []
        self.unpack: List[tuple] = []
        bucket = self.S.bucket_mb
        self.bucket_bytes = None if bucket is None else float(bucket) * MB
        self.tied = dict(step.meta.get("tied", {}))

    # -- inputs ------------------------------------------------------------
    def stage(self, p: Value) -> int:
        return self.L.stage_of_chunk(self.L.param_chunk[p])

    def create_inputs(self) -> None:
        em, S = self.L.em, self.S
        master = self.L.master_dtype
        for p in self.L.params:
            s = self.stage(p)
            numel = p.type.numel
            for d, t, r in self.L.group(s):
                lo, hi = shard_bounds(numel, S.dp, d)
                info = dict(name=p.name, dp_rank=d, tp_rank=t, stage=s)
                flat = TensorType((hi - lo,), p.type.dtype, r)
                if self.zero == 3:
                    self.param_in[(p, r)] = em.input(f"{p.name}_r{r}", flat, "param", flat=[lo, hi],
                                                     **info)
                else:
                    self.param_in[(p, r)] = em.input(f"{p.name}_r{r}", p.type.with_device(r),
                                                     "param", **info)
                st = (flat if self.zero >= 1 else p.type.with_device(r)).with_dtype(master)
                bounds = {"flat": [lo, hi]} if self.zero >= 1 else {}
                self.state_in[(p, r)] = (
                    em.input(f"{p.name}.master_r{r}", st, "master", state="master", **bounds,
                             **info),
                    em.input(f"{p.name}.m_r{r}", st, "optimizer", state="m", **bounds, **info),
                    em.input(f"{p.name}.v_r{r}", st, "optimizer", state="v", **bounds, **info))

    def note_layer_output(self, rank: int, layer: Any, value: Value) -> None:
        if self.zero == 3 and isinstance(layer, int):
            self.layer_out.setdefault(rank, {})[layer] = value

    def param_for_use(self, p: Value, rank: int, d: int, t: int, stage: int, mb: int,
                      layer: Any) -> Value:
        if self.zero != 3:
            return self.param_in[(p, rank)]
        key = ("zero3", p, self.L.current_kind)
        env = self.L.menv.setdefault((rank, mb), {})
        if key in env:
            return env[key]
        em, S = self.L.em, self.S
        ranks = [S.rank(dd, stage, t) for dd in range(S.dp)]
        shards = []
        for dd, r in enumerate(ranks):
            if not self.L.present(r):
                shards.append(None)
                continue
            shard = self.param_in[(p, r)]
            token = None
            if isinstance(layer, int):
                before = self.layer_out.get(r, {})
                # the end of the layer two before this one, in task order
                for cand in (layer - 2, layer + 2):
                    if cand in before and before[cand].type.device == r:
                        token = before[cand]
                        break
            if token is not None:
                shard = em.one("depend", [shard, token], None, f"{p.name}_gate_r{r}",
                               {"stage": stage, "microbatch": mb, "category": "weights",
                                "detail": "zero3 prefetch gate"})
            shards.append(shard)
        if S.dp > 1:
            full = em.collective(CollectiveType.ALL_GATHER, shards, ranks,
                                 [f"{p.name}_full_m{mb}_r{r}" for r in ranks],
                                 {"stage": stage, "microbatch": mb, "category": "weights",
                                  "role": "zero_gather"}, dim=0)
        else:
            full = shards
        for r, x in zip(ranks, full):
            if x is None:
                continue
            local = em.one("reshape", [x], {"shape": list(p.type.shape)},
                           f"{p.name}_use_m{mb}_r{r}",
                           {"stage": stage, "microbatch": mb, "category": "weights"})
            self.L.menv.setdefault((r, mb), {})[key] = local
        return self.L.menv[(rank, mb)][key]

    # -- gradients ---------------------------------------------------------
    def after_backward(self, stage: int, mb: int, grads: Sequence[Value]) -> None:
        em = self.L.em
        for g in grads:
            p = self.L.grad_of[g]
            final = self.count.get(p, 0) + 1 == self.L.M
            for d, t, r in self.L.group(stage):
                local = self.L.menv[(r, mb)][g]
                meta = {"stage": stage, "microbatch": mb, "phase": "backward",
                        "category": "gradients", "layer": None}
                # accumulation and averaging update the gradient buffer in place
                if (p, r) in self.acc:
                    old = self.acc[(p, r)]
                    local = em.one("add", [old, local], None, f"{p.name}_gacc_r{r}", meta)
                    self.updates[old.name] = local.name
                if final and self.L.M > 1:
                    old = local
                    local = em.one("scale", [local], {"factor": 1.0 / self.L.M},
                                   f"{p.name}_gmean_r{r}", meta)
                    self.updates[old.name] = local.name
                self.acc[(p, r)] = local
            self.count[p] = self.count.get(p, 0) + 1
            if final:
                self._ready(p, stage)

    def _ready(self, p: Value, stage: int) -> None:
        if self.S.dp == 1:
            for _, _, r in self.L.group(stage):
                self.synced[(p, r)] = self.acc[(p, r)]
            return
        if self.bucket_bytes == 0:
            self.deferred.setdefault(stage, []).append(p)
            return
        if self.zero >= 2 or self.bucket_bytes is None:
            self._sync_one(p, stage)
            return
        bucket = self.pending.setdefault(stage, [])
        bucket.append(p)
        if sum(q.type.size_bytes for q in bucket) >= self.bucket_bytes:
            self._flush(stage)

    def _sync_one(self, p: Value, stage: int) -> None:
        em, S = self.L.em, self.S
        meta = {"stage": stage, "role": "grad_sync", "category": "gradients"}
        for t in self.L.tp_indices():
            ranks = [S.rank(d, stage, t) for d in range(S.dp)]
            ins = [self.acc.get((p, r)) for r in ranks]  # None: not in a reduced program
            if self.zero >= 2:
                flat = [em.one("reshape", [x], {"shape": [p.type.numel]}, f"{p.name}_gflat_r{r}",
                               dict(meta)) if x is not None else None for x, r in zip(ins, ranks)]
                outs = em.collective(CollectiveType.REDUCE_SCATTER, flat, ranks,
                                     [f"{p.name}_gshard_r{r}" for r in ranks], dict(meta),
                                     dim=0, reduce_op="avg")
            else:
                outs = em.collective(CollectiveType.ALL_REDUCE, ins, ranks,
                                     [f"{p.name}_gavg_r{r}" for r in ranks], dict(meta),
                                     reduce_op="avg")
                for x, o in zip(ins, outs):  # NCCL all-reduces in place
                    if o is not None:
                        self.updates[x.name] = o.name
            for r, o in zip(ranks, outs):
                if o is not None:
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
                    self.updates[x.name] = o.name
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
                    outs = em.collective(CollectiveType.ALL_REDUCE,
                                         [self.synced[(pe, re_)], self.synced[(ph, rh)]],
                                         [re_, rh], [f"{emb}_gtied_r{re_}", f"{head}_gtied_r{rh}"],
                                         {"role": "grad_sync", "category": "gradients",
                                          "detail": "tied embedding"})
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
            master, m, v = self.state_in[(p, r)]
            outs = adamw_update(em_builder(em), f"{p.name}_r{r}", master, g, m, v,
                                self.L.hyper, p.type.dtype, meta)
            new_params[r] = outs[0]
            for old, new in zip((master, m, v), outs[1:]):
                self.updates[old.name] = new.name
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
            self.updates[old.name] = new.name
            em.io[new.name] = dict(em.io[old.name], role="updated")
            self.outputs.append(new)


class _BuilderShim:
    """The small FunctionBuilder surface :func:`adamw_update` needs."""

    def __init__(self, em) -> None:
        self.em = em

    def op(self, op_type, inputs, attrs=None, name=None, meta=None):
        names = [name] if isinstance(name, str) else list(name)
        outs = self.em.op(op_type, inputs, attrs, names, meta)
        return outs[0] if len(outs) == 1 else tuple(outs)


def em_builder(em) -> _BuilderShim:
    return _BuilderShim(em)


# -- moving numbers in and out ------------------------------------------------
def local_inputs(program: Function, params: Mapping[str, np.ndarray],
                 data: Mapping[str, np.ndarray], master_dtype: str = "float32",
                 micro_batch: Optional[int] = None) -> List[np.ndarray]:
    """Inputs of a lowered program from the global parameters (master
    weights start equal to them, moments at zero) and the global batch
    (``data[name]`` of shape ``(global_batch, ...)``, split into data-parallel
    ranks, then micro-batches)."""
    meta = program.meta
    shards = meta.get("param_shards", {})
    tp, M = meta["tp"], meta["microbatches"]
    out = []
    for v in program.inputs:
        info = meta["io"][v.name]
        role = info["role"]
        if role == "data":
            full = np.asarray(data[info["name"]])
            b = v.type.shape[0]
            start = (info["dp_rank"] * M + info["microbatch"]) * b
            out.append(full[start:start + b])
            continue
        value = np.asarray(params[info["name"]])
        spec = shards.get(info["name"])
        local = tp_shard(value, tuple(spec) if spec else None, tp, info["tp_rank"])
        if info.get("state") in ("m", "v"):
            local = np.zeros_like(local)
        if "flat" in info:
            lo, hi = info["flat"]
            local = local.reshape(-1)[lo:hi]
        dtype = v.type.dtype.numpy_name
        out.append(np.ascontiguousarray(local, dtype=dtype))
    return out


def global_updates(program: Function, outputs: Sequence[np.ndarray], state: str = "param"
                   ) -> Dict[str, np.ndarray]:
    """The updated global parameters (``state="param"``) or master weights
    (``"master"``) reassembled from a lowered program's outputs."""
    meta = program.meta
    shards = meta.get("param_shards", {})
    shapes = meta.get("param_global_shapes", {})
    tp, dp = meta["tp"], meta["dp"]
    pieces: Dict[str, Dict[int, Dict[int, np.ndarray]]] = {}
    flat: Dict[str, bool] = {}
    for v, value in zip(program.outputs, outputs):
        info = meta["io"].get(v.name, {})
        if info.get("role") != "updated" or info.get("state", "param") != state:
            continue
        pieces.setdefault(info["name"], {}).setdefault(info["tp_rank"], {})[info["dp_rank"]] = \
            np.asarray(value)
        flat[info["name"]] = "flat" in info
    out = {}
    for name, by_t in pieces.items():
        spec = shards.get(name)
        tp_pieces = []
        for t in range(tp):
            by_d = by_t[t]
            if flat[name]:
                whole = np.concatenate([by_d[d] for d in range(dp)])
                tp_pieces.append(whole.reshape(_local_shape(shapes[name], spec, tp)))
            else:
                tp_pieces.append(by_d[0])
        out[name] = tp_unshard(tp_pieces, tuple(spec) if spec else None)
    return out


def _local_shape(shape: Sequence[int], spec, tp: int) -> Tuple[int, ...]:
    shape = list(shape)
    if spec and tp > 1:
        shape[spec[0]] //= tp
    return tuple(shape)


def numel(shape: Sequence[int]) -> int:
    return int(prod(shape))
