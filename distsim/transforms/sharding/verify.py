"""The verifier of sharded programs.

- :func:`verify_sharded` (global view): every placement fits its value
  (dim exists, axis exists, shard size vs axis size), its mesh is the
  module's, each op's global shapes follow its shape rule, and -- once
  propagated -- each op's placements on every mesh axis are a strategy of
  its sharding rule, and together they lower to per-device ops whose
  pieces line up (:mod:`.validity`); every call matches its callee's
  signature (argument and result counts, shapes and dtypes; once
  propagated, placements too).
- :func:`verify_teams` (local view): every collective's team lies inside
  the mesh it names and is a group along the axes it names.

Errors are VerifyErrors naming the function, the value or op (the user's
op, and the file and line it was read from: :mod:`distsim.ir.source`),
and the rule.
"""
from __future__ import annotations

from typing import Mapping, Optional, Sequence

from ...errors import VerifyError
from ...ir.comm import is_communication
from ...ir.core import Function, Module, Op
from ...ir.mesh import DeviceMesh, DTensorType, check_placements
from ...ir.ops_call import is_call, link_calls, signature_error
from ...ir.registry import ShapeError, infer_types
from ...ir.source import describe
from ...ir.types import TensorType
from .propagate import REDISTRIBUTE
from .blocks import blocked_strategies
from .remembered import Remembered, frozen
from .rules import RULES, OpContext, strategies_for
from .validity import combination_error


def _plain(t) -> TensorType:
    return TensorType(t.shape, t.dtype, getattr(t, "device", None))


def verify_sharded(module: Module, propagated: bool = False) -> Module:
    link_calls(module)
    for f in module:
        _verify_function(f, module.meshes, propagated)
    return module


#: DTensor types whose placements fit their shape and mesh
_PLACED: Remembered[bool] = Remembered()


def _verify_function(f: Function, meshes: Mapping[str, DeviceMesh], propagated: bool) -> None:
    seen = set()
    for v in f.values():
        where = f"function '{f.name}', value %{v.name}"
        if v.name in seen:
            raise VerifyError(f"{where}: name used for two values (rule: SSA)")
        seen.add(v.name)
        t = v.type
        if isinstance(t, DTensorType):
            if meshes.get(t.mesh.name) != t.mesh:
                raise VerifyError(f"{where}: mesh @{t.mesh.name} is not a mesh of the module "
                                  "(rule: declared mesh)")
            if t not in _PLACED:          # (a type is checked once)
                check_placements(t.shape, t.mesh, t.placements, where)
                _PLACED.get(t, lambda: True)
        elif propagated:
            raise VerifyError(f"{where}: has no placement after propagation "
                              "(rule: every value placed)")
    for op in f.ops:
        _verify_op(f, op, propagated)


def _verify_op(f: Function, op: Op, propagated: bool) -> None:
    def where() -> str:      # (named only in an error)
        return describe(f.name, op)

    if is_call(op):
        # before propagation an argument's (or result's) placements may differ
        # from the callee's: a redistribute reconciles them; its tensor may not
        error = signature_error(op, exact=propagated)
        if error is not None:
            raise VerifyError(f"{where()}: {error} (rule: call signature)")
        return
    if op.op_type == REDISTRIBUTE:
        x, y = op.inputs[0].type, op.outputs[0].type
        if (x.shape, x.dtype) != (y.shape, y.dtype):
            raise VerifyError(f"{where()}: turns {_plain(x)} into {_plain(y)}: only "
                              "placements may change (rule: redistribute keeps the tensor)")
        return
    try:
        expected = infer_types(op.op_type, [_plain(v.type) for v in op.inputs], op.attrs)
    except ShapeError as e:
        raise VerifyError(f"{where()}: {e}") from None
    for v, t in zip(op.outputs, expected):
        if (v.type.shape, v.type.dtype) != (t.shape, t.dtype):
            raise VerifyError(f"{where()}: result %{v.name} is {v.type}, the op gives "
                              f"{t.dtype.value}{list(t.shape)} (rule: shape)")
    if not propagated:
        return
    values = list(op.inputs) + list(op.outputs)
    mesh = values[0].type.mesh
    for v in values:
        if v.type.mesh != mesh:
            raise VerifyError(f"{where()}: %{v.name} is on mesh @{v.type.mesh.name}, not "
                              f"@{mesh.name} (rule: one mesh per op)")
    ins, outs = tuple(v.type for v in op.inputs), tuple(v.type for v in op.outputs)
    key = (op.op_type, RULES.get(op.op_type), frozen(op.attrs), ins, outs)
    error = _PLACEMENT_ERRORS.get(key, lambda: _placement_error(op.op_type, op.attrs, ins, outs))
    if error is not None:
        raise VerifyError(f"{where()}: {error}")


#: (op type, rule, attributes, types) -> :func:`_placement_error`'s answer
#: (every layer of a model asks the same)
_PLACEMENT_ERRORS: Remembered[Optional[str]] = Remembered()


def _placement_error(op_type: str, attrs: Mapping[str, object], ins: Sequence[DTensorType],
                     outs: Sequence[DTensorType]) -> Optional[str]:
    """Why the op's placements (one mesh) are not a sharding the rules allow
    or do not lower to per-device ops; None when they are right."""
    mesh = ins[0].mesh if ins else outs[0].mesh
    ctx = OpContext(op_type, attrs, [_plain(t) for t in ins], [_plain(t) for t in outs])
    strategies = strategies_for(ctx)
    strategies = strategies + blocked_strategies(ctx, strategies, list(ins) + list(outs))
    for axis in range(mesh.ndim):
        got = (tuple(t.placements[axis] for t in ins), tuple(t.placements[axis] for t in outs))
        if got not in strategies:
            shown = ", ".join(p.print_text() for p in got[0]) + " -> " + \
                ", ".join(p.print_text() for p in got[1])
            return (f"placements {shown} on axis '{mesh.axis_names[axis]}' are not a sharding "
                    f"of {op_type} (rule: op sharding rule)")
    err = combination_error(op_type, attrs, list(ins), list(outs))
    if err is not None:
        return f"its placements do not lower to per-device ops: {err} (rule: pieces line up)"
    return None


def verify_teams(function: Function, meshes: Mapping[str, DeviceMesh]) -> Function:
    for op in function.ops:
        if not is_communication(op) or op.attrs.get("mesh") is None:
            continue
        where = describe(function.name, op)
        mesh = meshes.get(op.attrs["mesh"])
        if mesh is None:
            raise VerifyError(f"{where}: names unknown mesh @{op.attrs['mesh']} "
                              "(rule: team in mesh)")
        ranks = tuple(op.attrs["ranks"])
        outside = [r for r in ranks if r not in mesh.devices]
        if outside:
            raise VerifyError(f"{where}: ranks {outside} are outside mesh @{mesh.name} "
                              f"{list(mesh.devices)} (rule: team in mesh)")
        axes = op.attrs.get("axes")
        if axes:
            for a in axes:
                if a not in mesh.axis_names:
                    raise VerifyError(f"{where}: mesh @{mesh.name} has no axis '{a}' "
                                      "(rule: team in mesh)")
            if ranks not in mesh.groups(list(axes)) and len(ranks) != 2:
                raise VerifyError(f"{where}: ranks {list(ranks)} are not a group along axes "
                                  f"{list(axes)} of mesh @{mesh.name} (rule: team along axes)")
    return function
