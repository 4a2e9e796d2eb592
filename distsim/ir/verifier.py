"""The verifier: checks the invariants every pass and executor relies on.

- SSA: every value is defined once, names are unique;
- order: every operand is defined before the op that reads it;
- types: each op's declared output types equal what its shape rule infers
  (which also checks arity, attributes, devices and collective teams);
- outputs: the function's outputs are defined;
- sizes: no value takes more than 2^60 bytes (a malformed dimension).

Every error is a :class:`VerifyError` that names the function and the op
(and, for an op read from text, the file and line: :mod:`.source`).
"""
from __future__ import annotations

from operator import attrgetter, eq
from typing import Dict, Iterable, List, Optional, Set, Tuple

import numpy as np

from ..errors import UnsupportedOpError, VerifyError
from .build_log import BuildLog
from .core import Function, Module, Op, gc_paused
from .ops_fused import FUSED, fused_result_types
from .registry import ShapeError, infer_types, is_registered
from .source import describe
from .value_table import ValueTable

_NAME = attrgetter("name")
#: what an op's type rule reads besides its operand types
_RULE_INPUTS = attrgetter("op_type", "attrs", "subfunctions")


# No real tensor comes near this (an exbibyte); a larger one is a malformed
# dimension, and would make every later number (time, memory) meaningless.
MAX_VALUE_BYTES = 2 ** 60


def _label(function: Function, op: Op) -> str:
    return describe(function.name, op)


def verify(function: Function, known_devices: Iterable[int] | None = None,
           values: Optional[ValueTable] = None) -> Function:
    """Raise VerifyError on the first broken invariant; return the function.

    A first pass checks every invariant without words. For a function whose
    :class:`~distsim.ir.build_log.BuildLog` still lists its ops with their
    kinds, it works over columns (:func:`_looks_valid_by_columns`: numpy
    over a :class:`~distsim.ir.value_table.ValueTable`, ``values`` if given,
    and Python once per distinct op signature); otherwise op by op, values
    told apart by identity. Only when it finds something does the second,
    exact pass run, to raise the error of the first broken invariant in
    program order."""
    with gc_paused():
        log = function.build_log
        if isinstance(log, BuildLog) and log.matches(function):
            if values is None or not values.describes(function):
                values = ValueTable(function)
            if _looks_valid_by_columns(function, known_devices, values, log):
                return function
        elif _looks_valid(function, known_devices):
            return function
        return _verify(function, known_devices)


def _type_fits(t: object, devices: Set[int] | None) -> bool:
    """A type's size is sane and its device (if any) is known."""
    size = getattr(t, "size_bytes", 0)
    if isinstance(size, int) and size > MAX_VALUE_BYTES:
        return False
    dev = getattr(t, "device", None)
    return devices is None or dev is None or dev in devices


def _expected_types(op: Op, in_types: list, fused_types: Dict[tuple, list],
                    inferred: Dict[tuple, list]) -> Tuple[list, tuple | None]:
    """The result types ``op`` should declare, and the memo key they are
    kept under (None: not kept). Result types are inferred once per op
    type, attributes and input type objects (fused ops: per segment and
    input type objects); type objects are keyed by identity, the
    function's values holding them for the whole check. Raises the shape
    rule's ShapeError or UnsupportedOpError."""
    if op.op_type == FUSED:
        key = None
        if len(op.subfunctions) == 1:
            key = (id(op.subfunctions[0]), tuple([id(t) for t in in_types]))
        expected = fused_types.get(key) if key is not None else None
        if expected is None:
            expected = fused_result_types(op, in_types)
            if key is not None:
                fused_types[key] = expected
        return expected, key
    try:
        key = (op.op_type, tuple([id(t) for t in in_types]), tuple(op.attrs.items()))
        expected = inferred.get(key)
    except TypeError:  # an unhashable attribute
        key, expected = None, None
    if expected is None:
        expected = infer_types(op.op_type, in_types, op.attrs)
        if key is not None:
            inferred[key] = expected
    return expected, key


