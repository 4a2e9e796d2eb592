"""Sharding rules of the mixture-of-experts ops (:mod:`distsim.ir.ops_moe`),
registered into :data:`.rules.RULES` and :data:`.lower.LOCAL_RULES`.

The routing reads every probability of a token, so the experts' dim of
the probabilities is never split. One split is offered besides running
replicated: a shard of the tokens' groups (``groups`` a multiple of the
devices, the last leading dim split alike in the tokens and the
probabilities): each device routes its groups on their own into their
share of every expert's slots, so the slots are split along dim 1 --
sequence parallelism's routing (each rank its sequence shard, as
Megatron-LM's MoE layer routes). On a device the op has its groups and
its share of the capacity.
"""
from __future__ import annotations

from typing import Dict, List, Mapping

from ...ir.mesh import Shard
from .lower import local_rule
from .rules import OpContext, Strategy, rule
from .validity import LOCAL_ATTRS


@rule("moe_dispatch")
def _dispatch(ctx: OpContext) -> List[Strategy]:
    if int(ctx.attrs.get("groups", 1)) == 1:
        return []
    n = ctx.ins[1].rank - 2
    return [((Shard(n), Shard(n)), (Shard(1),))]


@rule("moe_combine")
def _combine(ctx: OpContext) -> List[Strategy]:
    if int(ctx.attrs.get("groups", 1)) == 1:
        return []
    return [((Shard(1), Shard(ctx.ins[1].rank - 2)), (Shard(ctx.outs[0].rank - 2),))]


def local_route(attrs: Mapping[str, object], slots: int) -> Dict[str, object]:
    """The attributes of a dispatch or combine on a device holding ``slots``
    of each expert's slots: its share of the groups and of the capacity
    (``groups`` left out where one remains)."""
    capacity = int(attrs["capacity"])   # type: ignore[call-overload]
    if slots == capacity:
        return dict(attrs)
    out = dict(attrs, capacity=slots,
               groups=int(attrs.get("groups", 1)) * slots // capacity)  # type: ignore[call-overload]
    if out["groups"] == 1:
        del out["groups"]
    return out


LOCAL_ATTRS["moe_dispatch"] = lambda attrs, ins, outs: local_route(attrs, outs[0][1])
LOCAL_ATTRS["moe_combine"] = lambda attrs, ins, outs: local_route(attrs, ins[0][1])


@local_rule("moe_dispatch", "moe_combine")
def _groups_here(lb, op, c, ins, hints):
    """The op on this device's groups (:func:`local_route`)."""
    slots = op.outputs[0] if op.op_type == "moe_dispatch" else op.inputs[0]
    return lb.emit(op.op_type, ins, local_route(op.attrs, slots.type.local_shape(c)[1]), hints)
