"""Every value of a function numbered, and every op's operands as numbers.

The verifier and the simulator's index both need the same facts about a
program of a million values: which value each operand is, whether a value
is defined twice, how many operands and results each op has. A
:class:`ValueTable` reads them once, by C-level maps over the objects (no
Python step per op), and both take it from there; :func:`distsim.simulate`
makes one and hands it to both.

Values are numbered function inputs first, then each op's results in
program order. Operands are numbered by identity without a hash table over
the values: the values' ids (addresses, which a live value keeps) are
sorted once and each operand's is found by binary search. A dict keyed by
a million values costs more (its probes land anywhere in a table larger
than the cache); values are made in program order, mostly at rising
addresses, so the stable sort runs over nearly sorted keys.

A table describes its function while the function's lists hold the same
ops, inputs and outputs (:meth:`ValueTable.describes`, identity checks
only). Like a :class:`~distsim.ir.build_log.BuildLog`, it does not notice
an op or value changed in place afterwards: ops and values are not changed
once in a function (transforms build new ones).
"""
from __future__ import annotations

from itertools import chain
from operator import attrgetter, is_
from typing import Iterable, List, Optional, Sequence, Tuple

import numpy as np

from .core import Function, Op, Value
from .types import Type

_INPUTS, _OUTPUTS, _TYPE = attrgetter("inputs"), attrgetter("outputs"), attrgetter("type")


class ValueTable:
    """``values`` (by number) and their ``types``; ``n_inputs``; per op
    ``n_in`` and ``n_out`` (operands and results); ``reads`` (the numbers
    of every op's operands, flat; -1 for a value that is not defined in
    the function); ``outputs`` (the numbers of the function's outputs, -1
    likewise); ``duplicated``: whether some value is defined twice (then
    the numbers of that value's reads are one of its definitions)."""

    __slots__ = ("ops", "values", "types", "n_inputs", "n_in", "n_out", "reads", "outputs",
                 "duplicated", "_order", "_sorted_ids", "_outputs_of", "_type_numbers")

    def __init__(self, function: Function) -> None:
        ops: List[Op] = list(function.ops)
        self.ops = ops
        n = len(ops)
        inputs_of = list(map(_INPUTS, ops))
        outputs_of = list(map(_OUTPUTS, ops))
        values: List[Value] = list(function.inputs)
        self.values = values
        self.n_inputs = len(values)
        values.extend(chain.from_iterable(outputs_of))
        nv = len(values)
        ids = np.fromiter(map(id, values), np.int64, nv)
        self._order = np.argsort(ids, kind="stable")
        self._sorted_ids = ids[self._order]
        self.duplicated = bool(nv > 1 and (self._sorted_ids[1:] == self._sorted_ids[:-1]).any())
        self.types: List[Type] = list(map(_TYPE, values))
        self.n_in = np.fromiter(map(len, inputs_of), np.int64, n)
        self.n_out = np.fromiter(map(len, outputs_of), np.int64, n)
        self.reads = self.number(chain.from_iterable(inputs_of), int(self.n_in.sum()))
        self._outputs_of = list(function.outputs)
        self.outputs = self.number(self._outputs_of, len(self._outputs_of))
        self._type_numbers: Optional[Tuple[np.ndarray, np.ndarray]] = None

    def type_numbers(self) -> Tuple[np.ndarray, np.ndarray]:
        """Type objects numbered by identity: the position of the first
        value holding each distinct type object (ascending), and each
        value's type's number (an index into those positions). Read once,
        when first asked for (the verifier and the index both ask)."""
        if self._type_numbers is None:
            self._type_numbers = identity_numbers(self.types)
        return self._type_numbers

    def number(self, values: Iterable[Value], n: int) -> np.ndarray:
        """The numbers of ``n`` ``values``; -1 for one the function does
        not define."""
        wanted = np.fromiter(map(id, values), np.int64, n)
        sorted_ids = self._sorted_ids
        if len(sorted_ids) == 0:
            return np.full(n, -1, np.int64)
        at = np.minimum(np.searchsorted(sorted_ids, wanted), len(sorted_ids) - 1)
        return np.where(sorted_ids[at] == wanted, self._order[at], -1)

    def out_start(self) -> np.ndarray:
        """Each op's first result's number (where its results would start,
        for an op without any)."""
        return self.n_inputs + np.cumsum(self.n_out) - self.n_out

    def describes(self, function: Function) -> bool:
        """Whether ``function`` still has exactly the ops, inputs and
        outputs read (identity checks only: see the module docstring)."""
        f = function
        return (len(f.ops) == len(self.ops) and len(f.inputs) == self.n_inputs
                and len(f.outputs) == len(self._outputs_of)
                and all(map(is_, f.ops, self.ops)) and all(map(is_, f.inputs, self.values))
                and all(map(is_, f.outputs, self._outputs_of)))


def identity_numbers(objects: Sequence[object]) -> Tuple[np.ndarray, np.ndarray]:
    """``objects`` numbered by identity, in order of first appearance: the
    position of the first of each distinct object (ascending), and each
    object's number (an index into those positions). A sort of their ids,
    no table keyed by a million objects."""
    ids = np.fromiter(map(id, objects), np.int64, len(objects))
    _, first, number = np.unique(ids, return_index=True, return_inverse=True)
    order = np.argsort(first)               # distinct objects by first appearance
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))
    return first[order], rank[number.reshape(-1)]
