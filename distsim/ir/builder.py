"""Build functions op by op with output types inferred by the registry.

    b = FunctionBuilder("step")
    x = b.input("x", TensorType((64, 128), DType.F32, 0))
    w = b.input("w", TensorType((128, 128), DType.F32, 0))
    y = b.op("matmul", [x, w], name="y")
    f = b.finish([y])

A global-view (sharded) program annotates a few values with placements on
a device mesh and lets propagation derive the rest
(:mod:`distsim.transforms.sharding`)::

    mesh = DeviceMesh("tp", (4,), ("tp",))
    w1 = b.annotate_sharding(b.input("w1", TensorType((128, 512), DType.F32)), mesh, ["S(1)"])
"""
from __future__ import annotations

from typing import Any, Dict, Iterable, Mapping, Optional, Sequence, Tuple, Union

from ..errors import VerifyError
from .core import Function, Op, Value
from .mesh import DeviceMesh, Placement, dtensor
from .registry import ShapeError, infer_types, with_defaults
from .types import TensorType, Type


class NameScope:
    """Hands out unique value names within one function."""

    def __init__(self, taken: Iterable[str] = ()) -> None:
        self._taken = set(taken)
        self._counters: Dict[str, int] = {}

    def fresh(self, hint: str) -> str:
        if hint not in self._taken:
            self._taken.add(hint)
            return hint
        n = self._counters.get(hint, 0)
        while True:
            n += 1
            name = f"{hint}.{n}"
            if name not in self._taken:
                self._counters[hint] = n
                self._taken.add(name)
                return name

    def reserve(self, name: str) -> None:
        self._taken.add(name)

    def __contains__(self, name: str) -> bool:
        """Whether ``name`` is taken."""
        return name in self._taken


def annotate_sharding(value: Value, mesh: DeviceMesh,
                      placements: Sequence[Union[Placement, str]]) -> Value:
    """Give ``value`` (a function input or an op result, before
    propagation) the type ``DTensorType(shape, dtype, mesh, placements)``;
    placements may be text (``"S(0)"``, ``"R"``, ``"P(sum)"``). Returns the
    value. VerifyError naming the value for placements that cannot apply
    (a dim or axis that does not exist, a shard smaller than one element)."""
    t = value.type
    if not isinstance(t, TensorType):
        raise VerifyError(f"value %{value.name}: only tensors can be sharded, not {t}")
    if t.device is not None:
        raise VerifyError(f"value %{value.name}: already placed on device {t.device}; "
                          "a sharded value is placed by its mesh")
    value.type = dtensor(t.shape, t.dtype, mesh, placements, f"value %{value.name}")
    return value


class FunctionBuilder:
    """Appends ops to a new function, inferring each op's output types."""

    def __init__(self, name: str) -> None:
        self.function = Function(name)
        self.names = NameScope()

    def input(self, name: str, type: Type) -> Value:
        value = Value(self.names.fresh(name), type)
        self.function.inputs.append(value)
        return value

    def op(self, op_type: str, inputs: Sequence[Value], attrs: Optional[Mapping[str, Any]] = None,
           name: Union[str, Sequence[str], None] = None, meta: Optional[Mapping[str, Any]] = None
           ) -> Union[Value, Tuple[Value, ...]]:
        """Append ``op_type(inputs) {attrs}``; returns its single output, or
        the tuple of outputs when it has several."""
        try:
            attrs = with_defaults(op_type, dict(attrs or {}))
            out_types = infer_types(op_type, [v.type for v in inputs], attrs)
        except ShapeError as e:
            label = name if isinstance(name, str) else op_type
            raise VerifyError(f"op '{label}' ({op_type}): {e}") from None
        if name is None:
            names = [op_type.split(".")[-1]] * len(out_types)
        elif isinstance(name, str):
            names = [name] if len(out_types) == 1 else \
                [f"{name}.{i}" for i in range(len(out_types))]
        else:
            names = list(name)
        outputs = [Value(self.names.fresh(n), t) for n, t in zip(names, out_types)]
        op = Op(op_type, inputs, outputs, attrs, meta=meta)
        self.function.ops.append(op)
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    def annotate_sharding(self, value: Value, mesh: DeviceMesh,
                          placements: Sequence[Union[Placement, str]]) -> Value:
        """Lay ``value`` out on ``mesh`` (see :func:`annotate_sharding`)."""
        return annotate_sharding(value, mesh, placements)

    def append(self, op: Op) -> Op:
        """Append an already-built op (its output names are reserved)."""
        for v in op.outputs:
            self.names.reserve(v.name)
        self.function.ops.append(op)
        return op

    def finish(self, outputs: Sequence[Value]) -> Function:
        self.function.outputs = list(outputs)
        return self.function


def clone_function(function: Function, name: Optional[str] = None
                   ) -> Tuple[Function, Dict[Value, Value]]:
    """A deep copy with fresh Value objects (same names and types); returns
    the copy and the old-to-new value mapping."""
    mapping: Dict[Value, Value] = {}

    def copy(v: Value) -> Value:
        if v not in mapping:
            mapping[v] = Value(v.name, v.type)
        return mapping[v]

    new = Function(name or function.name, [copy(v) for v in function.inputs])
    for op in function.ops:
        new.ops.append(Op(op.op_type, [mapping[v] for v in op.inputs],
                          [copy(v) for v in op.outputs], op.attrs, op.subfunctions, op.meta))
    new.outputs = [mapping[v] for v in function.outputs]
    new.meta = {k: (dict(v) if isinstance(v, dict) else v) for k, v in function.meta.items()}
    return new, mapping


def builder_from(function: Function, name: Optional[str] = None
                 ) -> Tuple[FunctionBuilder, Dict[Value, Value]]:
    """A builder that continues a clone of ``function`` (its outputs unset)."""
    new, mapping = clone_function(function, name)
    b = FunctionBuilder(new.name)
    b.function = new
    for v in new.values():
        b.names.reserve(v.name)
    return b, mapping
