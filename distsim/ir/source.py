"""Where an op comes from, and how an error names it.

- ``op.meta["loc"]``: a :class:`SourceLoc`, the source and line of the op
  in the text it was parsed from (the parser sets it).
- ``op.meta["origin"]``: an :class:`Origin`, the user's op that a
  transform made this op for (the sharding propagator sets it on every op
  it emits: a specialised copy, a ``redistribute`` before or after it).

An error about an op names the op the user wrote, where the text has it:
``nested.dir:9: function 'main', op %y = call``; an op a transform made is
named through its origin, followed by what it is in the transformed
program (``(as %x_rd = redistribute in @mlp.1)``).
"""
from __future__ import annotations

from typing import NamedTuple, Optional

from ..errors import DistsimError, ParseError
from .core import Op

LOC = "loc"
ORIGIN = "origin"


class SourceLoc(NamedTuple):
    """A place in a source text: its name (a path) and a line."""

    source: str
    line: int

    def __str__(self) -> str:
        return f"{self.source}:{self.line}"


class Origin(NamedTuple):
    """The user's op (and the function holding it) an op was made for."""

    function: str
    op: Op


def origin_of(function: str, op: Op) -> Origin:
    """The user's op behind ``op`` of ``function`` (``op`` itself when no
    transform made it)."""
    found = op.meta.get(ORIGIN)
    return found if isinstance(found, Origin) else Origin(function, op)


def loc_of(op: Op) -> Optional[SourceLoc]:
    found = op.meta.get(LOC)
    return found if isinstance(found, SourceLoc) else None


def op_text(op: Op) -> str:
    outs = ", ".join("%" + v.name for v in op.outputs) or "(no results)"
    return f"{outs} = {op.op_type}"


def describe(function: str, op: Op) -> str:
    """``[source:line: ]function 'f', op %y = type`` for the user's op
    behind ``op``, and what ``op`` is where that differs (an op a transform
    made, a copy in a specialised function)."""
    user = origin_of(function, op)
    loc = loc_of(user.op)
    text = f"{loc}: " if loc is not None else ""
    text += f"function '{user.function}', op {op_text(user.op)}"
    if (user.function, op_text(user.op)) != (function, op_text(op)):
        text += f" (as {op_text(op)} in @{function})"
    return text


def made_for(function: str, op: Op) -> dict:
    """The ``meta`` of an op a transform makes for ``op`` of ``function``:
    its origin, the user's op."""
    return {ORIGIN: origin_of(function, op)}


def at_op(error: DistsimError, function: str, op: Op) -> DistsimError:
    """``error``, raised while a transform handled ``op`` of ``function``,
    as an error of the same class naming the user's op first; an error
    that names one already (raised inside a callee) gets the call it was
    reached through added at the end. A ParseError is returned as it is
    (it names its place in the text)."""
    if isinstance(error, ParseError):
        return error
    where = describe(function, op)
    if getattr(error, "names_op", False):
        new = type(error)(f"{error} (called from {where})")
    else:
        new = type(error)(f"{where}: {error}")
    new.names_op = True
    return new
