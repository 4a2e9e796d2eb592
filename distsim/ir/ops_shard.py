"""Ops of the sharding layer.

- ``redistribute`` (global view): the same tensor with other placements
  (its result type says which); lowered to collectives by the planner.
- ``shard_slice {dim, index, parts}`` (local view): piece ``index`` of
  ``numpy.array_split(x, parts, dim)`` -- a device keeping its shard.
"""
from __future__ import annotations

from .ops_comm import split_sizes
from .registry import REQUIRED, OpSpec, ShapeError, register


def _identity(types, attrs):
    return [types[0]]


def _shard_slice(types, attrs):
    (x,) = types
    dim, index, parts = int(attrs["dim"]), int(attrs["index"]), int(attrs["parts"])
    if not 0 <= dim < x.rank:
        raise ShapeError(f"dim {dim} out of range for shape {x.shape}")
    if not 0 <= index < parts or parts > x.shape[dim]:
        raise ShapeError(f"piece {index} of {parts} does not exist for dim {dim} of size {x.shape[dim]}")
    shape = list(x.shape)
    shape[dim] = split_sizes(x.shape[dim], parts)[index]
    return [x.with_shape(tuple(shape))]


register(OpSpec("redistribute", 1, _identity, doc="change placements (global view)"))
register(OpSpec("shard_slice", 1, _shard_slice, {"dim": REQUIRED, "index": REQUIRED, "parts": REQUIRED},
                doc="numpy.array_split(x, parts, dim)[index]"))
