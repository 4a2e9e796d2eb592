"""The ``gpt`` model family: GPT / Llama training steps under any strategy.

``build_gpt_step`` returns the SPMD step of one micro-batch on one
tensor-parallel rank (forward, backward, recomputation, fusion): the
one-device forward (:func:`~.gpt.gpt_forward`) placed by the ``megatron``
plan (:func:`~distsim.transforms.parallelize.template_step`);
``build_gpt`` lowers it to the local view of the whole mesh
(:class:`~distsim.transforms.spmd.LowerSPMD`); ``gpt_reference_step`` is
the single-device step on the whole global batch with the same optimizer
(``Strategy.optimizer``: AdamW or SGD, both with fp32 master weights), the
reference every strategy is checked against.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Dict, Mapping, Optional, Tuple, Union

from ..errors import ConfigError
from ..ir.core import Function
from ..transforms.adam import AdamHyper, AdamW
from ..transforms.autodiff import Autodiff
from ..transforms.context_parallel import check_context_parallel
from ..transforms.optimizer import SGD, SGDHyper
from ..transforms.pipeline import check_schedule
from ..transforms.spmd import LowerSPMD
from ..transforms.strategy import Strategy, fusion_for
from .gpt import GPTConfig, check_tensor_parallel, gpt_forward
from .moe import moe_layers
from .registry import ModelFamily, register_family


def gpt_config(config: Mapping[str, Any]) -> GPTConfig:
    fields = {k: v for k, v in config.items() if k not in ("family", "name")}
    return GPTConfig.from_dict(fields, where=str(config.get("name", "gpt")))


def resolve_batch(c: GPTConfig, strategy: Strategy) -> Tuple[GPTConfig, int]:
    """The config with the strategy's batch sizes, and the number of
    micro-batches per data-parallel rank.

    The global batch is fixed: ``--global-batch`` or the model's. The
    other two sizes follow from it: with ``microbatches`` the micro-batch
    is ``global_batch / (dp x microbatches)`` (or, when ``micro_batch`` is
    given too, the three must multiply to the global batch); without it
    the micro-batch is ``micro_batch`` (or the model's) and the count is
    ``global_batch / (dp x micro_batch)``. So two strategies always train
    the same number of sequences per step and their step times compare.
    Raises ConfigError when the sizes do not fit together."""
    dp = strategy.dp or 1
    gb = strategy.global_batch or c.global_batch
    m = strategy.microbatches
    if m is not None:
        if strategy.micro_batch is not None:
            mb = strategy.micro_batch
            if dp * m * mb != gb:
                raise ConfigError(f"--global-batch {gb} differs from dp x microbatches x "
                                  f"micro-batch = {dp} x {m} x {mb} = {dp * m * mb} (give "
                                  "two of global batch, microbatches and micro-batch)")
        else:
            if gb % (dp * m):
                raise ConfigError(f"--global-batch {gb} is not a multiple of dp x microbatches "
                                  f"= {dp} x {m} (the micro-batch is global batch / "
                                  "(dp x microbatches))")
            mb = gb // (dp * m)
    else:
        mb = strategy.micro_batch or c.micro_batch
        if gb % (dp * mb):
            raise ConfigError(f"--global-batch {gb} is not a multiple of dp x micro-batch "
                              f"= {dp} x {mb}")
        m = gb // (dp * mb)
    return replace(c, global_batch=gb, micro_batch=mb), m


def validate(c: GPTConfig, strategy: Strategy) -> int:
    if strategy.plan not in (None, "megatron"):
        raise ConfigError(f"--plan {strategy.plan}: GPT models take --plan megatron only (their "
                          "layout is Megatron's)")
    c2, m = resolve_batch(c, strategy)
    check_context_parallel(c.seq, strategy.cp)
    local = c.seq // strategy.cp
    if strategy.sp and strategy.cp > 1 and local % strategy.tp:
        raise ConfigError(f"--sp: --tp {strategy.tp} does not divide the {local} tokens of a "
                          f"sequence on each of the --cp {strategy.cp} ranks")
    check_tensor_parallel(c, strategy.tp, strategy.sp)
    heads = c.num_kv_heads // strategy.tp
    if strategy.cp_comm == "alltoall" and strategy.cp > 1 and heads % strategy.cp:
        raise ConfigError(f"--cp-comm alltoall: --cp {strategy.cp} does not divide the {heads} "
                          "key/value heads of each tensor-parallel rank (Ulysses splits them "
                          "over the cp ranks)")
    if strategy.ep > 1 and not c.experts:
        raise ConfigError(f"--ep {strategy.ep}: the model has no experts (a dense model)")
    if strategy.ep > 1 and c.experts % strategy.ep:
        raise ConfigError(f"--ep {strategy.ep} does not divide the model's {c.experts} "
                          "experts")
    chunks = strategy.pp * strategy.chunks
    if chunks > c.layers:
        what = (f"pp x virtual stages = {strategy.pp} x {strategy.chunks}"
                if strategy.chunks > 1 else f"--pp {strategy.pp}")
        raise ConfigError(f"{what} pipeline stages but the model has only {c.layers} layers")
    check_schedule(strategy.schedule, strategy.pp, m, strategy.chunks)
    return m


def build_gpt_step(c: GPTConfig, strategy: Strategy, micro_batch: int,
                   backward: Optional[Function] = None) -> Function:
    """The SPMD step of one micro-batch (see the module docstring).
    ``backward``: :func:`build_gpt_backward` of the same model, micro-batch,
    ``tp``, ``sp``, ``cp`` (and ``cp_comm``) and ``pp > 1``, where it was
    built already (it is left unchanged)."""
    # the sharding layer is imported when a step is built, not with the family
    # (reading and running a lowered program needs neither)
    from ..transforms.parallelize import finish_step
    if backward is None:
        backward = build_gpt_backward(c, strategy, micro_batch)
    return finish_step(backward, strategy)


def build_gpt_backward(c: GPTConfig, strategy: Strategy, micro_batch: int) -> Function:
    """:func:`build_gpt_step` before recomputation and fusion
    (:func:`~distsim.transforms.parallelize.differentiated_template`): the
    same for every ``recompute`` of ``strategy``, and every ``fusion`` but
    ``megatron`` (Megatron's float32 loss at tp 1)."""
    from ..transforms.megatron_plan import megatron_plan
    from ..transforms.parallelize import differentiated_template
    fwd = gpt_forward(c, micro_batch=micro_batch, untie=strategy.pp > 1, pad_for=strategy.tp,
                      cp=strategy.cp, cp_comm=strategy.cp_comm)
    return differentiated_template(fwd, strategy, megatron_plan(fwd), "gpt")


def rank_forward(c: GPTConfig, tp: int, sp: bool, micro_batch: int, untie: bool) -> Function:
    """The forward pass of one micro-batch on one tensor-parallel rank as the
    megatron plan places it (no backward): its inputs are the parameters
    that rank holds, at their local sizes."""
    from ..transforms.megatron_plan import megatron_plan
    from ..transforms.tensor_parallel import TensorParallel
    fwd = gpt_forward(c, micro_batch=micro_batch, untie=untie, pad_for=tp)
    return TensorParallel(megatron_plan(fwd), tp, sp, "gpt")(fwd)


def hyper_of(c: GPTConfig, optimizer: str = "adamw") -> Union[AdamHyper, SGDHyper]:
    """The optimizer's hyper-parameters from the config (``momentum`` is SGD's)."""
    if optimizer == "sgd":
        return SGDHyper(lr=c.lr, momentum=c.momentum, weight_decay=c.weight_decay)
    return AdamHyper(lr=c.lr, weight_decay=c.weight_decay)


def build_gpt(config: Mapping[str, Any], strategy: Strategy) -> Function:
    c = gpt_config(config)
    strategy = strategy if strategy.dp is not None else replace(strategy, dp=1)
    # the family's fusion where the strategy leaves it unset, once for every pass
    strategy = replace(strategy, fusion=fusion_for(strategy, "gpt"))
    m = validate(c, strategy)
    c, _ = resolve_batch(c, strategy)
    step = build_gpt_step(c, strategy, c.micro_batch)
    program = LowerSPMD(strategy, m, hyper_of(c, strategy.optimizer), c.master_dtype,
                        representatives=strategy.symmetry, coarsen=strategy.coarsen)(step)
    program.meta["model"] = {"name": config.get("name", "gpt"), **c.to_dict(),
                             "parameters": c.parameter_count()}
    return program


def gpt_reference_step(config: Mapping[str, Any] | GPTConfig, optimizer: str = "adamw"
                       ) -> Function:
    """Forward, backward and the optimizer (``adamw`` or ``sgd``) of the
    whole global batch on one device."""
    c = config if isinstance(config, GPTConfig) else gpt_config(config)
    fwd = gpt_forward(c, micro_batch=c.global_batch)
    step = Autodiff(fwd.meta["loss"], fwd.meta["params"])(fwd)
    if optimizer == "sgd":
        return SGD(lr=c.lr, momentum=c.momentum, weight_decay=c.weight_decay,
                   master_dtype=c.master_dtype)(step)
    return AdamW(lr=c.lr, weight_decay=c.weight_decay, master_dtype=c.master_dtype)(step)


def describe_gpt(config: Mapping[str, Any]) -> Dict[str, Any]:
    c = gpt_config(config)
    out = {"parameters": c.parameter_count(), "layers": c.layers, "hidden": c.hidden,
           "heads": c.heads, "kv_heads": c.num_kv_heads, "ffn": c.ffn_size, "vocab": c.vocab,
           "seq": c.seq, "dtype": c.dtype, "attention": c.attention}
    if c.experts:
        out.update(active_parameters=c.parameter_count(active=True), experts=c.experts,
                   top_k=c.top_k, expert_ffn=c.expert_ffn_size, moe_layers=moe_layers(c))
        if c.shared_experts:
            out["shared_experts"] = c.shared_experts
    if c.published_params:
        out["published_parameters"] = c.published_params
    if c.published_active_params:
        out["published_active_parameters"] = c.published_active_params
    if c.description:
        out["description"] = c.description
    return out


GPT_FAMILY = register_family(ModelFamily("gpt", build_gpt, GPTConfig().to_dict(), describe_gpt,
                                         check=gpt_config))


def model_flops_per_step(model: Mapping[str, Any]) -> Optional[float]:
    """Model FLOPs of one training step of a ``gpt`` family config (None for
    other families): 3 x 2 FLOPs per token per weight of the linear layers
    it uses (a MoE layer's router, ``top_k`` routed and the shared experts)
    and the attention's scores and context."""
    needed = ("layers", "hidden", "heads", "vocab", "seq", "global_batch")
    if any(k not in model for k in needed):
        return None
    h, layers, heads = model["hidden"], model["layers"], model["heads"]
    d = model.get("head_dim") or h // heads
    kv = model.get("kv_heads") or heads
    ffn = model.get("ffn") or 4 * h
    glu = 2 if model.get("activation") == "swiglu" else 1
    attention = h * (heads + 2 * kv) * d + heads * d * h
    weights = layers * (attention + h * ffn * glu + ffn * h)
    experts = model.get("experts") or 0
    if experts:
        known = set(GPTConfig.__dataclass_fields__)
        moe = GPTConfig.from_dict({k: v for k, v in model.items() if k in known})
        f = moe.expert_ffn_size
        used = h * experts + (moe.top_k + moe.shared_experts) * (h * f * glu + f * h)
        weights += moe_layers(moe) * (used - (h * ffn * glu + ffn * h))
    forward_per_token = 2.0 * (weights + model["vocab"] * h)
    forward_per_token += 2.0 * 2.0 * model["seq"] * heads * d * layers
    tokens = model["global_batch"] * model["seq"]
    return 3.0 * forward_per_token * tokens
