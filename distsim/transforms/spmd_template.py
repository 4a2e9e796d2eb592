"""One tensor-parallel rank of a program placed on a 1-D mesh: the SPMD
template :class:`~distsim.transforms.spmd.LowerSPMD` instantiates.

Input: the entry function of a module propagated by the sharding layer
(:func:`~distsim.transforms.sharding.propagate`) on a mesh of one axis of
``n`` devices: every value a DTensor, ``redistribute`` ops where
placements change. Output: the program of one rank, written once for all
``n`` (Megatron's way of writing tensor parallelism):

- every value has its local shape (shards must be even: every rank runs
  the same shapes);
- every compute op is its per-device form, from the sharding layer's own
  local rules (:data:`~distsim.transforms.sharding.LOCAL_RULES`, e.g. a
  mean over a shard rescaled, an embedding on a vocabulary shard offset);
  attributes that differ between ranks go into ``meta["rank_attrs"]``
  (``attribute -> [value on rank 0, 1, ...]``), which LowerSPMD applies
  to each rank's copy and the backward ops inherit (:mod:`.autodiff`);
- every redistribution is the planner's steps as SPMD collectives
  (:mod:`distsim.ir.ops_spmd`): ``P -> R`` ``spmd.allreduce``, ``S -> R``
  ``spmd.allgather``, ``P -> S`` ``spmd.reducescatter``, ``S(d) -> S(e)``
  an all-gather and a slice; ``R -> S`` a ``slice`` whose bounds are rank
  attributes; ``R -> P`` (sum) a ``scale`` by ``1/n`` on every rank (an
  integer tensor: by 1 on rank 0 and 0 elsewhere).

The backward pass is made afterwards by autodiff of the template, so the
forward must say where a gradient is only one rank's share. A replicated
value read by an op whose result differs between ranks (a shard, a
partial sum, rank attributes) gets from that op only this rank's part of
its gradient; such readers read it through one ``spmd.copy`` (identity;
its gradient is all-reduced: Megatron's *f*). The result of an
``spmd.allgather`` is the exception: its gradient is reduce-scattered, so
it must arrive as shares; where replicated compute that needs a gradient
reads it too, the gather is written as a zero-padded shard all-reduced
instead (same value, a gradient that arrives whole).
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

from ..errors import ConfigError
from ..ir.builder import FunctionBuilder, NameScope
from ..ir.core import Function, Op, Value
from ..ir.mesh import DeviceMesh, DTensorType, Placement, Replicate
from ..ir.source import ORIGIN, Origin, describe
from ..ir.types import TensorType
from .grad_rules import NON_DIFFERENTIABLE
from .sharding.local_builder import LocalBuilder
from .sharding.lower import LOCAL_RULES
from .sharding.planner import Step, plan_redistribute
from .sharding.propagate import REDISTRIBUTE
from .sharding.remembered import Remembered, frozen

#: meta keys of the propagated ops that the template does not keep
_DROPPED_META = (ORIGIN,)
R = Replicate()
#: (op type, local rule, attributes, types) -> per op of its per-device form,
#: the attributes that differ between ranks (every layer asks the same)
_VARYING: Remembered[List[Dict[str, List[Any]]]] = Remembered()
#: (DTensor type, target placements) -> the planner's steps
_STEPS: Remembered[Tuple[Step, ...]] = Remembered()
#: DTensor type (its mesh one axis) -> its local shapes on the ranks (one: even shards)
_SHAPES: Remembered[Set[Tuple[int, ...]]] = Remembered()


def _where(f: Function, op: Op) -> str:
    return describe(f.name, op)


class TemplateBuilder:
    """Builds the template of ``f`` (propagated, one mesh axis); see the
    module docstring. ``device``: the device of the template's types."""

    def __init__(self, f: Function, device: Optional[int] = 0) -> None:
        self.f = f
        self.device = device
        meshes = {v.type.mesh for v in f.values() if isinstance(v.type, DTensorType)}
        if len(meshes) != 1 or next(iter(meshes)).ndim != 1:
            raise ConfigError(f"tensor parallelism: function '{f.name}' must be placed on one "
                              "mesh of one axis")
        self.mesh: DeviceMesh = next(iter(meshes))
        self.n = self.mesh.shape[0]
        self.b = FunctionBuilder(f.name)
        #: template value -> its placement on the axis
        self.placement: Dict[Value, Placement] = {}
        #: ids of the template's spmd.allgather ops
        self.gathers: Set[int] = set()
        self.coords = list(self.mesh.all_coords())

    # -- types ---------------------------------------------------------------
    def local_type(self, v: Value, op: Optional[Op] = None) -> TensorType:
        t = v.type
        if not isinstance(t, DTensorType):
            raise ConfigError(f"tensor parallelism: value %{v.name} has no placement")
        shapes = _SHAPES.get(t, lambda: {t.local_shape(c) for c in t.mesh.all_coords()})
        if len(shapes) > 1:
            pl = t.placements[0]
            where = f"{_where(self.f, op)}: " if op is not None else ""
            raise ConfigError(f"{where}value %{v.name} of shape {list(t.shape)} is split "
                              f"unevenly over tp {self.n} ({pl.print_text()}: local shapes "
                              f"{sorted(shapes)}); tensor parallelism needs even shards")
        return TensorType(next(iter(shapes)), t.dtype, self.device)

    def meta_of(self, op: Op) -> Dict[str, Any]:
        """The template meta of a propagated op: its own (the user's op's
        meta, as propagation copies it), or that of the user's op it was
        made for (a ``redistribute`` propagation inserted)."""
        meta = dict(op.meta)
        origin = meta.get(ORIGIN)
        if isinstance(origin, Origin) and "layer" not in meta and "layer" in origin.op.meta:
            meta["layer"] = origin.op.meta["layer"]
        for key in _DROPPED_META:
            meta.pop(key, None)
        return meta

    # -- the function --------------------------------------------------------
    def build(self) -> Tuple[Function, Dict[Value, Value]]:
        """The template and the map from the propagated function's values."""
        env: Dict[Value, Value] = {}
        for v in self.f.inputs:
            nv = self.b.input(v.name, self.local_type(v))
            env[v] = nv
            self.placement[nv] = v.type.placements[0]
        for op in self.f.ops:
            if op.op_type == REDISTRIBUTE:
                self.redistribute(op, env)
            else:
                self.compute(op, env)
        out = self.b.finish([env[v] for v in self.f.outputs])
        return out, env

    def compute(self, op: Op, env: Dict[Value, Value]) -> None:
        """The op's per-device form, from the sharding layer's local rule,
        made on every rank and compared: the same ops and shapes everywhere,
        attributes that differ become rank attributes. An op without a local
        rule is itself on its local inputs (even shards: the same on every
        rank)."""
        rule = LOCAL_RULES.get(op.op_type)
        meta = self.meta_of(op)
        pl = op.outputs[0].type.placements[0] if op.outputs else R
        if rule is None:
            outs = self._emit(op.op_type, [env[v] for v in op.inputs], op.attrs,
                              [v.name for v in op.outputs], meta, pl)
        else:
            outs = self._by_rule(op, rule, env, meta, pl)
        for v, y in zip(op.outputs, outs):
            want = self.local_type(v, op)
            if y.type.shape != want.shape:     # (the local rules keep shapes; a guard)
                raise ConfigError(f"{_where(self.f, op)}: local shape {y.type.shape} differs "
                                  f"from the shard {want.shape}")
            env[v] = y
            self.placement[y] = v.type.placements[0]

    def _emit(self, op_type: str, ins: List[Value], attrs, names: List[str],
              meta: Dict[str, Any], pl: Placement) -> List[Value]:
        made = self.b.op(op_type, ins, attrs, name=names if len(names) > 1 else names[0],
                         meta=meta)
        made = list(made) if isinstance(made, tuple) else [made]
        for y in made:
            self.placement[y] = pl
        return made

    def _by_rule(self, op: Op, rule, env: Dict[Value, Value], meta: Dict[str, Any],
                 pl: Placement) -> List[Value]:
        """The template ops of ``op``'s local rule (rank 0's, with the
        attributes that differ between ranks as rank attributes); its results."""
        first_ops, first_ins, first_outs = self._on_device(op, rule, self.coords[0])
        key = (op.op_type, rule, frozen(op.attrs), tuple(v.type for v in op.inputs),
               tuple(v.type for v in op.outputs))
        varying = _VARYING.get(key, lambda: self._rank_attrs(op, rule, first_ops))
        local: Dict[Value, Value] = {x: env[v] for x, v in zip(first_ins, op.inputs)}
        for k, lop in enumerate(first_ops):
            op_meta = dict(meta)
            if varying[k]:
                op_meta["rank_attrs"] = {a: list(values) for a, values in varying[k].items()}
            made = self._emit(lop.op_type, [local[x] for x in lop.inputs], dict(lop.attrs),
                              [v.name for v in lop.outputs], op_meta, pl)
            local.update(zip(lop.outputs, made))
        return [local[x] for x in first_outs]

    def _on_device(self, op: Op, rule, c) -> Tuple[List[Op], List[Value], List[Value]]:
        """The op's per-device ops at mesh coordinate ``c``, their inputs and
        results."""
        lb = LocalBuilder(f"{op.op_type}_r{c[0]}")
        ins = [lb.input(f"in{i}", v.type.local_type(c)) for i, v in enumerate(op.inputs)]
        outs = rule(lb, op, c, ins, [v.name for v in op.outputs])
        return lb.function.ops, ins, outs

    def _rank_attrs(self, op: Op, rule, first_ops: List[Op]) -> List[Dict[str, List[Any]]]:
        """Per op of the per-device form: the attributes that differ between
        ranks, with each rank's value. Raises ConfigError where the ranks'
        ops or shapes differ (uneven shards)."""
        per_rank = [first_ops] + [self._on_device(op, rule, c)[0] for c in self.coords[1:]]
        form = [(o.op_type, [v.type.shape for v in o.outputs]) for o in first_ops]
        for ops in per_rank[1:]:
            if [(o.op_type, [v.type.shape for v in o.outputs]) for o in ops] != form:
                raise ConfigError(f"{_where(self.f, op)}: its per-device ops differ between "
                                  f"tensor-parallel ranks (uneven shards); tensor parallelism "
                                  "needs even shards")
        varying = []
        for k, lop in enumerate(first_ops):
            rank_attrs = {}
            for key, value in lop.attrs.items():
                values = [ops[k].attrs.get(key) for ops in per_rank]
                if any(x != value for x in values):
                    rank_attrs[key] = values
            varying.append(rank_attrs)
        return varying

    def redistribute(self, op: Op, env: Dict[Value, Value]) -> None:
        x, y = op.inputs[0], op.outputs[0]
        src, dst = x.type, y.type
        meta = self.meta_of(op)
        cur = env[x]
        t = src
        steps = _STEPS.get((src, dst.placements), lambda: tuple(plan_redistribute(
            src.shape, src.dtype, self.mesh, src.placements, dst.placements)))
        for i, step in enumerate(steps):
            last = i == len(steps) - 1
            name = y.name if last else f"{y.name}_{i}"
            cur = self.step(step.kind, step.src, step.dst, cur, t, name, meta, op)
            t = t.with_placements([step.dst])
            self.placement[cur] = step.dst
        env[y] = cur

    def _bounds(self, t: DTensorType, dim: int) -> List[Tuple[int, int]]:
        size = t.shape[dim]
        piece = size // self.n
        return [(r * piece, (r + 1) * piece) for r in range(self.n)]

    def step(self, kind: str, a: Placement, z: Placement, x: Value, t: DTensorType, name: str,
             meta: Dict[str, Any], op: Op) -> Value:
        """One planner step as template ops (``t``: the global type before it)."""
        n = self.n
        if kind == "noop":
            return x
        if kind == "allreduce":
            return self.b.op("spmd.allreduce", [x], {"size": n, "reduce_op": a.op},
                             name=name, meta=dict(meta))
        if kind == "allgather":
            out = self.b.op("spmd.allgather", [x], {"size": n, "dim": a.dim}, name=name,
                            meta=dict(meta))
            self.gathers.add(id(self.b.function.ops[-1]))
            return out
        if kind == "reducescatter":
            if t.shape[z.dim] % n:
                raise ConfigError(f"{_where(self.f, op)}: dim {z.dim} of %{x.name} "
                                  f"({t.shape[z.dim]}) is not divisible by tp {n}")
            return self.b.op("spmd.reducescatter", [x], {"size": n, "dim": z.dim,
                                                         "reduce_op": a.op},
                             name=name, meta=dict(meta))
        if kind == "alltoall":
            whole = self.step("allgather", a, R, x, t, f"{name}_whole", meta, op)
            self.placement[whole] = R
            return self.step("slice", R, z, whole, t.with_placements([R]), name, meta, op)
        if kind == "slice":
            dim = z.dim
            if t.shape[dim] % n:
                raise ConfigError(f"{_where(self.f, op)}: dim {dim} of %{x.name} "
                                  f"({t.shape[dim]}) is not divisible by tp {n}")
            bounds = self._bounds(t, dim)
            size = t.shape[dim]
            rank_attrs = {"start": [lo for lo, _ in bounds], "stop": [hi for _, hi in bounds],
                          # the bounds of the backward's pad (autodiff hands them down)
                          "before": [lo for lo, _ in bounds],
                          "after": [size - hi for _, hi in bounds]}
            lo, hi = bounds[0]
            return self.b.op("slice", [x], {"axis": dim, "start": lo, "stop": hi}, name=name,
                             meta=dict(meta, rank_attrs=rank_attrs))
        if kind == "partial":
            if z.op in ("max", "min", "avg"):     # every rank's term is the whole
                return x
            if z.op != "sum":
                raise ConfigError(f"{_where(self.f, op)}: a partial {z.op} is not supported "
                                  "by tensor parallelism")
            if t.dtype.is_float:      # an equal share on every rank (Megatron's x / tp)
                return self.b.op("scale", [x], {"factor": 1.0 / n}, name=name, meta=dict(meta))
            factors = [1.0] + [0.0] * (n - 1)
            return self.b.op("scale", [x], {"factor": 1.0}, name=name,
                             meta=dict(meta, rank_attrs={"factor": factors}))
        raise ConfigError(f"{_where(self.f, op)}: redistribution step '{kind}' is not "
                          "supported by tensor parallelism")


