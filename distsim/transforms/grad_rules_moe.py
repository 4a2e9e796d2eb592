"""Gradient rules of the mixture-of-experts ops (:mod:`distsim.ir.ops_moe`).

The routing (which experts, which slots) is piecewise constant in the
router's probabilities: dispatch passes no gradient to them; combine does,
through the gates that weight each expert's output.
"""
from __future__ import annotations

from .grad_rules import _name, grad_rule


def _route(op):
    route = {"top_k": op.attrs["top_k"], "capacity": op.attrs["capacity"]}
    for key in ("groups", "first_expert", "local_experts"):
        if key in op.attrs and op.attrs[key] != (1 if key == "groups" else 0):
            route[key] = op.attrs[key]
    return route


@grad_rule("moe_dispatch")
def _dispatch(b, op, grads):
    dx = b.op("moe_dispatch_grad", [grads[0], op.inputs[1]], _route(op), name=_name(op, 0))
    return [dx, None]


@grad_rule("moe_combine")
def _combine(b, op, grads):
    y, probs = op.inputs
    dy, dprobs = b.op("moe_combine_grad", [grads[0], y, probs],
                      {**_route(op), "normalize": op.attrs.get("normalize", True)},
                      name=[_name(op, 0), _name(op, 1)])
    return [dy, dprobs]
