"""numpy kernels of the mixture-of-experts ops (:mod:`distsim.ir.ops_moe`).

:func:`routing` is the one deterministic router every op recomputes from
the router's probabilities: each token's ``top_k`` most probable experts
(ties to the lower index), then every expert's slots filled in token
order, all first choices before any second choice (GShard's priority),
a choice past the expert's ``capacity`` dropped.
"""
from __future__ import annotations

from typing import Tuple

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


def _route(attrs, probs):
    return routing(probs, int(attrs["top_k"]), int(attrs["capacity"]))


@kernel("moe_dispatch")
def _dispatch(attrs, x, probs):
    experts, slots, kept, _ = _route(attrs, probs)
    out = np.zeros((probs.shape[1], int(attrs["capacity"]), x.shape[1]), dtype=x.dtype)
    t, j = np.nonzero(kept)
    out[experts[t, j], slots[t, j]] = x[t]
    return out


@kernel("moe_dispatch_grad")
def _dispatch_grad(attrs, dy, probs):
    experts, slots, kept, _ = _route(attrs, probs)
    out = np.zeros((probs.shape[0], dy.shape[2]), dtype=dy.dtype)
    t, j = np.nonzero(kept)
    np.add.at(out, t, dy[experts[t, j], slots[t, j]])
    return out


@kernel("moe_combine")
def _combine(attrs, y, probs):
    experts, slots, kept, chosen = _route(attrs, probs)
    gates = _gates(chosen, bool(attrs.get("normalize", True)))
    out = np.zeros((probs.shape[0], y.shape[2]), dtype=y.dtype)
    t, j = np.nonzero(kept)
    np.add.at(out, t, gates[t, j, None] * y[experts[t, j], slots[t, j]])
    return out


@kernel("moe_combine_grad")
def _combine_grad(attrs, dout, y, probs):
    experts, slots, kept, chosen = _route(attrs, probs)
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
    np.put_along_axis(dprobs, experts, dchosen.astype(probs.dtype), axis=1)
    return dy, dprobs