def _same_types(op: Op, expected: list, key: tuple | None, fused_types: Dict[tuple, list],
                inferred: Dict[tuple, list]) -> bool:
    """Whether ``op``'s results are declared as ``expected`` says. Equal
    but not identical types replace the memo's, so that the op's repeats
    compare by identity (the program's own type objects)."""
    same = True
    for v, t in zip(op.outputs, expected):
        if v.type is not t:
            if v.type != t:
                return False
            same = False
    if not same and key is not None:
        (fused_types if op.op_type == FUSED else inferred)[key] = [v.type for v in op.outputs]
    return True


def _rule_holds(op: Op, fused_types: Dict[tuple, list], inferred: Dict[tuple, list]) -> bool:
    """``op``'s results are declared as its type rule gives them (memos as
    in :func:`_expected_types`)."""
    try:
        expected, key = _expected_types(op, [v.type for v in op.inputs], fused_types, inferred)
    except (ShapeError, UnsupportedOpError):
        return False
    return (len(expected) == len(op.outputs)
            and _same_types(op, expected, key, fused_types, inferred))


def _looks_valid(function: Function, known_devices: Iterable[int] | None) -> bool:
    """Every invariant holds (checked without building a message)."""
    devices = set(known_devices) if known_devices is not None else None
    types_ok: Set[int] = set()
    fused_types: Dict[tuple, list] = {}
    inferred: Dict[tuple, list] = {}
    defined: Set[int] = set()        # ids of the values defined so far
    names: List[str] = []

    def define(values: Iterable) -> bool:
        """Values defined once each, of sane types on known devices."""
        for v in values:
            if id(v) in defined:
                return False
            defined.add(id(v))
            names.append(v.name)
            if id(v.type) not in types_ok:
                if not _type_fits(v.type, devices):
                    return False
                types_ok.add(id(v.type))
        return True

    if not define(function.inputs):
        return False
    registered = is_registered
    for op in function.ops:
        if not registered(op.op_type):
            return False
        for v in op.inputs:
            if id(v) not in defined:
                return False
        if not _rule_holds(op, fused_types, inferred):
            return False
        if not define(op.outputs):
            return False
    for v in function.outputs:
        if id(v) not in defined:
            return False
    return _names_unique(names)


def _names_unique(names: List[str]) -> bool:
    """No two names equal: their hashes sorted (no table of a million
    strings), the names themselves compared only if two hashes collide."""
    hashes = np.fromiter(map(hash, names), np.int64, len(names))
    hashes.sort()
    if not (hashes[1:] == hashes[:-1]).any():
        return True
    return len(set(names)) == len(names)


