"""Import an ONNX model as a DistIR function.

    from distsim.importers.onnx import import_onnx
    f = import_onnx("model.onnx", input_shapes={"input_ids": (2, 128)})

Every value of the result is typed (static shapes). Initializers become
function inputs: floating-point ones with more than one element are
parameters (``meta["roles"][name] == "param"``), the rest constants
(``"const"``); graph inputs are ``"data"`` (and ``meta["batch_inputs"]``).
ONNX does not tell a trained weight from a buffer the exporter stored as an
initializer (PyTorch's rotary ``inv_freq``): initializers whose names match
a *frozen* pattern (:data:`DEFAULT_FROZEN` unless told otherwise) are
constants, so that a training step neither updates them nor keeps
gradients and optimizer state for them.
A weight given as ``ConstantOfShape(initializer)`` (how the models of
onnx's backend tests ship without their weights) is a parameter too.
Shape-computing subgraphs (Shape -> Gather -> Concat -> Reshape, ...) are
evaluated at import time by :mod:`.onnx_fold`; reading the file, element
types and names is :mod:`.onnx_model`; the op table lives in
:mod:`.onnx_ops`.

Errors: a file that is not ONNX, is truncated, has a cycle or a dangling
input -> :class:`ParseError`; a shape that contradicts its op ->
:class:`VerifyError` naming the node; ops outside the table -> one
:class:`UnsupportedOpError` listing every unsupported op type with its count.
"""
from __future__ import annotations

import fnmatch
import re
import warnings
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ..errors import ConfigError, ParseError, UnsupportedOpError, VerifyError
from ..ir.builder import FunctionBuilder
from ..ir.core import Function, Value
from ..ir.registry import ShapeError, infer_types, with_defaults
from ..ir.types import DType, TensorType
from ..ir.verifier import verify
from .onnx_explain import ShapeHints
from .onnx_fold import fold_fits, fold_node
from .onnx_model import (MIN_OPSET, ModelSource, OnnxOpsetWarning,
                         dtype_of_onnx, load_onnx_model, newest_checked_opset, sanitize_name)
from .onnx_ops import CHECKS, CONVERTERS, NO_FOLD, OnnxNode

FOLD_LIMIT = 1 << 20  # largest constant input (elements) evaluated at import time


@dataclass
class Const:
    """A value known at import time (array None: shape-only, e.g. a weight
    whose data is missing or external)."""

    array: Optional[np.ndarray]
    shape: Tuple[int, ...]
    dtype: DType
    role: str  # "param" or "const"


#: names (fnmatch patterns) of initializers that are buffers, not weights,
#: when the caller names none: the inverse frequencies of rotary position
#: embeddings (Hugging Face's ``rotary_emb.inv_freq``), which a PyTorch
#: export stores as an initializer like any weight
DEFAULT_FROZEN: Tuple[str, ...] = ("*inv_freq",)


