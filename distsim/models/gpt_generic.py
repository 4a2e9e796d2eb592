"""The GPT family on the generic path: the one-device forward
(:func:`~distsim.models.gpt.gpt_forward` at tp 1) parallelised by the
``megatron`` plan (:func:`~distsim.transforms.parallelize.parallelize`),
beside the hand-written per-rank builder that :func:`.gpt_family.build_gpt`
uses, and that the sweep's estimator profiles (``distsim/estimate/profile.py``
builds one rank's step with ``gpt_forward(tp=...)`` and ``build_gpt_step``,
so the builder stays until the estimator profiles the generic path).

The two agree to the op wherever tensor parallelism is off: data and
pipeline parallelism, ZeRO 1-3, every schedule, recomputation, both
optimizers (``tests/plans/test_gpt_one_path.py`` compares the printed
programs and the simulated step time and memory). With ``tp > 1`` both
train the same model (the reference executor checks each against the
one-device step, and the two against each other), but their programs
differ where the sharding layer has no Megatron-specific rule yet:

- *the loss*: the builder computes Megatron's vocabulary-parallel cross
  entropy on the logits' shards (all-reduces of the row maximum, of the
  sum of exponentials and of the label's logit). The plan all-gathers the
  logits, computes the loss on a batch shard and all-reduces the scalar
  loss (its backward reduce-scatters the whole logits' gradient);
- *an untied output layer* (``tied_embeddings: false``, Llama): the
  builder splits ``lm_head`` over the vocabulary; the plan finds no pair
  and no tied table for it and leaves it whole, so every rank computes
  all the logits;
- *the learned position table with sequence parallelism*: the builder
  keeps ``wpe`` whole and adds a tp-th of it to each rank's partial sum
  before the reduce-scatter; the plan splits it along the sequence and
  adds each rank's rows after it (no all-reduce of its gradient);
- *a vocabulary that tp does not divide*: the builder pads it (Megatron's
  way, a mask keeps the padding out of the softmax); the plan refuses it.

The rest -- the fused projections split block by block (query, key and
value; SwiGLU's gate and up: the plan's ``fused_colwise``, so the split
after the product stays local and attention runs on a head shard), the
vocabulary-parallel embedding (and the output layer's own
copy of a tied table under pipeline parallelism), the column/row pairs of
the MLP and of the attention output, the replicated norms, sequence
parallelism's gathers and scatters around them -- is the same program.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Mapping, Union

from ..ir.core import Function
from ..transforms.adam import AdamHyper
from ..transforms.optimizer import SGDHyper
from ..transforms.strategy import Strategy
from .gpt import GPTConfig, gpt_forward
from .gpt_family import gpt_config, hyper_of, resolve_batch, validate


def lower_gpt_generic(c: GPTConfig, strategy: Strategy, microbatches: int,
                      hyper: Union[AdamHyper, SGDHyper], master_dtype: str) -> Function:
    """The lowered step of ``c`` (its batch sizes resolved for ``strategy``,
    ``microbatches`` per data-parallel rank) by the generic path, as
    :class:`~distsim.transforms.spmd.LowerSPMD` lowers the hand-written
    step in :func:`.gpt_family.build_gpt`."""
    from ..transforms.parallelize import parallelize, resolve_plan
    forward = gpt_forward(c, tp=1, micro_batch=c.micro_batch, untie=strategy.pp > 1)
    return parallelize(forward, strategy, microbatches, hyper, master_dtype,
                       resolve_plan(strategy.plan, forward), "gpt")


def build_gpt_generic(config: Mapping[str, Any], strategy: Strategy) -> Function:
    """The GPT step of ``config`` under ``strategy`` by the generic path:
    the same batch sizes, checks, optimizer and ``meta["model"]`` as
    :func:`.gpt_family.build_gpt`."""
    c = gpt_config(config)
    strategy = strategy if strategy.dp is not None else replace(strategy, dp=1)
    m = validate(c, strategy)
    c, _ = resolve_batch(c, strategy)
    program = lower_gpt_generic(c, strategy, m, hyper_of(c, strategy.optimizer), c.master_dtype)
    program.meta["model"] = {"name": config.get("name", "gpt"), **c.to_dict(),
                             "parameters": c.parameter_count()}
    return program
