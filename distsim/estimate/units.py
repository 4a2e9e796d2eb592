"""ZeRO-3 by layer (``zero3_unit: layer``) in the estimator's memory walk
(:func:`.memory.estimate_memory`): what LowerSPMD's units hold beyond
what the per-parameter accounting counts. The gathers, the copy-in and
the copy-out are placed in time with the rest of ZeRO-3's gathers
(:mod:`.gathered`); where a block has no such placement, its bounds:

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
  next backward; before the stage's first backward there is none.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

from ..ir.comm import CollectiveType
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


def held_units(b: StepContext, stage: int, before: Sequence[tuple], t0: float
               ) -> List[Tuple[int, float, float, bool]]:
    """ZeRO-3 by layer: the units of gradient shards a backward block of
    ``stage`` starting at ``t0`` meets, from :attr:`.context.StepContext.unit_pending`
    (``before``: as the block started; now: as it ended): each one's
    (bytes, its reduce-scatter's start, its end, whether it was pending
    when the block started: settled where the block completes its own
    unit, else the block's own, live from its reduce-scatter's start on).
    Those settled long before ``t0`` are the same at any time before it.
    None unless by layer with a reduce-scatter per micro-batch."""
    if not (b.by_layer and b.scatter_each):
        return []
    out = []
    now = b.unit_pending.get(stage, ())
    for entry in list(before) + [e for e in now if e not in before]:
        name = entry[0]
        nbytes = b.unit_bytes(name)
        rs_end = entry[-1]
        rs_start = rs_end - b.dp_time(CollectiveType.REDUCE_SCATTER, nbytes)
        out.append((nbytes // b.dp, max(rs_start, t0 - 1.0), max(rs_end, t0 - 1.0),
                    entry in before))
    return out


def pending_shard_bytes(b: StepContext, backward: Sequence[Tuple[str, Any]], k: int,
                        earlier: bool = True) -> float:
    """The bytes of the unit of gradient shards held while the block at
    position ``k`` of a backward task (``backward``: its blocks; ``k =
    len(backward)``: after the task) runs: the reduce-scatter's result of
    the last unit before it, of this task or else (``earlier``: the stage
    ran one) of the stage's previous backward (taken as one like this),
    held until the stage's next unit is settled (0: none)."""
    for name, _ in list(backward[:k])[::-1] + (list(backward)[::-1] if earlier else []):
        if b.grad_unit(name) is not None:
            return float(b.unit_bytes(name) // b.strategy.dp)
    return 0.0


def unit_curve(b: StepContext, block: str, curve: Any) -> Tuple[Any, Optional[int]]:
    """ZeRO-3 by layer with a reduce-scatter per micro-batch: a block's
    backward curve (:class:`.gathered.GatherCurve`, its gathered
    parameters taken out) with its unit's gradients held from the op that
    makes each until the op that completes the unit, and, in place of its
    per-gradient points, those of :func:`unit_backward_excess` from the
    curve's ops making final gradients (:attr:`~.gathered.GatherCurve.made`):
    while an op runs, its gradients and the unit's made before it; once it
    ends, a unit gradient stays, any other is beside its flat copy; once
    the unit is complete, its concatenated copy beside them. Where the
    unit is complete the stage's pending units of gradient shards are
    settled (their split waits for their reduce-scatters): that offset is
    one more read of the curve, whose position is returned with it (None:
    the block has no unit). Placed in time by :func:`.gathered.block_peak`
    like any other curve, the units of shards as entries
    (:func:`held_units`)."""
    hit = b.memo.unit_curves.get(block)
    if hit is not None and hit[0] is curve:
        return hit[1]
    params = b.profile.params[block]
    unit = set(b.grad_unit(block) or ())
    total = b.unit_bytes(block) if unit else 0
    points = []
    ends = []
    steps: Dict[float, float] = {}
    made_so_far = 0
    settle = None
    for indices, t0, during, t1, after in curve.made:
        made_u = sum(params[i].numel * params[i].dtype.itemsize for i in indices if i in unit)
        made_n = sum(params[i].numel * params[i].dtype.itemsize for i in indices
                     if i not in unit)
        for i in indices:
            points.append((i, t0, during + made_so_far + made_u + made_n))
            points.append((i, t1, after + made_so_far + made_u + 2 * made_n))
            ends += (False, True)
        if made_u:
            steps[t0] = steps.get(t0, 0.0) + made_u
        made_so_far += made_u
        if unit and made_so_far == total and settle is None:
            # the stage's pending units settled, then the copy-in of the
            # whole unit
            for i in indices:
                points.append((i, t1, after + made_so_far + total))
                ends.append(True)
            steps[t1] = steps.get(t1, 0.0) - made_so_far
            settle = t1
    taus, vals = list(curve.taus), list(curve.vals)
    if steps:
        # the curve plus the held gradients, a step function too
        at = sorted(set(taus) | set(steps))
        out_v = []
        i = extra = 0
        for t in at:
            while i + 1 < len(taus) and taus[i + 1] <= t:
                i += 1
            extra += steps.get(t, 0.0)
            out_v.append(vals[i] + extra)
        taus, vals = at, out_v
    reads = tuple(curve.reads) + (((settle, settle),) if settle is not None else ())
    out = (curve._replace(taus=tuple(taus), vals=tuple(vals), points=tuple(points),
                          point_ends=tuple(ends), reads=reads, arrays=[]),
           len(curve.reads) if settle is not None else None)
    b.memo.unit_curves[block] = (curve, out)
    return out


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
