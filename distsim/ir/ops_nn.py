"""Shape rules of the neural-network ops (transformers and their training).

Forward ops: ``transpose{perm}``, ``softmax{axis}``, ``log_softmax{axis}``,
``layernorm(x, gamma, beta){axis, eps}`` (normalises over dims ``axis..``,
as ONNX LayerNormalization; gamma/beta have shape ``x.shape[axis:]``),
``rmsnorm(x, gamma){eps}`` (last dim), ``embedding(table, ids){offset}``
(rows ``ids - offset``; ids outside ``[0, rows)`` after the offset give
zeros, which is how a vocabulary-parallel shard looks up its part),
``cross_entropy(logits, labels)`` (mean over every token), ``concat{axis}``
(variadic), ``split{axis, sizes}`` (one output per size), ``slice{axis,
start, stop}``, ``pad{axis, before, after}`` (zeros), ``dropout{p}`` (two
outputs: the result and a 1-byte keep mask), ``silu``, ``log``,
``reduce_max``, ``causal_mask{fill}`` (entries above the diagonal of the
last two dims set to ``fill``), ``select_label{offset}`` (the logit of each
token's label, 0 where the label is outside this shard), ``stop_gradient``,
``depend(x, token)`` (x, ordered after token: a scheduling edge),
``fused_attention(q, k, v){scale, causal, dropout}`` (see below).

``fused_attention(q, k, v) -> (out, lse)`` is one fused attention kernel
(FlashAttention, Dao et al. 2022; FlashAttention-2, Dao 2023):
``out = softmax(scale * q k^T + causal mask) v`` and ``lse`` the
log-sum-exp of each row of the masked, scaled scores, without the
``seq x seq`` scores or probabilities ever being a value. q is
``(..., s_q, d)``, k ``(..., s_k, d)``, v ``(..., s_k, d_v)``; the batch
dims of k and v broadcast to q's (grouped-query attention: q ``(batch,
kv_heads, group, seq, d)``, k and v ``(batch, kv_heads, 1, seq, d)``). out
is ``(..., s_q, d_v)`` in q's dtype; lse ``(..., s_q)`` in float32 (float64
when q is float64). ``scale`` defaults to ``1 / sqrt(d)``; ``causal``
(default true) hides key j from query i when ``j > i + s_k - s_q`` (as
``causal_mask``) and needs ``s_k >= s_q``; ``dropout`` (default 0) is the
attention dropout on the probabilities, folded into the kernel as
FlashAttention does: its keep mask is regenerated from the random seed in
the backward pass, so no mask is a value (the NumpyExecutor keeps
everything, as for ``dropout``). Its backward
``fused_attention_grad(dout, q, k, v, out, lse[, dlse]) -> (dq, dk, dv)``
recomputes the probabilities from q, k and lse; ``dlse``, the gradient
of lse, is given only when lse is used.

Context parallelism (:mod:`distsim.transforms.context_parallel`) gives
``causal_mask``, ``fused_attention`` and its backward two more attributes,
``q_chunks`` and ``k_chunks``: the global chunks (all of one size) that
the queries' and the keys' rows are, in order. With them the causal mask
hides key j from query i when j's global position is after i's (and
``s_k >= s_q`` is not needed); without them (None, the default) the
rows are contiguous, as above.

Gradient ops: ``softmax_grad``, ``log_softmax_grad``, ``layernorm_grad``
(3 outputs), ``rmsnorm_grad`` (2 outputs), ``embedding_grad``,
``cross_entropy_grad``, ``dropout_grad``, ``gelu_grad``, ``silu_grad``,
``select_label_grad``, ``fused_attention_grad``.

Optimizer: ``adamw(w, g, m, v){lr, beta1, beta2, eps, weight_decay, step}``
-> (w, m, v) in w's dtype (g may be in a lower precision).
"""
from __future__ import annotations

import math
from typing import List, Tuple

from .ops import _grad_like_second, _reduce, _same_device, _unary, broadcast_shapes
from .registry import REQUIRED, OpSpec, ShapeError, register
from .types import DType, TensorType


def _axis(rank: int, axis: int) -> int:
    if not -rank <= axis < rank:
        raise ShapeError(f"axis {axis} out of range for rank {rank}")
    return axis % rank


def _softmax(types, attrs) -> List[TensorType]:
    (x,) = types
    _axis(x.rank, attrs["axis"])
    return [x]


