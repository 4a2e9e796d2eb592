"""Values, ops, functions and modules: the structure of a DistIR program.

A :class:`Function` holds its input values, its ops in topological order and
its output values. Every value is defined once (SSA): by being a function
input or by being an output of exactly one op. Values compare by identity;
ops also offer a *structural* key (op type, every attribute, operand types)
used to deduplicate and hash collectives.
"""
from __future__ import annotations

import gc
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple

from .types import Type

AttrValue = Any  # bool | int | float | str | tuple of AttrValue


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector while building or walking a
    large program. Values, ops and records form no reference cycles, but
    each of the collector's full passes walks every live object: over a
    program of a million ops those passes cost about a third of the time.
    The previous state is restored on exit (nesting is fine), and what the
    pause allocated is moved to the oldest generation (freeze then unfreeze,
    no traversal): otherwise the first collections afterwards would walk
    all of it three times over (young, middle, then old generation)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.freeze()
            gc.unfreeze()
            gc.enable()


_PLAIN = frozenset({int, float, str, bool, type(None)})


def normalize_attr(value: Any) -> AttrValue:
    """Attributes are immutable: lists become tuples, numpy scalars become
    Python numbers, enums become their value."""
    cls = type(value)
    if cls in _PLAIN:  # hot path: most attributes are plain already
        return value
    if cls is tuple and all(type(v) in _PLAIN for v in value):
        return value
    if isinstance(value, (list, tuple)):
        return tuple(normalize_attr(v) for v in value)
    if isinstance(value, bool) or value is None:
        return value
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        return value.item()
    if hasattr(value, "value") and value.__class__.__module__.startswith("distsim"):
        return value.value
    return value


class Value:
    """A named, typed SSA value. Identity is the object itself."""

    __slots__ = ("name", "type")

    def __init__(self, name: str, type: Type) -> None:
        self.name = name
        self.type = type

    def __repr__(self) -> str:
        return f"%{self.name}: {self.type}"


class Op:
    """One operation: ``outputs = op_type(inputs) {attrs}``.

    ``meta`` is for analyses (costs, schedules, stage ids); transforms and
    analyses never mutate ``attrs``.
    """

    __slots__ = ("op_type", "inputs", "outputs", "attrs", "subfunctions", "meta")

    def __init__(self, op_type: str, inputs: Sequence[Value], outputs: Sequence[Value],
                 attrs: Optional[Mapping[str, Any]] = None,
                 subfunctions: Sequence["Function"] = (),
                 meta: Optional[Dict[str, Any]] = None) -> None:
        self.op_type = op_type
        self.inputs: Tuple[Value, ...] = tuple(inputs)
        self.outputs: Tuple[Value, ...] = tuple(outputs)
        self.attrs: Dict[str, AttrValue] = {k: normalize_attr(v) for k, v in (attrs or {}).items()}
        self.subfunctions: Tuple["Function", ...] = tuple(subfunctions)
        self.meta: Dict[str, Any] = dict(meta or {})

    @classmethod
    def trusted(cls, op_type: str, inputs: Tuple[Value, ...], outputs: Tuple[Value, ...],
                attrs: Dict[str, AttrValue], subfunctions: Tuple["Function", ...] = (),
                meta: Optional[Dict[str, Any]] = None) -> "Op":
        """An op made without copying or normalizing: for builders emitting
        ops by the million that pass tuples, normalized attributes and a
        ``meta`` dict that no other op shares. ``attrs`` may be shared by
        the copies of one op (attributes are never changed in place, and a
        million copies of one small dict cost ~50 MB)."""
        op = object.__new__(cls)
        op.op_type = op_type
        op.inputs = inputs
        op.outputs = outputs
        op.attrs = attrs
        op.subfunctions = subfunctions
        op.meta = {} if meta is None else meta
        return op

    @property
    def name(self) -> str:
        """A display name: the first output's name, or the op type."""
        return self.outputs[0].name if self.outputs else self.op_type

    def structural_key(self) -> tuple:
        """Everything that makes two ops compute the same thing: op type,
        every attribute, operand and result types (not value names)."""
        return (self.op_type, tuple(sorted(self.attrs.items())),
                tuple(v.type for v in self.inputs), tuple(v.type for v in self.outputs),
                tuple(f.structural_key() for f in self.subfunctions))

    def structurally_equal(self, other: "Op") -> bool:
        return self.structural_key() == other.structural_key()

    def __repr__(self) -> str:
        outs = ", ".join("%" + v.name for v in self.outputs)
        ins = ", ".join("%" + v.name for v in self.inputs)
        return f"<Op {outs} = {self.op_type}({ins}) {self.attrs}>"


@dataclass
class Function:
    """A function: inputs, ops in topological order, outputs."""

    name: str
    inputs: List[Value] = field(default_factory=list)
    ops: List[Op] = field(default_factory=list)
    outputs: List[Value] = field(default_factory=list)
    # Roles and analysis results keyed by value name, e.g. ``meta["roles"]``
    # maps input names to "param" / "data" / "optimizer"; ``meta["grads"]``
    # maps a parameter name to its gradient's name. Not part of the text form.
    meta: Dict[str, Any] = field(default_factory=dict, compare=False)
    # What the builder that made the function knew (kinds of op, columns):
    # a distsim.ir.build_log.BuildLog, if one wrote it down.
    build_log: Optional[Any] = field(default=None, compare=False, repr=False)

    def values(self) -> Iterator[Value]:
        """Every value defined in the function, inputs first, in order."""
        yield from self.inputs
        for op in self.ops:
            yield from op.outputs

    def producers(self) -> Dict[Value, Op]:
        return {v: op for op in self.ops for v in op.outputs}

    def users(self) -> Dict[Value, List[Op]]:
        """For each value, the ops that read it, in program order."""
        out: Dict[Value, List[Op]] = {v: [] for v in self.values()}
        for op in self.ops:
            for v in op.inputs:
                out.setdefault(v, []).append(op)
        return out

    def value_by_name(self, name: str) -> Value:
        for v in self.values():
            if v.name == name:
                return v
        raise KeyError(name)

    def structural_key(self) -> tuple:
        """Structure up to value renaming: each value is numbered by its
        definition order."""
        index = {v: i for i, v in enumerate(self.values())}
        return (tuple(v.type for v in self.inputs),
                tuple((op.op_type, tuple(sorted(op.attrs.items())),
                       tuple(index.get(v, -1) for v in op.inputs),
                       tuple(v.type for v in op.outputs),
                       tuple(f.structural_key() for f in op.subfunctions)) for op in self.ops),
                tuple(index.get(v, -1) for v in self.outputs))

    def devices(self) -> List[int]:
        """The sorted ranks any value of the function lives on."""
        found = set()
        for v in self.values():
            dev = getattr(v.type, "device", None)
            if dev is not None:
                found.add(dev)
        return sorted(found)


@dataclass
class Module:
    """A set of named functions (and, with sharding, device meshes).
    ``main`` is the entry point when there is one."""

    functions: Dict[str, Function] = field(default_factory=dict)
    meshes: Dict[str, Any] = field(default_factory=dict)

    @property
    def main(self) -> Function:
        if "main" in self.functions:
            return self.functions["main"]
        return next(iter(self.functions.values()))

    def add(self, function: Function) -> Function:
        self.functions[function.name] = function
        return function

    def __iter__(self) -> Iterable[Function]:
        return iter(self.functions.values())
