"""Sharding rules of the convolution-network ops (ONNX imports) and of the
backward ops of the layout and normalisation ops.

Conventions as in :mod:`.rules`: strategies for one mesh axis, ``(input
placements, output placements)``, best first; all-replicated is added by
:func:`~.rules.strategies_for`. Whether a combination of them works on a
given mesh (piece sizes) is checked by :mod:`.validity`.

- ``conv`` (NCHW, weight OIHW): the batch dim; the output channels when the
  weight is sharded on its out-channel dim; the input channels (a
  contraction: partial sums) -- the channel strategies only for
  ``group == 1``.
- ``conv_grad_input`` / ``conv_grad_weight``: the same three dims seen from
  the backward side (a batch-sharded weight gradient is a partial sum).
- pooling, ``lrn``: the batch dim (and the channels for pooling, which works
  per channel; not for LRN, which mixes neighbouring channels).
- ``batchnorm`` (inference form): any dim; per-channel parameters follow a
  channel shard. Its gradient: the parameter gradients are sums over the
  batch and spatial dims, so sharding those gives partial sums.
- ``trilu``: the batch dims (not the last two, where the triangle lies).
- ``strided_slice`` / ``strided_slice_grad``: the dims not sliced.
- ``gather_grad``: the indices' dims (a partial sum, a scatter-add of each
  device's part) or a data dim other than the gathered axis.
"""
from __future__ import annotations

from typing import List

from ...ir.mesh import Shard
from .rules import P, R, OpContext, Strategy, _norm, rule


def _group1(ctx: OpContext) -> bool:
    return int(ctx.attrs.get("group", 1)) == 1


@rule("conv")
def _conv(ctx: OpContext) -> List[Strategy]:
    strategies: List[Strategy] = [((Shard(0), R), (Shard(0),))]
    if _group1(ctx):
        strategies += [((R, Shard(0)), (Shard(1),)), ((Shard(1), Shard(1)), (P,))]
    return strategies + [((P, R), (P,)), ((R, P), (P,))]


@rule("conv_grad_input")
def _conv_grad_input(ctx: OpContext) -> List[Strategy]:
    # (dy, w, like_x) -> dx
    strategies: List[Strategy] = [((Shard(0), R, Shard(0)), (Shard(0),))]
    if _group1(ctx):
        strategies += [((Shard(1), Shard(0), R), (P,)), ((R, Shard(1), Shard(1)), (Shard(1),))]
    return strategies + [((P, R, R), (P,)), ((R, P, R), (P,))]


@rule("conv_grad_weight")
def _conv_grad_weight(ctx: OpContext) -> List[Strategy]:
    # (dy, x, like_w) -> dw
    strategies: List[Strategy] = [((Shard(0), Shard(0), R), (P,))]
    if _group1(ctx):
        strategies += [((Shard(1), R, Shard(0)), (Shard(0),)),
                       ((R, Shard(1), Shard(1)), (Shard(1),))]
    return strategies + [((P, R, R), (P,)), ((R, P, R), (P,))]


@rule("maxpool", "averagepool")
def _pool(ctx: OpContext) -> List[Strategy]:
    strategies: List[Strategy] = [((Shard(d),), (Shard(d),)) for d in (0, 1)]
    if ctx.op_type == "averagepool":
        strategies.append(((P,), (P,)))
    return strategies


@rule("maxpool_grad", "averagepool_grad")
def _pool_grad(ctx: OpContext) -> List[Strategy]:
    # (dy, x) -> dx, linear in dy (the routing depends on x only)
    strategies: List[Strategy] = [((Shard(d), Shard(d)), (Shard(d),)) for d in (0, 1)]
    return strategies + [((P, R), (P,))]


@rule("lrn")
def _lrn(ctx: OpContext) -> List[Strategy]:
    return [((Shard(d),), (Shard(d),)) for d in range(ctx.ins[0].rank) if d != 1]


@rule("lrn_grad")
def _lrn_grad(ctx: OpContext) -> List[Strategy]:
    return [((Shard(d), Shard(d)), (Shard(d),)) for d in range(ctx.ins[0].rank) if d != 1]


@rule("batchnorm")
def _batchnorm(ctx: OpContext) -> List[Strategy]:
    # (x, scale, bias, mean, var) -> y
    rank = ctx.ins[0].rank
    strategies: List[Strategy] = [((Shard(d),) + (R,) * 4, (Shard(d),))
                                  for d in range(rank) if d != 1]
    strategies.append(((Shard(1),) + (Shard(0),) * 4, (Shard(1),)))
    return strategies


@rule("batchnorm_grad")
def _batchnorm_grad(ctx: OpContext) -> List[Strategy]:
    # (dy, x, scale, mean, var) -> (dx, dscale, dbias)
    rank = ctx.ins[0].rank
    strategies: List[Strategy] = [((Shard(d), Shard(d), R, R, R), (Shard(d), P, P))
                                  for d in range(rank) if d != 1]
    strategies.append(((Shard(1), Shard(1), Shard(0), Shard(0), Shard(0)),
                       (Shard(1), Shard(0), Shard(0))))
    strategies.append(((P, R, R, R, R), (P, P, P)))
    return strategies


@rule("trilu")
def _trilu(ctx: OpContext) -> List[Strategy]:
    rank = ctx.ins[0].rank
    return [((Shard(d),), (Shard(d),)) for d in range(rank - 2)] + [((P,), (P,))]


def _sliced_dims(ctx: OpContext, rank: int) -> set:
    axes = ctx.attrs.get("axes")
    if axes is None:
        axes = range(len(ctx.attrs.get("starts", ())))
    return {_norm(a, rank) for a in axes}


@rule("strided_slice_grad")
def _strided_slice_grad(ctx: OpContext) -> List[Strategy]:
    # (dy, like) -> dy placed into zeros shaped like
    rank = ctx.outs[0].rank
    touched = _sliced_dims(ctx, rank)
    strategies: List[Strategy] = [((Shard(d), Shard(d)), (Shard(d),))
                                  for d in range(rank) if d not in touched]
    return strategies + [((P, R), (P,))]


@rule("gather_grad")
def _gather_grad(ctx: OpContext) -> List[Strategy]:
    # (dy, indices, like) -> scatter-add of dy into zeros shaped like
    _, idx, like = ctx.ins
    axis = _norm(ctx.attrs.get("axis", 0), like.rank)
    strategies: List[Strategy] = [((Shard(axis + d), Shard(d), R), (P,)) for d in range(idx.rank)]
    for d in range(like.rank):
        if d != axis:
            dy_d = d if d < axis else d + idx.rank - 1
            strategies.append(((Shard(dy_d), R, Shard(d)), (Shard(d),)))
    return strategies + [((P, R, R), (P,))]
