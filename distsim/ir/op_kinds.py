"""Kinds of op, as the builder that made a function knew them.

A lowering that emits a program of millions of ops makes them as copies
of a few thousand template ops: the same op type, attributes, sub-functions
and analysis ``meta`` entries, only operands and results told apart. A
reader that must work out facts of each op that depend only on those (its
cost signature, its memory category, a collective's team) can then do it
once per kind instead of once per op, without reading every op's
attributes and ``meta`` back (a cache miss per dict on a program of a
million objects). The builder says which ops are copies of which as it
appends them, for the price of one list append: :meth:`KindLog.add` with a
*token*. Ops added with the same token (compared by identity) promise the
same op type, attributes, sub-functions and ``meta`` entries ``category``,
``role``, ``phase`` and ``detail``. An op added without a token is a kind
of its own.

The log is kept as ``function.kinds``. It describes the function only
while nobody changes its list of ops: :meth:`KindLog.matches` checks that
cheaply (by identity, reading no op), and a reader falls back to one kind
per op when it does not. Changing an op's attributes or ``meta`` entries
above in place is not detected: attributes never change, and analyses
write other ``meta`` entries.
"""
from __future__ import annotations

import weakref
from operator import is_
from typing import Any, Hashable, List, Optional

from .core import Function, Op


class KindLog:
    """Each op of one function, in order, with the token of its kind."""

    __slots__ = ("_function", "ops", "tokens")

    def __init__(self, function: Function) -> None:
        # the function logged (weakly: the function holds its log)
        self._function = weakref.ref(function)
        self.ops: List[Op] = []
        #: per op: its kind's token (the op itself when added without one)
        self.tokens: List[Any] = []

    def add(self, op: Op, token: Optional[Hashable] = None) -> None:
        """``op`` was appended to the function's ops."""
        self.ops.append(op)
        self.tokens.append(op if token is None else token)

    def matches(self, function: Function) -> bool:
        """Whether ``function`` still has exactly the ops logged, in order
        (identity checks only: see the module docstring)."""
        return (self._function() is function and function.kinds is self
                and len(function.ops) == len(self.ops)
                and all(map(is_, function.ops, self.ops)))
