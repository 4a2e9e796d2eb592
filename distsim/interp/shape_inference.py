"""ShapeInference: the interpreter over types instead of numbers.

Given input types it recomputes every op's result types from the registry's
shape rules; used to re-type a function after its inputs change.
"""
from __future__ import annotations

from typing import Any, List, Sequence

from ..errors import VerifyError
from ..ir.core import Function, Op
from ..ir.registry import ShapeError, infer_types
from .interpreter import Interpreter


class ShapeInference(Interpreter):
    def run_op(self, op: Op, args: List[Any]) -> List[Any]:
        try:
            return infer_types(op.op_type, args, op.attrs)
        except ShapeError as e:
            raise VerifyError(f"op %{op.name} ({op.op_type}): {e}") from None


def infer_function_types(function: Function, input_types: Sequence[Any] | None = None) -> List[Any]:
    """Output types of ``function`` for ``input_types`` (default: its own)."""
    types = input_types if input_types is not None else [v.type for v in function.inputs]
    return ShapeInference().run(function, list(types))