def _softmax_grad(types, attrs) -> List[TensorType]:
    dy, y = types
    _same_device(types)
    if dy.shape != y.shape:
        raise ShapeError(f"gradient shape {dy.shape} differs from output shape {y.shape}")
    _axis(y.rank, attrs["axis"])
    return [y]


def _transpose(types, attrs) -> List[TensorType]:
    (x,) = types
    perm = tuple(int(p) for p in attrs["perm"])
    if sorted(perm) != list(range(x.rank)):
        raise ShapeError(f"perm {perm} is not a permutation of the {x.rank} dims of {x.shape}")
    return [x.with_shape(tuple(x.shape[p] for p in perm))]


def _norm_axis(x: TensorType, attrs) -> int:
    return _axis(x.rank, attrs.get("axis", -1))


def _layernorm(types, attrs) -> List[TensorType]:
    x, gamma, beta = types
    _same_device(types)
    ax = _norm_axis(x, attrs)
    for name, p in (("gamma", gamma), ("beta", beta)):
        if p.shape != x.shape[ax:]:
            raise ShapeError(f"{name} shape {p.shape} differs from normalised shape {x.shape[ax:]}")
    return [x]


def _layernorm_grad(types, attrs) -> List[TensorType]:
    dy, x, gamma = types
    _same_device(types)
    if dy.shape != x.shape:
        raise ShapeError(f"gradient shape {dy.shape} differs from input shape {x.shape}")
    ax = _norm_axis(x, attrs)
    if gamma.shape != x.shape[ax:]:
        raise ShapeError(f"gamma shape {gamma.shape} differs from normalised shape {x.shape[ax:]}")
    return [x, gamma, gamma]


def _rmsnorm(types, attrs) -> List[TensorType]:
    x, gamma = types
    _same_device(types)
    if x.rank < 1 or gamma.shape != x.shape[-1:]:
        raise ShapeError(f"gamma shape {gamma.shape} differs from last dim of {x.shape}")
    return [x]


def _rmsnorm_grad(types, attrs) -> List[TensorType]:
    dy, x, gamma = types
    _same_device(types)
    if dy.shape != x.shape:
        raise ShapeError(f"gradient shape {dy.shape} differs from input shape {x.shape}")
    if gamma.shape != x.shape[-1:]:
        raise ShapeError(f"gamma shape {gamma.shape} differs from last dim of {x.shape}")
    return [x, gamma]


def _check_ids(ids: TensorType) -> None:
    if ids.dtype not in (DType.I32, DType.I64):
        raise ShapeError(f"ids must be integers, got {ids.dtype}")


def _embedding(types, attrs) -> List[TensorType]:
    table, ids = types
    _same_device(types)
    if table.rank != 2:
        raise ShapeError(f"embedding table must be rank 2, got {table.shape}")
    _check_ids(ids)
    return [TensorType(ids.shape + (table.shape[1],), table.dtype, table.device)]


def _embedding_grad(types, attrs) -> List[TensorType]:
    dy, ids = types
    _same_device(types)
    _check_ids(ids)
    if dy.shape[:-1] != ids.shape:
        raise ShapeError(f"gradient shape {dy.shape} does not match ids shape {ids.shape}")
    return [TensorType((int(attrs["num_embeddings"]), dy.shape[-1]), dy.dtype, dy.device)]


def _check_labels(logits: TensorType, labels: TensorType) -> None:
    _check_ids(labels)
    if logits.rank < 1 or logits.shape[:-1] != labels.shape:
        raise ShapeError(f"labels shape {labels.shape} does not match logits {logits.shape} "
                         "without the class dim")


def _cross_entropy(types, attrs) -> List[TensorType]:
    logits, labels = types
    _same_device(types)
    _check_labels(logits, labels)
    return [TensorType((), logits.dtype, logits.device)]


def _cross_entropy_grad(types, attrs) -> List[TensorType]:
    dl, logits, labels = types
    _same_device(types)
    if dl.shape != ():
        raise ShapeError(f"loss gradient must be a scalar, got shape {dl.shape}")
    _check_labels(logits, labels)
    return [logits]


def _select_label(types, attrs) -> List[TensorType]:
    logits, labels = types
    _same_device(types)
    _check_labels(logits, labels)
    return [TensorType(labels.shape, logits.dtype, logits.device)]


def _select_label_grad(types, attrs) -> List[TensorType]:
    dy, logits, labels = types
    _same_device(types)
    _check_labels(logits, labels)
    if dy.shape != labels.shape:
        raise ShapeError(f"gradient shape {dy.shape} differs from labels shape {labels.shape}")
    return [logits]


