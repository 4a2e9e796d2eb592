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
    ``b0_excess``) while a unit is split out of its gathered buffer (the
    most over the block's units): what the template holds at its reshape
    of the unit's first parameter (its ZeRO-3 gates hold each parameter
    gathered, as the gathered buffer does), less that reshape, plus the
    split parameters (the whole unit). None: no unit (or no such read in
    the template)."""
    if not b.by_layer:
        return None
    plan = gather_plan(b, kind, block)
    blk = b.profile.blocks[block]
    gathered = blk.f_gather if kind == "F" else blk.b_gather
    reads = blk.f_reads if kind == "F" else blk.b_reads
    most = None
    for unit in plan.units:       # (each unit split at its own first read)
        ps = [b.profile.params[owner][i] for owner, i in (gathered[j] for j in unit)]
        at = reads.get(ps[0].name)
        if at is not None:
            got = at - ps[0].numel * ps[0].dtype.itemsize + float(
                sum(p.numel * p.dtype.itemsize for p in ps))
            most = got if most is None else max(most, got)
    return most


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
        name, unit = entry[0], entry[2]
        nbytes = b.unit_bytes(name, unit)
        rs_end = entry[-1]
        rs_start = rs_end - b.dp_time(CollectiveType.REDUCE_SCATTER, nbytes,
                                      b.profile.params[name][unit[0]].expert)
        out.append((nbytes // b.unit_team(name, unit), max(rs_start, t0 - 1.0),
                    max(rs_end, t0 - 1.0), entry in before))
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
        units = b.grad_units(name)
        if units:       # the block's unit completed last
            return float(b.unit_bytes(name, units[-1]) // b.unit_team(name, units[-1]))
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
    held = UnitsHeld(b, block)
    points = []
    ends = []
    steps: Dict[float, float] = {}
    settle = None
    for indices, t0, during, t1, after in curve.made:
        before = held.held
        made_u, made_n, done = held.make(indices)
        for i in indices:
            points.append((i, t0, during + before + made_u + made_n))
            points.append((i, t1, after + before + made_u + 2 * made_n))
            ends += (False, True)
        if made_u:
            steps[t0] = steps.get(t0, 0.0) + made_u
        for total in done:
            # the stage's pending units settled (at the first unit done),
            # then the copy-in of the whole unit, its gradients then gone
            for i in indices:
                points.append((i, t1, after + held.held + total))
                ends.append(True)
            steps[t1] = steps.get(t1, 0.0) - total
            held.held -= total
            if settle is None:
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


class UnitsHeld:
    """A block's unit gradients held as its backward makes them (its
    units: :meth:`.context.StepContext.grad_units`): ``held``, the bytes
    of those made whose unit is not complete yet."""

    def __init__(self, b: StepContext, block: str) -> None:
        self.params = b.profile.params[block]
        self.unit_of = {i: unit for unit in b.grad_units(block) for i in unit}
        self.left = {unit: b.unit_bytes(block, unit) for unit in b.grad_units(block)}
        self.totals = dict(self.left)
        self.held = 0

    def make(self, indices: Sequence[int]) -> Tuple[int, int, List[int]]:
        """An op makes the gradients of ``indices``: (the bytes of those in
        units, of the others, and the whole bytes of each unit it
        completes); ``held`` counts the unit ones (the caller takes off a
        completed unit's once it is copied in)."""
        made_u = made_n = 0
        done = []
        for i in indices:
            nbytes = self.params[i].numel * self.params[i].dtype.itemsize
            unit = self.unit_of.get(i)
            if unit is None:
                made_n += nbytes
                continue
            made_u += nbytes
            self.left[unit] -= nbytes
            if self.left[unit] == 0:
                done.append(self.totals[unit])
        self.held += made_u
        return made_u, made_n, done


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
    held = UnitsHeld(b, block)
    best = blk.b0_excess
    per: Dict[int, float] = {}
    for indices, during, after, _ in blk.bs_made:
        before = held.held
        made_u, made_n, done = held.make(indices)
        value = max(during + before + made_u + made_n, after + before + made_u + 2 * made_n)
        for total in done:
            # the copy-in of the whole unit, its gradients then gone
            value = max(value, after + held.held + total)
            held.held -= total
        for i in indices:
            per[i] = value
        best = max(best, value)
    hit = b.memo.unit_excess[block] = (best, per)
    return hit