def _distinct_rows(rows: np.ndarray) -> np.ndarray:
    """The position of the first of each distinct row of ``rows`` (an
    integer matrix). Rows are told apart by a hash (a sum of the columns
    times odd constants, wrapping), which is checked to tell them apart
    exactly; only if two rows share a hash are they sorted as rows."""
    weights = np.arange(1, 2 * rows.shape[1], 2, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    keys = (rows.astype(np.uint64) * weights).sum(axis=1, dtype=np.uint64)
    _, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
    if (rows == rows[first[inverse.reshape(-1)]]).all():
        return first
    return np.unique(rows, axis=0, return_index=True)[1]


def _looks_valid_by_columns(function: Function, known_devices: Iterable[int] | None,
                            table: ValueTable, log: BuildLog) -> bool:
    """Every invariant holds, checked over columns (``table`` describes
    ``function``; ``log`` lists its ops with their kinds).

    Values are defined once, operands defined before their readers and the
    outputs defined: comparisons of value numbers. Each distinct type
    object is checked once for its size and device. The type rule of an op
    depends only on its op type, attributes, sub-functions and operand
    types: every op is checked to have its kind's template's op type,
    attributes and sub-functions (equal, not trusted from the log), and the
    rule runs once per distinct (kind, operand types, result types)."""
    ops = table.ops
    n_in, n_out, reads = table.n_in, table.n_out, table.reads
    if table.duplicated or (reads < 0).any() or (table.outputs < 0).any():
        return False
    out_start = table.out_start()
    if (reads >= np.repeat(out_start, n_in)).any():        # read before it is made
        return False
    if not _names_unique(list(map(_NAME, table.values))):
        return False
    devices = set(known_devices) if known_devices is not None else None
    types = table.types
    first_of, type_number = table.type_numbers()
    if not all(_type_fits(types[i], devices) for i in first_of.tolist()):
        return False
    kind = np.asarray(log.kind, np.int64).reshape(-1)
    templates = list(map(_RULE_INPUTS, map(ops.__getitem__, log.firsts)))
    if not all(map(eq, map(_RULE_INPUTS, ops), map(templates.__getitem__, kind.tolist()))):
        return False
    if not all(is_registered(op_type) for op_type, _, _ in templates):
        return False
    in_start = np.cumsum(n_in) - n_in
    in_types, out_types = type_number[reads], type_number
    fused_types: Dict[tuple, list] = {}
    inferred: Dict[tuple, list] = {}
    arity = n_in * (int(n_out.max(initial=0)) + 1) + n_out
    for shape in np.unique(arity).tolist():
        chosen = np.flatnonzero(arity == shape)
        a, b = int(n_in[chosen[0]]), int(n_out[chosen[0]])
        signature = np.stack([kind[chosen]] + [in_types[in_start[chosen] + j] for j in range(a)]
                             + [out_types[out_start[chosen] + j] for j in range(b)], axis=1)
        for op in map(ops.__getitem__, chosen[_distinct_rows(signature)].tolist()):
            if not _rule_holds(op, fused_types, inferred):
                return False
    return True


def _verify(function: Function, known_devices: Iterable[int] | None) -> Function:
    # The exact pass (see verify): the first broken invariant, worded.
    # name -> id of the value defined under it: one lookup checks that a
    # name is not reused, that a value is not defined twice, and that an
    # operand is defined before its reader
    owner: Dict[str, int] = {}
    devices = set(known_devices) if known_devices is not None else None
    types_ok: Set[int] = set()  # ids of types checked (alive: values hold them)
    fused_types: Dict[tuple, list] = {}
    inferred: Dict[tuple, list] = {}

    def define(value, where) -> None:
        if where is None or isinstance(where, Op):
            op = where
            where = ((lambda: f"function '{function.name}', input") if op is None
                     else (lambda: _label(function, op)))
        prev = owner.get(value.name)
        if prev == id(value):
            raise VerifyError(f"{where()}: value %{value.name} is defined twice")
        if prev is not None:
            raise VerifyError(f"{where()}: name %{value.name} is used for two values")
        owner[value.name] = id(value)
        if id(value.type) in types_ok:
            return
        if not _type_fits(value.type, None):
            raise VerifyError(f"{where()}: value %{value.name} ({value.type}) would take more "
                              f"than 2^60 bytes: a dimension is absurdly large")
        if not _type_fits(value.type, devices):
            raise VerifyError(f"{where()}: value %{value.name} is on device "
                              f"{value.type.device}, which is not one of the devices "
                              f"{sorted(devices or ())}")
        types_ok.add(id(value.type))

    for v in function.inputs:
        define(v, None)
    registered = is_registered
    for op in function.ops:
        label = _label  # only called to word an error
        if not registered(op.op_type):
            raise VerifyError(f"{label(function, op)}: unknown op type '{op.op_type}'")
        for v in op.inputs:
            if owner.get(v.name) != id(v):
                raise VerifyError(f"{label(function, op)}: operand %{v.name} is used before it "
                                  "is defined")
        in_types = [v.type for v in op.inputs]
        try:
            expected, key = _expected_types(op, in_types, fused_types, inferred)
        except ShapeError as e:
            raise VerifyError(f"{label(function, op)}: {e}") from None
        except UnsupportedOpError as e:
            raise VerifyError(f"{label(function, op)}: {e}") from None
        if len(expected) != len(op.outputs):
            raise VerifyError(f"{label(function, op)}: has {len(op.outputs)} results, its type "
                              f"rule gives {len(expected)}")
        if not _same_types(op, expected, key, fused_types, inferred):
            v, t = next((v, t) for v, t in zip(op.outputs, expected) if v.type != t)
            raise VerifyError(f"{label(function, op)}: result %{v.name} is declared "
                              f"{v.type} but the op produces {t}")
        for v in op.outputs:
            # fast path: a new name, of a type checked before
            if v.name in owner or id(v.type) not in types_ok:
                define(v, op)
            else:
                owner[v.name] = id(v)
    for v in function.outputs:
        if owner.get(v.name) != id(v):
            raise VerifyError(f"function '{function.name}': returned value %{v.name} is not "
                              "defined")
    return function


def verify_module(module: Module) -> Module:
    for f in module:
        verify(f)
    return module
