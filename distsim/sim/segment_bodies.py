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
  (:func:`.program_index.category_of`).

``pack`` and ``unpack`` only regroup values: they read and make nothing.
Every body's figures go into flat arrays (:class:`SegmentTable`) that the
instances of the body index, so numpy works per instance, never Python.
"""
from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from operator import attrgetter
from typing import Any, Dict, List, Tuple

import numpy as np

from ..cost.model import CostModel
from ..ir.core import Function, Op, Value
from ..ir.occupancy import held_bytes
from ..ir.ops_bundle import PACK, UNPACK
from ..ir.ops_fused import FUSED
from .program_index import ProgramIndex, category_of

__all__ = ["SegmentTable", "segment_table"]

_SUBS = attrgetter("subfunctions")


def _ints(values: List[int]) -> np.ndarray:
    return np.asarray(values, dtype=np.int64).reshape(-1)


def _floats(values: List[float]) -> np.ndarray:
    return np.asarray(values, dtype=float).reshape(-1)


@dataclass
class SegmentTable:
    """The memory events of every fused op of a program's simulated compute
    ops, by body. Per compute op: ``body`` (its body's number, -1: not a
    fused segment). Offsets are from the op's start; ``inf`` is its end
    (an offset of the body's whole duration), ``-inf`` never. Per body
    ``b``: ``duration[b]`` (the summed time) and, as ``*_start[b]`` into
    the flat tables:

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


def _category(op: Op) -> Tuple[Any, Any, Any]:
    """What an op's results' category depends on (:func:`.program_index.category_of`)."""
    m = op.meta
    return m.get("category"), m.get("role"), m.get("phase")


def _add_body(rows: _Rows, fn: Function, cost: CostModel, cat_of) -> None:
    """Append the rows of one segment body."""
    starts: List[float] = []
    ends: List[float] = []
    t = 0.0
    for time_s in cost.function_op_times(fn):    # as CostModel.function_cost sums them
        starts.append(t)
        t += time_s
        ends.append(t)
    rows["duration"].append(t)
    # the whole duration is the op's end itself (inf), not its start plus
    # the sum: the segment's last free ties with the next op's allocation
    starts = [math.inf if x == t else x for x in starts]
    ends = [math.inf if x == t else x for x in ends]
    made: Dict[Value, int] = {}          # value -> the inner op making it
    held: Dict[Value, int] = {}          # value -> its bytes (ir.occupancy.held_bytes)
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
        for k, v in enumerate(op.outputs):
            made[v] = i
            held[v] = held_bytes(op, k)

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
            return 0.0, 0.0, cat_of(None, None, None)
        return starts[i], ends[i], cat_of(*_category(fn.ops[i]))

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
            rows["out_part"].append((a, r, held.get(p, p.type.size_bytes), c))
        a, r, c = produced(v) if not parts else produced(parts[0])
        rows["out_alloc"].append(a)
        rows["out_ready"].append(r)
        rows["out_category"].append(c)
    temporaries = [(starts[i], ends[i if last.get(v) is None else last[v]],
                    held[v], cat_of(*_category(fn.ops[i])))
                   for v, i in made.items() if v not in leaving]
    pieces = _stacked(temporaries)
    rows["tmp_start"].append(len(rows["tmp"]))
    rows["tmp_count"].append(len(pieces))
    rows["tmp"].extend(pieces)


def _stacked(temporaries: List[Tuple[float, float, int, int]]
             ) -> List[Tuple[float, float, int, int]]:
    """The temporaries' bytes per category over the body, as few
    (alloc, free, bytes, category) pieces: at each offset the bytes a
    category gains are a new piece, the bytes it loses end the newest
    pieces (the last one cut in two if need be). At every offset, after
    its frees and after its allocations, each category holds what the
    temporaries would, so the curve, the peak and its breakdown are
    theirs, with about one event per offset where there were two per
    temporary (a chain of ops frees one as it makes the next)."""
    change: Dict[Tuple[int, float], int] = defaultdict(int)
    for alloc, free, nbytes, c in temporaries:
        if nbytes:
            change[(c, alloc)] += nbytes
            change[(c, free)] -= nbytes
    pieces: List[Tuple[float, float, int, int]] = []
    stack: List[List[Any]] = []     # [alloc, bytes] of a category's open pieces
    for (c, at), d in sorted(change.items()):
        if d > 0:
            stack.append([at, d])
            continue
        while d < 0:
            top = stack[-1]
            take = min(top[1], -d)
            pieces.append((top[0], at, take, c))
            top[1] -= take
            d += take
            if not top[1]:
                stack.pop()
    return pieces


def segment_table(ix: ProgramIndex, cost: CostModel) -> SegmentTable:
    """The :class:`SegmentTable` of ``ix``'s fused compute ops (a fused
    kernel, ``kernel`` set, is one op in the full program too: not one)."""
    body = np.full(len(ix.compute), -1, np.int64)
    categories = list(ix.categories)
    index = {name: i for i, name in enumerate(categories)}

    def number_of(name: str) -> int:
        c = index.get(name)
        if c is None:
            c = index[name] = len(categories)
            categories.append(name)
        return c

    known: Dict[tuple, int] = {}

    def cat_of(*key: Any) -> int:
        """The category number of an op's (category, role, phase)."""
        try:
            return known[key]
        except KeyError:
            c = known[key] = number_of(category_of(*key))
            return c
        except TypeError:      # a meta entry that is not hashable
            return number_of(category_of(*key))

    rows: _Rows = defaultdict(list)
    ops = ix.compute
    # by C-level maps (a large program has ~10^5 fused ops, of ~10^3
    # bodies): the copies of a segment share one tuple of sub-functions
    # (LowerSPMD emits them so), every op without one the empty tuple
    ids = np.fromiter(map(id, map(_SUBS, ops)), np.int64, len(ops))
    holding = np.flatnonzero(ids != id(()))
    _, first, which = np.unique(ids[holding], return_index=True, return_inverse=True)
    number = np.full(len(first), -1, np.int64)
    numbers: Dict[int, int] = {}        # a body's number, by its function
    for j in np.argsort(first).tolist():     # in program order
        op = ops[int(holding[first[j]])]
        if op.op_type != FUSED or op.attrs.get("kernel"):
            continue
        fn = op.subfunctions[0]
        b = numbers.get(id(fn))
        if b is None:
            b = numbers[id(fn)] = len(numbers)
            _add_body(rows, fn, cost, cat_of)
        number[j] = b
    body[holding] = number[which.reshape(-1)]
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