# -- where gradients are shares: spmd.copy ---------------------------------------
def _varying(op: Op, placement: Dict[Value, Placement]) -> bool:
    """Whether ``op``'s results differ between ranks."""
    if "rank_attrs" in op.meta:
        return True
    return any(placement.get(v, R) != R for v in op.outputs)


def _differentiable(f: Function, params: Sequence[str]) -> Set[Value]:
    """Values that depend on a parameter (a superset of what autodiff
    differentiates)."""
    found = {v for v in f.inputs if v.name in set(params)}
    for op in f.ops:
        if op.op_type not in NON_DIFFERENTIABLE and any(v in found for v in op.inputs):
            found.update(v for v in op.outputs if v.type.dtype.is_float)
    return found


def insert_copies(template: Function, placement: Dict[Value, Placement], gathers: Set[int],
                  params: Sequence[str], size: int) -> Function:
    """The template with ``spmd.copy`` where a replicated value that needs a
    gradient enters rank-varying compute, and all-gathers whose result
    replicated compute reads rewritten (see the module docstring)."""
    needs = _differentiable(template, params)
    users = template.users()
    producer = template.producers()
    # all-gathers whose result also feeds replicated compute needing a gradient
    rewrite: Set[int] = set()
    for op in template.ops:
        if id(op) in gathers and op.outputs[0] in needs:
            if any(not _varying(u, placement) and any(o in needs for o in u.outputs)
                   for u in users[op.outputs[0]]):
                rewrite.add(id(op))
    copies: Dict[int, List[Tuple[Value, Op]]] = {}   # id(first reader) -> copies before it
    replace: Dict[Tuple[int, Value], Value] = {}
    names = NameScope(v.name for v in template.values())
    for v in template.values():
        if placement.get(v, R) != R or v not in needs:
            continue
        p = producer.get(v)
        if p is not None and id(p) in gathers and id(p) not in rewrite:
            continue          # its gradient is reduce-scattered: shares are right
        readers = [u for u in users.get(v, []) if _varying(u, placement)]
        if not readers:
            continue
        first = readers[0]
        out = Value(names.fresh(f"{v.name}_tp"), v.type)
        meta = {k: first.meta[k] for k in ("layer",) if k in first.meta}
        copy = Op("spmd.copy", [v], [out], {"group": "tp", "size": size}, meta=meta)
        copies.setdefault(id(first), []).append((v, copy))
        for u in readers:
            replace[(id(u), v)] = out
    ops: List[Op] = []
    for op in template.ops:
        ops.extend(c for _, c in copies.get(id(op), ()))
        if id(op) in rewrite:
            ops.extend(_gather_as_allreduce(op, names, size))
            continue
        if any((id(op), v) in replace for v in op.inputs):
            op = Op(op.op_type, [replace.get((id(op), v), v) for v in op.inputs], op.outputs,
                    op.attrs, op.subfunctions, op.meta)
        ops.append(op)
    out = Function(template.name, list(template.inputs), ops, list(template.outputs))
    out.meta = dict(template.meta)
    return out


