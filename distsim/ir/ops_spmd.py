"""SPMD collectives: communication written once for every rank of a group.

A model builder that knows its tensor-parallel layout (Megatron) writes the
program of *one* rank of a group of ``size`` ranks; where the ranks talk it
places one of these ops. Lowering (:mod:`distsim.transforms.spmd`) turns the
program into the local view: one copy per rank and one ``comm.<kind>`` op per
SPMD op over the group's ranks.

- ``spmd.allreduce{group, size, reduce_op}``: partial sums -> replicated
  (Megatron's *g*; its gradient is the identity);
- ``spmd.copy{group, size}``: identity forward, all-reduce of the gradient
  (Megatron's *f*: a replicated value entering rank-sharded compute);
- ``spmd.allgather{group, size, dim}`` / ``spmd.reducescatter{group, size,
  dim}``: sequence-parallel regions; each is the other's gradient;
- ``spmd.shift{group, size, offset}``: each rank ``r`` sends its value to
  rank ``(r + offset) mod size`` and receives that of ``(r - offset) mod
  size`` (a step of a ring: context parallelism's key/value blocks); its
  gradient is the shift by ``-offset``;
- ``spmd.alltoall{group, size, split_dim, concat_dim}``: each rank splits
  its value along ``split_dim`` into ``size`` pieces, sends piece ``j`` to
  rank ``j`` and concatenates what it receives along ``concat_dim`` (in
  rank order: DeepSpeed-Ulysses' exchange of sequence for heads, group
  ``cp``; expert parallelism's dispatch and combine, group ``ep``); its
  gradient is the all-to-all with the two dims swapped.

The reduction over the group of a ``reduce_op="max"`` all-reduce is not
differentiated (it only feeds ``stop_gradient`` paths).
"""
from __future__ import annotations

from typing import List

from .comm import REDUCE_OPS
from .registry import REQUIRED, OpSpec, ShapeError, register
from .types import TensorType

SPMD_PREFIX = "spmd."


def _size(attrs) -> int:
    n = attrs["size"]
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ShapeError(f"group size must be a positive integer, got {n!r}")
    return n


def _dim(x: TensorType, attrs) -> int:
    d = int(attrs["dim"])
    if not -x.rank <= d < x.rank:
        raise ShapeError(f"dim {d} out of range for shape {x.shape}")
    return d % x.rank


def _same(types, attrs) -> List[TensorType]:
    _size(attrs)
    if attrs.get("reduce_op", "sum") not in REDUCE_OPS:
        raise ShapeError(f"reduce_op '{attrs['reduce_op']}' is not one of {', '.join(REDUCE_OPS)}")
    return [types[0]]


def _gather(types, attrs) -> List[TensorType]:
    (x,) = types
    n = _size(attrs)
    d = _dim(x, attrs)
    shape = list(x.shape)
    shape[d] *= n
    return [x.with_shape(tuple(shape))]


def _scatter(types, attrs) -> List[TensorType]:
    (x,) = types
    n = _size(attrs)
    d = _dim(x, attrs)
    if x.shape[d] % n:
        raise ShapeError(f"dim {d} of {x.shape} is not divisible by the group size {n}")
    shape = list(x.shape)
    shape[d] //= n
    return [x.with_shape(tuple(shape))]


def _all_to_all(types, attrs) -> List[TensorType]:
    (x,) = types
    n = _size(attrs)
    split = _dim(x, {"dim": attrs["split_dim"]})
    concat = _dim(x, {"dim": attrs["concat_dim"]})
    if x.shape[split] % n:
        raise ShapeError(f"split_dim {split} of {x.shape} is not divisible by the group size {n}")
    shape = list(x.shape)
    shape[split] //= n
    shape[concat] *= n
    return [x.with_shape(tuple(shape))]


register(OpSpec("spmd.allreduce", 1, _same, {"group": "tp", "size": REQUIRED, "reduce_op": "sum"}))
register(OpSpec("spmd.copy", 1, _same, {"group": "tp", "size": REQUIRED}))
register(OpSpec("spmd.allgather", 1, _gather, {"group": "tp", "size": REQUIRED, "dim": 0}))
register(OpSpec("spmd.alltoall", 1, _all_to_all,
                {"group": "tp", "size": REQUIRED, "split_dim": 0, "concat_dim": 0}))
register(OpSpec("spmd.shift", 1, _same, {"group": "tp", "size": REQUIRED, "offset": 1}))
register(OpSpec("spmd.reducescatter", 1, _scatter,
                {"group": "tp", "size": REQUIRED, "dim": 0, "reduce_op": "sum"}))
