"""numpy kernels of the neural-network ops (:mod:`distsim.ir.ops_nn`).

Dropout is deterministic here: the keep mask is all ones and the output
equals the input (evaluation semantics), so that a program and its
parallel versions compute the same numbers; its cost and its 1-byte mask
are still modelled by the cost model and the simulator.

The SPMD collectives (:mod:`distsim.ir.ops_spmd`) run here only for a group
of one rank (where they are identities); lower the program to the local view
to run a larger group.
"""
from __future__ import annotations

import math

import numpy as np

from ..errors import ExecutionError
from .kernels import kernel


def _norm_axes(x, axis):
    axis = axis % x.ndim
    return tuple(range(axis, x.ndim))


@kernel("transpose")
def _transpose(attrs, x):
    return np.ascontiguousarray(np.transpose(x, tuple(attrs["perm"])))


@kernel("softmax")
def _softmax(attrs, x):
    ax = attrs.get("axis", -1)
    e = np.exp(x - np.max(x, axis=ax, keepdims=True))
    return (e / np.sum(e, axis=ax, keepdims=True)).astype(x.dtype)


@kernel("log_softmax")
def _log_softmax(attrs, x):
    ax = attrs.get("axis", -1)
    s = x - np.max(x, axis=ax, keepdims=True)
    return (s - np.log(np.sum(np.exp(s), axis=ax, keepdims=True))).astype(x.dtype)


@kernel("softmax_grad")
def _softmax_grad(attrs, dy, y):
    ax = attrs.get("axis", -1)
    return (y * (dy - np.sum(dy * y, axis=ax, keepdims=True))).astype(y.dtype)


@kernel("log_softmax_grad")
def _log_softmax_grad(attrs, dy, y):
    ax = attrs.get("axis", -1)
    return (dy - np.exp(y) * np.sum(dy, axis=ax, keepdims=True)).astype(y.dtype)


def _ln_stats(x, axes, eps):
    mean = np.mean(x, axis=axes, keepdims=True)
    var = np.mean((x - mean) ** 2, axis=axes, keepdims=True)
    return mean, 1.0 / np.sqrt(var + eps)


@kernel("layernorm")
def _layernorm(attrs, x, gamma, beta):
    axes = _norm_axes(x, attrs.get("axis", -1))
    mean, rstd = _ln_stats(x, axes, attrs.get("eps", 1e-5))
    return ((x - mean) * rstd * gamma + beta).astype(x.dtype)


@kernel("layernorm_grad")
def _layernorm_grad(attrs, dy, x, gamma):
    axes = _norm_axes(x, attrs.get("axis", -1))
    lead = tuple(range(x.ndim - len(axes)))
    mean, rstd = _ln_stats(x, axes, attrs.get("eps", 1e-5))
    xhat = (x - mean) * rstd
    dgamma = np.sum(dy * xhat, axis=lead)
    dbeta = np.sum(dy, axis=lead)
    dxhat = dy * gamma
    n = int(np.prod([x.shape[a] for a in axes]))
    dx = rstd / n * (n * dxhat - np.sum(dxhat, axis=axes, keepdims=True)
                     - xhat * np.sum(dxhat * xhat, axis=axes, keepdims=True))
    return dx.astype(x.dtype), dgamma.astype(gamma.dtype), dbeta.astype(gamma.dtype)


@kernel("rmsnorm")
def _rmsnorm(attrs, x, gamma):
    rstd = 1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + attrs.get("eps", 1e-6))
    return (x * rstd * gamma).astype(x.dtype)


@kernel("rmsnorm_grad")
def _rmsnorm_grad(attrs, dy, x, gamma):
    n = x.shape[-1]
    rstd = 1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + attrs.get("eps", 1e-6))
    xhat = x * rstd
    dgamma = np.sum(dy * xhat, axis=tuple(range(x.ndim - 1)))
    dxhat = dy * gamma
    dx = rstd * (dxhat - xhat * np.sum(dxhat * xhat, axis=-1, keepdims=True) / n)
    return dx.astype(x.dtype), dgamma.astype(gamma.dtype)


def _local_ids(ids, offset, rows):
    local = ids.astype(np.int64) - int(offset)
    inside = (local >= 0) & (local < rows)
    return np.where(inside, local, 0), inside


@kernel("embedding")
def _embedding(attrs, table, ids):
    local, inside = _local_ids(ids, attrs.get("offset", 0), table.shape[0])
    return (table[local] * inside[..., None]).astype(table.dtype)


@kernel("embedding_grad")
def _embedding_grad(attrs, dy, ids):
    rows = int(attrs["num_embeddings"])
    local, inside = _local_ids(ids, attrs.get("offset", 0), rows)
    out = np.zeros((rows, dy.shape[-1]), dtype=dy.dtype)
    np.add.at(out, local[inside], dy[inside])
    return out


