"""Print DistIR in its textual format (the parser reads exactly this).

    func @step(%x: f32[64,128]@0, %w: f32[128,128]@0) -> (f32[64,128]@0) {
      %y = matmul(%x, %w) {trans_b = true} : f32[64,128]@0
      return %y
    }

Types: ``dtype[d0,d1,...]`` then ``@rank`` when the value is placed.
Attributes: booleans, integers, floats, double-quoted strings, lists.
"""
from __future__ import annotations

import json
import math
from typing import Any

from ..ir.core import Function, Module, Op
from ..ir.types import TensorType, TupleType, Type


def print_type(t: Type) -> str:
    if type(t) is TensorType:
        return str(t)
    if isinstance(t, TupleType):
        return "(" + ", ".join(print_type(x) for x in t.types) + ")"
    printer = getattr(t, "print_text", None)
    if printer is not None:
        return printer()
    raise TypeError(f"cannot print type {t!r}")


def print_attr(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, (tuple, list)):
        return "[" + ", ".join(print_attr(v) for v in value) + "]"
    raise TypeError(f"cannot print attribute value {value!r}")


def print_op(op: Op) -> str:
    outs = ", ".join("%" + v.name for v in op.outputs)
    ins = ", ".join("%" + v.name for v in op.inputs)
    text = f"{outs} = {op.op_type}({ins})" if op.outputs else f"{op.op_type}({ins})"
    if op.attrs:
        attrs = ", ".join(f"{k} = {print_attr(v)}" for k, v in sorted(op.attrs.items()))
        text += " {" + attrs + "}"
    if op.outputs:
        text += " : " + ", ".join(print_type(v.type) for v in op.outputs)
    return text


def print_function(f: Function) -> str:
    params = ", ".join(f"%{v.name}: {print_type(v.type)}" for v in f.inputs)
    results = ", ".join(print_type(v.type) for v in f.outputs)
    lines = [f"func @{f.name}({params}) -> ({results}) {{"]
    lines += ["  " + print_op(op) for op in f.ops]
    lines.append("  return " + ", ".join("%" + v.name for v in f.outputs))
    lines.append("}")
    return "\n".join(lines) + "\n"


def print_module(m: Module) -> str:
    parts = []
    for mesh in m.meshes.values():
        parts.append(mesh.print_text() + "\n")
    parts += [print_function(f) for f in m]
    return "\n".join(parts)


def print_program(f: Function) -> str:
    """``f`` and every function its ops hold (a coarsened program's fused
    segments, callees), as a module: ``f`` first, so that it is the
    module's main function when parsed back, then the held functions in
    the order of their first use."""
    order = [f]
    by_name = {f.name: f}
    for g in order:                      # grows as held functions are found
        for op in g.ops:
            for sub in op.subfunctions:
                known = by_name.get(sub.name)
                if known is sub:
                    continue
                if known is not None:
                    raise ValueError(f"two different functions are named @{sub.name}")
                by_name[sub.name] = sub
                order.append(sub)
    module = Module()
    for g in order:
        module.add(g)
    return print_module(module)
