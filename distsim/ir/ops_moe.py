"""Shape rules of the mixture-of-experts ops (:mod:`distsim.models.moe`).

Routing is recomputed from the router's probabilities by each op (top-k
per token, then each expert's slots filled in order, first choices
first; a token past an expert's ``capacity`` is dropped there), so that
dispatch, combine and their gradients agree without passing indices:

- ``moe_dispatch(x: tokens x h, probs: tokens x E) -> E x capacity x h``:
  each routed token copied into its expert's slot (empty slots zero);
- ``moe_combine(y: E x capacity x h, probs) -> tokens x h``: each token's
  expert outputs summed weighted by its gates (the chosen probabilities,
  divided by their sum when ``normalize``);
- ``moe_dispatch_grad(dy: E x capacity x h, probs) -> tokens x h``;
- ``moe_combine_grad(dout: tokens x h, y, probs) -> (dy, dprobs)``.
"""
from __future__ import annotations

from typing import List

from .ops import _same_device
from .registry import REQUIRED, OpSpec, ShapeError, register
from .types import TensorType

_ROUTE = {"top_k": REQUIRED, "capacity": REQUIRED}


def _probs(probs: TensorType, attrs) -> int:
    """The number of experts of a ``tokens x experts`` probability matrix."""
    if probs.rank != 2:
        raise ShapeError(f"router probabilities must be tokens x experts, got {probs.shape}")
    k = int(attrs["top_k"])
    if not 1 <= k <= probs.shape[1]:
        raise ShapeError(f"top_k {k} must be in [1, {probs.shape[1]} experts]")
    if int(attrs["capacity"]) < 1:
        raise ShapeError(f"capacity must be positive, got {attrs['capacity']}")
    return probs.shape[1]


def _slots(y: TensorType, probs: TensorType, attrs) -> None:
    experts = _probs(probs, attrs)
    if y.rank != 3 or y.shape[:2] != (experts, int(attrs["capacity"])):
        raise ShapeError(f"expert slots must be {experts} x {attrs['capacity']} x hidden, "
                         f"got {y.shape}")


def _tokens(x: TensorType, probs: TensorType) -> None:
    if x.rank != 2 or x.shape[0] != probs.shape[0]:
        raise ShapeError(f"tokens must be {probs.shape[0]} x hidden, got {x.shape}")


def _dispatch(types, attrs) -> List[TensorType]:
    x, probs = types
    device = _same_device(types)
    experts = _probs(probs, attrs)
    _tokens(x, probs)
    return [TensorType((experts, int(attrs["capacity"]), x.shape[1]), x.dtype, device)]


def _combine(types, attrs) -> List[TensorType]:
    y, probs = types
    device = _same_device(types)
    _slots(y, probs, attrs)
    return [TensorType((probs.shape[0], y.shape[2]), y.dtype, device)]


def _combine_grad(types, attrs) -> List[TensorType]:
    dout, y, probs = types
    _same_device(types)
    _slots(y, probs, attrs)
    _tokens(dout, probs)
    return [y, probs]


register(OpSpec("moe_dispatch", 2, _dispatch, dict(_ROUTE),
                doc="(tokens, router probs) -> experts x capacity x hidden: each token "
                    "copied to the slots of its top_k experts"))
register(OpSpec("moe_combine", 2, _combine, {**_ROUTE, "normalize": True},
                doc="(expert outputs, router probs) -> tokens x hidden: each token's "
                    "expert outputs weighted by its gates"))
register(OpSpec("moe_dispatch_grad", 2, _combine, dict(_ROUTE),
                doc="(dslots, probs) -> dtokens: the slots' gradients summed per token"))
register(OpSpec("moe_combine_grad", 3, _combine_grad, {**_ROUTE, "normalize": True},
                doc="(dout, expert outputs, probs) -> (doutputs, dprobs)"))
