"""The verifier: checks the invariants every pass and executor relies on.

- SSA: every value is defined once, names are unique;
- order: every operand is defined before the op that reads it;
- types: each op's declared output types equal what its shape rule infers
  (which also checks arity, attributes, devices and collective teams);
- outputs: the function's outputs are defined;
- sizes: no value takes more than 2^60 bytes (a malformed dimension).

Every error is a :class:`VerifyError` that names the function and the op.
"""
from __future__ import annotations

from typing import Iterable, Set

from ..errors import UnsupportedOpError, VerifyError
from .core import Function, Module, Op, gc_paused
from .ops_fused import FUSED, fused_result_types
from .registry import ShapeError, infer_types, is_registered


# No real tensor comes near this (an exbibyte); a larger one is a malformed
# dimension, and would make every later number (time, memory) meaningless.
MAX_VALUE_BYTES = 2 ** 60


def _label(function: Function, op: Op) -> str:
    outs = ", ".join("%" + v.name for v in op.outputs) or "(no results)"
    return f"function '{function.name}', op {outs} = {op.op_type}"


def verify(function: Function, known_devices: Iterable[int] | None = None) -> Function:
    """Raise VerifyError on the first broken invariant; return the function."""
    with gc_paused():
        return _verify(function, known_devices)


def _verify(function: Function, known_devices: Iterable[int] | None) -> Function:
    defined: Set[int] = set()
    names: Set[str] = set()
    devices = set(known_devices) if known_devices is not None else None

    def define(value, where: str) -> None:
        if id(value) in defined:
            raise VerifyError(f"{where}: value %{value.name} is defined twice")
        if value.name in names:
            raise VerifyError(f"{where}: name %{value.name} is used for two values")
        defined.add(id(value))
        names.add(value.name)
        size = getattr(value.type, "size_bytes", 0)
        if isinstance(size, int) and size > MAX_VALUE_BYTES:
            raise VerifyError(f"{where}: value %{value.name} ({value.type}) would take more "
                              f"than 2^60 bytes: a dimension is absurdly large")
        dev = getattr(value.type, "device", None)
        if devices is not None and dev is not None and dev not in devices:
            raise VerifyError(f"{where}: value %{value.name} is on device {dev}, "
                              f"which is not one of the devices {sorted(devices)}")

    for v in function.inputs:
        define(v, f"function '{function.name}', input")
    for op in function.ops:
        where = _label(function, op)
        if not is_registered(op.op_type):
            raise VerifyError(f"{where}: unknown op type '{op.op_type}'")
        for v in op.inputs:
            if id(v) not in defined:
                raise VerifyError(f"{where}: operand %{v.name} is used before it is defined")
        try:
            if op.op_type == FUSED:
                expected = fused_result_types(op, [v.type for v in op.inputs])
            else:
                expected = infer_types(op.op_type, [v.type for v in op.inputs], op.attrs)
        except ShapeError as e:
            raise VerifyError(f"{where}: {e}") from None
        except UnsupportedOpError as e:
            raise VerifyError(f"{where}: {e}") from None
        if len(expected) != len(op.outputs):
            raise VerifyError(f"{where}: has {len(op.outputs)} results, its type rule gives {len(expected)}")
        for v, t in zip(op.outputs, expected):
            if v.type != t:
                raise VerifyError(f"{where}: result %{v.name} is declared {v.type} "
                                  f"but the op produces {t}")
        for v in op.outputs:
            define(v, where)
    for v in function.outputs:
        if id(v) not in defined:
            raise VerifyError(f"function '{function.name}': returned value %{v.name} is not defined")
    return function


def verify_module(module: Module) -> Module:
    for f in module:
        verify(f)
    return module
