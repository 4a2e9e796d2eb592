"""Mixture-of-experts fields of the ``gpt`` family: which layers route
their tokens to experts, how many parameters that adds, and how many
tokens each expert is given room for.

A *MoE layer* replaces the dense MLP by a router (a linear layer to one
logit per expert, a softmax), ``experts`` expert MLPs of ``expert_ffn``
(default ``ffn``) each, of which every token uses its ``top_k`` most
probable, their outputs summed weighted by the router's probabilities
(renormalised over the chosen ``top_k`` when ``norm_topk``, Mixtral's
gating; as they are otherwise, DeepSeekMoE's), plus ``shared_experts``
MLPs of ``expert_ffn`` every token passes through (DeepSeekMoE's shared
experts, one MLP of ``shared_experts x expert_ffn``). The first
``dense_layers`` layers stay dense (DeepSeek's ``first_k_dense_replace``);
past them, layer ``i`` is MoE when ``i % moe_every == 0`` (1: every layer;
2: every other, as GShard interleaves them; DeepSeek's ``moe_layer_freq``).

Shapes are static, so each expert has a fixed number of token *slots* per
micro-batch (:func:`expert_slots`): the busiest expert's tokens under the
routing balance -- ``tokens x top_k / experts`` when uniform; with
``routing_skew`` s in [0, 1] the busiest expert gets ``mean + s x (tokens
- mean)`` (1: every token picks it); with ``expert_loads`` (one relative
load per expert, a histogram) its share of ``tokens x top_k``, at most
every token -- capped at ``capacity_factor x tokens x top_k / experts``
when a capacity factor is given (GShard's capacity; tokens past it are
dropped). The experts' FFNs run as one batched GEMM over ``experts x
slots`` rows, so an imbalanced routing costs the time of the busiest
expert for every expert, as a padded dispatch does.

``dispatch`` says which: ``padded`` (the default, above) or ``dropless``
(Megatron-core's default MoE: its ``alltoall`` token dispatcher with no
capacity factor and a grouped GEMM; ``capacity_factor`` is refused with
it). Dropless, each expert computes exactly its own tokens and the
all-to-all moves each rank's real counts, so the step is set by the
busiest expert-parallel rank. Per rank of ``tokens`` (:func:`expert_tokens`),
expert ``e`` receives ``n_e = min(tokens, tokens x top_k x load_e / sum
loads)`` tokens (uniform: ``tokens x top_k / experts`` each; with
``routing_skew``, expert 0 the busiest one above and the others the rest
evenly); rank ``r`` of ``ep`` holds experts ``r x experts / ep`` on, so the
busiest rank's experts get ``R = max_r sum n_e`` tokens from each of the
``ep`` ranks: a grouped GEMM of ``ep x R`` rows (``2 x ep x R x hidden x
ffn`` FLOPs per linear layer), ``R x hidden`` elements received from each
rank by the all-to-all. Shapes stay static: each expert has ``tokens``
slots (room for every token, so none is dropped and the numbers are the
one-device step's), and the ops between the dispatch and the combine --
the experts' FFNs, the all-to-alls, the slots' tensor-parallel gathers --
carry ``meta["occupancy"] = R / (experts / ep x tokens)``
(:mod:`distsim.transforms.expert_parallel`), the share of
their rows that hold tokens: they cost that share of their padded
arithmetic, traffic and message bytes (:mod:`distsim.cost.model`,
:func:`distsim.sim.simulator.collective_bytes`); the dispatch and combine
move ``sum n_e / (experts x tokens)`` of their slots. Every rank is costed as the busiest (the
all-to-all makes the others wait for it). The trace shows the padded
shapes; memory counts the share of the slots' rows that hold tokens
(:func:`distsim.ir.occupancy.held_bytes`), as buffers sized to the real
token counts hold.

``allgather`` is Megatron-core's all-gather token dispatcher: padded slots
as ``padded`` has, but under expert parallelism each rank all-gathers its
group's tokens and probabilities, routes every rank's tokens at its own
capacity into its local experts' slots, and reduce-scatters their partial
outputs back (:mod:`distsim.transforms.expert_parallel`); at ``ep`` 1 it is
the padded dispatch.
"""
from __future__ import annotations

import math
from typing import Any, Optional, Sequence

from ..errors import ConfigError

#: the MoE fields and their values in a dense model
DENSE_DEFAULTS = {"top_k": 1, "expert_ffn": None, "shared_experts": 0, "dense_layers": 0,
                  "moe_every": 1, "capacity_factor": None, "routing_skew": 0.0,
                  "expert_loads": None, "norm_topk": True, "dispatch": "padded"}

#: the ways tokens reach their experts (module docstring)
DISPATCHES = ("padded", "dropless", "allgather")