class OnnxImporter(ShapeHints):
    """One import: walks the graph once, keeping for every ONNX name its
    DistIR value and/or its constant."""

    def __init__(self, model: onnx.ModelProto, source: str, base_dir: Optional[str],
                 input_shapes: Mapping[str, Sequence[int]], batch: Optional[int],
                 seq: Optional[int], device: Optional[int], dtype: Optional[DType],
                 frozen: Sequence[str] = DEFAULT_FROZEN) -> None:
        self.model, self.source, self.base_dir = model, source, base_dir
        self.frozen = tuple(frozen)
        self.graph = model.graph
        self.graph_initializers = {i.name for i in model.graph.initializer}
        self.opset = self._opset()
        self.input_shapes = {k: tuple(int(d) for d in v) for k, v in input_shapes.items()}
        self.batch, self.seq, self.device, self.float_dtype = batch, seq, device, dtype
        self.batch_change: Optional[Tuple[int, int]] = None
        self.b = FunctionBuilder(sanitize_name(self.graph.name or Path(source).stem or "onnx"))
        self.values: Dict[str, Value] = {}
        self.consts: Dict[str, Const] = {}
        self.roles: Dict[str, str] = {}
        self.constants: Dict[str, np.ndarray] = {}
        self.onnx_names: Dict[str, str] = {}
        self.overridden = False
        self.producer: Dict[str, Any] = {}
        # ONNX output of a Slice whose end ran past its input's size
        # (name -> node label, sliced name, axis, end asked, size there)
        self.clamped: Dict[str, Tuple[str, str, int, int, int]] = {}

    # ----- set-up ---------------------------------------------------------
    def _opset(self) -> int:
        versions = [o.version for o in self.model.opset_import if o.domain in ("", "ai.onnx")]
        opset = versions[0] if versions else MIN_OPSET
        if opset < MIN_OPSET:
            raise UnsupportedOpError(f"{self.source}: opset {opset} is older than the oldest "
                                     f"supported ({MIN_OPSET})")
        newest = newest_checked_opset()
        if opset > newest:
            # not refused: ops rarely change between opsets, and a changed
            # one still fails by name if the importer cannot read it
            warnings.warn(f"{self.source}: ai.onnx opset {opset} is newer than the newest this "
                          f"importer was checked against ({newest}); its ops are read as "
                          f"defined in opset {newest}", OnnxOpsetWarning, stacklevel=4)
        return opset

    def dtype(self, elem_type: int, where: str) -> DType:
        dt = dtype_of_onnx(elem_type, where)
        return self.float_dtype if self.float_dtype is not None and dt.is_float else dt

    def where(self, node: Optional[OnnxNode] = None) -> str:
        return f"{self.source}: node '{node.label}' ({node.op_type})" if node else self.source

    def check_structure(self) -> List[Any]:
        """Nodes in a valid order; raises ParseError on a dangling input
        or a cycle, UnsupportedOpError listing every unknown op type."""
        g = self.graph
        for kind, entries in (("graph input", g.input), ("initializer", g.initializer),
                              ("graph output", g.output)):
            seen = Counter(e.name for e in entries)
            twice = sorted(name for name, count in seen.items() if count > 1)
            if twice:
                raise ParseError(f"{kind} '{twice[0]}' is declared {seen[twice[0]]} times",
                                 source=self.source)
        known = {i.name for i in g.initializer} | {i.name for i in g.input}
        producer: Dict[str, int] = {}
        for k, node in enumerate(g.node):
            for out in node.output:
                if out:
                    if out in producer or out in known:
                        raise ParseError(f"node '{node.name or out}' ({node.op_type}): output "
                                         f"'{out}' is defined twice", source=self.source)
                    producer[out] = k
        for node in g.node:
            for name in node.input:
                if name and name not in known and name not in producer:
                    raise ParseError(f"node '{node.name or (list(node.output) or ['?'])[0]}' "
                                     f"({node.op_type}): "
                                     f"input '{name}' is dangling (no node, graph input or "
                                     "initializer defines it)", source=self.source)
        self.producer = {name: g.node[k] for name, k in producer.items()}
        order = self._topological(producer)
        for out in g.output:
            if out.name not in known and out.name not in producer:
                raise ParseError(f"graph output '{out.name}' is not defined by any node",
                                 source=self.source)
        standard = ("", "ai.onnx")
        unsupported = Counter(n.op_type if n.domain in standard else f"{n.domain}.{n.op_type}"
                              for n in g.node
                              if n.domain not in standard or n.op_type not in CONVERTERS)
        if unsupported:
            listing = ", ".join(f"{op} (x{count})" for op, count in sorted(unsupported.items()))
            raise UnsupportedOpError(f"{self.source}: {sum(unsupported.values())} nodes of "
                                     f"{len(unsupported)} unsupported op types: {listing}")
        return order

    def _topological(self, producer: Dict[str, int]) -> List[Any]:
        nodes = list(self.graph.node)
        deps = [{producer[i] for i in n.input if i in producer} for n in nodes]
        users: Dict[int, List[int]] = {}
        for k, d in enumerate(deps):
            for p in d:
                users.setdefault(p, []).append(k)
        waiting = [len(d) for d in deps]
        ready = [k for k, w in enumerate(waiting) if w == 0]
        order = []
        while ready:
            k = ready.pop(0)
            order.append(nodes[k])
            for u in users.get(k, ()):
                waiting[u] -= 1
                if waiting[u] == 0:
                    ready.append(u)
        if len(order) != len(nodes):
            stuck = next(n for k, n in enumerate(nodes) if waiting[k] > 0)
            label = stuck.name or (stuck.output[0] if stuck.output else stuck.op_type)
            raise ParseError(f"the graph has a cycle through node '{label}' ({stuck.op_type})",
                             source=self.source)
        return order

    def add_initializers(self) -> None:
        for init in self.graph.initializer:
            where = f"{self.source}: initializer '{init.name}'"
            dt = self.dtype(init.data_type, where)
            shape = tuple(int(d) for d in init.dims)
            for i, d in enumerate(shape):
                if d < 0:
                    raise ConfigError(f"{where}: dimension {i} is negative ({d}) in shape "
                                      f"{list(shape)}")
            array = self._tensor_array(init)
            numel = int(np.prod(shape)) if shape else 1
            role = "param" if dt.is_float and numel > 1 else "const"
            if role == "param" and any(fnmatch.fnmatchcase(init.name, p) for p in self.frozen):
                role = "const"      # a buffer (see DEFAULT_FROZEN), not trained
            if array is not None:
                with np.errstate(over="ignore"):  # -3.4e38 masks become -inf in f16
                    array = array.astype(dt.numpy_name, copy=False)
            self.consts[init.name] = Const(array, shape, dt, role)

    def _tensor_array(self, tensor) -> Optional[np.ndarray]:
        """The data of an initializer, or None (shape only) when it is missing
        or is an external floating-point weight (never needed). Integer
        external data (shapes, indices) is read; a missing or short external
        file is a ConfigError naming it."""
        if tensor.data_location == TensorProto.EXTERNAL:
            if tensor.data_type not in (TensorProto.INT64, TensorProto.INT32, TensorProto.BOOL):
                return None
            self._check_external(tensor)
        try:
            return numpy_helper.to_array(tensor, self.base_dir or "")
        except Exception as e:  # no data at all: shape only
            if tensor.data_location == TensorProto.EXTERNAL:
                raise ConfigError(f"{self.source}: initializer '{tensor.name}': cannot read its "
                                  f"external data ({type(e).__name__}: {e})") from None
            return None

    def _check_external(self, tensor) -> None:
        """The external file of an integer initializer exists and is long
        enough (its values are needed at import time)."""
        info = {e.key: e.value for e in tensor.external_data}
        location = info.get("location", "")
        where = f"{self.source}: initializer '{tensor.name}'"
        if self.base_dir is None:
            raise ConfigError(f"{where} is stored in the external file '{location}', which "
                              "cannot be found for a model given as bytes (load it from its "
                              "file)")
        path = Path(self.base_dir) / location
        if not location or not path.is_file():
            raise ConfigError(f"{where} is stored in the external file '{location}', which is "
                              f"missing (looked for {path}); integer tensors (shapes, indices) "
                              "are read at import time")
        need = int(info.get("offset", 0) or 0) + int(info.get("length", 0) or 0)
        if path.stat().st_size < need:
            raise ConfigError(f"{where}: the external file '{location}' is shorter "
                              f"({path.stat().st_size} bytes) than its offset + length "
                              f"({need})")

    def add_inputs(self) -> None:
        inits = {i.name for i in self.graph.initializer}
        unknown = set(self.input_shapes) - {i.name for i in self.graph.input}
        if unknown:
            names = ", ".join(i.name for i in self.graph.input if i.name not in inits)
            raise ConfigError(f"{self.source}: --input-shape names no graph input "
                              f"'{sorted(unknown)[0]}' (inputs: {names})")
        for vi in self.graph.input:
            if vi.name in inits:
                continue
            where = f"{self.source}: graph input '{vi.name}'"
            if not vi.type.HasField("tensor_type"):
                raise UnsupportedOpError(f"{where}: only tensor inputs are supported")
            tt = vi.type.tensor_type
            shape = self._input_shape(vi.name, tt, where)
            value = self.b.input(sanitize_name(vi.name),
                                 TensorType(shape, self.dtype(tt.elem_type, where), self.device))
            self.values[vi.name] = value
            self.roles[value.name] = "data"
            self.onnx_names[value.name] = vi.name

    def _input_shape(self, name: str, tt, where: str) -> Tuple[int, ...]:
        dims = list(tt.shape.dim) if tt.HasField("shape") else None
        for i, d in enumerate(dims or ()):
            if d.HasField("dim_value") and d.dim_value < 0:
                declared = [x.dim_value if x.HasField("dim_value") else x.dim_param or "?"
                            for x in dims]
                raise ConfigError(f"{where}: dimension {i} is negative ({d.dim_value}) in the "
                                  f"declared shape {declared}")
        if name in self.input_shapes:
            given = self.input_shapes[name]
            if dims is not None and len(dims) != len(given):
                raise ConfigError(f"{where}: --input-shape gives rank {len(given)}, the model "
                                  f"declares rank {len(dims)}")
            if dims is not None and any(d.HasField("dim_value") and d.dim_value != g
                                        for d, g in zip(dims, given)):
                self.overridden = True
            return given
        if dims is None:
            raise ConfigError(f"{where}: the model gives no shape; use --input-shape {name}=AxB")
        shape = []
        for i, d in enumerate(dims):
            label = d.dim_param if d.HasField("dim_param") else ""
            if i == 0 and self.batch is not None:
                if d.HasField("dim_value") and d.dim_value != self.batch:
                    self.overridden = True
                    if d.dim_value > 0:  # a static batch the reshapes may repeat
                        self.batch_change = (int(d.dim_value), int(self.batch))
                shape.append(self.batch)
            elif d.HasField("dim_value") and d.dim_value > 0:
                shape.append(int(d.dim_value))
            elif (i == 1 or re.search(r"seq|len", label, re.I)) and self.seq is not None:
                shape.append(self.seq)
            else:
                hint = "--batch" if i == 0 else "--seq" if i == 1 else "--input-shape"
                # a declared 0 (some exporters write it for a dynamic size) is
                # not "symbolic": say what the file holds
                what = ("0 (no elements)" if d.HasField("dim_value") else
                        f"symbolic ('{label or '?'}')")
                raise ConfigError(f"{where}: dimension {i} is {what}; give "
                                  f"{hint} or --input-shape {name}=" +
                                  "x".join("N" for _ in dims))
        return tuple(shape)

    # ----- the converter context -------------------------------------------
    def const(self, name: str) -> Optional[np.ndarray]:
        c = self.consts.get(name)
        return None if c is None else c.array

    def type_of(self, name: str) -> TensorType:
        if name in self.values:
            return self.values[name].type
        c = self.consts[name]
        return TensorType(c.shape, c.dtype, self.device)

    def value(self, name: str) -> Value:
        """The DistIR value of ``name``, making a constant a function input."""
        if name in self.values:
            return self.values[name]
        c = self.consts[name]
        value = self.b.input(sanitize_name(name), TensorType(c.shape, c.dtype, self.device))
        self.values[name] = value
        self.roles[value.name] = c.role
        self.onnx_names[value.name] = name
        if c.array is not None:
            self.constants[value.name] = c.array
        return value

    def constant_value(self, array: np.ndarray, hint: str) -> Value:
        """A new constant input holding ``array`` (e.g. the 1 of a decomposition)."""
        name = f"{hint}__const"
        while name in self.consts or name in self.values:
            name += "_"
        self.consts[name] = self.make_const(np.asarray(array), hint)
        return self.value(name)

    def mark_role(self, name: str, role: str) -> None:
        """Change the role of an initializer (e.g. batch-norm statistics are
        not trained)."""
        if name in self.consts and self.consts[name].role == "param":
            self.consts[name].role = role
            if name in self.values:
                self.roles[self.values[name].name] = role

    def op(self, node: OnnxNode, op_type: str, inputs: Sequence[Value],
           attrs: Optional[Mapping[str, Any]] = None, out: Optional[int] = 0,
           names: Optional[Sequence[str]] = None):
        """Append an op for ``node``; ``out`` is the index of the ONNX output
        it produces (its name is the value's), None for an intermediate."""
        try:
            full = with_defaults(op_type, dict(attrs or {}))
            infer_types(op_type, [v.type for v in inputs], full)
        except ShapeError as e:
            raise self.shape_error(node, e) from None
        if names is None:
            base = sanitize_name(node.outputs[out if out is not None else 0] or node.label)
            names = base if out is not None else f"{base}_{op_type}"
        else:
            names = [sanitize_name(n) for n in names]
        return self.b.op(op_type, list(inputs), full, name=names, meta={"scope": node.scope})

    # ----- the walk -----------------------------------------------------------
    def run(self) -> Function:
        order = self.check_structure()
        self.add_initializers()
        self.add_inputs()
        for proto in order:
            node = OnnxNode(proto, self.opset)
            self.convert(node)
        outputs = [self._output(o.name) for o in self.graph.output]
        if not self.overridden:
            self.check_declared()
        f = self.b.finish(outputs)
        self._meta(f)
        try:
            return verify(f)
        except VerifyError as e:
            raise VerifyError(f"{self.source}: {e}") from None

    def _output(self, name: str) -> Value:
        """The value of graph output ``name``, always the result of an op:
        an output that is a graph input or an initializer (an Identity
        graph, a pass-through) gets an ``identity`` op, so that what a
        training step or a data-parallel lowering builds on the outputs is
        computed on the device rather than aliasing an argument."""
        value = self.value(name)
        if any(v is value for v in self.b.function.inputs):
            value = self.b.op("identity", [value], {}, name=sanitize_name(name))
            self.onnx_names.setdefault(value.name, name)
        return value

    def convert(self, node: OnnxNode) -> None:
        if node.op_type in CHECKS:
            CHECKS[node.op_type](self, node)
        ins = [i for i in node.inputs if i]
        arrays = [self.const(i) for i in ins]
        foldable = (node.op_type not in NO_FOLD and ins and
                    all(a is not None and self.consts[i].role == "const"
                        for i, a in zip(ins, arrays)) and
                    sum(a.size for a in arrays) <= FOLD_LIMIT)
        if foldable:
            inputs = dict(zip(ins, arrays))
            foldable = fold_fits(node.proto, inputs, self.model.opset_import, self.where(node))
        if foldable:
            try:
                results = fold_node(node.proto, inputs, self.model.opset_import)
            except Exception as e:
                raise VerifyError(f"{self.where(node)}: cannot evaluate its constant inputs: "
                                  f"{type(e).__name__}: {e}") from None
        else:
            try:
                results = CONVERTERS[node.op_type](self, node)
            except (ValueError, IndexError, KeyError, TypeError) as e:
                # a converter given a malformed node (too few inputs, an
                # attribute of the wrong type) is bad input, not a bug
                raise VerifyError(f"{self.where(node)}: malformed node "
                                  f"({type(e).__name__}: {e})") from None
        if node.op_type == "Slice":
            self.note_clamp(node)
        for name, result in zip(node.outputs, results):
            if not name or result is None:
                continue
            if isinstance(result, Value):
                self.values[name] = result
                self.onnx_names.setdefault(result.name, name)
            elif isinstance(result, Const):
                self.consts[name] = result
            else:
                self.consts[name] = self.make_const(np.asarray(result), self.where(node))

    def make_const(self, arr: np.ndarray, where: str, role: str = "const") -> Const:
        dt = dtype_of_onnx(helper.np_dtype_to_tensor_dtype(arr.dtype), where)
        if self.float_dtype is not None and dt.is_float:
            with np.errstate(over="ignore"):
                dt, arr = self.float_dtype, _recast(arr, self.float_dtype.numpy_name)
        return Const(arr, tuple(arr.shape), dt, role)

    def check_declared(self) -> None:
        """Declared static shapes (value_info, outputs) must match ours."""
        declared = list(self.graph.value_info) + list(self.graph.output)
        producers = {o: n for n in self.graph.node for o in n.output}
        for vi in declared:
            if vi.name not in self.values and vi.name not in self.consts:
                continue
            if not vi.type.HasField("tensor_type") or not vi.type.tensor_type.HasField("shape"):
                continue
            got = self.type_of(vi.name).shape
            dims = vi.type.tensor_type.shape.dim
            bad = len(dims) != len(got) or any(d.HasField("dim_value") and d.dim_value != g
                                               for d, g in zip(dims, got))
            if bad:
                want = tuple(d.dim_value if d.HasField("dim_value") else d.dim_param or "?"
                             for d in dims)
                node = producers.get(vi.name)
                label = f"node '{node.name or vi.name}' ({node.op_type})" if node else "the graph"
                raise VerifyError(f"{self.source}: {label}: '{vi.name}' is declared with shape "
                                  f"{want} but the op produces {got}")

    def _meta(self, f: Function) -> None:
        f.meta["roles"] = dict(self.roles)
        f.meta["params"] = [v.name for v in f.inputs if self.roles.get(v.name) == "param"]
        f.meta["batch_inputs"] = [v.name for v in f.inputs
                                  if self.roles.get(v.name) == "data" and v.type.rank >= 1]
        f.meta["constants"] = dict(self.constants)
        f.meta["onnx"] = {"source": self.source, "opset": self.opset,
                          "producer": self.model.producer_name,
                          "names": dict(self.onnx_names)}


