"""A program read into flat arrays: what the simulator's index is derived from.

Values are numbered function inputs first, then each op's results in
program order. Where the builder wrote the program's columns down (a
:class:`~distsim.ir.build_log.BuildLog` whose columns still describe the
function), they are taken as they are; otherwise from a
:class:`~distsim.ir.value_table.ValueTable` (the verifier's, when given,
else one read here: C-level maps over the objects, no Python step per op).

Facts of an op that depend only on its type, attributes, sub-functions and
``meta`` (its cost signature, memory category, a collective's team) are
worked out per *kind* of op, over :attr:`ProgramColumns.kinds`, and spread
to the ops by :attr:`ProgramColumns.kind`. Where the builder said which ops
are copies of one template (a :class:`~distsim.ir.build_log.BuildLog` in
``function.build_log``, still describing the function), a kind is a template's
copies, and those facts are read once per template; otherwise every op is
a kind of its own. Both give the same index (tested).
"""
from __future__ import annotations

from itertools import chain, count, islice, repeat
from operator import attrgetter, itemgetter, methodcaller
from typing import Any, Dict, Iterable, List, Optional, Set, Tuple

import numpy as np

from ..errors import SimulationError
from ..ir.comm import COMM_PREFIX
from ..ir.core import Function, Op, Value
from ..ir.build_log import BuildLog
from ..ir.value_table import ValueTable
from ..ir.types import Type

_NAME, _OP_TYPE = attrgetter("name"), attrgetter("op_type")
_IS_COMM = methodcaller("startswith", COMM_PREFIX)


def codes(keys: Iterable[Any], n: int) -> np.ndarray:
    """A small integer per key, equal keys equal integers (first seen, first
    numbered: the numbers are not dense)."""
    table: Dict[Any, int] = {}
    return np.fromiter(map(table.setdefault, keys, count()), np.int64, n)


class ProgramColumns:
    """The program as flat arrays (see the module docstring).

    ``ops``, ``values`` (by number) and ``types`` (each value's);
    ``n_in`` / ``n_out`` per op, ``reads`` (the value numbers of every
    op's operands, flat, with ``in_start`` the first of each op's),
    ``out_start`` (each op's first result), ``reader`` (the op of each
    entry of ``reads``), ``maker`` (the op making each value, -1 for an
    input); ``kinds`` (one op standing for each kind, in program order) and
    ``kind`` (each op's, a position in ``kinds``); ``is_comm`` per op;
    ``outputs`` (the numbers of the function's outputs, -1 for one the
    program does not define).

    A SimulationError names a value defined twice or an operand that no op
    or input defines."""

    def __init__(self, function: Function, table: Optional[ValueTable] = None) -> None:
        f = self.function = function
        ops = self.ops = f.ops
        n = self.n_ops = len(ops)
        self.n_inputs = len(f.inputs)
        #: as the builder gave them (BuildLog): the results named as
        #: gradients, by number (from its columns), and the in-place updates
        #: of ``meta["updates"]`` as (old, new) numbers (-1: not in the
        #: program; from its columns or the values it logged); None: found
        #: by name
        self.gradients: Optional[np.ndarray] = None
        self.in_place: Optional[Tuple[np.ndarray, np.ndarray]] = None
        self._table: Optional[ValueTable] = None
        log = f.build_log
        logged, columns = (log.describes(f) if isinstance(log, BuildLog)
                           else (False, False))
        if columns:
            self._from_columns(log)
        else:
            self._from_objects(table)
            if logged and log.updated is not None:
                self.in_place = self._updated(log.updated, f.meta.get("updates"))
        self.in_start = np.cumsum(self.n_in) - self.n_in
        self.out_start = self.n_inputs + np.cumsum(self.n_out) - self.n_out
        self.reader = np.repeat(np.arange(n), self.n_in)
        self.maker = np.concatenate([np.full(self.n_inputs, -1, np.int64),
                                     np.repeat(np.arange(n), self.n_out)])
        if logged:
            self.kinds: List[Op] = list(map(ops.__getitem__, log.firsts))
            self.kind = np.array(log.kind, np.int64).reshape(-1)
        else:
            self.kinds, self.kind = ops, np.arange(n)
        self.is_comm = self.per_kind(map(_IS_COMM, map(_OP_TYPE, self.kinds)), bool)
        self._names: Optional[List[str]] = None

    def _from_columns(self, log: BuildLog) -> None:
        """What the builder wrote down: no op or value is read."""
        self.values = log.values
        self.types: List[Type] = log.types
        self.n_values = len(log.values)
        self.n_in = np.array(log.n_in, np.int64).reshape(-1)
        self.n_out = np.array(log.n_out, np.int64).reshape(-1)
        self.reads = np.array(log.reads, np.int64).reshape(-1)
        self.outputs = np.array(log.outputs, np.int64).reshape(-1)
        if log.gradients is not None:
            self.gradients = np.array(log.gradients, np.int64).reshape(-1)
        if log.in_place is not None:
            pairs = log.in_place
            self.in_place = (np.fromiter(pairs.keys(), np.int64, len(pairs)),
                             np.fromiter(pairs.values(), np.int64, len(pairs)))

    def _from_objects(self, table: Optional[ValueTable]) -> None:
        """Every op's operands and results, and every value's type, from a
        :class:`~distsim.ir.value_table.ValueTable` (``table`` if it still
        describes the function, else one read now)."""
        f = self.function
        if table is None or not table.describes(f):
            table = ValueTable(f)
        self._table = table
        self.values, self.types = table.values, table.types
        self.n_values = len(table.values)
        if table.duplicated:
            raise SimulationError(_defined_twice(f))
        self.n_in, self.n_out, self.reads = table.n_in, table.n_out, table.reads
        if (self.reads < 0).any():
            raise SimulationError(_undefined_read(f, set(map(id, self.values))))
        self.outputs = table.outputs

    def _updated(self, logged: Tuple[Dict[str, str], List[Tuple[Value, Value]]],
                 updates: Any) -> Optional[Tuple[np.ndarray, np.ndarray]]:
        """The (old, new) numbers of the updates the builder logged as
        values, or None when they do not describe ``updates`` (the
        function's ``meta["updates"]``: see :class:`BuildLog`)."""
        written, pairs = logged
        if updates is not written:
            return None
        if len(pairs) != len(updates):      # an old value updated twice: the last counts
            pairs = list(dict(pairs).items())
            if len(pairs) != len(updates):
                return None
        n = len(pairs)
        return (self._table.number(map(itemgetter(0), pairs), n),
                self._table.number(map(itemgetter(1), pairs), n))

    def type_numbers(self) -> Optional[Tuple[np.ndarray, np.ndarray]]:
        """The type objects numbered by identity, when the values came
        from a :class:`~distsim.ir.value_table.ValueTable` (which keeps
        them: the verifier numbered them already); else None."""
        return self._table.type_numbers() if self._table is not None else None

    def names(self) -> List[str]:
        """Every value's name, by number (read once, when first asked for)."""
        if self._names is None:
            self._names = list(map(_NAME, self.values))
        return self._names

    def first_operand(self) -> np.ndarray:
        """Each op's first result, else its first operand (-1: neither):
        the value whose device is the op's."""
        has_in = self.n_in > 0
        first_in = np.full(self.n_ops, -1, np.int64)
        first_in[has_in] = self.reads[self.in_start[has_in]]
        return np.where(self.n_out > 0, self.out_start, first_in)

    def per_kind(self, column: Iterable[Any], dtype: Any = np.int64) -> np.ndarray:
        """A value per kind (``column`` over :attr:`kinds`), spread to every op."""
        return np.fromiter(column, dtype, len(self.kinds))[self.kind]