def check_moe(c: Any) -> None:
    """The MoE fields of GPTConfig ``c``, each checked by type and range
    (a ConfigError naming the field)."""
    if isinstance(c.experts, bool) or not isinstance(c.experts, int) or c.experts < 0:
        raise ConfigError(f"experts: must be an integer >= 0 (0: a dense model), "
                          f"got {c.experts!r}")
    if c.experts == 0:
        given = [k for k, v in DENSE_DEFAULTS.items() if getattr(c, k) != v]
        if given:
            raise ConfigError(f"{given[0]}: a mixture-of-experts field, but experts is 0 "
                              "(give experts)")
        return
    _integer("top_k", c.top_k, 1)
    if c.top_k > c.experts:
        raise ConfigError(f"top_k: {c.top_k} is larger than the {c.experts} experts")
    if c.expert_ffn is not None:
        _integer("expert_ffn", c.expert_ffn, 1)
    _integer("shared_experts", c.shared_experts, 0)
    _integer("dense_layers", c.dense_layers, 0)
    _integer("moe_every", c.moe_every, 1)
    if not any(is_moe_layer(c, i) for i in range(c.layers)):
        raise ConfigError(f"dense_layers: {c.dense_layers} (moe_every {c.moe_every}) leaves no "
                          f"MoE layer among the {c.layers} layers")
    if c.dispatch not in DISPATCHES:
        raise ConfigError(f"dispatch: must be one of {', '.join(DISPATCHES)}, "
                          f"got {c.dispatch!r}")
    if c.dispatch == "dropless" and c.capacity_factor is not None:
        raise ConfigError("capacity_factor: a dropless dispatch drops no token (give "
                          "capacity_factor only with dispatch padded)")
    if c.capacity_factor is not None:
        _real("capacity_factor", c.capacity_factor)
        if c.capacity_factor <= 0:
            raise ConfigError(f"capacity_factor: must be a positive number, "
                              f"got {c.capacity_factor!r}")
    _real("routing_skew", c.routing_skew)
    if not 0 <= c.routing_skew <= 1:
        raise ConfigError(f"routing_skew: must be in [0, 1] (0: uniform, 1: every token "
                          f"routed to one expert), got {c.routing_skew!r}")
    if c.expert_loads is not None:
        loads = c.expert_loads
        if not isinstance(loads, (list, tuple)) or len(loads) != c.experts:
            raise ConfigError(f"expert_loads: must be a list of {c.experts} relative loads "
                              f"(one per expert), got {loads!r}")
        for x in loads:
            _real("expert_loads", x)
            if x < 0:
                raise ConfigError(f"expert_loads: loads must be >= 0, got {x!r}")
        if sum(loads) <= 0:
            raise ConfigError("expert_loads: at least one load must be positive")
        if c.routing_skew:
            raise ConfigError("routing_skew: give routing_skew or expert_loads, not both")
    if not isinstance(c.norm_topk, bool):
        raise ConfigError(f"norm_topk: must be true or false, got {c.norm_topk!r}")


def _integer(name: str, value: Any, least: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ConfigError(f"{name}: must be an integer >= {least}, got {value!r}")


def _real(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"{name}: must be a number, got {value!r}")


def is_moe_layer(c: Any, i: int) -> bool:
    """Whether layer ``i`` routes its tokens to experts."""
    return c.experts > 0 and i >= c.dense_layers and i % c.moe_every == 0


def moe_layers(c: Any) -> int:
    return sum(is_moe_layer(c, i) for i in range(c.layers))


def mlp_params(hidden: int, ffn: int, gated: bool, bias: bool) -> int:
    """Parameters of one MLP (two linear layers, the first doubled when gated)."""
    width = 2 * ffn if gated else ffn
    return hidden * width + ffn * hidden + ((width + hidden) if bias else 0)


def moe_mlp_params(c: Any, experts: int) -> int:
    """Parameters of one MoE layer's MLP part with ``experts`` routed
    experts counted: router, those experts and the shared experts."""
    gated, f = c.activation == "swiglu", c.expert_ffn_size
    shared = mlp_params(c.hidden, c.shared_experts * f, gated, c.bias) if c.shared_experts else 0
    return c.hidden * c.experts + experts * mlp_params(c.hidden, f, gated, c.bias) + shared


def busiest_tokens(c: Any, tokens: int) -> float:
    """Tokens routed to the busiest expert of a micro-batch of ``tokens``
    under the routing balance (see the module docstring)."""
    mean = tokens * c.top_k / c.experts
    if c.expert_loads is not None:
        return min(float(tokens), tokens * c.top_k * max(c.expert_loads) / sum(c.expert_loads))
    return mean + c.routing_skew * (tokens - mean)


def expert_slots(c: Any, tokens: int) -> int:
    """Token slots of each expert in a micro-batch of ``tokens``: the
    busiest expert's tokens, capped by the capacity factor; dropless,
    every token (none is dropped)."""
    if c.dispatch == "dropless":
        return tokens
    slots = math.ceil(round(busiest_tokens(c, tokens), 6))
    if c.capacity_factor is not None:
        slots = min(slots, math.ceil(round(c.capacity_factor * tokens * c.top_k / c.experts, 6)))
    return max(1, slots)


def expert_tokens(c: Any, tokens: int) -> tuple:
    """Tokens each expert receives from a micro-batch of ``tokens`` under
    the routing balance (a dropless dispatch's counts: module docstring)."""
    total = tokens * c.top_k
    if c.expert_loads is not None:
        s = sum(c.expert_loads)
        return tuple(min(float(tokens), total * x / s) for x in c.expert_loads)
    if c.experts == 1:
        return (float(total),)
    busiest = busiest_tokens(c, tokens)
    return (busiest,) + ((total - busiest) / (c.experts - 1),) * (c.experts - 1)


def loads_tuple(loads: Optional[Sequence[float]]) -> Optional[tuple]:
    """``expert_loads`` as a tuple (a frozen config holds no list)."""
    return tuple(loads) if isinstance(loads, list) else loads
