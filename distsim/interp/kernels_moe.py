"""numpy kernels of the mixture-of-experts ops (:mod:`distsim.ir.ops_moe`).

:func:`routing` is the one deterministic router every op recomputes from
the router's probabilities: each token's ``top_k`` most probable experts
(ties to the lower index), then every expert's slots filled in token
order, all first choices before any second choice (GShard's priority),
a choice past the expert's ``capacity`` dropped. Under ``groups`` each
group of tokens is routed on its own into its share of the slots.
Under ``local_experts`` only the choices of experts ``first_expert`` on
count, in their slots (the others' are another rank's).
"""
from __future__ import annotations

from typing import List, Tuple

import numpy as np

from .kernels import kernel


def routing(probs: np.ndarray, top_k: int, capacity: int
            ) -> Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(experts, slots, kept, chosen)``, each ``tokens x top_k``: the
    expert of each choice, its slot there, whether it fits the capacity,
    and the chosen probabilities."""
    tokens, count = probs.shape
    experts = np.argsort(-probs, axis=1, kind="stable")[:, :top_k]
    slots = np.zeros_like(experts)
    filled = np.zeros(count, dtype=np.int64)
    for j in range(top_k):
        onehot = np.zeros((tokens, count), dtype=np.int64)
        onehot[np.arange(tokens), experts[:, j]] = 1
        before = filled + np.cumsum(onehot, axis=0) - onehot
        slots[:, j] = before[np.arange(tokens), experts[:, j]]
        filled += onehot.sum(axis=0)
    chosen = np.take_along_axis(probs, experts, axis=1)
    return experts, slots, slots < capacity, chosen


def _gates(chosen: np.ndarray, normalize: bool) -> np.ndarray:
    return chosen / chosen.sum(axis=1, keepdims=True) if normalize else chosen


def _route(attrs, probs, groups: int):
    """:func:`routing` of ``probs``, ``kept`` only for the op's experts
    (all, or ``local_experts`` from ``first_expert``), whose indices
    ``experts`` counts from the first of them."""
    experts, slots, kept, chosen = routing(probs, int(attrs["top_k"]),
                                           int(attrs["capacity"]) // groups)
    first, count = int(attrs.get("first_expert", 0)), int(attrs.get("local_experts", 0))
    if count:
        experts = experts - first
        kept = kept & (experts >= 0) & (experts < count)
    return experts, slots, kept, chosen


def _held(attrs, probs) -> int:
    """The number of experts whose slots the op holds."""
    return int(attrs.get("local_experts", 0)) or probs.shape[-1]


def _grouped(tokens: np.ndarray, groups: int) -> List[np.ndarray]:
    """``tokens`` (``... x n x d``) as ``groups`` matrices of rows, group
    ``g`` the ``g``-th of ``groups`` pieces of dim ``n`` (see
    :mod:`distsim.ir.ops_moe`)."""
    if tokens.ndim < 2:
        return [tokens]
    pieces = np.split(tokens, groups, axis=tokens.ndim - 2)
    return [p.reshape(-1, tokens.shape[-1]) for p in pieces]


def _ungrouped(rows: List[np.ndarray], like: Tuple[int, ...]) -> np.ndarray:
    """The inverse of :func:`_grouped`: the groups' rows back in ``like``."""
    n = len(like) - 2
    piece = like[:n] + (like[n] // len(rows), like[-1])
    return np.concatenate([r.reshape(piece) for r in rows], axis=n)


def _groups(attrs) -> int:
    return int(attrs.get("groups", 1))


@kernel("moe_dispatch")
def _dispatch(attrs, x, probs):
    g = _groups(attrs)
    return np.concatenate([_dispatch_rows(attrs, g, xr, pr) for xr, pr in
                           zip(_grouped(x, g), _grouped(probs, g))], axis=1)


def _dispatch_rows(attrs, groups, x, probs):
    experts, slots, kept, _ = _route(attrs, probs, groups)
    out = np.zeros((_held(attrs, probs), int(attrs["capacity"]) // groups, x.shape[1]),
                   dtype=x.dtype)
    t, j = np.nonzero(kept)
    out[experts[t, j], slots[t, j]] = x[t]
    return out


@kernel("moe_dispatch_grad")
def _dispatch_grad(attrs, dy, probs):
    return _to_tokens(attrs, dy, probs, gated=False)


@kernel("moe_combine")
def _combine(attrs, y, probs):
    return _to_tokens(attrs, y, probs, gated=True)


def _to_tokens(attrs, y, probs, gated: bool):
    """Each token's rows of the slots ``y`` summed, weighted by its gates
    (``gated``: combine) or not (dispatch's gradient), group by group."""
    g = _groups(attrs)
    rows = [_token_rows(attrs, g, yy, pr, gated) for yy, pr in
            zip(np.split(y, g, axis=1), _grouped(probs, g))]
    return _ungrouped(rows, probs.shape[:-1] + (y.shape[2],))


def _token_rows(attrs, groups, y, probs, gated: bool):
    experts, slots, kept, chosen = _route(attrs, probs, groups)
    out = np.zeros((probs.shape[0], y.shape[2]), dtype=y.dtype)
    t, j = np.nonzero(kept)
    rows = y[experts[t, j], slots[t, j]]
    if gated:
        rows = _gates(chosen, bool(attrs.get("normalize", True)))[t, j, None] * rows
    np.add.at(out, t, rows)
    return out


@kernel("moe_combine_grad")
def _combine_grad(attrs, dout, y, probs):
    g = _groups(attrs)
    parts = [_combine_grad_rows(attrs, g, d, yy, pr) for d, yy, pr in
             zip(_grouped(dout, g), np.split(y, g, axis=1), _grouped(probs, g))]
    dy = np.concatenate([p[0] for p in parts], axis=1)
    return dy, _ungrouped([p[1] for p in parts], probs.shape)


def _combine_grad_rows(attrs, groups, dout, y, probs):
    experts, slots, kept, chosen = _route(attrs, probs, groups)
    normalize = bool(attrs.get("normalize", True))
    gates = _gates(chosen, normalize)
    t, j = np.nonzero(kept)
    dy = np.zeros_like(y)
    dy[experts[t, j], slots[t, j]] = gates[t, j, None] * dout[t]
    dgates = np.zeros_like(chosen)
    dgates[t, j] = np.sum(dout[t] * y[experts[t, j], slots[t, j]], axis=1)
    if normalize:        # g = p / S, S the sum of the chosen p
        total = chosen.sum(axis=1, keepdims=True)
        dchosen = dgates / total - np.sum(dgates * chosen, axis=1, keepdims=True) / total ** 2
    else:
        dchosen = dgates
    dprobs = np.zeros_like(probs)
    first = int(attrs.get("first_expert", 0)) if int(attrs.get("local_experts", 0)) else 0
    np.put_along_axis(dprobs, experts + first, dchosen.astype(probs.dtype), axis=1)
    return dy, dprobs