def _check_labels(labels, classes):
    if labels.size and (labels.min() < 0 or labels.max() >= classes):
        raise ExecutionError(f"labels must be in [0, {classes}), got values in "
                             f"[{labels.min()}, {labels.max()}]")


@kernel("cross_entropy")
def _cross_entropy(attrs, logits, labels):
    _check_labels(labels, logits.shape[-1])
    s = logits - np.max(logits, axis=-1, keepdims=True)
    logp = s - np.log(np.sum(np.exp(s), axis=-1, keepdims=True))
    picked = np.take_along_axis(logp, labels[..., None].astype(np.int64), axis=-1)
    return np.asarray(-np.mean(picked), dtype=logits.dtype)


@kernel("cross_entropy_grad")
def _cross_entropy_grad(attrs, dl, logits, labels):
    s = logits - np.max(logits, axis=-1, keepdims=True)
    p = np.exp(s) / np.sum(np.exp(s), axis=-1, keepdims=True)
    onehot = np.zeros_like(p)
    np.put_along_axis(onehot, labels[..., None].astype(np.int64), 1.0, axis=-1)
    return (dl * (p - onehot) / labels.size).astype(logits.dtype)


@kernel("select_label")
def _select_label(attrs, logits, labels):
    local, inside = _local_ids(labels, attrs.get("offset", 0), logits.shape[-1])
    picked = np.take_along_axis(logits, local[..., None], axis=-1)[..., 0]
    return (picked * inside).astype(logits.dtype)


@kernel("select_label_grad")
def _select_label_grad(attrs, dy, logits, labels):
    local, inside = _local_ids(labels, attrs.get("offset", 0), logits.shape[-1])
    out = np.zeros_like(logits)
    np.put_along_axis(out, local[..., None], (dy * inside)[..., None], axis=-1)
    return out


@kernel("concat")
def _concat(attrs, *xs):
    return np.concatenate(xs, axis=int(attrs["axis"]))


@kernel("split")
def _split(attrs, x):
    bounds = np.cumsum([int(s) for s in attrs["sizes"]])[:-1]
    return tuple(np.ascontiguousarray(p) for p in np.split(x, bounds, axis=int(attrs["axis"])))


@kernel("chunk_cat")
def _chunk_cat(attrs, *xs):
    rows = int(attrs["rows"])
    return np.concatenate([x.reshape(rows, -1) for x in xs], axis=1).reshape(-1)


@kernel("chunk_split")
def _chunk_split(attrs, x):
    rows = int(attrs["rows"])
    shapes = [tuple(int(d) for d in shape) for shape in attrs["shapes"]]
    widths = [int(np.prod(shape, dtype=np.int64)) // rows for shape in shapes]
    blocks = np.split(x.reshape(rows, -1), np.cumsum(widths)[:-1], axis=1)
    return tuple(np.ascontiguousarray(b).reshape(shape) for b, shape in zip(blocks, shapes))


@kernel("slice")
def _slice(attrs, x):
    index = [slice(None)] * x.ndim
    index[int(attrs["axis"])] = slice(int(attrs["start"]), int(attrs["stop"]))
    return np.ascontiguousarray(x[tuple(index)])


@kernel("pad")
def _pad(attrs, x):
    widths = [(0, 0)] * x.ndim
    widths[int(attrs["axis"]) % x.ndim] = (int(attrs.get("before", 0)), int(attrs.get("after", 0)))
    return np.pad(x, widths)


@kernel("dropout")
def _dropout(attrs, x):
    # Deterministic: keep everything (see the module docstring).
    return x.copy(), np.ones(x.shape, dtype=bool)


@kernel("dropout_grad")
def _dropout_grad(attrs, dy, mask):
    return (dy * mask).astype(dy.dtype)


@kernel("silu")
def _silu(attrs, x):
    return (x / (1.0 + np.exp(-x))).astype(x.dtype)


@kernel("silu_grad")
def _silu_grad(attrs, dy, x):
    s = 1.0 / (1.0 + np.exp(-x))
    return (dy * s * (1.0 + x * (1.0 - s))).astype(x.dtype)


@kernel("gelu_grad")
def _gelu_grad(attrs, dy, x):
    c = math.sqrt(2.0 / math.pi)
    u = c * (x + 0.044715 * x ** 3)
    t = np.tanh(u)
    du = c * (1.0 + 3 * 0.044715 * x ** 2)
    return (dy * (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * du)).astype(x.dtype)


@kernel("log")
def _log(attrs, x):
    return np.log(x)


@kernel("stop_gradient")
def _stop_gradient(attrs, x):
    return x.copy()


@kernel("reduce_max")
def _reduce_max(attrs, x):
    axes = attrs.get("axes")
    axes = None if axes is None or axes == () else tuple(axes)
    return np.asarray(np.max(x, axis=axes, keepdims=attrs.get("keepdims", False)), dtype=x.dtype)


@kernel("causal_mask")
def _causal_mask(attrs, x):
    q, k = x.shape[-2], x.shape[-1]
    upper = np.triu(np.ones((q, k), dtype=bool), k=k - q + 1)
    return np.where(upper, np.asarray(attrs.get("fill", -1e4), dtype=x.dtype), x).astype(x.dtype)


def _attention_scale(attrs, q) -> float:
    scale = attrs.get("scale")
    return 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)


