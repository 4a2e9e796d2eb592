"""Shape rules of the mixture-of-experts ops (:mod:`distsim.models.moe`).

Routing is recomputed from the router's probabilities by each op (top-k
per token, then each expert's slots filled in order, first choices
first; a token past an expert's ``capacity`` is dropped there), so that
dispatch, combine and their gradients agree without passing indices.
Tokens may have any leading dims (``mb x seq x h``: in row-major order).

- ``moe_dispatch(x: ... x h, probs: ... x E) -> E x capacity x h``:
  each routed token copied into its expert's slot (empty slots zero);
- ``moe_combine(y: E x capacity x h, probs) -> ... x h``: each token's
  expert outputs summed weighted by its gates (the chosen probabilities,
  divided by their sum when ``normalize``);
- ``moe_dispatch_grad(dy: E x capacity x h, probs) -> ... x h``;
- ``moe_combine_grad(dout: ... x h, y, probs) -> (dy, dprobs)``.

``groups`` (default 1) routes the tokens in that many groups of their
last leading dim (the sequence) on their own: group ``g`` (positions
``g x n / groups`` to ``(g + 1) x n / groups - 1`` of that dim, every
other dim whole) fills slots ``g x capacity / groups`` to ``(g + 1) x
capacity / groups - 1`` of every expert. A rank holding a group's
sequence shard routes it as Megatron-LM does under sequence parallelism
(each rank its own tokens, its own capacity): the group is a shard.

``first_expert`` and ``local_experts`` (default 0 and 0: every expert)
keep only experts ``first_expert`` to ``first_expert + local_experts - 1``
of the routing: the dispatch's slots are theirs (``local_experts x
capacity x h``), the combine reads theirs and sums only the choices of
them (a partial sum: the other experts' ranks hold the rest), as a rank
of the all-gather dispatcher does (:mod:`distsim.transforms.expert_parallel`).
"""
from __future__ import annotations

from typing import List

from .ops import _same_device
from .registry import REQUIRED, OpSpec, ShapeError, register
from .types import TensorType

_ROUTE = {"top_k": REQUIRED, "capacity": REQUIRED, "groups": 1, "first_expert": 0,
          "local_experts": 0}


def _probs(probs: TensorType, attrs) -> int:
    """The number of experts of a ``... x experts`` probability tensor."""
    if probs.rank < 2:
        raise ShapeError(f"router probabilities must be tokens x experts, got {probs.shape}")
    k = int(attrs["top_k"])
    if not 1 <= k <= probs.shape[-1]:
        raise ShapeError(f"top_k {k} must be in [1, {probs.shape[-1]} experts]")
    capacity, groups = int(attrs["capacity"]), int(attrs.get("groups", 1))
    if capacity < 1:
        raise ShapeError(f"capacity must be positive, got {attrs['capacity']}")
    if groups < 1 or capacity % groups or probs.shape[-2] % groups:
        raise ShapeError(f"groups {groups} must divide the capacity {capacity} and the "
                         f"{probs.shape[-2]} tokens of the last leading dim")
    return probs.shape[-1]


def _local(probs: TensorType, attrs) -> int:
    """The number of experts whose slots the op holds (``local_experts``,
    0: all of them), checked to lie among the router's experts."""
    experts = _probs(probs, attrs)
    first, count = int(attrs.get("first_expert", 0)), int(attrs.get("local_experts", 0))
    if count == 0 and first == 0:
        return experts
    if first < 0 or count < 1 or first + count > experts:
        raise ShapeError(f"experts {first} to {first + count - 1} (first_expert, "
                         f"local_experts) must lie among the {experts} experts")
    return count


def _slots(y: TensorType, probs: TensorType, attrs) -> None:
    experts = _local(probs, attrs)
    if y.rank != 3 or y.shape[:2] != (experts, int(attrs["capacity"])):
        raise ShapeError(f"expert slots must be {experts} x {attrs['capacity']} x hidden, "
                         f"got {y.shape}")


def _tokens(x: TensorType, probs: TensorType) -> None:
    if x.shape[:-1] != probs.shape[:-1]:
        raise ShapeError(f"tokens must be {' x '.join(map(str, probs.shape[:-1]))} x hidden, "
                         f"got {x.shape}")


def _dispatch(types, attrs) -> List[TensorType]:
    x, probs = types
    device = _same_device(types)
    experts = _local(probs, attrs)
    _tokens(x, probs)
    return [TensorType((experts, int(attrs["capacity"]), x.shape[-1]), x.dtype, device)]


def _combine(types, attrs) -> List[TensorType]:
    y, probs = types
    device = _same_device(types)
    _slots(y, probs, attrs)
    return [TensorType(tuple(probs.shape[:-1]) + (y.shape[2],), y.dtype, device)]


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
