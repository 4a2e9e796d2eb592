"""The ``call`` op: a function calling another function of its module.

    %y = call(%x, %w) {callee = "mlp"} : f32[8,16]

The callee is named by the ``callee`` attribute (so the text form is plain
op syntax) and, once linked (:func:`link_calls`), held as the op's single
sub-function. A call's result types are its callee's: the registry's shape
rule only sees attributes, so it cannot give them: :func:`verify_calls`
checks every call against its callee's signature (the sharding verifier
and propagation do).
"""
from __future__ import annotations

from typing import List, Optional, Sequence

from ..errors import VerifyError
from .core import Function, Module, Op
from .registry import REQUIRED, OpSpec, ShapeError, register
from .source import describe
from .types import TensorType, Type

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
                    raise VerifyError(f"{describe(f.name, op)}: call to unknown function @{name}")
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


def _tensor(t: Type) -> object:
    """What the global view says of a type: its shape and dtype."""
    return (t.shape, t.dtype) if isinstance(t, TensorType) else t


def _shown(t: Type) -> str:
    """The tensor a global-view type describes (no placements)."""
    return str(TensorType(t.shape, t.dtype)) if isinstance(t, TensorType) else str(t)


def signature_error(op: Op, exact: bool = True) -> Optional[str]:
    """What makes a (linked) call disagree with its callee's signature, or
    None: the number of arguments, each argument's type against its
    parameter's, the number of results, each declared result type against
    the callee's. ``exact=False`` compares shapes and dtypes only (the
    global view before propagation: placements may differ, a redistribute
    reconciles them)."""
    callee = callee_of(op)
    same = (lambda a, b: a == b) if exact else (lambda a, b: _tensor(a) == _tensor(b))
    show = str if exact else _shown
    if len(op.inputs) != len(callee.inputs):
        return (f"@{callee.name} takes {len(callee.inputs)} arguments, the call passes "
                f"{len(op.inputs)}")
    for i, (a, p) in enumerate(zip(op.inputs, callee.inputs)):
        if not same(a.type, p.type):
            return (f"argument {i} %{a.name} is {show(a.type)}, but @{callee.name} takes "
                    f"{show(p.type)} (parameter %{p.name})")
    if len(op.outputs) != len(callee.outputs):
        return (f"@{callee.name} returns {len(callee.outputs)} values, the call declares "
                f"{len(op.outputs)} results")
    for i, (v, r) in enumerate(zip(op.outputs, callee.outputs)):
        if not same(v.type, r.type):
            return (f"result {i} %{v.name} is declared {show(v.type)}, but @{callee.name} "
                    f"returns {show(r.type)}")
    return None


def verify_calls(module: Module, exact: bool = True) -> Module:
    """Link the calls and check each against its callee's signature
    (:func:`signature_error`); VerifyError naming the call op."""
    link_calls(module)
    for f in module:
        for op in f.ops:
            if is_call(op):
                error = signature_error(op, exact)
                if error is not None:
                    raise VerifyError(f"{describe(f.name, op)}: {error} (rule: call signature)")
    return module
