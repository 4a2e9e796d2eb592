"""What the builder of a function knew as it made it, written down.

A lowering that emits a program of millions of ops knows, as it appends
each op, facts that a reader would otherwise have to read back from every
op and value object afterwards (a cache miss per object touched, a dozen
times over). A :class:`BuildLog` (kept as ``function.build_log``) is where
it writes them down, at the price of a few list appends per op.

*Kinds* (every builder that can say so): the program's ops are copies of
a few thousand template ops, sharing the op type, attributes,
sub-functions and analysis ``meta``, only operands and results told apart.
Ops added with the same *token* (compared by identity) promise the same op
type, attributes, sub-functions and ``meta`` entries ``category``,
``role``, ``phase`` and ``detail``; an op added without one is a kind of
its own. A reader works out what those decide once per kind.

*Columns* (builders that number the values as they go, like
:class:`~distsim.transforms.data_parallel.DataParallel`): every value's
number and type (inputs first, then each op's results in order), the
numbers each op reads, which results the function's ``meta["grads"]``
names as gradients, the in-place updates of ``meta["updates"]`` as
numbers, and the numbers of the function's outputs: everything the
simulator's index would read from the objects.

*Updates* (builders that do not number values, like the transformer
lowering): the in-place updates of ``meta["updates"]`` as the value
objects, so that a reader finds them among a million values by identity
instead of by reading every value's name. They describe the function while
its ``meta["updates"]`` is the very dict the builder wrote them with, of as
many entries as distinct old values logged (as with the ops, an entry
changed in place is not detected).

A log describes its function only while nobody changes the function's
lists: :meth:`BuildLog.matches` and :meth:`BuildLog.columns_match` check
that by identity (reading no op), and a reader falls back to the objects
when they fail. Changing an op or a value in place (its operands,
results, attributes, the ``meta`` entries above, a value's type or name)
after it was logged is not detected: ops and values are not changed once
in a function (transforms build new ones).
"""
from __future__ import annotations

import weakref
from operator import attrgetter, is_
from typing import Any, Dict, Hashable, List, Optional, Sequence, Tuple

from .core import Function, Op, Value
from .types import Type

_TYPE = attrgetter("type")


class BuildLog:
    """Each op of one function, in order, with the token of its kind; and,
    for a builder that numbers values, the function's columns."""

    __slots__ = ("_function", "ops", "kind", "firsts", "_kind_of", "_tokens", "numbered",
                 "values", "types", "n_inputs", "reads", "n_in", "n_out", "outputs",
                 "gradients", "in_place", "updated")

    def __init__(self, function: Function, numbered: bool = False) -> None:
        # the function logged (weakly: the function holds its log)
        self._function = weakref.ref(function)
        self.ops: List[Op] = []
        #: per op: its kind (kinds numbered as they first appear), and each
        #: kind's first op (its position)
        self.kind: List[int] = []
        self.firsts: List[int] = []
        self._kind_of: Dict[int, int] = {}     # id(token) -> kind
        self._tokens: List[Any] = []           # keeps each kind's token (and so its id) alive
        #: whether the columns below are kept (see :meth:`add_input`)
        self.numbered = numbered
        #: every value by number, and its type
        self.values: List[Value] = []
        self.types: List[Type] = []
        self.n_inputs = 0
        #: the numbers of every op's operands, flat, and per op how many it
        #: reads and makes
        self.reads: List[int] = []
        self.n_in: List[int] = []
        self.n_out: List[int] = []
        #: the numbers of the function's outputs, of the results named as
        #: gradients, and the in-place updates (old, new; -1 for a name that
        #: names no value), each None until the builder gives them
        self.outputs: Optional[List[int]] = None
        self.gradients: Optional[List[int]] = None
        self.in_place: Optional[Dict[int, int]] = None
        #: for a log without columns: the function's ``meta["updates"]``
        #: (the dict object itself) and the same updates as (old, new)
        #: values, in the order written; None until the builder gives them
        self.updated: Optional[Tuple[Dict[str, str], List[Tuple[Value, Value]]]] = None

    def __reduce__(self):
        """A pickled function carries no log (it is a cache of its
        builder's knowledge, tied to the objects of one process): it
        unpickles as ``build_log = None``, and is read from its objects."""
        return (_no_log, ())

    def add(self, op: Op, token: Optional[Hashable] = None) -> None:
        """``op`` was appended to the function's ops (its values not
        numbered here: a numbered log stops keeping columns)."""
        self.numbered = False
        self._add_kind(op, token)

    def add_input(self, value: Value) -> int:
        """``value`` was appended to the function's inputs; its number.
        Inputs come first: one added after an op ends the columns."""
        if self.ops:
            self.numbered = False
        self.values.append(value)
        self.types.append(value.type)
        self.n_inputs += 1
        return len(self.values) - 1

    def add_numbered(self, op: Op, reads: Sequence[int], token: Optional[Hashable] = None
                     ) -> int:
        """``op`` was appended to the function's ops, reading the values
        numbered ``reads`` (its operands, in order); the number of its first
        result (the others follow)."""
        first = len(self.values)
        outs = op.outputs
        self.values.extend(outs)
        self.types.extend(map(_TYPE, outs))
        self.reads.extend(reads)
        self.n_in.append(len(reads))
        self.n_out.append(len(outs))
        self._add_kind(op, token)
        return first

    def _add_kind(self, op: Op, token: Optional[Hashable]) -> None:
        k = None if token is None else self._kind_of.get(id(token))
        if k is None:
            k = len(self.firsts)
            self.firsts.append(len(self.ops))
            if token is not None:
                self._kind_of[id(token)] = k
                self._tokens.append(token)
        self.kind.append(k)
        self.ops.append(op)

    def matches(self, function: Function) -> bool:
        """Whether ``function`` still has exactly the ops logged, in order
        (identity checks only: see the module docstring)."""
        return (self._function() is function and function.build_log is self
                and len(function.ops) == len(self.ops)
                and all(map(is_, function.ops, self.ops)))

    def columns_match(self, function: Function) -> bool:
        """Whether the columns describe ``function``: its ops (see
        :meth:`matches`), inputs and outputs are the ones logged."""
        return self.matches(function) and self._ends_match(function)

    def describes(self, function: Function) -> Tuple[bool, bool]:
        """(:meth:`matches`, :meth:`columns_match`) of ``function``, the ops
        checked once (a reader asks both)."""
        kinds = self.matches(function)
        return kinds, kinds and self._ends_match(function)

    def _ends_match(self, function: Function) -> bool:
        """The columns are kept and the function's inputs and outputs are
        the ones logged."""
        values = self.values
        return (self.numbered and self.outputs is not None
                and len(function.inputs) == self.n_inputs
                and all(map(is_, function.inputs, values))
                and len(function.outputs) == len(self.outputs)
                and all(map(is_, function.outputs, map(values.__getitem__, self.outputs))))

def _no_log() -> None:
    """What a pickled :class:`BuildLog` unpickles as."""
    return None
