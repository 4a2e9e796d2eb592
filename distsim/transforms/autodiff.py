"""Reverse-mode automatic differentiation of a DistIR function.

``Autodiff(loss, wrt)(f)`` returns a new function: the forward ops of ``f``,
then the backward ops (gradient rules from :mod:`.grad_rules`, applied in
reverse program order), returning ``f``'s outputs followed by the gradients
of ``loss`` with respect to each value in ``wrt``. ``meta["grads"]`` maps
each ``wrt`` name to its gradient's name. A ring attention (ops tagged
``meta["ring"]``) is differentiated as a whole (:mod:`.ring_backward`).
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Set

from ..errors import PassPreconditionError
from ..ir.builder import builder_from
from ..ir.core import Function, Value
from .cleanup import eliminate_dead_code
from .grad_rules import NON_DIFFERENTIABLE, lookup_grad_rule
from .ring_backward import find_rings, ring_backward

# Meta keys a forward op hands down to the backward ops emitted for it
# (e.g. the transformer layer, so that pipeline stages and recomputation
# can find a layer's backward; a dropless dispatch's share of occupied
# rows, ``occupancy``, which the sums of a routing op's input gradients --
# tokens and probabilities, every row real -- do not take).
INHERITED_META = ("layer", "rank_attrs", "cp_rank_attrs", "ep_rank_attrs", "occupancy")


class Autodiff:
    """The pass: gradients of the scalar ``loss`` w.r.t. ``wrt`` (names)."""

    def __init__(self, loss: str, wrt: Sequence[str]) -> None:
        self.loss = loss
        self.wrt = list(wrt)

    def __call__(self, function: Function) -> Function:
        b, mapping = builder_from(function, function.name)
        f = b.function
        by_name = {v.name: v for v in f.values()}
        if self.loss not in by_name:
            raise PassPreconditionError(f"autodiff: loss value %{self.loss} not in "
                                        f"'{function.name}'")
        loss = by_name[self.loss]
        if loss.type.shape != ():
            raise PassPreconditionError(f"autodiff: loss %{self.loss} must be a scalar, "
                                        f"has shape {loss.type.shape}")
        missing = [n for n in self.wrt if n not in by_name]
        if missing:
            raise PassPreconditionError(f"autodiff: no value %{missing[0]} in '{function.name}'")
        wrt = [by_name[n] for n in self.wrt]

        # Values that depend on some wrt value (forward) and that the loss
        # depends on (backward): only these need gradients.
        depends: Set[Value] = set(wrt)
        forward_ops = list(f.ops)
        for op in forward_ops:
            if op.op_type not in NON_DIFFERENTIABLE and any(v in depends for v in op.inputs):
                depends.update(op.outputs)
        needed: Set[Value] = {loss}
        for op in reversed(forward_ops):
            if any(v in needed for v in op.outputs):
                needed.update(v for v in op.inputs if v in depends)

        grads: Dict[Value, Value] = {loss: b.op("ones_like", [loss], name=f"d_{loss.name}")}
        rings = find_rings(forward_ops)
        in_ring = set(rings)
        for op in reversed(forward_ops):
            if op.meta.get("ring") in in_ring:
                # the ring's last op comes first: its output's gradient is whole
                ring = rings.pop(op.meta["ring"], None)
                if ring is not None and grads.get(ring.out) is not None:
                    layer = {k: ring.blocks[0].meta[k] for k in ("layer",)
                             if k in ring.blocks[0].meta}
                    for v, g in ring_backward(b, ring, grads[ring.out]):
                        grads[v] = (b.op("add", [grads[v], g], name=f"d_{v.name}", meta=layer)
                                    if v in grads else g)
                continue
            out_grads: List[Optional[Value]] = [grads.get(v) for v in op.outputs]
            if all(g is None for g in out_grads):
                continue
            if not any(v in needed and v in depends for v in op.inputs):
                continue
            first_new = len(f.ops)
            in_grads = lookup_grad_rule(op)(b, op, out_grads)
            for v, g in zip(op.inputs, in_grads):
                if g is None or v not in depends:
                    continue
                if v in grads:
                    grads[v] = b.op("add", [grads[v], g], name=f"d_{v.name}")
                else:
                    grads[v] = g
            inherited = {k: op.meta[k] for k in INHERITED_META if k in op.meta}
            if inherited:
                for new_op in f.ops[first_new:]:
                    for k, val in inherited.items():
                        if k == "occupancy" and op.op_type.startswith("moe_") \
                                and new_op.op_type == "add":
                            continue
                        new_op.meta.setdefault(k, val)
        results: List[Value] = []
        for v in wrt:
            if v not in grads:
                raise PassPreconditionError(f"autodiff: loss %{self.loss} does not depend on "
                                            f"%{v.name}")
            results.append(grads[v])
        f.outputs = [mapping[v] for v in function.outputs] + results
        f.meta["grads"] = {v.name: g.name for v, g in zip(wrt, results)}
        for op in f.ops[len(forward_ops):]:
            op.meta.setdefault("phase", "backward")
        # Rules emit every input's gradient; drop those nobody needs.
        return eliminate_dead_code(f)
