"""Rewrites on the communication ops of a local-view function.

- :func:`dedup_comms`: collectives with the same structural key (op type,
  every attribute) on the same input values are computed once.
- :func:`fuse_reduce_scatter_all_gather`: a reduce-scatter whose pieces
  only feed an all-gather of the same dim over the same team is an
  all-reduce.
- :func:`drop_gather_slice`: an all-gather whose results are only sliced
  back to each rank's own piece is no communication at all.
- :func:`split_all_reduce` (the reverse of the fusion, where it pays): an
  all-reduce whose every result is read only by a chain of the same unary
  element-wise ops (``relu``, ``scale``, ``cast``, ...) becomes a
  reduce-scatter, the chain on each rank's piece, and an all-gather. The
  bytes are the same by the DESIGN.md table (``(n-1)/n * S`` twice against
  ``2(n-1)/n * S``; less when the chain narrows the dtype) and every rank
  computes the chain on ``1/n`` of the elements. It is not applied when a
  result is also read elsewhere or returned (the full value is needed
  anyway: the split would add an all-gather's latency and save nothing),
  when the chain is empty (a reduce-scatter + all-gather back to back is
  just a slower all-reduce: the fusion above undoes it), or when no dim of
  the tensor has at least one element per rank.

:func:`simplify_comms` applies all four and removes dead ops.
"""
from __future__ import annotations

from typing import Dict, List

from ...ir.builder import NameScope
from ...ir.comm import CollectiveType, is_communication
from ...ir.core import Function, Op, Value
from ...ir.registry import infer_types, is_registered, lookup
from .planner import step_bytes
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


def _unary_elementwise(op: Op) -> bool:
    return (is_registered(op.op_type) and lookup(op.op_type).elementwise
            and len(op.inputs) == 1 and len(op.outputs) == 1)


def _chain(values: List[Value], users: Dict[Value, List[Op]]) -> List[List[Op]]:
    """The longest run of identical unary element-wise ops (same type and
    attributes on every rank) reading only ``values``: one list of ops per
    step, one op per rank."""
    steps: List[List[Op]] = []
    current = values
    while True:
        readers = [users.get(v, []) for v in current]
        if any(len(r) != 1 or r[0] is None for r in readers):
            return steps
        ops = [r[0] for r in readers]
        first = ops[0]
        if not _unary_elementwise(first) or any(
                o.op_type != first.op_type or o.attrs != first.attrs or not _unary_elementwise(o)
                for o in ops):
            return steps
        steps.append(ops)
        current = [o.outputs[0] for o in ops]


def _split_dim(shape, n: int):
    dims = [d for d, size in enumerate(shape) if size >= n]
    even = [d for d in dims if shape[d] % n == 0]
    return (even or dims or [None])[0]


def split_all_reduce(function: Function) -> Function:
    """Turn all-reduce -> element-wise chain into reduce-scatter -> chain on
    the pieces -> all-gather where that pays (see the module docstring)."""
    users = _sole_users(function)
    names = NameScope(v.name for v in function.values())
    replaced: Dict[int, List[Op]] = {}
    dropped = set()
    for op in function.ops:
        if op.op_type != AR or op.attrs.get("present") is not None:
            continue
        steps = _chain(list(op.outputs), users)
        if not steps:
            continue
        ranks = list(op.attrs["ranks"])
        n = len(ranks)
        dim = _split_dim(op.inputs[0].type.shape, n)
        if dim is None or n < 2:
            continue
        team = {k: op.attrs[k] for k in ("mesh", "axes") if op.attrs.get(k) is not None}
        rs_attrs = dict(team, ranks=ranks, dim=dim, reduce_op=op.attrs.get("reduce_op", "sum"))
        rs_types = infer_types(RS, [v.type for v in op.inputs], rs_attrs)
        pieces = [Value(names.fresh(v.name + "_piece"), t) for v, t in zip(op.outputs, rs_types)]
        new_ops = [Op(RS, op.inputs, pieces, rs_attrs, meta={
            "bytes_per_device": step_bytes(CollectiveType.REDUCE_SCATTER.value, n,
                                           op.inputs[0].type.size_bytes)})]
        for step in steps:
            outs = []
            for chain_op, v in zip(step, pieces):
                t = infer_types(chain_op.op_type, [v.type], chain_op.attrs)[0]
                outs.append(Value(names.fresh(chain_op.outputs[0].name + "_piece"), t))
                new_ops.append(Op(chain_op.op_type, [v], [outs[-1]], chain_op.attrs,
                                  meta=chain_op.meta))
                dropped.add(id(chain_op))
            pieces = outs
        finals = [o.outputs[0] for o in steps[-1]]  # the gathered values keep the chain's names
        new_ops.append(Op(AG, pieces, finals, dict(team, ranks=ranks, dim=dim), meta={
            "bytes_per_device": step_bytes(CollectiveType.ALL_GATHER.value, n,
                                           finals[0].type.size_bytes)}))
        replaced[id(op)] = new_ops
    if replaced:
        ops: List[Op] = []
        for op in function.ops:
            if id(op) in replaced:
                ops.extend(replaced[id(op)])
            elif id(op) not in dropped:
                ops.append(op)
        function.ops = ops
    return function


def _prune_records(function: Function) -> None:
    """Drop ``meta['sharding']`` records naming local values a rewrite
    removed (their global value is then not compared by ``distsim check``)."""
    record = function.meta.get("sharding") if isinstance(function.meta, dict) else None
    if not record:
        return
    present = {v.name for v in function.values()}
    for name in [k for k, (_, names) in record.items() if not all(n in present for n in names)]:
        del record[name]


def simplify_comms(function: Function) -> Function:
    """All rewrites, in place; returns the function."""
    dedup_comms(function)
    fuse_reduce_scatter_all_gather(function)
    split_all_reduce(function)
    drop_gather_slice(function)
    eliminate_dead_code(function)
    _prune_records(function)
    return function
