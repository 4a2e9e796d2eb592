"""The ``call`` op: a function calling another function of its module.

    %y = call(%x, %w) {callee = "mlp"} : f32[8,16]

The callee is named by the ``callee`` attribute (so the text form is plain
op syntax) and, once linked (:func:`link_calls`), held as the op's single
sub-function. A call's result types are its callee's: the registry's shape
rule only sees attributes, so it cannot give them; use
:func:`call_result_types` (the sharding verifier and lowering do).
"""
from __future__ import annotations

from typing import List, Sequence

from ..errors import VerifyError
from .core import Function, Module, Op
from .registry import REQUIRED, OpSpec, ShapeError, register
from .types import Type

CALL = "call"


def _call_rule(types, attrs):
    raise ShapeError(f"the result types of call @{attrs['callee']} come from its callee; "
                     "verify a module with calls with distsim.ir.ops_call.verify_calls")


register(OpSpec(CALL, None, _call_rule, {"callee": REQUIRED},
                doc="call the module function named by 'callee' (held as the op's sub-function)"))


def is_call(op: Op) -> bool:
    return op.op_type == CALL


def callee_of(op: Op) -> Function:
    if not op.subfunctions:
        raise VerifyError(f"call %{op.name} to @{op.attrs.get('callee')} is not linked "
                          "(run distsim.ir.ops_call.link_calls on its module)")
    return op.subfunctions[0]


def make_call(callee: Function, inputs: Sequence, outputs: Sequence) -> Op:
    return Op(CALL, inputs, outputs, {"callee": callee.name}, subfunctions=(callee,))


def link_calls(module: Module) -> Module:
    """Point every call op at the module function its ``callee`` names
    (in place); VerifyError for an unknown callee or a recursive call."""
    for f in module:
        for op in f.ops:
            if is_call(op):
                name = op.attrs.get("callee")
                if name not in module.functions:
                    raise VerifyError(f"function '{f.name}', op %{op.name}: call to unknown "
                                      f"function @{name}")
                op.subfunctions = (module.functions[name],)
    _check_acyclic(module)
    return module


def _check_acyclic(module: Module) -> None:
    state = {}

    def visit(f: Function, path: List[str]) -> None:
        if state.get(f.name) == "done":
            return
        if state.get(f.name) == "open":
            raise VerifyError(f"recursive call: {' -> '.join(path + [f.name])}")
        state[f.name] = "open"
        for op in f.ops:
            if is_call(op):
                visit(callee_of(op), path + [f.name])
        state[f.name] = "done"

    for f in module:
        visit(f, [])


def call_result_types(op: Op, input_types: Sequence[Type]) -> List[Type]:
    """The callee's result types, after checking the argument types."""
    callee = callee_of(op)
    if len(input_types) != len(callee.inputs):
        raise ShapeError(f"@{callee.name} takes {len(callee.inputs)} arguments, got "
                         f"{len(input_types)}")
    for i, (t, p) in enumerate(zip(input_types, callee.inputs)):
        if t != p.type:
            raise ShapeError(f"argument {i} of @{callee.name} is {t}, its parameter %{p.name} "
                             f"is {p.type}")
    return [v.type for v in callee.outputs]


def verify_calls(module: Module) -> Module:
    """Check every call against its callee's signature (link first)."""
    link_calls(module)
    for f in module:
        for op in f.ops:
            if is_call(op):
                try:
                    expected = call_result_types(op, [v.type for v in op.inputs])
                except ShapeError as e:
                    raise VerifyError(f"function '{f.name}', op %{op.name} = call: {e}") from None
                if [v.type for v in op.outputs] != expected:
                    raise VerifyError(f"function '{f.name}', op %{op.name} = call: results "
                                      f"declared {[str(v.type) for v in op.outputs]}, "
                                      f"@{op.attrs['callee']} returns {[str(t) for t in expected]}")
    return module
