"""Sharding propagation: from a few annotated values to a placement for
every value of every function, interprocedurally.

1. *Decide* the placements of unannotated inputs: sweeps forward (an op
   with some known inputs picks the strategy that keeps them as they are
   and gives its unknown inputs and its outputs their placements) and
   backward (an op with known outputs gives its unknown inputs the
   placements that produce them), until nothing changes; what is still
   unknown is replicated. The entry function's unannotated inputs then
   take the cheapest placement the planner finds for the whole program
   (:mod:`.entry_inputs`).
2. *Build* the sharded program: every op takes the cheapest valid
   combination of per-axis strategies (ranked by the planner's table, then
   checked by :mod:`.validity`). Where an input must change -- a conflict
   -- the few cheapest combinations are costed exactly, each input's
   change at its cheapest point along its producer chain (right before the
   op, or earlier, re-placing producers nothing else reads: see
   :mod:`.conflicts`), and the cheapest is realised with ``redistribute``
   ops. A value annotated with other placements than its op produces gets
   a ``redistribute`` after the op.
3. *Calls*: every call is first checked against its callee's signature
   (counts, shapes, dtypes). A callee is specialised per placement
   signature of its arguments (``mlp``, ``mlp.1``, ...): its parameters
   take the argument types and its results' placements flow back to the
   caller. The entry function's results are never partial: a ``P`` is
   reduced to ``R``.

Every op made records the user's op it was made for (``meta["origin"]``,
:mod:`distsim.ir.source`), and an error raised while placing an op names
that op, its file and line, and the calls that reached it.
"""
from __future__ import annotations

from itertools import product
from typing import Dict, List, Optional, Sequence, Tuple

from ...errors import DistsimError, PassPreconditionError, VerifyError
from ...ir.builder import NameScope
from ...ir.core import Function, Module, Op, Value
from ...ir.mesh import DeviceMesh, DTensorType, Partial, Placement, Replicate, check_placements
from ...ir.ops_call import callee_of, is_call, verify_calls
from ...ir.source import at_op, made_for
from ...ir.types import TensorType
from .blocks import blocked_strategies
from .rules import RULES, OpContext, strategies_for
from .conflicts import MAX_CANDIDATES, ConflictResolver
from .costs import _CHANGE, axis_cost, type_cost  # noqa: F401  (re-exported)
from .entry_inputs import place_entry_inputs
from .remembered import Remembered, frozen
from .validity import combination_error

REDISTRIBUTE = "redistribute"
def _global(t) -> TensorType:
    return TensorType(t.shape, t.dtype)


MAX_AXIS_CHOICES = 6     # strategies kept per mesh axis, cheapest first
MAX_COMBINATIONS = 64    # combinations of them tried, cheapest first


def ranked_combinations(op: Op, ins: Sequence[Optional[DTensorType]],
                        outs: Sequence[Optional[DTensorType]], mesh: DeviceMesh
                        ) -> List[Tuple[float, List[List[Placement]], List[List[Placement]]]]:
    """Combinations of per-axis strategies, cheapest to reach from the known
    input (and output) types first: (cost, input placements, output
    placements). The per-axis rules are independent, so the cost of a
    combination is the sum of its axes' costs."""
    ctx = OpContext(op.op_type, op.attrs, [_global(v.type) for v in op.inputs],
                    [_global(v.type) for v in op.outputs])
    strategies = strategies_for(ctx)
    strategies = strategies + blocked_strategies(ctx, strategies, list(ins) + list(outs))
    per_axis = []
    for axis in range(mesh.ndim):
        costed = []
        for k, (s_in, s_out) in enumerate(strategies):
            cost = 0.0
            for known, want in list(zip(ins, s_in)) + list(zip(outs, s_out)):
                if known is None:
                    continue
                if known.mesh != mesh:
                    cost += known.size_bytes + 1.0
                    continue
                cost += axis_cost(known, mesh, known.placements, axis, known.placements[axis], want)
            costed.append((cost, k, s_in, s_out))
        costed.sort(key=lambda e: (e[0], e[1]))
        per_axis.append(costed[:MAX_AXIS_CHOICES])
    combos = sorted(product(*per_axis), key=lambda cs: (sum(c[0] for c in cs), [c[1] for c in cs]))
    out = []
    for cs in combos[:MAX_COMBINATIONS]:
        in_pl = [[c[2][i] for c in cs] for i in range(len(op.inputs))]
        out_pl = [[c[3][i] for c in cs] for i in range(len(op.outputs))]
        out.append((sum(c[0] for c in cs), in_pl, out_pl))
    return out


