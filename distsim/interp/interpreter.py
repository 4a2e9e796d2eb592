"""One walker for every way of running a function.

Like ``torch.fx.Interpreter``: :class:`Interpreter` walks the ops in order,
keeps ``env`` (value -> whatever the subclass computes) and dispatches each
op to ``run_op``. :class:`~distsim.interp.numpy_executor.NumpyExecutor`
computes numbers, :class:`~distsim.interp.shape_inference.ShapeInference`
computes types. Errors name the op that failed.
"""
from __future__ import annotations

from typing import Any, Dict, List, Sequence

from ..errors import DistsimError, ExecutionError
from ..ir.core import Function, Op, Value


class Interpreter:
    """Walk ``function`` on ``inputs``; subclasses implement ``run_op``."""

    def __init__(self) -> None:
        self.env: Dict[Value, Any] = {}

    def run(self, function: Function, inputs: Sequence[Any]) -> List[Any]:
        if len(inputs) != len(function.inputs):
            raise ExecutionError(f"function '{function.name}' takes {len(function.inputs)} inputs, "
                                 f"got {len(inputs)}")
        self.env = {}
        for value, given in zip(function.inputs, inputs):
            self.env[value] = self.load_input(value, given)
        for op in function.ops:
            args = [self.env[v] for v in op.inputs]
            try:
                results = self.run_op(op, args)
            except DistsimError:
                raise
            except Exception as e:  # a kernel failing on its inputs is reported with the op
                raise ExecutionError(f"function '{function.name}', op %{op.name} ({op.op_type}): "
                                     f"{type(e).__name__}: {e}") from e
            if len(results) != len(op.outputs):
                raise ExecutionError(f"op %{op.name} ({op.op_type}) produced {len(results)} "
                                     f"results, expected {len(op.outputs)}")
            for value, result in zip(op.outputs, results):
                self.env[value] = result
        return [self.env[v] for v in function.outputs]

    def load_input(self, value: Value, given: Any) -> Any:
        """Hook to check or convert a function input."""
        return given

    def run_op(self, op: Op, args: List[Any]) -> List[Any]:  # pragma: no cover - abstract
        raise NotImplementedError