def _attention_scores(attrs, q, k):
    """scale * q k^T in float64, -inf where the causal mask hides a key."""
    s = _attention_scale(attrs, q) * np.matmul(q.astype(np.float64),
                                               np.swapaxes(k.astype(np.float64), -1, -2))
    if attrs.get("causal", True):
        sq, sk = s.shape[-2], s.shape[-1]
        s = np.where(np.triu(np.ones((sq, sk), dtype=bool), k=sk - sq + 1), -np.inf, s)
    return s


def _unbroadcast(x, shape):
    """``x`` summed down to ``shape`` (undoing the broadcast of k and v's
    batch dims over q's)."""
    lead = x.ndim - len(shape)
    if lead:
        x = x.sum(axis=tuple(range(lead)))
    axes = tuple(i for i, (a, b) in enumerate(zip(x.shape, shape)) if b == 1 and a != 1)
    return x.sum(axis=axes, keepdims=True) if axes else x


def _lse_dtype(q):
    return np.float64 if q.dtype == np.float64 else np.float32


@kernel("fused_attention")
def _fused_attention(attrs, q, k, v):
    # Exact attention in float64; dropout keeps everything (module docstring).
    s = _attention_scores(attrs, q, k)
    m = np.max(s, axis=-1, keepdims=True)
    lse = m + np.log(np.sum(np.exp(s - m), axis=-1, keepdims=True))
    out = np.matmul(np.exp(s - lse), v.astype(np.float64))
    return out.astype(q.dtype), lse[..., 0].astype(_lse_dtype(q))


@kernel("fused_attention_grad")
def _fused_attention_grad(attrs, dout, q, k, v, out, lse, dlse=None):
    """The FlashAttention backward: P = exp(S - lse) recomputed from q, k and
    the saved lse; dV = P^T dO, dP = dO V^T, dS = P (dP - D) with D the row
    sums of dO * O (minus dlse when lse has a gradient), dQ = scale dS K,
    dK = scale dS^T Q."""
    scale = _attention_scale(attrs, q)
    p = np.exp(_attention_scores(attrs, q, k) - lse.astype(np.float64)[..., None])
    do = dout.astype(np.float64)
    vf = v.astype(np.float64)
    dv = np.matmul(np.swapaxes(p, -1, -2), do)
    dp = np.matmul(do, np.swapaxes(vf, -1, -2))
    row = np.sum(do * out.astype(np.float64), axis=-1, keepdims=True)
    if dlse is not None:
        row = row - dlse.astype(np.float64)[..., None]
    ds = p * (dp - row)
    dq = scale * np.matmul(ds, k.astype(np.float64))
    dk = scale * np.matmul(np.swapaxes(ds, -1, -2), q.astype(np.float64))
    return (dq.astype(q.dtype), _unbroadcast(dk, k.shape).astype(k.dtype),
            _unbroadcast(dv, v.shape).astype(v.dtype))


@kernel("depend")
def _depend(attrs, x, token):
    return x.copy()


@kernel("adamw")
def _adamw(attrs, w, g, m, v):
    b1, b2, step = attrs["beta1"], attrs["beta2"], int(attrs["step"])
    g = g.astype(w.dtype)
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    mhat = m / (1 - b1 ** step)
    vhat = v / (1 - b2 ** step)
    w = w - attrs["lr"] * (mhat / (np.sqrt(vhat) + attrs["eps"]) + attrs["weight_decay"] * w)
    return w.astype(w.dtype), m.astype(w.dtype), v.astype(w.dtype)


def _single_rank(attrs, x):
    if attrs["size"] != 1:
        raise ExecutionError(f"an SPMD collective over {attrs['size']} ranks runs only after "
                             "lowering to the local view")
    return x.copy()


for _name in ("spmd.allreduce", "spmd.copy", "spmd.allgather", "spmd.reducescatter",
              "spmd.alltoall"):
    kernel(_name)(_single_rank)