def valid_types(op: Op, mesh: DeviceMesh, in_pl: Sequence[Sequence[Placement]],
                out_pl: Sequence[Sequence[Placement]]
                ) -> Optional[Tuple[List[DTensorType], List[DTensorType]]]:
    """The DTensor types of a combination, or None when the tensors cannot
    take it (a shard smaller than one element) or the per-device program
    would not compute the op's pieces (:func:`combination_error`)."""
    types_in = [_fit(v.type, mesh, pl) for v, pl in zip(op.inputs, in_pl)]
    types_out = [_fit(v.type, mesh, pl) for v, pl in zip(op.outputs, out_pl)]
    if any(t is None for t in types_in + types_out):
        return None
    if combination_error(op.op_type, op.attrs, types_in, types_out) is not None:
        return None
    return types_in, types_out


def replicated_types(op: Op, mesh: DeviceMesh) -> Tuple[List[DTensorType], List[DTensorType]]:
    rep = [Replicate()] * mesh.ndim
    return ([DTensorType(v.type.shape, v.type.dtype, mesh, rep) for v in op.inputs],
            [DTensorType(v.type.shape, v.type.dtype, mesh, rep) for v in op.outputs])


def choose(op: Op, ins: Sequence[Optional[DTensorType]], outs: Sequence[Optional[DTensorType]],
           mesh: DeviceMesh) -> Tuple[List[DTensorType], List[DTensorType]]:
    """The cheapest valid combination of per-axis strategies from the known
    input (and output) types; returns the required input and the output
    types (all replicated when no combination is valid)."""
    found = _valid_candidates(op, ins, outs, mesh)
    return found[0] if found else replicated_types(op, mesh)


def _fit(t, mesh: DeviceMesh, pl: Sequence[Placement]) -> Optional[DTensorType]:
    try:
        check_placements(t.shape, mesh, pl, "value")
    except VerifyError:
        return None
    return DTensorType(t.shape, t.dtype, mesh, pl)


def _annotation(v: Value) -> Optional[DTensorType]:
    return v.type if isinstance(v.type, DTensorType) else None


