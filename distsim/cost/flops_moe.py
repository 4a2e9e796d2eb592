"""FLOP counts of the mixture-of-experts ops (:mod:`distsim.ir.ops_moe`).

Each op routes first: the top-k of each token's expert probabilities,
one comparison per probability (``tokens x experts``). Then, per routed
token-choice that fits its expert (at most ``tokens x top_k``, at most
``experts x capacity``) and per hidden element: dispatch copies (no
arithmetic, charged its bytes by the roofline), its gradient adds (1),
combine multiplies by the gate and adds (2), combine's gradient scales
the output gradient (1) and dots it with the expert output (2).

Under a dropless dispatch (``meta["occupancy"]``, :mod:`distsim.models.moe`)
the slots (``experts x capacity x hidden``) hold tokens in only that share
of their rows: :func:`routing_bytes` charges that share of them, the
tokens and probabilities whole.
"""
from __future__ import annotations

import math

from ..ir.core import Op
from ..ir.occupancy import holds_slots
from .flops import flop_rule

#: FLOPs per routed token-choice and hidden element
_PER_ELEMENT = {"moe_dispatch": 0, "moe_dispatch_grad": 1, "moe_combine": 2,
                "moe_combine_grad": 3}


def routed(op: Op) -> int:
    """Token-choices an op moves: tokens x top_k, capped by the slots."""
    probs = op.inputs[-1].type
    tokens, experts = math.prod(probs.shape[:-1]), probs.shape[-1]
    return min(tokens * int(op.attrs["top_k"]), experts * int(op.attrs["capacity"]))


#: the routing ops, their FLOPs counted on the routed tokens already
ROUTING_OPS = frozenset(_PER_ELEMENT)


def routing_bytes(op: Op, occupancy: float) -> float:
    """Bytes a routing op moves when ``occupancy`` of its slots' rows hold
    tokens: the slots that share, every other operand and result whole."""
    return float(sum(v.type.size_bytes * (occupancy if holds_slots(op, v.type) else 1.0)
                     for v in (*op.inputs, *op.outputs)))


@flop_rule(*_PER_ELEMENT)
def _moe(op: Op) -> float:
    probs = op.inputs[-1].type
    hidden = op.inputs[0].type.shape[-1]
    return float(math.prod(probs.shape)
                 + _PER_ELEMENT[op.op_type] * routed(op) * hidden)