def _concat(types, attrs) -> List[TensorType]:
    if not types:
        raise ShapeError("concat needs at least one input")
    first = types[0]
    device = _same_device(types)
    ax = _axis(first.rank, attrs["axis"])
    for t in types[1:]:
        if t.rank != first.rank or t.dtype != first.dtype or any(
                a != b for i, (a, b) in enumerate(zip(t.shape, first.shape)) if i != ax):
            raise ShapeError(f"inputs differ outside axis {ax}: {first.shape} {first.dtype} "
                             f"vs {t.shape} {t.dtype}")
    shape = list(first.shape)
    shape[ax] = sum(t.shape[ax] for t in types)
    return [TensorType(tuple(shape), first.dtype, device)]


def _split(types, attrs) -> List[TensorType]:
    (x,) = types
    ax = _axis(x.rank, attrs["axis"])
    sizes = [int(s) for s in attrs["sizes"]]
    if not sizes or any(s < 0 for s in sizes) or sum(sizes) != x.shape[ax]:
        raise ShapeError(f"sizes {tuple(sizes)} do not add up to dim {ax} of {x.shape}")
    out = []
    for s in sizes:
        shape = list(x.shape)
        shape[ax] = s
        out.append(x.with_shape(tuple(shape)))
    return out


def _slice(types, attrs) -> List[TensorType]:
    (x,) = types
    ax = _axis(x.rank, attrs["axis"])
    start, stop = int(attrs["start"]), int(attrs["stop"])
    if not 0 <= start <= stop <= x.shape[ax]:
        raise ShapeError(f"slice [{start}:{stop}] out of range for dim {ax} of {x.shape}")
    shape = list(x.shape)
    shape[ax] = stop - start
    return [x.with_shape(tuple(shape))]


def _pad(types, attrs) -> List[TensorType]:
    (x,) = types
    ax = _axis(x.rank, attrs["axis"])
    before, after = int(attrs["before"]), int(attrs["after"])
    if before < 0 or after < 0:
        raise ShapeError(f"pad amounts must be non-negative, got {before}, {after}")
    shape = list(x.shape)
    shape[ax] += before + after
    return [x.with_shape(tuple(shape))]


def _dropout(types, attrs) -> List[TensorType]:
    (x,) = types
    p = float(attrs["p"])
    if not 0 <= p < 1:
        raise ShapeError(f"dropout probability must be in [0, 1), got {p}")
    return [x, TensorType(x.shape, DType.BOOL, x.device)]


def _dropout_grad(types, attrs) -> List[TensorType]:
    dy, mask = types
    _same_device(types)
    if dy.shape != mask.shape:
        raise ShapeError(f"gradient shape {dy.shape} differs from mask shape {mask.shape}")
    return [dy]


def causal_chunks(attrs) -> Tuple[Tuple[int, ...], Tuple[int, ...]]:
    """(q_chunks, k_chunks) of a causal attention op, () each when its rows
    are contiguous (see the module docstring)."""
    return tuple(attrs.get("q_chunks") or ()), tuple(attrs.get("k_chunks") or ())


def _check_chunks(attrs, sq: int, sk: int) -> bool:
    """Whether the op has chunk attributes; ShapeError where they do not
    fit its ``sq`` queries and ``sk`` keys."""
    qc, kc = causal_chunks(attrs)
    if not qc and not kc:
        return False
    if not qc or not kc:
        raise ShapeError("q_chunks and k_chunks are given together or not at all")
    for name, chunks, n in (("q_chunks", qc, sq), ("k_chunks", kc, sk)):
        if any(isinstance(c, bool) or not isinstance(c, int) or c < 0 for c in chunks):
            raise ShapeError(f"{name} must be non-negative integers, got {list(chunks)}")
        if n % len(chunks):
            raise ShapeError(f"{name}: {len(chunks)} chunks do not divide {n} rows")
    if sq // len(qc) != sk // len(kc):
        raise ShapeError(f"query chunks of {sq // len(qc)} rows and key chunks of "
                         f"{sk // len(kc)} differ in size")
    return True


def _causal_mask(types, attrs) -> List[TensorType]:
    (x,) = types
    if x.rank < 2:
        raise ShapeError(f"causal_mask needs rank >= 2, got {x.shape}")
    _check_chunks(attrs, x.shape[-2], x.shape[-1])
    return [x]


