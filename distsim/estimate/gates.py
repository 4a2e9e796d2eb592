"""ZeRO-3 in the estimator's block-level tasks: a block's compute waits for
the gather of each parameter where it first reads it, not for all of the
block's gathers at its start (see :mod:`.timeline`).

LowerSPMD issues a block's gathers (and the next ``prefetch`` blocks')
back to back on the communication stream when it enters the block, in the
order the block first reads the parameters; each read goes through a
reshape of the gathered value (``{param}_use_m{mb}``), the only op that
waits for the gather. So the compute before the block's first read runs
under the gathers, and the compute between two reads waits for no gather
past the first of them (:attr:`.profile.Block.f_gates`). A
block's compute that holds the communication stream (tensor-parallel
collectives) waits for every gather anyway: the stream takes them in
order.
"""
from __future__ import annotations

from typing import Dict, List, NamedTuple, Optional, Tuple

from ..ir.comm import CollectiveType
from ..transforms.sync_policy import layer_gathers, sync_team
from .context import StepContext


#: A block's first compute piece cut at its reads of gathered parameters:
#: (time, busy time or None, how long before the end of the block's gathers
#: the parameter read there is gathered, or None: waits for none)
Chain = List[Tuple[float, Optional[float], Optional[float]]]


class GatherPlan(NamedTuple):
    """A block's all-gathers in a forward / backward task, as LowerSPMD
    issues them: ``items``, their times in the order issued (per
    parameter; with ``zero3_unit: layer`` the unit of the parameters dp
    divides first, as one, then the others); ``upto``, per position of the
    block's gathered parameters (:attr:`.profile.Block.f_gather`),
    the last item a read there waits for (the reads so far are a prefix of
    those positions, which are in the order of first reads; -1: none, the
    reads so far of parameters gathered over no team); by layer,
    ``copy_in``, the concatenation of the unit's shards on the compute
    stream before its gather, ``first``, the position of the unit's first
    parameter (None: no unit)."""

    items: List[float]
    upto: List[int]
    copy_in: float = 0.0
    first: Optional[int] = None
    #: by layer, the split of the gathered unit at its first read, and per
    #: position the template's reshape it replaces (0 for a parameter
    #: gathered alone)
    split_s: float = 0.0
    reshape_s: Tuple[float, ...] = ()
    #: by layer, the unit's gathered bytes (its parameters whole)
    unit_bytes: int = 0
    #: by layer, what the split in place of the reshapes changes in the
    #: block's time, and in its compute before its first tensor-parallel
    #: collective (:func:`split_change`; None: not known)
    change: Optional[float] = None
    pre_change: Optional[float] = None
    #: ... and after its last one
    post_change: Optional[float] = None
    #: per item, the positions of the parameters it gathers (under expert
    #: parallelism the others' items come before the experts', not in the
    #: order of the positions)
    members: Tuple[Tuple[int, ...], ...] = ()
    #: the positions of the parameters gathered over no team (an expert's
    #: with ep = dp: the lowering emits no collective, the read waits for
    #: none), which no item gathers
    alone: Tuple[int, ...] = ()
    #: by layer, each unit's positions, in the order issued (under expert
    #: parallelism with ep < dp a MoE block's two: the others' over dp,
    #: then the experts' over dp / ep), and each one's split
    #: (``split_s`` and ``unit_bytes`` are theirs summed, ``first`` the
    #: first unit's first position)
    units: Tuple[Tuple[int, ...], ...] = ()
    unit_splits: Tuple[float, ...] = ()
    #: by layer, per item, the copy-in on the compute stream before it (a
    #: unit's; 0: a parameter alone): ``copy_in`` is theirs summed
    item_copy_ins: Tuple[float, ...] = ()

    def read_change(self, before: int, upto: int) -> float:
        """By layer, the change in a compute run whose reads of gathered
        parameters go on from position ``before`` (exclusive) to ``upto``:
        the reshapes of those in units gone, and the split of each unit
        first read there in (each unit split at its first read)."""
        change = -sum(self.reshape_s[before + 1:upto + 1])
        for unit, split_s in zip(self.units, self.unit_splits):
            if before < unit[0] <= upto:
                change += split_s
        return change

    @property
    def copy_out(self) -> float:
        """The split less the reshapes it replaces: the change in the
        block's compute (0: no unit)."""
        return self.split_s - sum(self.reshape_s)

    @property
    def copy_out_time(self) -> float:
        """The change in the block's time (:func:`split_change`; 0: no
        unit)."""
        return self.copy_out if self.change is None else self.change

    def copy_out_pre(self, kind: str) -> float:
        """The change in the block's compute before its first
        tensor-parallel collective (:func:`split_change`; not known: all
        of :attr:`copy_out` in a backward, none in a forward)."""
        if self.pre_change is not None:
            return self.pre_change
        return self.copy_out if kind == "B" else 0.0

    @property
    def copy_out_post(self) -> float:
        """The change in the block's compute after its last
        tensor-parallel collective (0: not known)."""
        return self.post_change or 0.0


