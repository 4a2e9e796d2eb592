"""Clean-up passes shared by other transforms."""
from __future__ import annotations

from typing import Set

from ..ir.core import Function, Value


def eliminate_dead_code(function: Function) -> Function:
    """Drop ops none of whose results is used or returned (in place)."""
    live: Set[Value] = set(function.outputs)
    kept = []
    for op in reversed(function.ops):
        if any(v in live for v in op.outputs):
            kept.append(op)
            live.update(op.inputs)
    kept.reverse()
    function.ops = kept
    return function