def _check_attention_attrs(attrs) -> None:
    scale = attrs.get("scale")
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, (int, float))
                              or not math.isfinite(scale)):
        raise ShapeError(f"scale must be a finite number, got {scale!r}")
    if not isinstance(attrs["causal"], bool):
        raise ShapeError(f"causal must be true or false, got {attrs['causal']!r}")
    p = attrs["dropout"]
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 <= p < 1:
        raise ShapeError(f"dropout probability must be in [0, 1), got {p!r}")
    kernel = attrs.get("kernel")
    if kernel is not None and (not isinstance(kernel, str) or not kernel):
        raise ShapeError(f"kernel must be a kernel's name or None, got {kernel!r}")


def attention_types(q: TensorType, k: TensorType, v: TensorType, attrs
                    ) -> List[TensorType]:
    """(out, lse) of ``fused_attention(q, k, v)`` (see the module docstring)."""
    _same_device([q, k, v])
    _check_attention_attrs(attrs)
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.rank < 2:
            raise ShapeError(f"{name} must have rank >= 2 (..., seq, head_dim), got {t.shape}")
        if not t.dtype.is_float:
            raise ShapeError(f"{name} must be floating-point, got {t.dtype}")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise ShapeError(f"dtypes differ: q {q.dtype}, k {k.dtype}, v {v.dtype}")
    if k.shape[-1] != q.shape[-1]:
        raise ShapeError(f"head dims differ: q {q.shape} and k {k.shape} (last dim)")
    if v.shape[-2] != k.shape[-2]:
        raise ShapeError(f"k {k.shape} and v {v.shape} have different key lengths (dim -2)")
    batch = q.shape[:-2]
    for name, t in (("k", k), ("v", v)):
        try:
            ok = t.rank <= q.rank and broadcast_shapes(batch, t.shape[:-2]) == batch
        except ShapeError:
            ok = False
        if not ok:
            raise ShapeError(f"{name} {t.shape} does not broadcast to q {q.shape} (the batch "
                             f"dims {t.shape[:-2]} must be q's {batch} or 1)")
    sq, sk = q.shape[-2], k.shape[-2]
    chunked = _check_chunks(attrs, sq, sk)
    if chunked and not attrs["causal"]:
        raise ShapeError("q_chunks and k_chunks place a causal mask: they need causal true")
    if attrs["causal"] and sk < sq and not chunked:
        raise ShapeError(f"causal attention needs at least as many keys ({sk}) as queries "
                         f"({sq})")
    lse_dtype = DType.F64 if q.dtype is DType.F64 else DType.F32
    return [q.with_shape(q.shape[:-1] + (v.shape[-1],)),
            TensorType(q.shape[:-1], lse_dtype, q.device)]


def _fused_attention(types, attrs) -> List[TensorType]:
    q, k, v = types
    return attention_types(q, k, v, attrs)


def _fused_attention_grad(types, attrs) -> List[TensorType]:
    if len(types) not in (6, 7):
        raise ShapeError(f"expects 6 inputs (dout, q, k, v, out, lse) or 7 (and dlse), "
                         f"got {len(types)}")
    dout, q, k, v, out, lse = types[:6]
    _same_device(types)
    want_out, want_lse = attention_types(q, k, v, attrs)
    if out.shape != want_out.shape:
        raise ShapeError(f"out shape {out.shape} is not the forward's {want_out.shape}")
    if dout.shape != out.shape:
        raise ShapeError(f"gradient shape {dout.shape} differs from out shape {out.shape}")
    for name, t in zip(("lse", "dlse"), types[5:]):
        if t.shape != want_lse.shape:
            raise ShapeError(f"{name} shape {t.shape} is not the forward's {want_lse.shape}")
    return [q, k, v]


def _depend(types, attrs) -> List[TensorType]:
    x, _token = types
    _same_device(types)
    return [x]


def _adamw(types, attrs) -> List[TensorType]:
    w, g, m, v = types
    _same_device(types)
    for name, t in (("gradient", g), ("m", m), ("v", v)):
        if t.shape != w.shape:
            raise ShapeError(f"{name} shape {t.shape} differs from weight shape {w.shape}")
    if m.dtype != w.dtype or v.dtype != w.dtype:
        raise ShapeError(f"optimizer state dtypes {m.dtype}, {v.dtype} differ from weight "
                         f"{w.dtype}")
    return [w, m, v]