def _recast(arr: np.ndarray, dtype: str) -> np.ndarray:
    """``arr`` as ``dtype``. A broadcast scalar (ConstantOfShape: every
    stride 0) stays a view of one element: casting it element by element
    would allocate the whole constant, however large it is."""
    if arr.size > 1 and not any(arr.strides):
        return np.broadcast_to(np.asarray(arr[(0,) * arr.ndim], dtype=dtype), arr.shape)
    return arr.astype(dtype, copy=False)


def import_onnx(model: ModelSource, input_shapes: Optional[Mapping[str, Sequence[int]]] = None,
                batch: Optional[int] = None, seq: Optional[int] = None,
                device: Optional[int] = 0, dtype: Union[str, DType, None] = None,
                frozen: Optional[Sequence[str]] = None) -> Function:
    """Import ``model`` (a path, the name of an ONNX file in ``models/`` such
    as ``"gpt2-tiny"``, bytes or a ModelProto) as a typed function.

    ``input_shapes`` maps graph input names to shapes; ``batch`` sets dim 0
    of every graph input (overriding a static one: the exported batch is
    usually 1), ``seq`` fills a symbolic dim 1 or a dim named like seq/len.
    ``dtype`` recasts every floating-point tensor (e.g. ``"f16"``).
    ``frozen``: fnmatch patterns of initializer names that are constants,
    not parameters (None: :data:`DEFAULT_FROZEN`; ``[]``: every
    floating-point initializer of more than one element is a parameter);
    a pattern that matches no initializer is an error (a typo would
    otherwise train what was meant to be frozen).
    """
    for label, n in (("batch", batch), ("seq", seq)):
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
            raise ConfigError(f"--{label}: must be a positive integer, got {n!r}")
    float_dtype = _float_dtype(dtype)
    patterns = _frozen_patterns(frozen)
    proto, source, base = load_onnx_model(model)
    if frozen is not None:
        names = [i.name for i in proto.graph.initializer]
        for p in patterns:
            if not any(fnmatch.fnmatchcase(n, p) for n in names):
                raise ConfigError(f"{source}: frozen: pattern {p!r} matches no initializer")
    importer = OnnxImporter(proto, source, base, dict(input_shapes or {}), batch, seq, device,
                            float_dtype, patterns)
    return importer.run()


