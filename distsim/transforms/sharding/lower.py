"""Lowering: a propagated global-view module -> one local-view function.

Every DTensor value becomes one local value per device of its mesh (named
``<value>_r<rank>``, typed with that device's shard); every op becomes one
op per device; every ``redistribute`` becomes the planner's steps as
explicit ``comm.*`` ops whose teams (mesh + axes, kept as the ``mesh`` and
``axes`` attributes) are resolved to ranks; calls are inlined. The result
verifies with :func:`distsim.ir.verify` and runs in the NumpyExecutor and
the simulator.

``function.meta["sharding"]`` maps each global value name of the entry
function to ``(DTensorType, [local value names in mesh order])``, which is
how ``distsim check`` compares the two programs value by value.
"""
from __future__ import annotations

from math import prod
from typing import Callable, Dict, List, Tuple

from ...errors import DistsimError, PassPreconditionError
from ...ir.core import Function, Module, Op, Value
from ...ir.mesh import DTensorType, shard_range
from ...ir.ops_call import callee_of, is_call
from ...ir.source import at_op
from .blocks import local_split_sizes
from .cross_mesh import cross_mesh
from .local_builder import (Coords, LocalBuilder, Locals, apply_step,  # noqa: F401  (re-exported)
                            local_name, redistribute_on_mesh)
from .propagate import REDISTRIBUTE


def redistribute_locals(lb: LocalBuilder, vals: Locals, src: DTensorType, dst: DTensorType,
                        hint: str) -> Locals:
    """Local values of ``src`` turned into those of ``dst`` (same mesh:
    the planner's steps; across meshes: the cheapest recipe of
    :mod:`.cross_mesh`)."""
    if src.mesh != dst.mesh:
        return cross_mesh(lb, vals, src, dst, hint)
    return redistribute_on_mesh(lb, vals, src, dst, hint)


# -- per-device forms of compute ops --------------------------------------------
LocalRule = Callable[[LocalBuilder, Op, Coords, List[Value], List[str]], List[Value]]
LOCAL_RULES: Dict[str, LocalRule] = {}


def local_rule(*names: str):
    def deco(fn: LocalRule) -> LocalRule:
        for n in names:
            LOCAL_RULES[n] = fn
        return fn
    return deco


def _same(lb: LocalBuilder, op: Op, c: Coords, ins: List[Value], hints: List[str]) -> List[Value]:
    return lb.emit(op.op_type, ins, op.attrs, hints)


@local_rule("reshape", "broadcast_to")
def _target_shape(lb, op, c, ins, hints):
    return lb.emit(op.op_type, ins, dict(op.attrs, shape=list(op.outputs[0].type.local_shape(c))),
                   hints)


def _rescaled(lb: LocalBuilder, op: Op, ins: List[Value], hints: List[str], factor: float
              ) -> List[Value]:
    """The op, then its result times ``factor`` (when not 1)."""
    if factor == 1.0:
        return lb.emit(op.op_type, ins, op.attrs, hints)
    out = lb.emit(op.op_type, ins, op.attrs, [hints[0] + "_local"])[0]
    return lb.emit("scale", [out], {"factor": factor}, hints)


@local_rule("reduce_mean", "mse_loss", "cross_entropy")
def _mean(lb, op, c, ins, hints):
    """A mean over sharded elements: the local mean rescaled to count the
    whole, so that the terms sum (``P(sum)``) to the global mean."""
    x, y = op.inputs[0].type, op.outputs[0].type
    local = prod(x.local_shape(c)) / max(prod(y.local_shape(c)), 1)
    whole = prod(x.shape) / max(prod(y.shape), 1)
    return _rescaled(lb, op, ins, hints, local / whole if whole else 1.0)


@local_rule("mse_loss_grad", "cross_entropy_grad")
def _mean_grad(lb, op, c, ins, hints):
    y = op.inputs[1].type
    return _rescaled(lb, op, ins, hints, prod(y.local_shape(c)) / max(prod(y.shape), 1))


def _offset_of(t: DTensorType, dim: int, c: Coords) -> Tuple[int, int]:
    """(start, length) of the piece of ``t``'s dim ``dim`` at ``c``."""
    return shard_range(t.shape[dim], t.placements, t.mesh.shape, dim, c)


