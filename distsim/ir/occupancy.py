"""Bytes a value holds when only a share of its rows holds data: a
dropless mixture-of-experts dispatch (:mod:`distsim.models.moe`) keeps
static shapes, every expert with room for every token, and marks the ops
between a dispatch and its combine (and their backward) with
``meta["occupancy"]`` f, the share of their slots' rows that hold tokens.
A framework allocates those buffers at the real token counts, so a
result that holds slot rows counts f x its bytes; every other value (the
tokens, the router's probabilities, the experts' weight and bias
gradients) counts its type's bytes.

Which results of a marked op hold slot rows, op by op: a routing op's
``experts x capacity x ...`` results (:func:`holds_slots`); a
communication op's, lowered or not (an all-to-all moves slot rows); a ``matmul``'s unless
``trans_a`` (its rows are its first operand's; a weight gradient's are
the hidden features); any other op's ``experts x slots x features``
result whose first two dims are an operand's (elementwise, a split or
concat of the features; a reduction over the rows has one row). A
``fused`` segment's results hold what its inner ops make.
"""
from __future__ import annotations

from typing import Dict, Optional

from .comm import is_communication
from .core import Function, Op, Value
from .ops_bundle import PACK
from .ops_fused import FUSED
from .types import Type


def holds_slots(op: Op, t: Type) -> bool:
    """Whether ``t``, an operand or result type of routing op ``op``
    (``moe_*``), is its ``experts x capacity x hidden`` slots."""
    probs = op.inputs[-1].type
    return (getattr(t, "rank", 0) == 3
            and t.shape[:2] == (probs.shape[-1], int(op.attrs["capacity"])))


def occupied_bytes(nbytes: int, op: Op) -> int:
    """``nbytes`` of slot rows of ``op``: its ``meta["occupancy"]`` share
    of them (all when unmarked)."""
    occupancy = op.meta.get("occupancy")
    return nbytes if occupancy is None else round(nbytes * occupancy)


def marked(op: Op, _bodies: Optional[Dict[int, bool]] = None) -> bool:
    """Whether any result of ``op`` may hold less than its type's bytes:
    ``op`` carries ``meta["occupancy"]``, or is a fused segment holding
    such an op (``_bodies``: a cache of segments' answers, by segment).
    :func:`held_bytes` of every other op's results is their types' bytes."""
    if "occupancy" in op.meta:
        return True
    if op.op_type != FUSED or not op.subfunctions:
        return False
    body = op.subfunctions[0]
    cache = {} if _bodies is None else _bodies
    got = cache.get(id(body))
    if got is None:
        got = cache[id(body)] = any(marked(o, cache) for o in body.ops)
    return got


def held_bytes(op: Op, k: int, _bodies: Optional[Dict[int, Dict[int, int]]] = None) -> int:
    """Bytes result ``k`` of ``op`` holds (module docstring). ``_bodies``:
    a cache of fused segments' results, by segment."""
    v = op.outputs[k]
    if op.op_type == FUSED and op.subfunctions:
        body = op.subfunctions[0]
        cache = {} if _bodies is None else _bodies
        held = cache.get(id(body))
        if held is None:
            held = cache[id(body)] = _body_results(body)
        return held[k]
    if "occupancy" not in op.meta or not _slot_rows(op, v):
        return v.type.size_bytes
    return occupied_bytes(v.type.size_bytes, op)


def _slot_rows(op: Op, v: Value) -> bool:
    if op.op_type.startswith("moe_"):
        return holds_slots(op, v.type)
    if is_communication(op) or op.op_type.startswith("spmd."):
        return True
    if op.op_type == "matmul":
        return not op.attrs.get("trans_a")
    shape = getattr(v.type, "shape", None)
    return shape is not None and len(shape) == 3 and any(
        getattr(u.type, "rank", 0) == 3 and u.type.shape[:2] == shape[:2] for u in op.inputs)


def _body_results(body: Function) -> Dict[int, int]:
    """Bytes each result of a fused segment holds (a packed bundle: its
    parts'), by its position."""
    maker = {id(o): (op, k) for op in body.ops for k, o in enumerate(op.outputs)}

    def held(v: Value) -> int:
        op, k = maker.get(id(v), (None, 0))
        if op is None:
            return v.type.size_bytes
        if op.op_type == PACK:
            return sum(map(held, op.inputs))
        return held_bytes(op, k)
    return {k: held(v) for k, v in enumerate(body.outputs)}