register(OpSpec("transpose", 1, _transpose, {"perm": REQUIRED}))
register(OpSpec("softmax", 1, _softmax, {"axis": -1}))
register(OpSpec("log_softmax", 1, _softmax, {"axis": -1}))
register(OpSpec("softmax_grad", 2, _softmax_grad, {"axis": -1}, doc="(dy, y) -> dx"))
register(OpSpec("log_softmax_grad", 2, _softmax_grad, {"axis": -1}, doc="(dy, y) -> dx"))
register(OpSpec("layernorm", 3, _layernorm, {"axis": -1, "eps": 1e-5}))
register(OpSpec("layernorm_grad", 3, _layernorm_grad, {"axis": -1, "eps": 1e-5},
                doc="(dy, x, gamma) -> (dx, dgamma, dbeta)"))
register(OpSpec("rmsnorm", 2, _rmsnorm, {"eps": 1e-6}))
register(OpSpec("rmsnorm_grad", 3, _rmsnorm_grad, {"eps": 1e-6},
                doc="(dy, x, gamma) -> (dx, dgamma)"))
register(OpSpec("embedding", 2, _embedding, {"offset": 0},
                doc="table[ids - offset], zeros where ids - offset is out of range"))
register(OpSpec("embedding_grad", 2, _embedding_grad,
                {"num_embeddings": REQUIRED, "offset": 0}, doc="(dy, ids) -> dtable"))
register(OpSpec("cross_entropy", 2, _cross_entropy, doc="mean over tokens of -log softmax[label]"))
register(OpSpec("cross_entropy_grad", 3, _cross_entropy_grad,
                doc="(dl, logits, labels) -> dlogits"))
register(OpSpec("select_label", 2, _select_label, {"offset": 0},
                doc="logits[..., label - offset], 0 where out of range"))
register(OpSpec("select_label_grad", 3, _select_label_grad, {"offset": 0},
                doc="(dy, logits, labels) -> dlogits (one-hot scatter)"))
register(OpSpec("concat", None, _concat, {"axis": REQUIRED}))
register(OpSpec("split", 1, _split, {"axis": REQUIRED, "sizes": REQUIRED}))
register(OpSpec("slice", 1, _slice, {"axis": REQUIRED, "start": REQUIRED, "stop": REQUIRED}))
register(OpSpec("pad", 1, _pad, {"axis": REQUIRED, "before": 0, "after": 0}))
register(OpSpec("dropout", 1, _dropout, {"p": 0.1},
                doc="(y, keep mask); NumpyExecutor: deterministic, mask all ones, y = x"))
register(OpSpec("dropout_grad", 2, _dropout_grad, {"p": 0.1}, doc="(dy, mask) -> dx"))
for _name in ("silu", "log", "stop_gradient"):
    register(OpSpec(_name, 1, _unary, elementwise=True))
for _name in ("gelu_grad", "silu_grad"):
    register(OpSpec(_name, 2, _grad_like_second, elementwise=True, doc="(dy, x) -> dx"))
register(OpSpec("reduce_max", 1, _reduce, {"axes": None, "keepdims": False}))
register(OpSpec("causal_mask", 1, _causal_mask, {"fill": -1e4, "q_chunks": None,
                                                 "k_chunks": None},
                doc="x with entries j > i + (k - q) of the last two dims set to fill (with "
                    "q_chunks / k_chunks: where key j's position is after query i's)"))
register(OpSpec("depend", 2, _depend, doc="x, scheduled after token"))
register(OpSpec("fused_attention", 3, _fused_attention,
                {"scale": None, "causal": True, "dropout": 0.0, "q_chunks": None,
                 "k_chunks": None, "kernel": None},
                doc="(q, k, v) -> (out, lse): softmax(scale q k^T + causal mask) v without "
                    "the seq x seq scores (FlashAttention); scale defaults to 1/sqrt(head_dim)"))
register(OpSpec("fused_attention_grad", None, _fused_attention_grad,
                {"scale": None, "causal": True, "dropout": 0.0, "q_chunks": None,
                 "k_chunks": None, "kernel": None},
                doc="(dout, q, k, v, out, lse[, dlse]) -> (dq, dk, dv), the probabilities "
                    "recomputed from q, k and lse"))
register(OpSpec("adamw", 4, _adamw,
                {"lr": 1e-3, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "weight_decay": 0.0,
                 "step": 1}, doc="(w, g, m, v) -> (w, m, v)"))
