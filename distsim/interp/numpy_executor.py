"""NumpyExecutor: runs a function on real numbers, all devices in one process.

The reference every transform is checked against: run the original and the
transformed program on the same inputs and compare. Collectives are really
executed (see :mod:`distsim.interp.collectives`).
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from ..errors import ExecutionError, UnsupportedOpError
from ..ir.comm import CollectiveType, is_communication
from ..ir.core import Function, Op, Value
from ..ir.types import DType, TensorType
from .collectives import run_collective
from .interpreter import Interpreter
from .kernels import KERNELS


class NumpyExecutor(Interpreter):
    """Execute ops with the numpy kernels; check every input's shape."""

    def load_input(self, value: Value, given: Any) -> Any:
        arr = np.asarray(given)
        t = value.type
        if arr.dtype == object and isinstance(t, TensorType) and t.dtype is DType.U8:
            return arr   # a bundle: its tensors as pack gave them (see kernels._pack)
        if isinstance(t, TensorType) and tuple(arr.shape) != t.shape:
            raise ExecutionError(f"input %{value.name} has shape {tuple(arr.shape)}, "
                                 f"expected {t.shape}")
        return arr

    def run_op(self, op: Op, args: List[Any]) -> List[Any]:
        if is_communication(op):
            if op.attrs.get("present") is not None:
                raise ExecutionError(f"op %{op.name} ({op.op_type}) is from a reduced program "
                                     f"(only ranks {list(op.attrs['present'])} present): it can be "
                                     "simulated but not executed")
            return run_collective(CollectiveType.from_op_type(op.op_type), op.attrs, args)
        kernel = KERNELS.get(op.op_type)
        if kernel is None and op.subfunctions:  # an op holding a function (a call): run it
            return type(self)().run(op.subfunctions[0], args)
        if kernel is None:
            raise UnsupportedOpError(f"op %{op.name}: NumpyExecutor has no kernel for "
                                     f"'{op.op_type}'")
        result = kernel(op.attrs, *args)
        results = [np.asarray(r) for r in (result if isinstance(result, tuple) else [result])]
        for value, r in zip(op.outputs, results):
            _check_result(op, value, r)
        return results


def _check_result(op: Op, value: Value, result: np.ndarray) -> None:
    """A kernel's result has the shape and dtype that the op's declared
    result type says (what the cost model and the simulator read), so that
    every differential test also checks the shape rules. Bundles (object
    arrays of ``pack``) carry their tensors as given."""
    t = value.type
    if not isinstance(t, TensorType) or result.dtype == object:
        return
    if tuple(result.shape) != t.shape:
        raise ExecutionError(f"op %{op.name} ({op.op_type}): the kernel gave shape "
                             f"{tuple(result.shape)}, the result type says {t.shape}")
    if result.dtype != np.dtype(t.dtype.numpy_name):
        raise ExecutionError(f"op %{op.name} ({op.op_type}): the kernel gave dtype "
                             f"{result.dtype}, the result type says {t.dtype.value}")


def random_inputs(function: Function, seed: int = 0,
                  overrides: Optional[Dict[str, np.ndarray]] = None) -> List[np.ndarray]:
    """Deterministic random inputs matching the function's input types
    (floats in [-1, 1), integers in [0, 8), booleans)."""
    rng = np.random.default_rng(seed)
    out = []
    for v in function.inputs:
        if overrides and v.name in overrides:
            out.append(np.asarray(overrides[v.name]))
            continue
        t = v.type
        shape = t.shape
        dtype = t.dtype
        if dtype.is_float:
            out.append(rng.uniform(-1, 1, size=shape).astype(dtype.numpy_name))
        elif dtype.value == "bool":
            out.append(rng.integers(0, 2, size=shape).astype(bool))
        else:
            out.append(rng.integers(0, 8, size=shape).astype(dtype.numpy_name))
    return out


def execute(function: Function, inputs: Sequence[Any]) -> List[np.ndarray]:
    return NumpyExecutor().run(function, inputs)
