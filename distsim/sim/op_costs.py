"""The time, FLOPs and bytes of each compute op of a program, for the
simulator's :mod:`.program_index`: each distinct op is costed once by the
:class:`~distsim.cost.model.CostModel`.

Two ops cost the same when they have the same *content* (op type,
attributes, sub-functions: its kind's) and the same operand and result
shape classes. A large program (a GPT-3 step: millions of ops, copies of a
few hundred kinds) is grouped with numpy, a table per content and arity;
a small one (the sweep estimator's per-layer templates: a few hundred ops
in a hundred groups) costs less op by op in Python than in numpy calls per
group. Both cost the first op of each distinct (content, shapes) and give
it to the others: the same numbers either way.
"""
from __future__ import annotations

from itertools import count
from operator import attrgetter, itemgetter
from typing import Dict, Tuple

import numpy as np

from ..cost.model import CostModel
from .program_columns import ProgramColumns, codes as _codes, groups, kinds_of, pick

_ATTRS, _OP_TYPE, _SUBS = attrgetter("attrs"), attrgetter("op_type"), attrgetter("subfunctions")
_FIRST = itemgetter(0)
#: Programs with at most this many values and reads are costed op by op.
SMALL = 20_000


def program_costs(col: ProgramColumns, computes: np.ndarray, shape_of: np.ndarray,
                  cost: CostModel) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(time, flops, bytes) of each compute op in ``computes``, costed once
    per distinct (op type, attributes, sub-functions, operand and result
    shape classes: ``shape_of``, by value number). Attributes are told
    apart by their ``repr`` (equal reprs of normalized attributes are equal
    attributes; equal attributes spelled differently are only costed
    twice)."""
    nc = len(computes)
    if nc == 0:
        return np.zeros(0), np.zeros(0), np.zeros(0)
    content, at = _content(col, computes)
    if len(col.reads) + len(shape_of) <= SMALL:
        return _costs_op_by_op(col, computes, shape_of, cost, content.tolist())
    return _costs_by_group(col, computes, shape_of, cost, content, at)


def _content(col: ProgramColumns, computes: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """Per compute op, a code for what its cost depends on besides its
    shapes (op type, attributes, sub-functions), coded once per kind; and
    its kind's place (:func:`.program_columns.kinds_of`)."""
    kinds, at = kinds_of(col, computes)
    nk = len(kinds)
    # sub-functions by identity (0: none): a fused op holds one
    subs = list(map(_SUBS, kinds))
    sub_count = np.fromiter(map(len, subs), np.int64, nk)
    sub_code = np.zeros(nk, np.int64)
    one = np.flatnonzero(sub_count == 1)
    if len(one):
        sub_code[one] = _codes(map(id, map(_FIRST, pick(subs, one))), len(one)) + 1
    sub_ids: Dict[tuple, int] = {}
    for i in np.flatnonzero(sub_count > 1).tolist():
        sub_code[i] = -1 - sub_ids.setdefault(tuple(map(id, subs[i])), len(sub_ids))
    type_code = _codes(map(_OP_TYPE, kinds), nk)
    attr_code = _codes(map(repr, map(_ATTRS, kinds)), nk)
    return _codes(zip(type_code.tolist(), attr_code.tolist(), sub_code.tolist()), nk)[at], at


def _costs_op_by_op(col: ProgramColumns, computes: np.ndarray, shape_of: np.ndarray,
                    cost: CostModel, content: list
                    ) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`program_costs` of a small program, one op after another."""
    shapes = shape_of.tolist()
    reads = col.reads.tolist()
    ops_at = computes.tolist()
    in_start, n_in = col.in_start[computes].tolist(), col.n_in[computes].tolist()
    out_start, n_out = col.out_start[computes].tolist(), col.n_out[computes].tolist()
    seen: Dict[tuple, tuple] = {}
    rows = []
    for k, i in enumerate(ops_at):
        a, b = in_start[k], out_start[k]
        key = (content[k], tuple([shapes[v] for v in reads[a:a + n_in[k]]]),
               tuple(shapes[b:b + n_out[k]]))
        row = seen.get(key)
        if row is None:
            c = cost.op_cost(col.ops[i])
            row = seen[key] = (c.time_s, c.flops, c.bytes)
        rows.append(row)
    table = np.array(rows, dtype=float).reshape(len(rows), 3)
    return table[:, 0].copy(), table[:, 1].copy(), table[:, 2].copy()


def _costs_by_group(col: ProgramColumns, computes: np.ndarray, shape_of: np.ndarray,
                    cost: CostModel, content: np.ndarray, at: np.ndarray
                    ) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`program_costs` of a large program, a numpy table per content
    and arity (``at``: each op's kind's place)."""
    nc = len(computes)
    out = (np.zeros(nc), np.zeros(nc), np.zeros(nc))
    n_in, n_out = col.n_in[computes], col.n_out[computes]
    # ops of one content and arity share a row width: each group is one table
    # (content, arity) as one integer (arities below 2**16: one op reads
    # or makes no more values than that here; else told apart as tuples)
    if len(n_in) and max(int(n_in.max()), int(n_out.max())) < 1 << 16:
        shape_key = (content << 32) | (n_in << 16) | n_out
    else:
        shape_key = _codes(zip(content.tolist(), n_in.tolist(), n_out.tolist()), nc)
    for _, group in groups(shape_key):
        taken = computes[group]
        k_in, k_out = int(n_in[group[0]]), int(n_out[group[0]])
        shapes = np.concatenate([
            shape_of[col.reads[col.in_start[taken][:, None] + np.arange(k_in)]],
            shape_of[col.out_start[taken][:, None] + np.arange(k_out)]], axis=1)
        # rows coded by their shapes; the copies of a template usually have
        # its shapes, so each kind's first op is coded and its copies are
        # checked against it with numpy (those that differ are coded too)
        _, first_of_kind, of_kind = np.unique(at[group], return_index=True,
                                              return_inverse=True)
        of_kind = of_kind.reshape(-1)
        table: Dict[tuple, int] = {}
        row = np.fromiter(map(table.setdefault, zip(*shapes[first_of_kind].T.tolist()),
                              count()), np.int64, len(first_of_kind))[of_kind]
        odd = np.flatnonzero((shapes != shapes[first_of_kind][of_kind]).any(axis=1))
        if len(odd):
            row[odd] = np.fromiter(map(table.setdefault, zip(*shapes[odd].T.tolist()),
                                       count(len(first_of_kind))), np.int64, len(odd))
        _, firsts, inverse = np.unique(row, return_index=True, return_inverse=True)
        costed = [cost.op_cost(col.ops[i]) for i in taken[firsts].tolist()]
        for column, name in zip(out, ("time_s", "flops", "bytes")):
            column[group] = np.array([getattr(c, name) for c in costed],
                                     dtype=float)[inverse.reshape(-1)]
    return out
