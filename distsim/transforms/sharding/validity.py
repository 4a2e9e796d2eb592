"""Whether a combination of per-axis strategies computes the op's shards.

The rules of :mod:`.rules` are per mesh axis and know nothing of the mesh,
so some combinations they allow are wrong on a given mesh: a reshape whose
input and output pieces hold different elements (``[6,4] -> [3,8]`` with
dim 0 sharded over 2 devices: the input pieces are rows 0-2 and 3-5, i.e.
elements 0-11 and 12-23, but ``[3,8]`` cannot be cut into two row pieces
at element 12), or any op whose per-device shapes its shape rule rejects.
:func:`combination_error` says why a combination does not work (or None);
propagation skips such combinations and the verifier rejects them.
"""
from __future__ import annotations

from math import prod
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from ...ir.mesh import DeviceMesh, DTensorType, Placement, Shard, shard_range
from ...ir.registry import ShapeError, infer_types, with_defaults
from ...ir.types import TensorType
from .blocks import local_split_sizes
from .remembered import Remembered, frozen
from .rules import reshape_groups

# ops whose per-device attributes differ from the global ones (as lowered):
# (global attributes, per-device input shapes, per-device output shapes) -> attributes
LocalAttrs = Callable[[Mapping[str, object], Sequence[Tuple[int, ...]],
                       Sequence[Tuple[int, ...]]], Dict[str, object]]
LOCAL_ATTRS: Dict[str, LocalAttrs] = {
    "reshape": lambda attrs, ins, outs: dict(attrs, shape=list(outs[0])),
    "broadcast_to": lambda attrs, ins, outs: dict(attrs, shape=list(outs[0])),
    # a device's rows of the table gradient (lower.py also moves the offset)
    "embedding_grad": lambda attrs, ins, outs: dict(attrs, num_embeddings=outs[0][0]),
}


def _sharding_axes(placements: Sequence[Placement], mesh: DeviceMesh, dim: int) -> List[int]:
    """The mesh axes of more than one device sharding ``dim``, outer first."""
    return [i for i, p in enumerate(placements)
            if isinstance(p, Shard) and p.dim == dim and mesh.shape[i] > 1]


def reshape_error(x: DTensorType, y: DTensorType) -> Optional[str]:
    """A reshape lowers to per-device reshapes when, in every group of
    merged or split dims, at most the group's major (first non-1) dim is
    sharded, on the same axes in the input and the output, and each
    device's input piece covers the same run of the group's elements as its
    output piece."""
    mesh = x.mesh
    groups = reshape_groups(x.shape, y.shape)
    if not groups:
        return f"shapes {list(x.shape)} and {list(y.shape)} do not pair up"
    for gi, gj in groups:
        ins = [d for d in gi if _sharding_axes(x.placements, mesh, d)]
        outs = [d for d in gj if _sharding_axes(y.placements, mesh, d)]
        if not ins and not outs:
            continue
        where = f"dims {gi} -> {gj}"
        if len(ins) != 1 or len(outs) != 1:
            return f"{where}: sharded dims {ins} -> {outs}; one dim on each side must be sharded"
        a, b = ins[0], outs[0]
        if any(x.shape[d] != 1 for d in gi if d < a) or any(y.shape[d] != 1 for d in gj if d < b):
            return f"{where}: sharded dim {a} -> {b} is not the major dim of its group"
        axes = _sharding_axes(x.placements, mesh, a)
        if axes != _sharding_axes(y.placements, mesh, b):
            return f"{where}: dim {a} and dim {b} are sharded over different mesh axes"
        total = prod(x.shape[d] for d in gi)
        row_a, row_b = total // x.shape[a], total // y.shape[b]
        for c in mesh.all_coords():
            sa, la = shard_range(x.shape[a], x.placements, mesh.shape, a, c)
            sb, lb = shard_range(y.shape[b], y.placements, mesh.shape, b, c)
            if (sa * row_a, la * row_a) != (sb * row_b, lb * row_b):
                return (f"{where}: at mesh coordinate {tuple(c)} the input piece holds elements "
                        f"[{sa * row_a}, {(sa + la) * row_a}) of the group, the output piece "
                        f"[{sb * row_b}, {(sb + lb) * row_b})")
    return None


#: (op type, attributes, input and output types) -> combination_error's answer
_ERRORS: Remembered[Optional[str]] = Remembered()


def combination_error(op_type: str, attrs: Mapping[str, object], ins: Sequence[DTensorType],
                      outs: Sequence[DTensorType]) -> Optional[str]:
    """:func:`checked_combination`, remembered per op type, attributes and
    types (:mod:`.remembered`)."""
    key = (op_type, frozen(dict(attrs)), tuple(ins), tuple(outs))
    return _ERRORS.get(key, lambda: checked_combination(op_type, attrs, ins, outs))


def checked_combination(op_type: str, attrs: Mapping[str, object], ins: Sequence[DTensorType],
                        outs: Sequence[DTensorType]) -> Optional[str]:
    """None when running the op on every device's pieces gives every
    device's result pieces (as far as shapes tell, plus the reshape rule
    above); else a short reason."""
    if op_type == "reshape":
        err = reshape_error(ins[0], outs[0])
        if err:
            return err
    values = list(ins) + list(outs)
    if not values:
        return None
    mesh = values[0].mesh
    seen = set()
    local_attrs = LOCAL_ATTRS.get(op_type)
    for c in mesh.all_coords():
        in_shapes = tuple(t.local_shape(c) for t in ins)
        out_shapes = tuple(t.local_shape(c) for t in outs)
        key = (in_shapes, out_shapes)
        if key in seen:
            continue
        seen.add(key)
        a = dict(attrs)
        if local_attrs is not None and out_shapes:
            a = local_attrs(a, in_shapes, out_shapes)
        if op_type == "split" and ins:
            a["sizes"] = local_split_sizes(attrs, ins[0]) or a["sizes"]
        try:
            got = infer_types(op_type, [TensorType(s, t.dtype) for s, t in zip(in_shapes, ins)],
                              with_defaults(op_type, a))
        except ShapeError as e:
            return f"at mesh coordinate {tuple(c)}: {e}"
        for i, (g, want) in enumerate(zip(got, out_shapes)):
            if tuple(g.shape) != tuple(want):
                return (f"at mesh coordinate {tuple(c)}: result {i} would be {list(g.shape)} "
                        f"on the device, its piece is {list(want)}")
    return None
