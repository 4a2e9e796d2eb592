"""Sharding rules of context parallelism's collectives on the other mesh
axes (registered into :data:`.rules.RULES`).

A context-parallel forward (:mod:`distsim.models.gpt_context`) gathers its
keys and values over the ``cp`` group with ``spmd.allgather{group: cp}``
(whose gradient is ``spmd.reducescatter{group: cp}``) before the tensor
parallelism places it over ``tp``: to that axis such an op is a
concatenation along the sequence with the other ranks' pieces (a ring's
``spmd.shift{group: cp}`` an exchange of whole blocks, Ulysses'
``spmd.alltoall{group: cp}`` one of pieces of a rank's own shard), so it runs
on any shard of another dim (the heads' split by tp: each tensor-parallel
rank gathers only its heads) and on partial sums (it is linear). A
collective of the tensor-parallel group itself is never placed (the
sharding layer writes those).
"""
from __future__ import annotations

from typing import List

from ...ir.mesh import Shard
from .rules import P, OpContext, Strategy, rule


@rule("spmd.allgather", "spmd.reducescatter", "spmd.shift", "spmd.alltoall")
def _context_collective(ctx: OpContext) -> List[Strategy]:
    if ctx.attrs.get("group") != "cp":
        return []
    x = ctx.ins[0]
    if ctx.op_type == "spmd.alltoall":
        # every rank of a cp group is the same tensor-parallel rank: it
        # exchanges pieces of its own shard, along any dim (the heads tp splits
        # included)
        return [((Shard(d),), (Shard(d),)) for d in range(x.rank)] + [((P,), (P,))]
    dim = int(ctx.attrs["dim"]) % x.rank if "dim" in ctx.attrs else None
    strategies: List[Strategy] = [((Shard(d),), (Shard(d),)) for d in range(x.rank) if d != dim]
    strategies.append(((P,), (P,)))
    return strategies
