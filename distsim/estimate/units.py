"""ZeRO-3 by layer (``zero3_unit: layer``) in the estimator's memory walk
(:func:`.memory.estimate_memory`): what LowerSPMD's units hold beyond
what the per-parameter accounting counts.

- The copy-out: at a block's first read of its unit, the gathered buffer
  and the parameters split out of it are both live (per parameter, one
  gathered value and its reshape at a time).
- The gradients: a block's unit gradients are held until the block's
  backward has made them all, then concatenated into one copy for the
  reduce-scatter (per parameter, each is flattened into its copy right
  after it is made); the reduce-scatter's result (the unit's shards)
  lives until the stage's next unit is settled
  (``GradientSync._settle_units``), through the next block's backward,
  or, for a task's last unit, through the forwards until the stage's
  next backward.
"""
from __future__ import annotations

from typing import Any, Dict, Optional, Sequence, Tuple

from .context import StepContext
from .gates import gather_plan



def copy_out_excess(b: StepContext, kind: str, block: str) -> Optional[float]:
    """Bytes above the block's baseline (as its ``f_excess`` /
    ``b0_excess``) while its unit is split out of the gathered buffer:
    what the template holds at its reshape of the unit's first parameter
    (its ZeRO-3 gates hold each parameter gathered, as the gathered
    buffer does), less that reshape, plus the split parameters (the whole
    unit). None: no unit (or no such read in the template)."""
    if not b.by_layer:
        return None
    plan = gather_plan(b, kind, block)
    if plan.first is None:
        return None
    blk = b.profile.blocks[block]
    owner, i = (blk.f_gather if kind == "F" else blk.b_gather)[plan.first]
    p = b.profile.params[owner][i]
    at = (blk.f_reads if kind == "F" else blk.b_reads).get(p.name)
    if at is None:
        return None
    return at - p.numel * p.dtype.itemsize + float(plan.unit_bytes)


def pending_shard_bytes(b: StepContext, backward: Sequence[Tuple[str, Any]], k: int) -> float:
    """The bytes of the unit of gradient shards held while the block at
    position ``k`` of a backward task (``backward``: its blocks; ``k =
    len(backward)``: after the task) runs: the reduce-scatter's result of
    the last unit before it, of this task or else of the stage's previous
    backward (taken as one like this), held until the stage's next unit
    is settled (0: none)."""
    for name, _ in list(backward[:k])[::-1] + list(backward)[::-1]:
        if b.grad_unit(name) is not None:
            return float(b.unit_bytes(name) // b.strategy.dp)
    return 0.0


def unit_backward_excess(b: StepContext, block: str) -> Tuple[float, Dict[int, float]]:
    """A block's backward with its unit's gradients held to the end: the
    most bytes above the baseline (and the template's ``b0_excess``), and
    per parameter the bytes at the op that makes its gradient (as
    :attr:`.profile.Block.bs_grads` per parameter). From the
    template's ops that make final gradients
    (:attr:`~.profile.Block.bs_made`): while an op runs, its
    gradients and the unit's made before it are live; once it ends, a
    unit gradient stays, any other is beside its flat copy; the op that
    completes the unit is followed by the concatenated copy of all of
    them."""
    hit = b.memo.unit_excess.get(block)
    if hit is not None:
        return hit
    blk = b.profile.blocks[block]
    params = b.profile.params[block]
    unit = set(b.grad_unit(block) or ())
    total = b.unit_bytes(block) if unit else 0
    best = blk.b0_excess
    per: Dict[int, float] = {}
    held = 0
    for indices, during, after, _ in blk.bs_made:
        made_u = sum(params[i].numel * params[i].dtype.itemsize for i in indices if i in unit)
        made_n = sum(params[i].numel * params[i].dtype.itemsize for i in indices
                     if i not in unit)
        value = max(during + held + made_u + made_n, after + held + made_u + 2 * made_n)
        held += made_u
        if unit and held == total:
            value = max(value, after + held + total)     # the copy-in of the whole unit
        for i in indices:
            per[i] = value
        best = max(best, value)
    hit = b.memo.unit_excess[block] = (best, per)
    return hit
