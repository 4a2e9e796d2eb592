"""The memory events inside each fused segment, once per segment body.

A ``fused`` op (:mod:`distsim.ir.ops_fused`) runs its segment's ops back
to back, so inner op ``i`` starts ``start[i]`` and ends ``end[i]`` after
the segment starts: the prefix sums of the same per-op costs whose sum is
the segment's time (:meth:`~distsim.cost.model.CostModel.function_cost`,
summed in the same order). The full program would allocate and free each
value at its own op's start and end; this module says when, as offsets
from the segment's start, so that :mod:`.value_lifetimes` can place the
coarsened program's memory events where the full program has them:

- each *output* (each part of a packed bundle, :mod:`distsim.ir.ops_bundle`)
  is allocated at its inner producer's start offset (and, if nobody reads
  it, freed at that producer's end offset);
- each *input* (each part of an unpacked bundle) read inside is freed, if
  this segment is its last reader, at the end offset of its last inner
  reader (``-inf`` where no inner op reads it);
- each *temporary* (made and used up inside) lives from its producer's
  start offset to its last reader's end offset (its producer's end if
  nobody reads it), with the category the full program gives its op
  (:func:`.program_index._category_of`).

``pack`` and ``unpack`` only regroup values: they read and make nothing.
Every body's figures go into flat arrays (:class:`SegmentTable`) that the
instances of the body index, so numpy works per instance, never Python.
"""
from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Dict, List, Tuple

import numpy as np

from ..cost.model import CostModel
from ..ir.core import Function, Op, Value
from ..ir.ops_bundle import PACK, UNPACK
from ..ir.ops_fused import FUSED
from .program_index import ProgramIndex, _category_of

__all__ = ["SegmentTable", "segment_table"]


def _ints(values: List[int]) -> np.ndarray:
    return np.asarray(values, dtype=np.int64).reshape(-1)


def _floats(values: List[float]) -> np.ndarray:
    return np.asarray(values, dtype=float).reshape(-1)


@dataclass
class SegmentTable:
    """The memory events of every fused op of a program's simulated compute
    ops, by body. Per compute op: ``body`` (its body's number, -1: not a
    fused segment). Per body ``b``: ``duration[b]`` (the summed time: an
    offset equal to it is the op's end) and, as ``*_start[b]`` into the
    flat tables:

    - inputs (``in_*``, one row per input position): ``in_free`` (the
      whole value's last inner reader's end offset) and, for an unpacked
      bundle, its parts' (``in_part_*``: ``in_part_free``);
    - outputs (``out_*``, one row per output position): ``out_alloc``,
      ``out_ready``, ``out_category`` and, for a packed bundle, its parts'
      (``out_part_*``: ``alloc``, ``ready``, ``bytes``, ``category``);
    - temporaries (``tmp_*``): ``alloc``, ``free``, ``bytes``, ``category``.

    Categories are indices into ``categories`` (the program's, then any new
    ones the bodies add)."""

    body: np.ndarray
    duration: np.ndarray
    categories: List[str]
    in_start: np.ndarray
    in_free: np.ndarray
    in_part_start: np.ndarray
    in_part_count: np.ndarray
    in_part_free: np.ndarray
    out_start: np.ndarray
    out_alloc: np.ndarray
    out_ready: np.ndarray
    out_category: np.ndarray
    out_part_start: np.ndarray
    out_part_count: np.ndarray
    out_part_alloc: np.ndarray
    out_part_ready: np.ndarray
    out_part_bytes: np.ndarray
    out_part_category: np.ndarray
    tmp_start: np.ndarray
    tmp_count: np.ndarray
    tmp_alloc: np.ndarray
    tmp_free: np.ndarray
    tmp_bytes: np.ndarray
    tmp_category: np.ndarray

    @property
    def empty(self) -> bool:
        return not len(self.duration)


#: the flat tables while the bodies are read: column name -> its rows
_Rows = Dict[str, list]


def _category(op: Op) -> str:
    m = op.meta
    return _category_of(m.get("category"), m.get("role"), m.get("phase"))