def _frozen_patterns(frozen: Optional[Sequence[str]]) -> Tuple[str, ...]:
    """The ``frozen`` option checked: a list of name patterns (None: the
    default ones)."""
    if frozen is None:
        return DEFAULT_FROZEN
    if isinstance(frozen, str) or not all(isinstance(p, str) and p for p in frozen):
        raise ConfigError(f"frozen: expected a list of initializer name patterns, got {frozen!r}")
    return tuple(frozen)


def _float_dtype(dtype: Union[str, DType, None]) -> Optional[DType]:
    """The ``dtype`` option: a floating-point type. An integer one would
    turn every weight into a constant (no parameters) and every float op
    into integer arithmetic: a different model, so it is refused."""
    if dtype is None:
        return None
    try:
        dt = DType.parse(str(dtype)) if isinstance(dtype, str) else dtype
    except ConfigError:
        dt = None
    if not isinstance(dt, DType) or not dt.is_float:
        raise ConfigError(f"--dtype: '{dtype!s}' is not a floating-point type (it recasts "
                          "the model's floating-point tensors: f16, bf16, f32 or f64)")
    return dt


def onnx_input_arrays(function: Function, feeds: Mapping[str, Any]) -> List[np.ndarray]:
    """The arguments of an imported ``function`` in input order: graph
    inputs from ``feeds`` (by ONNX or DistIR name), parameters and
    constants from the model (``meta["constants"]``)."""
    names = function.meta.get("onnx", {}).get("names", {})
    constants = function.meta.get("constants", {})
    out = []
    for v in function.inputs:
        onnx_name = names.get(v.name, v.name)
        if onnx_name in feeds or v.name in feeds:
            arr = np.asarray(feeds[onnx_name] if onnx_name in feeds else feeds[v.name])
        elif v.name in constants:
            arr = np.asarray(constants[v.name])
        else:
            raise ConfigError(f"no value for input '{onnx_name}' (not fed, and the model holds "
                              "no data for it)")
        out.append(arr.astype(v.type.dtype.numpy_name, copy=False))
    return out