def _gather_as_allreduce(op: Op, names: NameScope, size: int) -> List[Op]:
    """``spmd.allgather`` as this rank's shard padded with zeros to the whole
    (a partial sum) and all-reduced: the same value, whose gradient (the
    all-reduce's: the identity; the pad's: this rank's slice) arrives
    whole."""
    x, y = op.inputs[0], op.outputs[0]
    dim = int(op.attrs["dim"]) % x.type.rank
    piece = x.type.shape[dim]
    whole = piece * size
    padded = Value(names.fresh(f"{y.name}_padded"),
                   x.type.with_shape(tuple(whole if d == dim else s
                                           for d, s in enumerate(x.type.shape))))
    rank_attrs = {"before": [r * piece for r in range(size)],
                  "after": [whole - (r + 1) * piece for r in range(size)],
                  "start": [r * piece for r in range(size)],
                  "stop": [(r + 1) * piece for r in range(size)]}
    meta = {k: v for k, v in op.meta.items() if k != "rank_attrs"}
    pad = Op("pad", [x], [padded], {"axis": dim, "before": 0, "after": whole - piece},
             meta=dict(meta, rank_attrs=rank_attrs))
    reduce = Op("spmd.allreduce", [padded], [y], {"group": "tp", "size": size,
                                                  "reduce_op": "sum"}, meta=meta)
    return [pad, reduce]


def spmd_template(f: Function, params: Sequence[str], device: Optional[int] = 0
                  ) -> Tuple[Function, Dict[Value, Value]]:
    """The one-rank template of propagated ``f`` (see the module docstring)
    and the map from ``f``'s values to the template's (before copies are
    inserted: a value keeps its template value; copies only add readers)."""
    builder = TemplateBuilder(f, device)
    template, env = builder.build()
    template = insert_copies(template, builder.placement, builder.gathers, params, builder.n)
    return template, env

