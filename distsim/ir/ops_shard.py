"""Ops of the sharding layer.

- ``redistribute`` (global view): the same tensor with other placements
  (its result type says which); lowered to collectives by the planner.
- ``shard_slice {dim, index, parts}`` (local view): piece ``index`` of
  ``numpy.array_split(x, parts, dim)`` -- a device keeping its shard.
- ``chunk_cat {rows}``: each input viewed as ``rows`` equal rows, the rows
  concatenated side by side, flat: FSDP2's copy-in of a unit's gradients
  before one reduce-scatter (``torch._chunk_cat``), so that row ``d`` (the
  result's ``d``-th ``1/rows``) holds every input's ``d``-th shard.
- ``chunk_split {rows, shapes}``: its inverse, the copy-out of a unit's
  all-gathered flat buffer (``rows`` ranks' concatenated shards) into the
  unsharded parameters of ``shapes`` (``split_with_sizes_copy``).
"""
from __future__ import annotations

from math import prod

from .ops_comm import split_sizes
from .registry import REQUIRED, OpSpec, ShapeError, register
from .types import TensorType


def _identity(types, attrs):
    return [types[0]]


def _shard_slice(types, attrs):
    (x,) = types
    dim, index, parts = int(attrs["dim"]), int(attrs["index"]), int(attrs["parts"])
    if not 0 <= dim < x.rank:
        raise ShapeError(f"dim {dim} out of range for shape {x.shape}")
    if not 0 <= index < parts or parts > x.shape[dim]:
        raise ShapeError(f"piece {index} of {parts} does not exist for dim {dim} of size "
                         f"{x.shape[dim]}")
    shape = list(x.shape)
    shape[dim] = split_sizes(x.shape[dim], parts)[index]
    return [x.with_shape(tuple(shape))]


register(OpSpec("redistribute", 1, _identity, doc="change placements (global view)"))
register(OpSpec("shard_slice", 1, _shard_slice,
                {"dim": REQUIRED, "index": REQUIRED, "parts": REQUIRED},
                doc="numpy.array_split(x, parts, dim)[index]"))


def _rows(attrs) -> int:
    rows = int(attrs["rows"])
    if rows < 1:
        raise ShapeError(f"rows must be positive, got {rows}")
    return rows


def _chunk_cat(types, attrs):
    if not types:
        raise ShapeError("chunk_cat needs at least one input")
    rows = _rows(attrs)
    first = types[0]
    for t in types:
        if t.dtype != first.dtype or t.device != first.device:
            raise ShapeError(f"inputs differ in dtype or device: {first} vs {t}")
        if t.numel % rows:
            raise ShapeError(f"input of shape {t.shape} does not split into {rows} equal rows")
    return [TensorType((sum(t.numel for t in types),), first.dtype, first.device)]


def _chunk_split(types, attrs):
    (x,) = types
    rows = _rows(attrs)
    shapes = [tuple(int(d) for d in shape) for shape in attrs["shapes"]]
    if any(prod(shape) % rows for shape in shapes):
        raise ShapeError(f"shapes {shapes} do not all split into {rows} equal rows")
    if x.rank != 1 or x.numel != sum(prod(shape) for shape in shapes):
        raise ShapeError(f"input of shape {x.shape} is not the flat concatenation of {shapes}")
    return [x.with_shape(shape) for shape in shapes]


register(OpSpec("chunk_cat", None, _chunk_cat, {"rows": REQUIRED},
                doc="inputs as `rows` rows each, concatenated along the rows, flat"))
register(OpSpec("chunk_split", 1, _chunk_split, {"rows": REQUIRED, "shapes": REQUIRED},
                doc="inverse of chunk_cat into tensors of `shapes`"))
