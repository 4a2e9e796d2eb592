"""Rewrites on the communication ops of a local-view function.

- :func:`dedup_comms`: collectives with the same structural key (op type,
  every attribute) on the same input values are computed once.
- :func:`fuse_reduce_scatter_all_gather`: a reduce-scatter whose pieces
  only feed an all-gather of the same dim over the same team is an
  all-reduce.
- :func:`drop_gather_slice`: an all-gather whose results are only sliced
  back to each rank's own piece is no communication at all.

:func:`simplify_comms` applies all three and removes dead ops.
"""
from __future__ import annotations

from typing import Dict, List

from ...ir.comm import CollectiveType, is_communication
from ...ir.core import Function, Op, Value
from ..cleanup import eliminate_dead_code

AG, RS, AR = (CollectiveType.ALL_GATHER.op_type, CollectiveType.REDUCE_SCATTER.op_type,
              CollectiveType.ALL_REDUCE.op_type)


def _replace(function: Function, mapping: Dict[Value, Value]) -> None:
    if not mapping:
        return

    def get(v: Value) -> Value:
        while v in mapping:
            v = mapping[v]
        return v

    for op in function.ops:
        op.inputs = tuple(get(v) for v in op.inputs)
    function.outputs = [get(v) for v in function.outputs]


def dedup_comms(function: Function) -> Function:
    seen: Dict[tuple, Op] = {}
    mapping: Dict[Value, Value] = {}
    for op in function.ops:
        op.inputs = tuple(mapping.get(v, v) for v in op.inputs)
        if not is_communication(op):
            continue
        key = (op.op_type, tuple(sorted(op.attrs.items())), tuple(id(v) for v in op.inputs))
        if key in seen:
            mapping.update(zip(op.outputs, seen[key].outputs))
        else:
            seen[key] = op
    _replace(function, mapping)
    return eliminate_dead_code(function)


def _sole_users(function: Function) -> Dict[Value, List[Op]]:
    users = function.users()
    for v in function.outputs:
        users.setdefault(v, []).append(None)  # a returned value has an outside user
    return users


def fuse_reduce_scatter_all_gather(function: Function) -> Function:
    users = _sole_users(function)
    new_ops: List[Op] = []
    fused: Dict[int, Op] = {}
    for op in function.ops:
        if op.op_type != RS:
            continue
        ag_users = {id(u): u for v in op.outputs for u in users.get(v, [])}
        if len(ag_users) != 1:
            continue
        ag = next(iter(ag_users.values()))
        if (ag is None or ag.op_type != AG or ag.inputs != op.outputs
                or tuple(ag.attrs["ranks"]) != tuple(op.attrs["ranks"])
                or ag.attrs["dim"] != op.attrs["dim"]):
            continue
        attrs = {"ranks": op.attrs["ranks"], "reduce_op": op.attrs["reduce_op"]}
        for k in ("mesh", "axes"):
            if op.attrs.get(k) is not None:
                attrs[k] = op.attrs[k]
        meta = dict(ag.meta)
        if "bytes_per_device" in op.meta and "bytes_per_device" in ag.meta:
            meta["bytes_per_device"] = op.meta["bytes_per_device"] + ag.meta["bytes_per_device"]
        fused[id(ag)] = Op(AR, op.inputs, ag.outputs, attrs, meta=meta)
        fused[id(op)] = None
    for op in function.ops:
        if id(op) in fused:
            if fused[id(op)] is not None:
                new_ops.append(fused[id(op)])
        else:
            new_ops.append(op)
    function.ops = new_ops
    return function


def drop_gather_slice(function: Function) -> Function:
    users = _sole_users(function)
    mapping: Dict[Value, Value] = {}
    for op in function.ops:
        if op.op_type != AG:
            continue
        n, dim = len(op.outputs), op.attrs["dim"]
        ok = True
        pairs = []
        for i, out in enumerate(op.outputs):
            us = users.get(out, [])
            if len(us) != 1 or us[0] is None or us[0].op_type != "shard_slice":
                ok = False
                break
            s = us[0].attrs
            sizes_equal = len({v.type.shape[dim] for v in op.inputs}) == 1
            if (s["dim"] != dim or s["parts"] != n or s["index"] != i
                    or not (sizes_equal or _array_split_sizes(op, dim))):
                ok = False
                break
            pairs.append((us[0].outputs[0], op.inputs[i]))
        if ok:
            mapping.update(pairs)
    _replace(function, mapping)
    return eliminate_dead_code(function)


def _array_split_sizes(op: Op, dim: int) -> bool:
    """Whether the gathered pieces are exactly numpy.array_split's."""
    sizes = [v.type.shape[dim] for v in op.inputs]
    total, n = sum(sizes), len(sizes)
    base, extra = divmod(total, n)
    return sizes == [base + (1 if i < extra else 0) for i in range(n)]


def simplify_comms(function: Function) -> Function:
    """All rewrites, in place; returns the function."""
    dedup_comms(function)
    fuse_reduce_scatter_all_gather(function)
    drop_gather_slice(function)
    return eliminate_dead_code(function)
