"""Expert parallelism in the estimator.

- The profile (:func:`with_expert_parallel`): the template is one
  expert-parallel group (with context parallelism, :func:`template_dp`
  replicas of the cp group), its all-to-alls among each MoE block's
  collectives and its experts' weights at their 1/ep shape
  (:mod:`.profile`), its optimizer figures those of the template without
  expert parallelism. Under sequence parallelism the block holds the
  tensor-parallel all-gather and reduce-scatter of the experts' slots
  too, as the lowered template does (each rank routes its sequence
  shard): nothing of its own here. A dropless dispatch
  (:mod:`distsim.models.moe`) needs nothing either: the template's
  experts' ops and all-to-alls carry their ``occupancy`` and are timed
  by it, as in the simulation.
- The gradient sync (:class:`ExpertSyncPolicy`): an expert's weights
  synchronise over their expert-data-parallel team of dp / ep ranks by a
  policy of their own, as the lowering's
  :class:`~distsim.transforms.zero.GradientSync` does (its
  ``expert_policy``); the others over the data-parallel team. Each
  parameter's team (:meth:`.context.StepContext.team`) sizes its ZeRO
  shard, its sync and its update.
- The tasks (:func:`bare_edges`): without tensor parallelism the MoE
  blocks' all-to-alls are the only collectives, so blocks without any
  lead or end tasks that hold the communication stream.
"""
from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Iterable, Optional, Sequence, Tuple, Union

from ..transforms.sync_policy import SyncPolicy, SyncSink, sync_team
from .blocks import LayerProfile, Param

if TYPE_CHECKING:
    from .context import StepContext

__all__ = ["ExpertSyncPolicy", "bare_edges", "sync_policy", "template_dp",
           "with_expert_parallel"]


def template_dp(ep: int, cp: int) -> int:
    """The template's data-parallel degree: the fewest replicas whose
    ``dp x cp`` ranks hold whole expert-parallel groups (``ep``
    consecutive ranks of that axis) and whole context-parallel groups,
    lcm(ep, cp) / cp; ``ep`` without context parallelism. Its rank 0's
    all-to-alls and cp exchanges run over the teams they run over in the
    step (the first ``ep`` and the first ``cp`` ranks of the axis, which a
    step of ``dp x cp`` ranks holds, as ep and cp divide it)."""
    return math.lcm(ep, cp) // cp


def with_expert_parallel(profile: LayerProfile, plain: LayerProfile) -> LayerProfile:
    """The profile of an expert-parallel template (``profile``: lowered
    with one expert-parallel group, dp = ep) with its optimizer figures
    as a template without data parallelism measures them: from the same
    layout's template without expert parallelism (``plain``, dp 1, its
    experts whole). In ``profile`` the data-parallel sync (deferred after
    the backward) leaves the others' gradients unpacked while the updates
    run, and its ZeRO 1 shards their update over the ep ranks. An
    expert's weights keep their own times (their team in the template is
    one rank: updated whole at their 1/ep shape); their update's memory
    is ``plain``'s scaled to that shape, as a ZeRO shard scales it
    (:func:`.memory._param_optimizer_excess`)."""
    times = ("opt_pre", "opt_update", "opt_post")
    memory = ("opt_with", "opt_after", "opt_flat")
    whole = {p.name: p for ps in plain.params.values() for p in ps}

    def measured(p: Param) -> Param:
        q = whole[p.name]
        if not p.expert:
            return replace(p, **{f: getattr(q, f) for f in times + memory})
        ratio = p.numel / q.numel
        return replace(p, opt_with=q.opt_with * ratio, opt_after=q.opt_after * ratio,
                       opt_flat=q.opt_flat * p.numel // q.numel)

    params = {blk: [measured(p) for p in ps] for blk, ps in profile.params.items()}
    return replace(profile, params=params, wall_s=profile.wall_s + plain.wall_s)


class ExpertSyncPolicy:
    """Two :class:`~distsim.transforms.sync_policy.SyncPolicy` on one sink:
    ``main`` over dp, ``experts`` over dp / ep, each gradient to its
    parameter's; the end of the step as the lowering orders it (the
    experts' buckets first, every update after). What a replayed task
    records of a policy (``pending``, ``deferred``) is the main one's: no
    task is replayed where the experts' holds gradients between calls
    (:attr:`.context.StepContext.experts_held`)."""

    def __init__(self, ctx: "StepContext", sink: Any) -> None:
        S = ctx.strategy
        self.ctx = ctx
        self.main: SyncPolicy = SyncPolicy(S, sink, sink.nbytes)
        self.experts: SyncPolicy = SyncPolicy(replace(S, dp=sync_team(S, True), ep=1), sink,
                                              sink.nbytes)
        self.pending, self.pending_bytes = self.main.pending, self.main.pending_bytes
        self.deferred = self.main.deferred

    def final(self, key: Tuple[str, Any, int], stage: int) -> None:
        policy = self.experts if self.ctx.param(key).expert else self.main
        policy.final(key, stage)

    def unit_gradient(self, unit: tuple, member: Any, stage: int, microbatch: int) -> None:
        self.main.unit_gradient(unit, member, stage, microbatch)

    def units_made_from(self, other: "ExpertSyncPolicy") -> None:
        self.main.units_made_from(other.main)

    def finish(self, stages: int, params: Sequence[Any],
               tied: Iterable[Tuple[Any, int, Any, int]] = ()) -> None:
        self.experts.finish(stages, [])
        self.main.finish(stages, params, tied)


def sync_policy(ctx: "StepContext", sink: SyncSink) -> Union[SyncPolicy, ExpertSyncPolicy]:
    """The step's sync policy: the lowering's, two of them under expert
    parallelism (:class:`ExpertSyncPolicy`)."""
    if ctx.strategy.ep > 1:
        return ExpertSyncPolicy(ctx, sink)
    return SyncPolicy(ctx.strategy, sink, sink.nbytes)  # type: ignore[attr-defined]


def bare_edges(ctx: "StepContext", kind: str, order, mb: int, rest: bool,
               pre: Optional[float], post: Optional[float]
               ) -> Tuple[Optional[float], Optional[float]]:
    """A task's compute before its first collective and after its last
    (:meth:`.timeline.Builder._pieces`) where its first or last blocks have
    no collectives of their own (``pre`` / ``post`` None: the embedding,
    the head, dense layers beside MoE layers with all-to-alls, without
    tensor parallelism): their whole times (the first less a leading
    recomputation, ``rest``) and the edge of the nearest block with
    collectives; (None, None) where no block has any."""
    blocks = ctx.part(kind)
    edges = [(blk.f_pre, blk.f_post) if kind == "F" else
             (blk.b_rest_pre if rest and k == 0 else blk.b_pre, blk.b_post)
             for k, blk in enumerate(blocks[name] for name, _ in order)]
    own = [k for k, (a, b) in enumerate(edges) if a is not None and b is not None]
    if not own:
        return None, None

    def bare(k: int) -> float:
        t = ctx.block_time(blocks[order[k][0]], kind, mb)[0]
        return t - blocks[order[k][0]].b_lead if rest and k == 0 else t

    if pre is None:
        pre = sum(bare(k) for k in range(own[0])) + edges[own[0]][0]
    if post is None:
        post = sum(bare(k) for k in range(own[-1] + 1, len(order))) + edges[own[-1]][1]
    return pre, post
