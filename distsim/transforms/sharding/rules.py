"""Sharding rules: for each op type, the placements it can compute in.

A rule sees the op's global input and output types and its attributes and
returns *strategies* for one mesh axis: ``(input placements, output
placements)`` pairs, best first. Mesh axes are independent: propagation
picks one strategy per axis. Every op can run replicated (all ``R`` ->
all ``R``), which is added when a rule does not list it; an op without a
rule runs only replicated. Element-wise ops (``OpSpec.elementwise``) share
one broadcasting rule.

Adding an op's rule is one entry in :data:`RULES` (the convolution-network
and several backward ops are in :mod:`.rules_cnn`). Ops whose per-device
form differs from the global one (a reshape's target shape, a mean over a
sharded dim) also have an entry in :data:`LOCAL_RULES` (see ``lower.py``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from ...ir.mesh import Partial, Placement, Replicate, Shard
from ...ir.registry import is_registered, lookup
from ...ir.types import TensorType

R = Replicate()
P = Partial("sum")
Strategy = Tuple[Tuple[Placement, ...], Tuple[Placement, ...]]


@dataclass
class OpContext:
    op_type: str
    attrs: Mapping[str, object]
    ins: Sequence[TensorType]
    outs: Sequence[TensorType]


Rule = Callable[[OpContext], List[Strategy]]
RULES: Dict[str, Rule] = {}


def rule(*names: str):
    def deco(fn: Rule) -> Rule:
        for n in names:
            RULES[n] = fn
        return fn
    return deco


def _s(dim: Optional[int]) -> Placement:
    return R if dim is None else Shard(dim)


def _shards(ctx: OpContext, maps: Sequence[Tuple[Sequence[Optional[int]], Sequence[Optional[int]]]]
            ) -> List[Strategy]:
    """Strategies from dim correspondences: (dim or None per input,
    dim or None per output); a correspondence with no sharded output dim
    is skipped."""
    out = []
    for ins, outs in maps:
        if all(d is None for d in outs):
            continue
        out.append((tuple(_s(d) for d in ins), tuple(_s(d) for d in outs)))
    return out


def _norm(axis, rank: int) -> int:
    return int(axis) % rank if rank else 0


# -- element-wise ------------------------------------------------------------
LINEAR_UNARY = {"neg", "scale", "identity", "cast", "stop_gradient", "zeros_like"}
# binary ops linear in the inputs marked True: (P, R) -> P when only the first is.
LINEAR_IN = {"add": "all", "sub": "all", "mul": (True, True), "div": (True, False),
             "relu_grad": (True, False), "gelu_grad": (True, False), "silu_grad": (True, False)}
MAX_MONOTONE = {"relu", "maximum", "reduce_max", "identity", "exp", "sigmoid", "tanh"}


def elementwise_strategies(ctx: OpContext) -> List[Strategy]:
    out_t = ctx.outs[0]
    r = out_t.rank
    maps = []
    for d in range(r):
        dims = []
        for t in ctx.ins:
            k = d - (r - t.rank)
            dims.append(k if k >= 0 and t.shape[k] == out_t.shape[d] else None)
        maps.append((dims, [d] * len(ctx.outs)))
    strategies = _shards(ctx, maps)
    n = len(ctx.ins)
    lin = LINEAR_IN.get(ctx.op_type)
    if ctx.op_type in LINEAR_UNARY or lin == "all":
        strategies.append(((P,) * n, (P,) * len(ctx.outs)))
    elif isinstance(lin, tuple):
        for i, ok in enumerate(lin):
            if ok:
                strategies.append((tuple(P if j == i else R for j in range(n)), (P,)))
    if ctx.op_type in MAX_MONOTONE:
        pm = Partial("max")
        strategies.append(((pm,) * n, (pm,) * len(ctx.outs)))
    return strategies


@rule("sgd", "adamw", "dropout", "dropout_grad", "causal_mask", "depend")
def _same_shape(ctx: OpContext) -> List[Strategy]:
    """Every input and output of the first input's shape shares its dims
    (extra inputs such as depend's token stay replicated)."""
    shape = ctx.ins[0].shape
    r = len(shape)
    maps = []
    for d in range(r):
        if ctx.op_type == "causal_mask" and d >= r - 2:
            continue
        ins = [d if t.shape == shape else None for t in ctx.ins]
        outs = [d if t.shape == shape else None for t in ctx.outs]
        maps.append((ins, outs))
    strategies = _shards(ctx, maps)
    if ctx.op_type == "dropout_grad":
        strategies.append(((P, R), (P,)))
    return strategies


# -- contractions ------------------------------------------------------------
def _broadcast_dim(full: TensorType, t: TensorType, d: int) -> Optional[int]:
    """The dim of ``t`` matching batch dim ``d`` of ``full``, which ``t``
    broadcasts to (None where ``t`` has no such dim or is broadcast along
    it: a matmul operand's missing batch dims, the group dim of
    grouped-query attention's k and v)."""
    k = d - (full.rank - t.rank)
    return k if k >= 0 and t.shape[k] == full.shape[d] else None


@rule("matmul")
def _matmul(ctx: OpContext) -> List[Strategy]:
    a, b = ctx.ins
    o = ctx.outs[0]
    ta, tb = bool(ctx.attrs.get("trans_a")), bool(ctx.attrs.get("trans_b"))
    am, ak = (a.rank - 1, a.rank - 2) if ta else (a.rank - 2, a.rank - 1)
    bk, bn = (b.rank - 1, b.rank - 2) if tb else (b.rank - 2, b.rank - 1)
    maps = [([am, None], [o.rank - 2]), ([None, bn], [o.rank - 1])]
    if ctx.attrs.get("sum_batch"):
        strategies = _shards(ctx, maps)
        # the batch dims are contracted: split alike, each shard a partial sum
        strategies += [((Shard(d), Shard(d)), (P,)) for d in range(a.rank - 2)]
    else:
        # batch dims, broadcast like element-wise
        maps += [([_broadcast_dim(o, a, d), _broadcast_dim(o, b, d)], [d])
                 for d in range(o.rank - 2)]
        strategies = _shards(ctx, maps)
    strategies.append(((Shard(ak), Shard(bk)), (P,)))
    strategies += [((P, R), (P,)), ((R, P), (P,))]
    return strategies


# -- reductions --------------------------------------------------------------
def _reduced_axes(ctx: OpContext) -> Tuple[int, ...]:
    rank = ctx.ins[0].rank
    axes = ctx.attrs.get("axes")
    if axes is None or axes == ():
        return tuple(range(rank))
    return tuple(sorted({int(a) % rank for a in axes}))


@rule("reduce_sum", "reduce_mean", "reduce_max")
def _reduce(ctx: OpContext) -> List[Strategy]:
    x = ctx.ins[0]
    axes = _reduced_axes(ctx)
    keep = bool(ctx.attrs.get("keepdims"))
    strategies: List[Strategy] = []
    kind = Partial("max") if ctx.op_type == "reduce_max" else P
    for d in range(x.rank):
        if d in axes:
            strategies.append(((Shard(d),), (kind,)))
        else:
            out_d = d if keep else d - sum(1 for a in axes if a < d)
            strategies.append(((Shard(d),), (Shard(out_d),)))
    strategies.append(((kind,), (kind,)))
    return strategies


@rule("mse_loss", "cross_entropy")
def _mean_loss(ctx: OpContext) -> List[Strategy]:
    """A mean over every element: sharded inputs give a partial sum of
    locally rescaled means (see the local rule)."""
    y = ctx.ins[0]
    strategies = []
    for d in range(y.rank if ctx.op_type == "mse_loss" else y.rank - 1):
        strategies.append((tuple(Shard(d) for _ in ctx.ins), (P,)))
    return strategies


@rule("mse_loss_grad", "cross_entropy_grad")
def _mean_loss_grad(ctx: OpContext) -> List[Strategy]:
    y = ctx.ins[1]
    dims = range(y.rank if ctx.op_type == "mse_loss_grad" else y.rank - 1)
    return [((R,) + tuple(Shard(d) for _ in ctx.ins[1:]), (Shard(d),)) for d in dims]


# -- layout ------------------------------------------------------------------
def reshape_groups(src: Sequence[int], dst: Sequence[int]) -> List[Tuple[List[int], List[int]]]:
    """Pair runs of source and target dims with equal products."""
    groups, i, j = [], 0, 0
    while i < len(src) or j < len(dst):
        gi, gj = [], []
        pi = pj = 1
        while True:
            if pi == pj and gi and gj:
                break
            if (pi <= pj and i < len(src)) or j >= len(dst):
                if i >= len(src):
                    break
                gi.append(i)
                pi *= src[i]
                i += 1
            else:
                gj.append(j)
                pj *= dst[j]
                j += 1
        if pi != pj:
            return []
        groups.append((gi, gj))
    return groups


@rule("reshape")
def _reshape(ctx: OpContext) -> List[Strategy]:
    """A shard of the first (major) dim of a group of merged or split dims
    stays a shard of the group's first dim. Only where the pieces line up on
    the mesh (each device's input and output piece hold the same elements,
    e.g. both dims divisible by the axis size) does the combination lower;
    :func:`.validity.reshape_error` checks that, propagation skips the
    others and the verifier rejects them."""
    x, o = ctx.ins[0], ctx.outs[0]
    strategies = []
    for gi, gj in reshape_groups(x.shape, o.shape):
        gi = [d for d in gi if x.shape[d] != 1]
        gj = [d for d in gj if o.shape[d] != 1]
        if gi and gj:
            strategies.append(((Shard(gi[0]),), (Shard(gj[0]),)))
    strategies.append(((P,), (P,)))
    return strategies


@rule("broadcast_to")
def _broadcast_to(ctx: OpContext) -> List[Strategy]:
    x, o = ctx.ins[0], ctx.outs[0]
    off = o.rank - x.rank
    strategies = [((Shard(d),), (Shard(d + off),)) for d in range(x.rank)
                  if x.shape[d] == o.shape[d + off]]
    strategies.append(((P,), (P,)))
    # a replicated input broadcast straight into a shard of a new (or
    # size-1) dim: each device makes only its piece
    strategies.append(((R,), (R,)))
    strategies += [((R,), (Shard(d),)) for d in range(o.rank)
                   if o.shape[d] > 1 and (d < off or x.shape[d - off] == 1)]
    return strategies


@rule("transpose")
def _transpose(ctx: OpContext) -> List[Strategy]:
    perm = [int(p) for p in ctx.attrs["perm"]]
    strategies = [((Shard(d),), (Shard(perm.index(d)),)) for d in range(ctx.ins[0].rank)]
    strategies.append(((P,), (P,)))
    return strategies


@rule("softmax", "log_softmax", "softmax_grad", "log_softmax_grad")
def _softmax(ctx: OpContext) -> List[Strategy]:
    rank = ctx.outs[0].rank
    ax = _norm(ctx.attrs.get("axis", -1), rank)
    strategies = [(tuple(Shard(d) for _ in ctx.ins), (Shard(d),)) for d in range(rank) if d != ax]
    if ctx.op_type.endswith("_grad"):
        strategies.append(((P, R), (P,)))
    return strategies


@rule("layernorm", "rmsnorm")
def _norm_rule(ctx: OpContext) -> List[Strategy]:
    x = ctx.ins[0]
    ax = _norm(ctx.attrs.get("axis", -1), x.rank) if ctx.op_type == "layernorm" else x.rank - 1
    params = len(ctx.ins) - 1
    return [((Shard(d),) + (R,) * params, (Shard(d),)) for d in range(ax)]


@rule("layernorm_grad", "rmsnorm_grad")
def _norm_grad(ctx: OpContext) -> List[Strategy]:
    """(dy, x, gamma) -> (dx, dgamma[, dbeta]): along a dim that is not
    normalised; the parameter gradients sum over those dims: partial."""
    x = ctx.ins[1]
    ax = _norm(ctx.attrs.get("axis", -1), x.rank) if ctx.op_type == "layernorm_grad" else x.rank - 1
    params = len(ctx.outs) - 1
    return [((Shard(d), Shard(d), R), (Shard(d),) + (P,) * params) for d in range(ax)]


@rule("fused_attention")
def _fused_attention(ctx: OpContext) -> List[Strategy]:
    """(q, k, v) -> (out, lse): any batch dim of q (batch, heads; k and v
    follow where they have that dim, else stay replicated); without the
    causal mask also q's sequence dim (each device attends its queries to
    every key). A causal query shard would need its global offset, so it
    is not offered (context parallelism is not modelled)."""
    q, k, v = ctx.ins
    maps = [([d, _broadcast_dim(q, k, d), _broadcast_dim(q, v, d)], [d, d])
            for d in range(q.rank - 2)]
    if not ctx.attrs.get("causal", True):
        maps.append(([q.rank - 2, None, None], [q.rank - 2, q.rank - 2]))
    return _shards(ctx, maps)


@rule("fused_attention_grad")
def _fused_attention_grad(ctx: OpContext) -> List[Strategy]:
    """(dout, q, k, v, out, lse[, dlse]) -> (dq, dk, dv) along the forward's
    dims; dk and dv sum over the dims k and v are broadcast along (and
    over the queries): partial sums there."""
    q, k, v = ctx.ins[1:4]
    extra = len(ctx.ins) - 6          # dlse, sharded as lse
    strategies: List[Strategy] = []
    for d in range(q.rank - 2):
        kd, vd = _broadcast_dim(q, k, d), _broadcast_dim(q, v, d)
        ins = (Shard(d), Shard(d), _s(kd), _s(vd), Shard(d), Shard(d)) + (Shard(d),) * extra
        outs = (Shard(d), P if kd is None else Shard(kd), P if vd is None else Shard(vd))
        strategies.append((ins, outs))
    if not ctx.attrs.get("causal", True):
        sq = Shard(q.rank - 2)
        strategies.append(((sq, sq, R, R, sq, sq) + (sq,) * extra, (sq, P, P)))
    return strategies


@rule("embedding_grad")
def _embedding_grad(ctx: OpContext) -> List[Strategy]:
    """(dy, ids) -> dtable: the ids' dims give partial sums of the table's
    gradient, the feature dim gives its columns."""
    dy, ids = ctx.ins
    strategies = [((Shard(d), Shard(d)), (P,)) for d in range(ids.rank)]
    strategies.append(((Shard(ids.rank), R), (Shard(1),)))
    strategies.append(((P, R), (P,)))
    # vocabulary rows: each device accumulates only the ids of its rows
    # (offset and num_embeddings set per device, see lower.py); listed after
    # the replicated strategy, so that it is taken only where the gradient
    # is wanted row-sharded, not whenever the inputs are replicated
    strategies.append(((R, R), (R,)))
    strategies.append(((R, R), (Shard(0),)))
    return strategies


@rule("select_label")
def _select_label(ctx: OpContext) -> List[Strategy]:
    logits = ctx.ins[0]
    strategies = [((Shard(d), Shard(d)), (Shard(d),)) for d in range(logits.rank - 1)]
    # vocabulary (class) shards: a device picks the labels in its range
    # and gives 0 for the others, so the pieces sum to the whole (offset
    # per device, see lower.py)
    strategies.append(((Shard(logits.rank - 1), R), (P,)))
    return strategies


@rule("select_label_grad")
def _select_label_grad(ctx: OpContext) -> List[Strategy]:
    # (dy, logits, labels) -> dlogits, linear in dy
    logits = ctx.ins[1]
    last = logits.rank - 1
    strategies = [((Shard(d),) * 3, (Shard(d),)) for d in range(last)]
    # vocabulary shards: each device scatters the labels in its range
    strategies.append(((R, Shard(last), R), (Shard(last),)))
    return strategies + [((P, R, R), (P,))]


@rule("embedding")
def _embedding(ctx: OpContext) -> List[Strategy]:
    table, ids = ctx.ins
    strategies = [((R, Shard(d)), (Shard(d),)) for d in range(ids.rank)]
    strategies.append(((Shard(1), R), (Shard(ids.rank),)))
    # vocabulary rows (Megatron's vocabulary-parallel embedding): a device
    # looks up the ids in its rows and gives zeros for the others, so the
    # pieces sum to the whole (offset per device, see lower.py)
    strategies.append(((Shard(0), R), (P,)))
    return strategies


@rule("gather")
def _gather(ctx: OpContext) -> List[Strategy]:
    data, idx = ctx.ins
    axis = _norm(ctx.attrs.get("axis", 0), data.rank)
    strategies = [((R, Shard(d)), (Shard(axis + d),)) for d in range(idx.rank)]
    for d in range(data.rank):
        if d != axis:
            out_d = d if d < axis else d + idx.rank - 1
            strategies.append(((Shard(d), R), (Shard(out_d),)))
    return strategies


@rule("concat")
def _concat(ctx: OpContext) -> List[Strategy]:
    rank = ctx.outs[0].rank
    ax = _norm(ctx.attrs["axis"], rank)
    n = len(ctx.ins)
    strategies = [((Shard(d),) * n, (Shard(d),)) for d in range(rank) if d != ax]
    strategies.append(((P,) * n, (P,)))
    return strategies


@rule("split")
def _split(ctx: OpContext) -> List[Strategy]:
    rank = ctx.ins[0].rank
    ax = _norm(ctx.attrs["axis"], rank)
    n = len(ctx.outs)
    strategies = [((Shard(d),), (Shard(d),) * n) for d in range(rank) if d != ax]
    strategies.append(((P,), (P,) * n))
    return strategies


@rule("slice", "pad", "strided_slice")
def _along_axis(ctx: OpContext) -> List[Strategy]:
    x = ctx.ins[0]
    if "axis" not in ctx.attrs:  # the ONNX slice {starts, ends, axes}
        axes = ctx.attrs.get("axes") or range(len(ctx.attrs.get("starts", ())))
        touched = {_norm(a, x.rank) for a in axes}
    else:
        touched = {_norm(ctx.attrs["axis"], x.rank)}
    strategies = [((Shard(d),), (Shard(d),)) for d in range(x.rank) if d not in touched]
    strategies.append(((P,), (P,)))
    return strategies


def strategies_for(ctx: OpContext) -> List[Strategy]:
    """The op's strategies for one mesh axis, all-replicated last."""
    fn = RULES.get(ctx.op_type)
    if fn is not None:
        found = fn(ctx)
    elif is_registered(ctx.op_type) and lookup(ctx.op_type).elementwise:
        found = elementwise_strategies(ctx)
    else:
        found = []
    replicated = ((R,) * len(ctx.ins), (R,) * len(ctx.outs))
    if replicated not in found:
        found = list(found) + [replicated]
    return found

