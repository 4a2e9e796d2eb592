"""``pack`` and ``unpack``: several tensors held as one value (a bundle).

    %b = pack(%q, %k, %v) : (bf16[4,8], bf16[4,8], f32[4]) -> u8[144]
    %q, %k, %v = unpack(%b) {shapes = [[4, 8], [4, 8], [4]], dtypes = ["bf16", "bf16", "f32"]}

A coarsened program (:mod:`distsim.ir.ops_fused`) produces many values per
fused op, and a simulator's work is mostly per value (its name, number,
type, ready time and lifetime). Results of one segment that the same
segments read are allocated together and freed together, so tracking them
as one value of their summed bytes changes no time and no memory curve:
the producing segment ends with a ``pack`` and each reading segment starts
with an ``unpack``. Both are bookkeeping, not kernels: they cost nothing
(:mod:`distsim.cost.model`), and the numpy executor passes the tensors
through unchanged, so a bundled program still computes the same numbers.
"""
from __future__ import annotations

from typing import Dict, List, Sequence

from .registry import REQUIRED, OpSpec, ShapeError, register
from .types import DType, TensorType

PACK = "pack"
UNPACK = "unpack"
#: ops that only regroup values: no time, no FLOPs, no memory traffic
BOOKKEEPING_OPS = frozenset({PACK, UNPACK})


def bundle_type(types: Sequence[TensorType]) -> TensorType:
    """The type of a bundle of ``types``: their summed bytes, on their
    common device."""
    devices = {t.device for t in types}
    if len(devices) > 1:
        raise ShapeError(f"pack: inputs on different devices {sorted(devices, key=str)}")
    return TensorType((sum(t.size_bytes for t in types),), DType.U8,
                      devices.pop() if devices else None)


def unpack_attrs(types: Sequence[TensorType]) -> Dict[str, tuple]:
    """The attributes of the ``unpack`` that gives back ``types``."""
    return {"shapes": tuple(tuple(t.shape) for t in types),
            "dtypes": tuple(t.dtype.value for t in types)}


def _pack_rule(types, attrs) -> List[TensorType]:
    if not types:
        raise ShapeError("pack needs at least one input")
    return [bundle_type(types)]


def _unpack_rule(types, attrs) -> List[TensorType]:
    (bundle,) = types
    shapes, dtypes = attrs["shapes"], attrs["dtypes"]
    if len(shapes) != len(dtypes):
        raise ShapeError(f"unpack: {len(shapes)} shapes but {len(dtypes)} dtypes")
    if bundle.dtype is not DType.U8 or bundle.rank != 1:
        raise ShapeError(f"unpack takes a bundle (u8[bytes]), got {bundle}")
    parts = [TensorType(tuple(s), DType.parse(d), bundle.device) for s, d in zip(shapes, dtypes)]
    total = sum(t.size_bytes for t in parts)
    if total != bundle.shape[0]:
        raise ShapeError(f"unpack: the parts hold {total} bytes, the bundle {bundle.shape[0]}")
    return parts


register(OpSpec(PACK, None, _pack_rule,
                doc="several tensors held as one value of their summed bytes (bookkeeping)"))
register(OpSpec(UNPACK, 1, _unpack_rule, {"shapes": REQUIRED, "dtypes": REQUIRED},
                doc="the tensors of a bundle, as pack took them (bookkeeping)"))
