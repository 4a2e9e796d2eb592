"""The GPT family on the generic path: the one-device forward
(:func:`~distsim.models.gpt.gpt_forward` at tp 1) parallelised by the
``megatron`` plan (:func:`~distsim.transforms.parallelize.parallelize`),
beside the hand-written per-rank builder that :func:`.gpt_family.build_gpt`
uses, and that the sweep's estimator profiles (``distsim/estimate/profile.py``
builds one rank's step with ``gpt_forward(tp=...)`` and ``build_gpt_step``).
The builder stays while the propagation is slower (about 30 times the
builder's time: ``reports/gpt-one-path/``, "Why the builder is not
deleted yet").

Without tensor parallelism the two print the same program: data and
pipeline parallelism, ZeRO 1-3, every schedule, recomputation, both
optimizers. With ``tp`` (and ``sp``) they are the same program up to the
names of values -- the same ops, shapes, attributes and collectives, so
the same step time and memory -- and train the same model (the reference
executor, float64). The plan gives Megatron's layout by structure:
fused projections split block by block (query, key and value; SwiGLU's
gate and up: ``fused_colwise``, so the split after the product stays
local and attention runs on a head shard), the vocabulary-parallel
embedding (and the output layer's own copy of a tied table under
pipeline parallelism), an untied output layer split over the vocabulary,
the vocabulary-parallel cross entropy
(:mod:`~distsim.transforms.sharding.vocab_loss`), the column/row pairs of
the MLP and of the attention output, replicated norms, and with ``sp``
the partial lookups and a tp-th of the learned position table
reduce-scattered together. A vocabulary that tp does not divide is padded
as the builder pads it (``gpt_forward(pad_for=tp)``: a multiple of tp,
a mask keeps the padding out of the softmax).

What differs (``tests/plans/test_gpt_one_path.py`` pins it): a learned
position table longer than the sequence (``positions > seq``). Without
``sp`` the plan slices the table after the embedding's all-reduce, the
builder before it (the same ops in another order: the same step time and
memory); with ``sp`` the plan all-reduces the gradient of the rows used,
the builder that of the whole table.
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
    forward = gpt_forward(c, tp=1, micro_batch=c.micro_batch, untie=strategy.pp > 1,
                          pad_for=strategy.tp)
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
