"""Blocked shards (:class:`~distsim.ir.mesh.BlockShard`) through ops.

A fused weight -- query, key and value side by side, or SwiGLU's gate and
up projections -- is split block by block (Megatron's layout): a device
holds its part of every block, so that the ``split`` of the product into
the blocks stays local and each device goes on with whole heads. The
per-axis rules of :mod:`.rules` know only contiguous shards; here they are
extended where a blocked shard is known:

- ops that keep a dim's coordinates (``matmul``, element-wise ops,
  ``dropout``): a strategy that shards the blocked dim carries the blocks
  to every dim it shards alongside (dims of the same size: the rules pair
  only corresponding dims);
- ``split`` into exactly the blocks: each result is an ordinary shard of
  its block (:func:`local_split_sizes` gives the per-device sizes).

A blocked shard is never redistributed (:mod:`.planner`); every other
strategy costs it infinitely much.
"""
from __future__ import annotations

from typing import List, Mapping, Optional, Sequence

from ...ir.mesh import BlockShard, DTensorType, Placement, Shard
from ...ir.registry import is_registered, lookup
from .rules import OpContext, Strategy, _norm

#: ops (besides element-wise ones) whose strategies pair only dims that
#: hold the same coordinates
KEEP_COORDINATES = frozenset({"matmul", "dropout"})


def _keeps_coordinates(op_type: str) -> bool:
    return op_type in KEEP_COORDINATES or (is_registered(op_type)
                                           and lookup(op_type).elementwise)


def blocked_strategies(ctx: OpContext, strategies: Sequence[Strategy],
                       known: Sequence[Optional[DTensorType]]) -> List[Strategy]:
    """The strategies of ``ctx``'s op that read or make the blocked shards
    among ``known`` (its inputs' then its outputs' types, None where not
    known): none when there are none."""
    blocked = [(i, p) for i, t in enumerate(known) if t is not None
               for p in t.placements if isinstance(p, BlockShard)]
    if not blocked:
        return []
    n_in = len(ctx.ins)
    shapes = [t.shape for t in ctx.ins] + [t.shape for t in ctx.outs]
    found: List[Strategy] = []
    if ctx.op_type == "split":
        axis = _norm(ctx.attrs["axis"], ctx.ins[0].rank)
        sizes = tuple(int(s) for s in ctx.attrs["sizes"])
        for i, p in blocked:
            if i == 0 and p.dim == axis and p.blocks == sizes:
                found.append(((p,), (Shard(axis),) * len(ctx.outs)))
        return found
    if not _keeps_coordinates(ctx.op_type):
        return []
    for i, p in blocked:
        size = shapes[i][p.dim]
        for s_in, s_out in strategies:
            slots = list(s_in) + list(s_out)
            if i >= len(slots) or slots[i] != Shard(p.dim):
                continue
            lifted: List[Placement] = []
            for j, q in enumerate(slots):
                if type(q) is Shard:
                    if shapes[j][q.dim] != size:
                        break
                    q = BlockShard(q.dim, p.blocks)
                lifted.append(q)
            else:
                strategy = (tuple(lifted[:n_in]), tuple(lifted[n_in:]))
                if strategy not in found:
                    found.append(strategy)
    return found


def local_split_sizes(attrs: Mapping[str, object], x: DTensorType) -> Optional[List[int]]:
    """The per-device ``sizes`` of a ``split`` of ``x`` along a blocked
    dim (each block's part); None when the split dim is not blocked."""
    axis = _norm(attrs["axis"], x.rank)
    n = 1
    for size, p in zip(x.mesh.shape, x.placements):
        if isinstance(p, BlockShard) and p.dim == axis:
            n *= size
    if n == 1:
        return None
    return [int(s) // n for s in attrs["sizes"]]