def gather_plan(b: StepContext, kind: str, block: str) -> GatherPlan:
    """:class:`GatherPlan` of ``block``'s gathers in a ``kind`` task."""
    hit = b.memo.gather_plans.get((kind, block))
    if hit is not None:
        return hit
    blk = b.profile.blocks[block]
    params = [b.profile.params[owner][i] for owner, i in
              (blk.f_gather if kind == "F" else blk.b_gather)]
    # the lowering's groups (the unit, then each other parameter alone;
    # under expert parallelism the others', then the experts' over their
    # team); none over a team of one rank (the experts' with ep = dp): the
    # lowering emits no collective there, their reads wait for no gather
    teams = [(group, expert) for group, expert in
             layer_gathers([p.numel for p in params], [p.expert for p in params], b.strategy)
             if sync_team(b.strategy, expert) > 1]
    groups = [group for group, _ in teams]
    items = [b.dp_time(CollectiveType.ALL_GATHER,
                       sum(params[j].numel * params[j].dtype.itemsize for j in group), expert)
             for group, expert in teams]
    item_of = {j: g for g, group in enumerate(groups) for j in group}
    upto, most = [], -1
    for j in range(len(params)):
        most = max(most, item_of.get(j, -1))
        upto.append(most)
    units = [(group, expert) for group, expert in teams if len(group) > 1]
    alone = tuple(j for j in range(len(params)) if j not in item_of)
    if not units:
        hit = GatherPlan(items, upto, members=tuple(groups), alone=alone)
    else:
        # each unit over its own team: its shards concatenated (the
        # copy-ins back to back on the compute stream), split at its first read
        cost = b.costs.cost
        copy_ins, splits, reshape_s = [0.0] * len(items), [], [0.0] * len(params)
        for unit, expert in units:
            ps = [params[j] for j in unit]
            d = ps[0].dtype
            team = sync_team(b.strategy, expert)
            copy_ins[groups.index(unit)] = cost("concat", [(p.numel // team, d) for p in ps],
                                                [(sum(p.numel for p in ps) // team, d)])[0]
            splits.append(cost("chunk_split", [(sum(p.numel for p in ps), d)],
                               [(p.numel, d) for p in ps])[0])
            for j in unit:
                reshape_s[j] = cost("reshape", [(params[j].numel, d)], [(params[j].numel, d)])[0]
        unit_bytes = sum(params[j].numel * params[j].dtype.itemsize
                         for unit, _ in units for j in unit)
        hit = GatherPlan(items, upto, sum(copy_ins), units[0][0][0], sum(splits),
                         tuple(reshape_s), unit_bytes, members=tuple(groups), alone=alone,
                         units=tuple(unit for unit, _ in units), unit_splits=tuple(splits),
                         item_copy_ins=tuple(copy_ins))
        blk = b.profile.blocks[block]
        segs = blk.f_segs if kind == "F" else blk.only
        if segs:
            change, pre, post = split_change(segs, hit)
            hit = hit._replace(change=change, pre_change=pre, post_change=post)
    b.memo.gather_plans[(kind, block)] = hit
    return hit


def split_change(segments, plan: GatherPlan) -> Tuple[float, float, float]:
    """By layer, what the unit's split at its first read, in place of the
    reshapes of its parameters, changes in a block's time, and in its
    compute before its first tensor-parallel collective and after its
    last: the block's
    op-level entries (:class:`~.segments.Segment`: compute runs and
    tensor-parallel collectives, the communication stream taking those in
    order) run with and without the change. A reshape the compute stream
    runs while it would wait for a collective anyway (the bias's, under
    the projection's all-reduce) takes nothing off the block; the split
    before the first collective (the first layernorm reads its weight)
    delays it."""
    end, changed = _segments_end(segments, plan)
    kinds = [seg.kind for seg in segments]
    first = kinds.index("t") if "t" in kinds else len(kinds)
    last = len(kinds) - 1 - kinds[::-1].index("t") if "t" in kinds else len(kinds)
    return (end - _segments_end(segments, None)[0], sum(changed[:first]),
            sum(changed[last + 1:]))


def _segments_end(segments, plan: Optional[GatherPlan]) -> Tuple[float, List[float]]:
    """Where a block's compute ends, its entries run from 0 with its
    gathers done (``plan``: by layer, each run's reshapes of the units'
    parameters out and each unit's split in at its first read, as
    :meth:`.backward.OpByOpBackward._segment_plan` does), and how much
    that changed each entry's time."""
    compute = comm = 0.0
    ends: List[float] = []
    changed: List[float] = []
    read = -1
    for seg in segments:
        end = compute
        change = 0.0
        if seg.kind == "c":
            t = seg.time_s
            if plan is not None and seg.gate is not None and seg.gate > read:
                t = max(0.0, t + plan.read_change(read, seg.gate))
                read = seg.gate
                change = t - seg.time_s
            ready = max([compute] + [ends[d] for d in seg.deps if d is not None])
            end = compute = ready + t
        elif seg.kind == "t":
            # no deps: it reads what the forward kept; None: from before the block
            ready = 0.0 if not seg.deps else compute if seg.deps[0] is None \
                else ends[seg.deps[0]]
            end = comm = max(comm, ready) + seg.time_s
        elif seg.deps and seg.deps[0] is not None:
            end = ends[seg.deps[0]]
        ends.append(end)
        changed.append(change)
    return compute, changed


def gather_pieces(b: StepContext, kind: str, block: str) -> List[Tuple[float, float, int]]:
    """ZeRO-3: a block's all-gathers in a forward / backward task as runs
    that each start with a copy-in (by layer, a unit's concatenated
    shards, on the compute stream; 0: none), (its time, the run's
    gathers' time, the position of its last item): the gathers run back
    to back on the communication stream, each unit's after its own
    copy-in (under expert parallelism a MoE block's experts' unit after
    the others' gathers), as LowerSPMD emits them. One run where the
    block has one unit, or none."""
    hit = b.memo.gathers.get((kind, block))
    if hit is None:
        plan = gather_plan(b, kind, block)
        copy_ins = plan.item_copy_ins or (0.0,) * len(plan.items)
        hit = []
        for g, t in enumerate(plan.items):
            if not hit or copy_ins[g]:
                hit.append((copy_ins[g], t, g))
            else:
                hit[-1] = (hit[-1][0], hit[-1][1] + t, g)
        b.memo.gathers[(kind, block)] = hit = hit or [(0.0, 0.0, -1)]
    return hit


def chain(b: StepContext, kind: str, block: str, piece: Tuple[float, Optional[float], bool]
          ) -> Optional[Chain]:
    """The first compute piece of a block's task cut at its reads of
    gathered parameters (:data:`Chain`), or None where it waits for all of
    them (it holds the communication stream, or the block reads none).
    By layer, the piece (which includes :attr:`GatherPlan.copy_out`) has
    that change where the unit is first read, not at its end."""
    time_s, busy_s, holds = piece
    blk = b.profile.blocks[block]
    gates = blk.f_gates if kind == "F" else blk.b_gates
    if holds or not gates:
        return None
    plan = gather_plan(b, kind, block)
    times, upto = plan.items, plan.upto
    total = sum(times)
    ends: List[float] = []
    done = 0.0
    for t in times:
        done += t
        ends.append(total - done)
    # by layer: template offsets past the unit's first read move by the
    # copy-out's change (kept in order)
    shift = plan.copy_out
    first_read = None
    if plan.first is not None and shift:
        first_read = next((before for before, j in gates if j >= plan.first), None)
    out: Chain = []
    at, wait = 0.0, None
    for before, j in gates:
        if first_read is not None and before > first_read:
            before = max(first_read, before + shift)
        cut = min(before, time_s)
        if cut > at:
            out.append((cut - at, _part(busy_s, cut - at, time_s), wait))
            at = cut
        wait = ends[upto[j]] if upto[j] >= 0 else None
    out.append((time_s - at, _part(busy_s, time_s - at, time_s), wait))
    return out


def _part(busy_s: Optional[float], length: float, time_s: float) -> Optional[float]:
    return None if busy_s is None or time_s <= 0.0 else busy_s * length / time_s


def emit_chain(b: StepContext, stage: int, pieces: Chain, gathered: float, ready: float
               ) -> float:
    """Emit a :data:`Chain` on ``stage``: each piece from ``ready`` and the
    gather it waits for (``gathered``: the end of the block's gathers);
    returns the last end."""
    compute = b.tl.compute
    end = ready
    for time_s, busy_s, before in pieces:
        at = ready if before is None else max(ready, gathered - before)
        end = compute(stage, time_s, at, busy_s)
    return end


def entrywise(b: StepContext) -> bool:
    """Whether a ZeRO-3 block-level task is emitted entry by entry
    (:func:`emit_entries`): under ``comm_streams: per-group`` with tensor
    parallelism, where the gathers run on the data-parallel stream and
    the block's tensor-parallel collectives on theirs, so that a block's
    compute waits for each gather only where it reads the parameter, and
    its collectives for the compute making their inputs. Under expert
    parallelism too, on one communication stream: a MoE block's first
    collective (its dispatch's all-to-all) comes after its attention, and
    its compute reads each gathered parameter where it needs it, the
    experts' (their reshapes) while the all-to-all waits behind their
    gathers on that stream; the block-level task would wait for them all."""
    return b.block_comm and (b.tl.per_group or b.strategy.ep > 1)


#: An entry of :func:`entry_plan`: kind ("c" a compute run, "t" a
#: tensor-parallel collective), time, the collectives a run reads
#: (entries of the block), the run a collective reads (-1: the compute
#: before it, -2: none, what the forward kept), whether it is the
#: recomputation a backward starts with, and how long before the end of
#: the block's gathers the last parameter a run reads is gathered (None:
#: it reads none)
Entry = Tuple[str, float, Tuple[int, ...], int, bool, Optional[float]]


class EntryPlan(List[Entry]):
    """A block's :data:`Entry` items, with what :func:`emit_entries`
    replays them from: ``record``, the items of one emission that found
    the block's gathers, its input and the stage's streams done by its
    start, relative to that start (:meth:`.engine.Timeline.since`), the
    end of its compute after it, and how long after the start the
    gathers may end and no run that reads them start later (the least,
    over those runs, of the run's start and how long before the gathers'
    end its parameter is gathered); ``replayable``, whether such an
    emission depends on nothing but its start (no collective of it reads
    what the forward kept: one would start where the tensor-parallel
    stream ends, before the block's compute)."""

    record: Optional[Tuple[tuple, float, float]] = None
    replayable = True


def entry_plan(b: StepContext, kind: str, block: str, mb: int) -> EntryPlan:
    """A block's forward (:attr:`.blocks.Block.f_segs`) or backward (the
    first micro-batch's, :attr:`.blocks.Block.only`, or a later one's,
    :attr:`.blocks.Block.mid`) as :data:`Entry` items; by layer, the
    unit's split in place of its parameters' reshapes
    (:func:`split_change`)."""
    key = (kind, block, kind == "B" and mb > 0)
    hit = b.memo.entry_plans.get(key)
    if hit is not None:
        return hit
    blk = b.profile.blocks[block]
    segs = blk.f_segs if kind == "F" else blk.mid if mb else blk.only
    plan = gather_plan(b, kind, block)
    changed = _segments_end(segs, plan)[1] if plan.first is not None else [0.0] * len(segs)
    items = plan.items
    # per item, the time of the items after it (its end before the last's)
    after = [sum(items[k + 1:]) for k in range(len(items))]
    hit = EntryPlan()
    for seg, change in zip(segs, changed):
        if seg.kind == "c":
            gate = seg.gate
            # None: it waits for every gather; -1 (or a read of a parameter
            # gathered over no team, as all before it): for none
            upto = len(items) - 1 if gate is None else gate if gate == -1 else plan.upto[gate]
            before = None if upto == -1 else after[upto]
            hit.append(("c", max(0.0, seg.time_s + change),
                        tuple(d for d in seg.deps if d is not None), -2, seg.lead, before))
        elif seg.kind == "t":
            src = -2 if not seg.deps else -1 if seg.deps[0] is None else seg.deps[0]
            hit.append(("t", seg.time_s, (), src, seg.lead, None))
            hit.replayable = hit.replayable and src != -2
        else:       # a mark (a gradient made, the input gradient): nothing to run
            hit.append(("m", 0.0, (), -2, seg.lead, None))
    b.memo.entry_plans[key] = hit
    return hit


def emit_entries(b: StepContext, stage: int, plan: EntryPlan, gathered: float,
                 ready: float, before: float) -> float:
    """Emit a block's :func:`entry_plan` on ``stage``: each compute run
    from ``ready`` (the task's input; not a leading recomputation), the
    gathers it reads (``gathered``: the end of the block's gathers) and
    the collectives it reads; each collective on the tensor-parallel
    stream from the run making its input (``before``: where the compute
    before the block ends). Returns where its compute ends.

    Where the compute stream ends at ``before`` and the input and the
    tensor-parallel stream are done by then, the block's items depend
    only on ``before`` (a :attr:`EntryPlan.replayable` plan's) if its
    gathers end early enough that no run waits for them: the first
    emission with the gathers done by ``before`` is recorded, with how
    late they may end (:class:`EntryPlan`), and the next ones whose
    gathers end by then replay it, shifted (a stage's forward has tens
    of such blocks; most of a ZeRO-3 step's items)."""
    tl = b.tl
    s = 2 * stage
    mark = None
    if (plan.replayable and tl.free[s] == before and tl.free[s + 1] <= before
            and ready <= before):
        record = plan.record
        if record is not None and gathered - before <= record[2]:
            tl.replay(stage, record[0], before)
            return before + record[1]
        if record is None and gathered <= before:
            mark = tl.mark(stage)
    local: Dict[int, float] = {}
    last = before
    slack = float("inf")
    for i, (kind, time_s, waits, src, lead, gate) in enumerate(plan):
        if kind == "c":
            at = 0.0 if gate is None else gathered - gate
            if not lead and ready > at:
                at = ready
            for d in waits:
                if local[d] > at:
                    at = local[d]
            if mark is not None and gate is not None:
                # recording: where the run starts (:meth:`.engine.Timeline.compute`)
                start = tl.free[s] if tl.free[s] > 0.0 else 0.0
                if at > start:
                    start = at
                if start - before + gate < slack:
                    slack = start - before + gate
            local[i] = last = tl.compute(stage, time_s, at)
        elif kind == "t":
            local[i] = tl.comm_on(stage, time_s, local[src] if src >= 0 else
                                  last if src == -1 else 0.0, tp=True)
    if mark is not None:
        items = tl.since(stage, mark, before)
        if items is not None:
            plan.record = (items, last - before, slack)
    return last