def _add_body(rows: _Rows, fn: Function, cost: CostModel, cat_of) -> None:
    """Append the rows of one segment body."""
    starts: List[float] = []
    ends: List[float] = []
    t = 0.0
    for op in fn.ops:           # as CostModel.function_cost sums them
        starts.append(t)
        t += cost.op_cost(op).time_s
        ends.append(t)
    rows["duration"].append(t)
    made: Dict[Value, int] = {}          # value -> the inner op making it
    last: Dict[Value, int] = {}          # value -> its last inner reader
    unpacked: Dict[Value, List[Value]] = {}   # input -> its parts
    packed: Dict[Value, List[Value]] = {}     # output -> its parts
    inputs = set(fn.inputs)
    for i, op in enumerate(fn.ops):
        if op.op_type == UNPACK and op.inputs[0] in inputs:
            unpacked[op.inputs[0]] = list(op.outputs)
            continue
        if op.op_type == PACK:
            packed[op.outputs[0]] = list(op.inputs)
            continue
        for v in op.inputs:
            last[v] = i
        for v in op.outputs:
            made[v] = i

    def freed(v: Value) -> float:
        i = last.get(v)
        return -math.inf if i is None else ends[i]

    rows["in_start"].append(len(rows["in_free"]))
    for v in fn.inputs:
        parts = unpacked.get(v, ())
        rows["in_part_start"].append(len(rows["in_part_free"]))
        rows["in_part_count"].append(len(parts))
        rows["in_part_free"].extend(map(freed, parts))
        rows["in_free"].append(max(map(freed, parts), default=-math.inf) if parts else freed(v))

    def produced(v: Value) -> Tuple[float, float, int]:
        i = made.get(v)
        if i is None:     # an input passed through: there from the start
            return 0.0, 0.0, cat_of("activations")
        return starts[i], ends[i], cat_of(_category(fn.ops[i]))

    rows["out_start"].append(len(rows["out_alloc"]))
    leaving = set()
    for v in fn.outputs:
        parts = packed.get(v, ())
        leaving.update(parts)
        leaving.add(v)
        rows["out_part_start"].append(len(rows["out_part"]))
        rows["out_part_count"].append(len(parts))
        for p in parts:
            a, r, c = produced(p)
            rows["out_part"].append((a, r, p.type.size_bytes, c))
        a, r, c = produced(v) if not parts else produced(parts[0])
        rows["out_alloc"].append(a)
        rows["out_ready"].append(r)
        rows["out_category"].append(c)
    rows["tmp_start"].append(len(rows["tmp"]))
    n = 0
    for v, i in made.items():
        if v in leaving:
            continue
        j = last.get(v)
        rows["tmp"].append((starts[i], ends[i if j is None else j], v.type.size_bytes,
                         cat_of(_category(fn.ops[i]))))
        n += 1
    rows["tmp_count"].append(n)


def segment_table(ix: ProgramIndex, cost: CostModel) -> SegmentTable:
    """The :class:`SegmentTable` of ``ix``'s fused compute ops (a fused
    kernel, ``kernel`` set, is one op in the full program too: not one)."""
    body = np.full(len(ix.compute), -1, np.int64)
    categories = list(ix.categories)
    index = {name: i for i, name in enumerate(categories)}

    def cat_of(name: str) -> int:
        c = index.get(name)
        if c is None:
            c = index[name] = len(categories)
            categories.append(name)
        return c

    rows: _Rows = defaultdict(list)
    numbers: Dict[int, int] = {}
    fused = [k for k, op in enumerate(ix.compute)
             if op.op_type == FUSED and not op.attrs.get("kernel")] if ix.compute else []
    for k in fused:
        fn = ix.compute[k].subfunctions[0]
        b = numbers.get(id(fn))
        if b is None:
            b = numbers[id(fn)] = len(numbers)
            _add_body(rows, fn, cost, cat_of)
        body[k] = b
    part = np.asarray(rows["out_part"], dtype=float).reshape(-1, 4)
    tmp = np.asarray(rows["tmp"], dtype=float).reshape(-1, 4)
    return SegmentTable(
        body=body, duration=_floats(rows["duration"]), categories=categories,
        in_start=_ints(rows["in_start"]), in_free=_floats(rows["in_free"]),
        in_part_start=_ints(rows["in_part_start"]), in_part_count=_ints(rows["in_part_count"]),
        in_part_free=_floats(rows["in_part_free"]),
        out_start=_ints(rows["out_start"]), out_alloc=_floats(rows["out_alloc"]),
        out_ready=_floats(rows["out_ready"]), out_category=_ints(rows["out_category"]),
        out_part_start=_ints(rows["out_part_start"]), out_part_count=_ints(rows["out_part_count"]),
        out_part_alloc=part[:, 0].copy(), out_part_ready=part[:, 1].copy(),
        out_part_bytes=part[:, 2].astype(np.int64), out_part_category=part[:, 3].astype(np.int64),
        tmp_start=_ints(rows["tmp_start"]), tmp_count=_ints(rows["tmp_count"]),
        tmp_alloc=tmp[:, 0].copy(), tmp_free=tmp[:, 1].copy(),
        tmp_bytes=tmp[:, 2].astype(np.int64), tmp_category=tmp[:, 3].astype(np.int64))