class Propagator:
    """Propagates shardings through a module, specialising callees."""

    def __init__(self, module: Module) -> None:
        self.module = module
        self.out = Module(meshes=dict(module.meshes))
        self._specs: Dict[Tuple[str, Tuple], Function] = {}
        self._names = NameScope()

    # -- step 1: decide unknown placements -------------------------------
    def decide(self, f: Function, known: Sequence[Optional[DTensorType]]
               ) -> Dict[Value, Optional[DTensorType]]:
        state: Dict[Value, Optional[DTensorType]] = {v: _annotation(v) for v in f.values()}
        for v, t in zip(f.inputs, known):
            if t is not None:
                state[v] = t
        for _ in range(2 * len(f.ops) + 2):
            before = dict(state)
            for forward, ops in ((True, f.ops), (False, reversed(f.ops))):
                for op in ops:
                    try:
                        self._sweep(op, state, forward)
                    except DistsimError as e:
                        raise at_op(e, f.name, op) from None
            if before == state:
                break
        return state

    def _sweep(self, op: Op, state, forward: bool) -> None:
        ins = [state[v] for v in op.inputs]
        outs = [state[v] for v in op.outputs]
        if is_call(op):   # (the callee's own annotations count, even where the call knows nothing)
            callee = callee_of(op)
            sub = self.decide(callee, ins)
            for v, p in zip(op.inputs, callee.inputs):
                if state[v] is None and sub[p] is not None:
                    state[v] = sub[p]
            for v, r in zip(op.outputs, callee.outputs):
                if (forward or state[v] is None) and sub[r] is not None and _annotation(v) is None:
                    state[v] = sub[r]
            return
        if op.op_type == REDISTRIBUTE:
            if state[op.inputs[0]] is None and outs[0] is not None and not forward:
                state[op.inputs[0]] = outs[0]
            return
        known = [t for t in ins if t is not None]
        if not forward:
            if all(t is not None for t in ins) or all(t is None for t in outs):
                return
            known += [t for t in outs if t is not None]
        if not known:
            return
        mesh = known[0].mesh
        req_in, res_out = choose(op, ins, outs if not forward else [None] * len(outs), mesh)
        for v, t in zip(op.inputs, req_in):
            if state[v] is None:
                state[v] = t
        if forward:
            for v, t in zip(op.outputs, res_out):
                if _annotation(v) is None:
                    state[v] = t

    # -- step 2: build the sharded function ----------------------------
    def specialise(self, f: Function, arg_types: Sequence[Optional[DTensorType]],
                   entry: bool = False) -> Function:
        state = self.decide(f, arg_types)
        meshes = [t.mesh for t in state.values() if t is not None]
        if not meshes and state:   # (a function without values has nothing to place)
            raise PassPreconditionError(f"sharding: no value of @{f.name} has a placement "
                                        "(annotate an input with a DTensor type)")
        default_mesh = meshes[0] if meshes else None
        params = []
        for v in f.inputs:
            t = state[v]
            if t is None:
                t = DTensorType(v.type.shape, v.type.dtype, default_mesh,
                                [Replicate()] * default_mesh.ndim)
            params.append(t)
        key = (f.name, tuple(params), entry)
        if key in self._specs:
            return self._specs[key]
        name = f.name if f.name not in self.out.functions else self._fresh_name(f.name)
        new = Function(name)
        self._specs[key] = new
        self.out.add(new)
        names = NameScope()
        env: Dict[Value, Value] = {}
        for v, t in zip(f.inputs, params):
            nv = Value(names.fresh(v.name), t)
            new.inputs.append(nv)
            env[v] = self._convert(new, names, nv, _annotation(v), v.name)
        build = _Build(f, new, names, env, state)
        for op in f.ops:
            try:
                self._build_op(build, op)
            except DistsimError as e:
                raise at_op(e, f.name, op) from None
        producers = f.producers()
        outs = []
        for v in f.outputs:
            nv = env[v]
            if entry and any(isinstance(p, Partial) for p in nv.type.placements):
                pl = [Replicate() if isinstance(p, Partial) else p for p in nv.type.placements]
                meta = made_for(f.name, producers[v]) if v in producers else None
                nv = self._convert(new, names, nv, nv.type.with_placements(pl), v.name, meta)
            outs.append(nv)
        new.outputs = outs
        new.meta = {k: (dict(x) if isinstance(x, dict) else x) for k, x in f.meta.items()}
        return new

    def _fresh_name(self, base: str) -> str:
        k = 1
        while f"{base}.{k}" in self.out.functions or f"{base}.{k}" in self.module.functions:
            k += 1
        return f"{base}.{k}"

    def _convert(self, new: Function, names: NameScope, v: Value, want: Optional[DTensorType],
                 hint: str, meta: Optional[dict] = None) -> Value:
        """``v`` as type ``want`` (a redistribute op, with ``meta``, when they
        differ)."""
        if want is None or want == v.type:
            return v
        out = Value(names.fresh(hint + "_rd"), want)
        new.ops.append(Op(REDISTRIBUTE, [v], [out], meta=meta))
        return out

    def _build_op(self, build: "_Build", op: Op) -> None:
        """The sharded form of ``op``: every op made for it (its copy, the
        redistributes around it) records it as their origin."""
        new, names, env, state = build.new, build.names, build.env, build.state
        meta = made_for(build.name, op)
        ins = [env[v] for v in op.inputs]
        if is_call(op):
            callee = self.specialise(callee_of(op), [v.type for v in ins])
            outs = [Value(names.fresh(v.name), r.type) for v, r in zip(op.outputs, callee.outputs)]
            new.ops.append(Op("call", ins, outs, {"callee": callee.name}, (callee,),
                              {**op.meta, **meta}))
        else:
            if op.op_type == REDISTRIBUTE:
                want = _annotation(op.outputs[0]) or state[op.outputs[0]] or ins[0].type
                outs = [Value(names.fresh(op.outputs[0].name), want)]
                if want == ins[0].type:
                    env[op.outputs[0]] = ins[0]
                    return
                new.ops.append(Op(REDISTRIBUTE, ins, outs, meta={**op.meta, **meta}))
            else:
                mesh = ins[0].type.mesh if ins else (state[op.outputs[0]] or _first(state)).mesh
                ins, res = self._place(build, op, ins, mesh, meta)
                outs = [Value(names.fresh(v.name), t) for v, t in zip(op.outputs, res)]
                new_op = Op(op.op_type, ins, outs, op.attrs, op.subfunctions, {**op.meta, **meta})
                new.ops.append(new_op)
                if build.may_move(op):
                    build.movable[outs[0]] = new_op
        for old, nv in zip(op.outputs, outs):
            env[old] = self._convert(new, names, nv, _annotation(old), old.name, meta)

    def _place(self, build: "_Build", op: Op, ins: List[Value], mesh: DeviceMesh, meta: dict
               ) -> Tuple[List[Value], List[DTensorType]]:
        """Pick the op's placements and bring its inputs to them.

        The cheapest valid combinations (by the per-axis table) are costed
        exactly: each input's change at its cheapest point along its
        producer chain (:mod:`.conflicts`). Without a conflict the first
        combination needs no change and is taken as it is. An annotated result
        counts too: a combination's cost includes changing its result to the
        annotation, so one producing the annotated placement directly wins
        where it is no dearer (no redistribute after the op)."""
        candidates = _valid_candidates(op, [v.type for v in ins],
                                       [_annotation(v) for v in op.outputs], mesh)
        if not candidates:
            req, res = replicated_types(op, mesh)
            return [build.resolver.realise(v, build.resolver.plan(v, t, 0), v.name, meta)
                    for v, t in zip(ins, req)], res
        best = None
        for req, res in candidates:
            plans = [build.resolver.plan(v, t) for v, t in zip(ins, req)]
            cost = sum(p.cost for p in plans)
            if best is None or cost < best[0]:
                best = (cost, plans, res)
            if cost == 0.0:
                break
        _, plans, res = best
        return [build.resolver.realise(v, p, v.name, meta) for v, p in zip(ins, plans)], res