def pick(items: List[Any], positions: np.ndarray) -> List[Any]:
    """``items`` at ``positions``, without a Python loop."""
    return list(map(items.__getitem__, positions.tolist()))


def spans(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """The positions of the slices ``[start, start + count)``, one after
    another (a ragged gather without a Python loop)."""
    return np.repeat(starts - (np.cumsum(counts) - counts), counts) + np.arange(int(counts.sum()))


def cut(items: List[Any], counts: List[int]) -> List[tuple]:
    """``items`` cut into consecutive tuples of ``counts`` items each."""
    rest = iter(items)
    return list(map(tuple, map(islice, repeat(rest), counts)))


def kinds_of(col: ProgramColumns, at: np.ndarray) -> Tuple[List[Op], np.ndarray]:
    """The kinds of the ops at positions ``at`` (an op standing for each)
    and, for each of those ops, its kind's place in that list."""
    kind = col.kind[at]
    used = np.flatnonzero(np.bincount(kind, minlength=len(col.kinds)))
    place = np.empty(len(col.kinds), np.int64)
    place[used] = np.arange(len(used))
    return pick(col.kinds, used), place[kind]


def groups(keys: np.ndarray) -> List[Tuple[int, np.ndarray]]:
    """Each distinct key with the positions that hold it (ascending), the
    keys in the order they first appear."""
    order = np.argsort(keys, kind="stable")
    ordered = keys[order]
    firsts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]]) if len(keys) \
        else np.zeros(0, np.int64)
    ends = np.r_[firsts[1:], len(keys)].astype(np.int64)
    out = [(key, order[a:b]) for key, a, b in
           zip(ordered[firsts].tolist(), firsts.tolist(), ends.tolist())]
    out.sort(key=lambda group: int(group[1][0]))
    return out


def _defined_twice(f: Function) -> str:
    seen: Set[int] = set()
    for v in chain(f.inputs, chain.from_iterable(op.outputs for op in f.ops)):
        if id(v) in seen:
            return (f"value %{v.name} is defined twice (an op's result or input of "
                    "the program once each)")
        seen.add(id(v))
    return "a value is defined twice"   # pragma: no cover - the caller saw one


def _undefined_read(f: Function, defined: Set[int]) -> str:
    for op in f.ops:
        for v in op.inputs:
            if id(v) not in defined:
                return (f"op %{op.name} ({op.op_type}) reads %{v.name}, which no op or "
                        "input of the program defines")
    return "an op reads a value nobody defines"   # pragma: no cover - the caller saw one
