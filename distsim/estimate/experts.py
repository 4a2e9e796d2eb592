"""Expert parallelism in the estimator's gradient sync: an expert's weights
synchronise over their expert-data-parallel team of dp / ep ranks by a
policy of their own, as the lowering's
:class:`~distsim.transforms.zero.GradientSync` does (its
``expert_policy``); the others over the data-parallel team.

The other parts of expert parallelism come from the profile and the
context: the template is one expert-parallel group, its all-to-alls among
each MoE block's collectives and its experts' weights at their 1/ep shape
(:mod:`.profile`); each parameter's team (:meth:`.context.StepContext.team`)
sizes its ZeRO shard, its sync and its update.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Iterable, Sequence, Tuple, Union

from ..transforms.sync_policy import SyncPolicy, SyncSink
from .context import StepContext

__all__ = ["ExpertSyncPolicy", "sync_policy"]


class ExpertSyncPolicy:
    """Two :class:`~distsim.transforms.sync_policy.SyncPolicy` on one sink:
    ``main`` over dp, ``experts`` over dp / ep, each gradient to its
    parameter's; the end of the step as the lowering orders it (the
    experts' buckets first, every update after). What a replayed task
    records of a policy (``pending``, ``deferred``) is the main one's: no
    task is replayed where the experts' holds gradients between calls
    (:attr:`.context.StepContext.experts_held`)."""

    def __init__(self, ctx: StepContext, sink: Any) -> None:
        S = ctx.strategy
        self.ctx = ctx
        self.main: SyncPolicy = SyncPolicy(S, sink, sink.nbytes)
        self.experts: SyncPolicy = SyncPolicy(replace(S, dp=S.dp // S.ep, ep=1), sink,
                                              sink.nbytes)
        self.pending, self.pending_bytes = self.main.pending, self.main.pending_bytes
        self.deferred = self.main.deferred

    def final(self, key: Tuple[str, Any, int], stage: int) -> None:
        policy = self.experts if self.ctx.param(key).expert else self.main
        policy.final(key, stage)

    def unit_gradient(self, unit: tuple, member: Any, stage: int, microbatch: int) -> None:
        self.main.unit_gradient(unit, member, stage, microbatch)

    def finish(self, stages: int, params: Sequence[Any],
               tied: Iterable[Tuple[Any, int, Any, int]] = ()) -> None:
        self.experts.finish(stages, [])
        self.main.finish(stages, params, tied)


def sync_policy(ctx: StepContext, sink: SyncSink) -> Union[SyncPolicy, ExpertSyncPolicy]:
    """The step's sync policy: the lowering's, two of them under expert
    parallelism (:class:`ExpertSyncPolicy`)."""
    if ctx.strategy.ep > 1:
        return ExpertSyncPolicy(ctx, sink)
    return SyncPolicy(ctx.strategy, sink, sink.nbytes)  # type: ignore[attr-defined]
