"""Moving numbers between the global (single-device) parameters and a
program lowered by :class:`~distsim.transforms.spmd.LowerSPMD`: each
rank's inputs (its tensor-parallel part, its ZeRO flat shard, its
constants) from the global arrays (:func:`local_inputs`), and the global
updated parameters and states back from the ranks' outputs
(:func:`global_updates`). Used by the differential tests that run a
lowered step against the single-device one."""
from __future__ import annotations

from math import prod
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from ..ir.core import Function
from .context_parallel import local_sequence


def tp_shard(array: np.ndarray, spec: Optional[Tuple[int, Sequence[int]]], tp: int,
             t: int) -> np.ndarray:
    """Rank ``t``'s part of a global parameter (see ``param_shards`` in
    :mod:`distsim.transforms.tensor_parallel`). A parameter shorter along ``dim`` than its
    blocks (a vocabulary padded to a multiple of ``tp``) is padded with
    zero rows first."""
    if spec is None or tp == 1:
        return array
    dim, blocks = spec
    missing = sum(blocks) - array.shape[dim]
    if missing > 0:
        widths = [(0, 0)] * array.ndim
        widths[dim] = (0, missing)
        array = np.pad(array, widths)
    parts, start = [], 0
    for size in blocks:
        block = np.take(array, range(start, start + size), axis=dim)
        parts.append(np.array_split(block, tp, axis=dim)[t])
        start += size
    return np.concatenate(parts, axis=dim)


def tp_unshard(pieces: Sequence[np.ndarray], spec: Optional[Tuple[int, Sequence[int]]],
               unpadded: Optional[int] = None) -> np.ndarray:
    """Inverse of :func:`tp_shard` over all ranks' pieces; ``unpadded``: the
    unpadded length along the split dim (the padding rows are dropped)."""
    if spec is None or len(pieces) == 1:
        return pieces[0]
    dim, blocks = spec
    tp = len(pieces)
    out, offset = [], 0
    for size in blocks:
        part = size // tp
        out.extend(np.take(p, range(offset, offset + part), axis=dim) for p in pieces)
        offset += part
    whole = np.concatenate(out, axis=dim)
    if unpadded is not None and unpadded < whole.shape[dim]:
        whole = np.take(whole, range(unpadded), axis=dim)
    return whole


# -- moving numbers in and out ------------------------------------------------
#: inputs that start at zero: Adam's moments, SGD's momentum, gradient buffers
ZERO_STATES = ("m", "v", "mom", "grad")


def const_value(spec: Mapping[str, Any], tp_rank: int, dtype: str) -> np.ndarray:
    """A constant input of a lowered program from its ``meta["consts"]``
    entry: ``vocab_pad`` is 0 on the real vocabulary entries of this
    rank's shard and the dtype's most negative number on the padding (added
    to the logits, it keeps padded entries out of the softmax)."""
    if spec.get("kind") != "vocab_pad":
        raise ValueError(f"unknown constant kind {spec.get('kind')!r}")
    shard, valid = int(spec["shard"]), int(spec["valid"])
    index = tp_rank * shard + np.arange(shard)
    return np.where(index < valid, 0.0, np.finfo(dtype).min).astype(dtype)


def local_inputs(program: Function, params: Mapping[str, np.ndarray],
                 data: Mapping[str, np.ndarray], master_dtype: str = "float32",
                 micro_batch: Optional[int] = None) -> List[np.ndarray]:
    """Inputs of a lowered program from the global parameters (master
    weights start equal to them, moments at zero) and the global batch
    (``data[name]`` of shape ``(global_batch, seq, ...)``, split into
    data-parallel ranks, then micro-batches; with context parallelism
    each rank of a group takes its chunks of the sequences,
    :func:`~.context_parallel.local_sequence`)."""
    meta = program.meta
    shards = meta.get("param_shards", {})
    tp, M, cp = meta["tp"], meta["microbatches"], meta.get("cp", 1)
    out = []
    for v in program.inputs:
        info = meta["io"][v.name]
        role = info["role"]
        if role == "data":
            full = np.asarray(data[info["name"]])
            b = v.type.shape[0]
            d, c = divmod(info["dp_rank"], cp)
            start = (d * M + info["microbatch"]) * b
            out.append(local_sequence(full[start:start + b], c, cp))
            continue
        if role == "const":
            out.append(const_value(meta["consts"][info["name"]], info["tp_rank"],
                                   v.type.dtype.numpy_name))
            continue
        value = np.asarray(params[info["name"]])
        if "ep_rank" in info:        # an expert-parallel rank's experts
            value = np.split(value, meta["ep"], axis=0)[info["ep_rank"]]
        spec = shards.get(info["name"])
        local = tp_shard(value, tuple(spec) if spec else None, tp, info["tp_rank"])
        if info.get("state") in ZERO_STATES:
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
    tp, dp, ep = meta["tp"], meta["dp"], meta.get("ep", 1)
    experts = set(meta.get("expert_params", ()))
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
        # an expert's weights: each expert-parallel rank e's experts, held
        # (ZeRO: sharded) by data-parallel ranks e, e + ep, ...
        groups = ep if name in experts else 1
        shape = list(shapes.get(name, ()))
        if shape:
            shape[0] //= groups
        tp_pieces = []
        for t in range(tp):
            by_d = by_t[t]
            parts = []
            for e in range(groups):
                if flat[name]:
                    whole = np.concatenate([by_d[d] for d in range(e, dp, groups)])
                    parts.append(whole.reshape(_local_shape(shape, spec, tp)))
                else:
                    parts.append(by_d[e])
            tp_pieces.append(np.concatenate(parts, axis=0) if groups > 1 else parts[0])
        out[name] = tp_unshard(tp_pieces, tuple(spec) if spec else None,
                               meta.get("param_unpadded", {}).get(name))
    return out


def _local_shape(shape: Sequence[int], spec, tp: int) -> Tuple[int, ...]:
    shape = list(shape)
    if spec and tp > 1:
        shape[spec[0]] //= tp
    return tuple(shape)


def numel(shape: Sequence[int]) -> int:
    return int(prod(shape))