@local_rule("embedding", "select_label", "select_label_grad")
def _vocabulary_piece(lb, op, c, ins, hints):
    """On a piece of the vocabulary (table rows, logits' last dim) the op
    sees ids relative to its first row: ``offset`` grows by the piece's
    start (ids outside the piece give zeros: the pieces sum to the whole)."""
    vocab = op.inputs[1 if op.op_type == "select_label_grad" else 0].type
    dim = 0 if op.op_type == "embedding" else vocab.rank - 1
    start, _ = _offset_of(vocab, dim, c)
    return lb.emit(op.op_type, ins, dict(op.attrs, offset=int(op.attrs.get("offset", 0)) + start),
                   hints)


@local_rule("split")
def _split_blocks(lb, op, c, ins, hints):
    """A split of a blocked dim into its blocks: each block's part."""
    sizes = local_split_sizes(op.attrs, op.inputs[0].type)
    return lb.emit("split", ins, op.attrs if sizes is None else dict(op.attrs, sizes=sizes),
                   hints)


@local_rule("embedding_grad")
def _embedding_grad_rows(lb, op, c, ins, hints):
    """The gradient of this device's rows of the table: ``num_embeddings``
    its rows, ``offset`` grown by their start."""
    start, rows = _offset_of(op.outputs[0].type, 0, c)
    return lb.emit(op.op_type, ins, dict(op.attrs, num_embeddings=rows,
                                         offset=int(op.attrs.get("offset", 0)) + start), hints)


# -- the function ------------------------------------------------------------------
class Lowering:
    def __init__(self, module: Module, entry: str = "main") -> None:
        self.module = module
        self.entry = module.functions[entry]
        self.lb = LocalBuilder(entry)
        self.record: Dict[str, Tuple[DTensorType, List[str]]] = {}

    def run(self) -> Function:
        f = self.entry
        env: Dict[Value, Locals] = {}
        for v in f.inputs:
            t = _dtensor(v, f)
            env[v] = {c: self.lb.input(local_name(v.name, t.mesh.rank_at(c)), t.local_type(c))
                      for c in t.mesh.all_coords()}
            self._note(v, env[v])
        self._lower_ops(f, env, prefix="")
        out = self.lb.function
        out.outputs = [x for v in f.outputs for x in env[v].values()]
        out.meta = {"sharding": self.record, "outputs": [(v.name, v.type) for v in f.outputs]}
        return out

    def _note(self, v: Value, vals: Locals) -> None:
        self.record[v.name] = (v.type, [x.name for x in vals.values()])

    def _lower_ops(self, f: Function, env: Dict[Value, Locals], prefix: str) -> None:
        """Lower ``f``'s ops; an inlined callee's values are named ``<prefix><name>``.
        An error names the user's op the failing op was made for."""
        for op in f.ops:
            try:
                self._lower_op(f, op, env, prefix)
            except DistsimError as e:
                raise at_op(e, f.name, op) from None
            if not prefix:
                for v in op.outputs:
                    self._note(v, env[v])

    def _lower_op(self, f: Function, op: Op, env: Dict[Value, Locals], prefix: str) -> None:
        for v in op.inputs + op.outputs:
            _dtensor(v, f)
        if is_call(op):
            callee = callee_of(op)
            sub = {p: env[a] for p, a in zip(callee.inputs, op.inputs)}
            self._lower_ops(callee, sub, f"{prefix}{callee.name}.")
            for v, r in zip(op.outputs, callee.outputs):
                env[v] = sub[r]
        elif op.op_type == REDISTRIBUTE:
            x, y = op.inputs[0], op.outputs[0]
            env[y] = redistribute_locals(self.lb, env[x], x.type, y.type, prefix + y.name)
        else:
            mesh = op.outputs[0].type.mesh if op.outputs else op.inputs[0].type.mesh
            for v in op.inputs:
                if v.type.mesh != mesh:
                    raise PassPreconditionError(f"lowering: reads %{v.name} on another mesh; "
                                                "propagate first")
            results: List[Locals] = [{} for _ in op.outputs]
            rule = LOCAL_RULES.get(op.op_type, _same)
            for c in mesh.all_coords():
                rank = mesh.rank_at(c)
                outs = rule(self.lb, op, c, [env[v][c] for v in op.inputs],
                            [local_name(prefix + v.name, rank) for v in op.outputs])
                for i, v in enumerate(outs):
                    results[i][c] = v
            for v, vals in zip(op.outputs, results):
                env[v] = vals


def _dtensor(v: Value, f: Function) -> DTensorType:
    if not isinstance(v.type, DTensorType):
        raise PassPreconditionError(f"lowering: value %{v.name} of @{f.name} has no placement "
                                    f"({v.type}); propagate shardings first")
    return v.type


def lower(module: Module, entry: str = "main") -> Function:
    """The local-view function of a propagated module's entry function."""
    return Lowering(module, entry).run()