class _Build:
    """The state of one function being built: the new function, its names,
    the old-to-new value map, the decided placements, and which new values'
    producers may still be re-placed to resolve a later conflict."""

    def __init__(self, f: Function, new: Function, names: NameScope, env: Dict[Value, Value],
                 state) -> None:
        self.new, self.names, self.env, self.state = new, names, env, state
        self.name = f.name   # the user's function, which the ops made name as their origin
        self.users = f.users()
        self.returned = set(f.outputs)
        self.movable: Dict[Value, Op] = {}
        self.resolver = ConflictResolver(new, names, self.movable, _producer_candidates)

    def may_move(self, op: Op) -> bool:
        """A plain op whose single result has one reader, is not returned
        and carries no annotation: re-placing it affects nothing else."""
        if len(op.outputs) != 1 or op.op_type == REDISTRIBUTE:
            return False
        v = op.outputs[0]
        return (len(self.users.get(v, [])) == 1 and v not in self.returned
                and _annotation(v) is None)


#: (op type, rule, attributes, global types, known types, mesh) -> the op's valid
#: combinations, cheapest first (:func:`_valid_candidates`)
Candidates = List[Tuple[Tuple[DTensorType, ...], Tuple[DTensorType, ...]]]
_CANDIDATES: Remembered[Candidates] = Remembered()


def _valid_candidates(op: Op, ins: Sequence[Optional[DTensorType]],
                      outs: Sequence[Optional[DTensorType]], mesh: DeviceMesh) -> Candidates:
    """The first :data:`MAX_CANDIDATES` valid combinations from the known
    input (and output) types, cheapest first; remembered per op type,
    attributes, the op's global types, the known types, the mesh and the
    op type's rule (every layer of a model asks the same)."""
    key = (op.op_type, RULES.get(op.op_type), frozen(op.attrs),
           tuple((v.type.shape, v.type.dtype) for v in op.inputs),
           tuple((v.type.shape, v.type.dtype) for v in op.outputs), tuple(ins), tuple(outs), mesh)
    return _CANDIDATES.get(key, lambda: _ranked_valid(op, ins, outs, mesh))


def _ranked_valid(op: Op, ins: Sequence[Optional[DTensorType]],
                  outs: Sequence[Optional[DTensorType]], mesh: DeviceMesh) -> Candidates:
    found = []
    for _, in_pl, out_pl in ranked_combinations(op, ins, outs, mesh):
        types = valid_types(op, mesh, in_pl, out_pl)
        if types is not None:
            found.append((tuple(types[0]), tuple(types[1])))     # (shared: read only)
            if len(found) >= MAX_CANDIDATES:
                break
    return found


def _producer_candidates(op: Op, ins: List[DTensorType], want: DTensorType) -> Candidates:
    return _valid_candidates(op, ins, [want], want.mesh)


def _first(state) -> DTensorType:
    return next(t for t in state.values() if t is not None)


def propagate(module: Module, entry: str = "main") -> Module:
    """A new module whose functions have a DTensor type on every value:
    the entry function (first) and one specialisation per callee signature.
    The entry's unannotated inputs take the cheapest placement the planner
    finds (:mod:`.entry_inputs`)."""
    if entry not in module.functions:
        raise PassPreconditionError(f"sharding: module has no function @{entry}")
    verify_calls(module, exact=False)
    f = module.functions[entry]

    def build(arg_types: Sequence[Optional[DTensorType]]) -> Module:
        prop = Propagator(module)
        prop.specialise(f, arg_types, entry=True)
        ordered = Module(meshes=prop.out.meshes)
        ordered.add(prop.out.functions[entry])
        for name, fn in prop.out.functions.items():
            if name != entry:
                ordered.add(fn)
        return ordered

    return place_entry_inputs([_annotation(v) for v in f.inputs], build)
