"""ZeRO-3's gathered parameters in the estimator's memory, placed in time.

LowerSPMD gates each gathered parameter on the compute before the block
that issues its all-gather (a ``depend`` whose result, the shard, lives
until the gather ends), all-gathers it on the communication stream (the
whole parameter lives from the gather's start until the reshape of its
first use ends) and reshapes it where a block first reads it. Gathers run
one after another, so at a block's peak some may not have started (only
their gates are live), one may be running (its gate and its result) and
the rest done; the reads wait for theirs.

The template (dp 1, no prefetch) holds each of a block's parameters whole
from the block's start (its gate is the parameter) until its reshape
ends. :func:`gather_curves` takes each block's memory curve on the
template (above the baseline its peak is measured on) less those
parameters, with where the block reads each; :func:`block_peak` puts the
parameters back as the step's timeline has them (the gates, the gathers'
starts and ends of the block's own parameters and of those issued ahead
for the next ones) and returns the block's most bytes above the
baseline.

By layer (``zero3_unit: layer``) a block's gathers are its unit's, as
one, then each parameter dp does not divide alone
(:func:`~distsim.transforms.sync_policy.gather_groups`): the unit's gate
is the concatenation of its shards (the copy-in, on the compute stream
before the gather), its gathered buffer lives from the gather's start
until the split at the unit's first read ends, and the split makes every
parameter of the unit there, ahead of the template's reshape of each
(:func:`unit_shape`). With a reduce-scatter per micro-batch the
backward's curve also holds the unit's gradients until the unit is
complete (:func:`.units.unit_curve`).
"""
from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from ..ir.comm import is_communication
from ..ir.core import Op
from ..transforms.zero3 import used_param_name
from .context import StepContext
from .costs import shard_size
from .gates import gather_plan


class GatherCurve(NamedTuple):
    """A block's memory on the template, for :func:`block_peak`: ``taus``
    (offsets from the block's compute start, ascending, up to ``end``) and
    ``vals`` (the bytes above the block's baseline from each offset on,
    less the block's gathered parameters until their reshapes end);
    ``reads``, per position
    of the block's gathered parameters, the offsets of its reshape's start
    and end (``inf``: not read); ``points``, extra candidates (the index of
    a parameter of the block, an offset, bytes): with ZeRO 2/3 reducing
    each gradient, the op making it and its flat copy right after."""

    taus: Tuple[float, ...]
    vals: Tuple[float, ...]
    reads: Tuple[Tuple[float, float], ...]
    points: Tuple[Tuple[int, float, float], ...]
    #: the offset where the block ends (its last op, a collective too)
    end: float
    #: ``taus`` and ``vals`` as arrays (made once: :meth:`array_taus`)
    arrays: list
    #: the first micro-batch's backward: per op making final gradients,
    #: in order, (the indices of their parameters in the block, the op's
    #: start offset, the bytes above the baseline while it runs, its end
    #: offset, the bytes once it has ended less the next op's results),
    #: both less the gathered parameters then: ZeRO-3 by layer holds a
    #: unit's gradients to the block's end (:func:`.units.unit_curve`)
    made: Tuple[Tuple[Tuple[int, ...], float, float, float, float], ...] = ()
    #: the block's first tensor-parallel collective, which the
    #: communication stream takes after the gathers issued before it: the
    #: offset of the first op reading its result (``inf``: none) and its
    #: time
    comm: Tuple[float, float] = (math.inf, 0.0)
    #: where the offsets start on the template's timeline
    start: float = 0.0
    #: per point, whether it is where an op ends (the gradient and its
    #: flat copy once the op making it has ended): placed in time as the
    #: end of what ran before it, not the start of what runs after
    point_ends: Tuple[bool, ...] = ()

    def array_taus(self) -> np.ndarray:
        if not self.arrays:
            self.arrays.extend((np.asarray(self.taus), np.asarray(self.vals)))
        return self.arrays[0]

    def array_vals(self) -> np.ndarray:
        self.array_taus()
        return self.arrays[1]

    def array_points(self) -> Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """``points`` as arrays: indices, offsets, bytes, and whether each
        is where an op ends."""
        self.array_taus()
        if len(self.arrays) == 2:
            index, at, value = zip(*self.points)
            ends = self.point_ends or (False,) * len(self.points)
            self.arrays.extend((np.asarray(index), np.asarray(at), np.asarray(value),
                                np.asarray(ends, dtype=bool)))
        return self.arrays[2], self.arrays[3], self.arrays[4], self.arrays[5]


def gather_curve(ops: List[Op], times, samples: Sequence[Tuple[float, int]],
                 stamps: Sequence[float], base: float, gathered: Sequence[Tuple[str, int]],
                 params, producer: Dict[int, Op],
                 points: Sequence[Tuple[int, float, float, bool]] = (),
                 made: Sequence[Tuple[Tuple[int, ...], float, float, float, float]] = ()
                 ) -> Optional[GatherCurve]:
    """The :class:`GatherCurve` of a template block's ``ops`` (rank 0, its
    group), over ``base`` bytes; ``gathered``: the block's gathered
    parameters (owner block, index); ``producer``: id(value) -> the op
    making it; ``points``: (parameter index, template time, live bytes,
    whether an op ends there) extra candidates; ``made``: the ops making final gradients (indices,
    start, live bytes while it runs, end, live bytes after it, in template
    time: :attr:`GatherCurve.made`). None: no compute op."""
    compute = [o for o in ops if not is_communication(o)]
    if not compute:
        return None
    t_c0 = min(times[o.name][0] for o in compute)
    t_end = max(times[o.name][1] for o in ops)
    # each gathered parameter: whole from its gate until its reshape ends
    by_name = {params[owner][i].name: j for j, (owner, i) in enumerate(gathered)}
    reads: List[Tuple[float, float]] = [(math.inf, math.inf)] * len(gathered)
    held: List[Tuple[float, float, int]] = []
    for op in compute:
        name = used_param_name(op)
        j = by_name.get(name) if name is not None else None
        if j is None or reads[j][0] != math.inf:
            continue
        r0, r1, _ = times[op.name]
        reads[j] = (r0 - t_c0, r1 - t_c0)
        gate = producer.get(id(op.inputs[0]))
        g0 = times[gate.name][0] if gate is not None and gate.name in times else t_c0
        owner, i = gathered[j]
        p = params[owner][i]
        held.append((min(g0, t_c0), r1, p.numel * p.dtype.itemsize))

    # the next block's, where its compute starts under this block's last
    # collective: its gates (its parameters whole) until its reshapes end
    mine = {id(o) for o in ops}
    others = [o for o in {id(o): o for o in producer.values()}.values()
              if id(o) not in mine and not is_communication(o) and o.name in times
              and t_c0 <= times[o.name][0] < t_end]
    readers = {id(o.inputs[0]): o for o in others if used_param_name(o) is not None}
    for o in others:
        if o.op_type == "depend" and o.meta.get("detail") == "zero3 prefetch gate":
            reader = readers.get(id(o.outputs[0]))
            held.append((times[o.name][0], times[reader.name][1] if reader is not None else t_end,
                         o.outputs[0].type.size_bytes))

    def own(t: float) -> int:
        return sum(nbytes for g0, r1, nbytes in held if g0 <= t < r1)

    lo = bisect_right(stamps, t_c0)
    # the block's window, but for where the next block's compute has
    # started under its last collective
    last = max(times[o.name][0] for o in compute)
    cut = min((times[o.name][0] for o in others if last < times[o.name][0]), default=t_end)
    hi = bisect_left(stamps, cut)
    taus: List[float] = [0.0]
    vals: List[float] = [(samples[lo - 1][1] if lo else 0) - base - own(t_c0)]
    for t, live in samples[lo:hi]:
        v = live - base - own(t)
        if v != vals[-1]:
            taus.append(t - t_c0)
            vals.append(v)
    extra = tuple((i, t - t_c0, live - base - own(t)) for i, t, live, _ in points)
    point_ends = tuple(end for _, _, _, end in points)
    ops_made = tuple((indices, t0 - t_c0, during - base - own(t0), t1 - t_c0,
                      after - base - own(t1)) for indices, t0, during, t1, after in made)
    comm = (math.inf, 0.0)
    tp = [o for o in ops if is_communication(o) and o.meta.get("role") is None
          and o.name in times]
    if tp:
        first = min(tp, key=lambda o: times[o.name][0])
        made_by = {id(v) for v in first.outputs}
        reader = next((o for o in compute if any(id(v) in made_by for v in o.inputs)), None)
        if reader is not None:
            comm = (times[reader.name][0] - t_c0, times[first.name][1] - times[first.name][0])
    return GatherCurve(tuple(taus), tuple(float(v) for v in vals), tuple(reads), extra,
                       t_end - t_c0, [], ops_made, comm, t_c0, point_ends)


#: a gathered parameter in a task (see :func:`block_peak`): (the position
#: of the block that reads it in the task, its position in that block's
#: gathered parameters, its shard's bytes, its whole bytes, its gate's time,
#: its gather's start and end); position -1: a copy held (its whole bytes)
#: from its start until its end, of no block
Entry = Tuple[int, int, int, int, float, float, float]


class UnitShape(NamedTuple):
    """ZeRO-3 by layer, a block's unit in its task (:func:`unit_shape`),
    in the template's offsets: where the template's ops move (``moves``:
    ascending offsets, and the total move from each on: the split of the
    unit at its first read in place of that read's reshape, the later
    reads' reshapes gone) and the unit's parameters split out ahead of
    their template reshapes (``pieces``: from the split's start offset
    to the offset of the reshape whose result the template holds from
    then on, and the bytes)."""

    move_at: Tuple[float, ...]
    move_by: Tuple[float, ...]
    pieces: Tuple[Tuple[float, float, int], ...]


def block_peak(curve: GatherCurve, k: int, t0: float, entries: Sequence[Entry],
               wait_all: bool = False, unit: Optional[UnitShape] = None,
               comm_free: float = -math.inf,
               marks: Optional[Sequence[Tuple[float, float]]] = None,
               spans: Optional[np.ndarray] = None) -> Tuple[float, Dict[int, float]]:
    """Block ``k`` of a task, its compute starting at ``t0``: the most
    bytes above its baseline with the task's gathered parameters
    (``entries``: those issued so far) placed in time, and per extra point
    of the curve (a parameter's gradient) the bytes there. The block's
    compute runs as on the template from ``t0``, each read waiting for its
    parameter's gather (``wait_all``: every read for all of them at the
    start, where the compute holds the communication stream); a parameter
    of a later block is live (its gate, its gather) past the block's end,
    one of an earlier block is gone. By layer (``unit``: the block's
    :class:`UnitShape`) an entry is a gather of the unit or of a
    parameter alone, and the unit's split moves the template's later ops
    and holds its parameters from its start. The block's first
    tensor-parallel collective (:attr:`GatherCurve.comm`) starts no
    earlier than the communication stream is through what was queued
    before it (``comm_free``: the gathers issued so far, the reduce-scatters
    before them), and the op reading its result waits for it. ``marks``:
    where the timeline ran the block's compute runs, (the template offset
    of each run's start, its time), ascending: the block's times from
    those instead (the op-by-op backward's, its waits all in them);
    ``spans``: per point where an op ends (:attr:`GatherCurve.point_ends`),
    how long its bytes stay (the gradient's flattening into its copy):
    what starts before that counts. At one time every change counts (the
    simulator frees before it allocates, and its peak is after)."""
    reads = curve.reads
    own = [e for e in entries if e[0] == k]
    move_at = unit.move_at if unit is not None else ()
    move_by = unit.move_by if unit is not None else ()

    def moved(tau: float) -> float:
        i = bisect_right(move_at, tau)
        return move_by[i - 1] if i else 0.0

    # the block's timeline: offset -> time, with the waits at its reads
    cut_at: List[float] = []
    cut_wait: List[float] = []
    # each wait: (the offset that waits, until when)
    waits = [(reads[e[1]][0], e[6]) for e in own if reads[e[1]][0] != math.inf]
    if marks:
        # the runs' starts as the timeline has them; inside a run, the
        # unit's moves from its start on
        waits = []
        cut_at = [tau for tau, _ in marks]
        cut_wait = [at - t0 - tau - (moved(tau) if move_at else 0.0) for tau, at in marks]
    elif wait_all:
        waits = [(0.0, max((e[6] for e in own), default=t0))]
    if curve.comm[0] != math.inf and comm_free > t0 and not marks:
        waits.append((curve.comm[0], comm_free + curve.comm[1]))
    if waits:
        waited = 0.0
        for at, end in sorted(waits):
            late = end - (t0 + at + (moved(at) if move_at else 0.0) + waited)
            if late > 0.0:
                waited += late
                if cut_at and cut_at[-1] == at:
                    cut_wait[-1] = waited
                else:
                    cut_at.append(at)
                    cut_wait.append(waited)
    if move_at:
        # the waits and the unit's moves together, as one table of offsets
        at_all = sorted(set(cut_at) | set(move_at))
        by_all = []
        for tau in at_all:
            i = bisect_right(cut_at, tau)
            by_all.append((cut_wait[i - 1] if i else 0.0) + moved(tau))
        cut_at, cut_wait = at_all, by_all

    def when(tau: float) -> float:
        i = bisect_right(cut_at, tau)
        return t0 + tau + (cut_wait[i - 1] if i else 0.0)

    # the gathered bytes as events in time
    ev_t: List[float] = []
    ev_d: List[int] = []
    for owner, j, shard, whole, gate, start, end in entries:
        if owner < 0:     # a copy held from before the block until ``end``
            ev_t += (start, end)
            ev_d += (whole, -whole)
            continue
        if owner < k:
            continue
        ev_t += (gate, end, start)
        ev_d += (shard, -shard, whole)
        if owner == k:
            ev_t.append(when(reads[j][1]))
            ev_d.append(-whole)
    if unit is not None:
        for lo, hi, nbytes in unit.pieces:
            ev_t += (when(lo), when(hi))
            ev_d += (nbytes, -nbytes)
    taus = curve.array_taus()
    vals = curve.array_vals()
    if cut_at:
        shift = np.concatenate(([0.0], cut_wait))
        cuts = np.asarray(cut_at)

        def when_all(x: np.ndarray, side: str = "right") -> np.ndarray:
            return x + t0 + shift[np.searchsorted(cuts, x, side=side)]
    else:
        def when_all(x: np.ndarray, side: str = "right") -> np.ndarray:
            return x + t0
    pts = when_all(taus)
    if not ev_t:
        extra: Dict[int, float] = {}
        for i, _, v in curve.points:
            if v > extra.get(i, -math.inf):
                extra[i] = v
        return float(vals.max()), extra
    times = np.asarray(ev_t)
    order = np.argsort(times, kind="stable")
    times = times[order]
    held = np.concatenate(([0.0], np.cumsum(np.asarray(ev_d, dtype=float)[order])))
    # with ``marks`` a run's start is its end less its time: what comes
    # within a picosecond after a point counts at it (the gather it waited
    # for ends there)
    tol = 1e-12 if marks else 0.0
    # at each point of the curve (every change at or before it counted), and
    # at each event (the curve's value then, every change at that time)
    g_pts = held[np.searchsorted(times, pts + tol if marks else pts, side="right")]
    last = np.searchsorted(times, times, side="right")
    v_ev = np.searchsorted(pts, times, side="right") - 1
    inside = (v_ev >= 0) & (times < when(curve.end))
    best = float((vals + g_pts).max())
    if inside.any():
        best = max(best, float((vals[v_ev[inside]] + held[last[inside]]).max()))
    extra = {}
    if curve.points:
        index, at, value, ends = curve.array_points()
        got = value + held[np.searchsorted(times, when_all(at) + tol, side="right")]
        if ends.any():
            # a point where an op ends: from the end of what ran before it
            # (its op's), the most over its span (to a picosecond before
            # the flattening ends)
            start = when_all(at, "left") + tol
            first = np.searchsorted(times, start, side="right")
            most = held[first]
            if spans is not None:
                upto = np.searchsorted(times, start + spans - 1e-12 - tol, side="right")
                for i in np.flatnonzero(ends & (upto > first)).tolist():
                    most[i] = held[first[i]:upto[i] + 1].max()
            got = np.where(ends, value + most, got)
        for i, v in zip(index.tolist(), got.tolist()):
            if v > extra.get(i, -math.inf):
                extra[i] = v
    return best, extra


def param_bytes(b: StepContext, kind: str, block: str) -> List[Tuple[int, int]]:
    """Per position of ``block``'s gathered parameters in a ``kind`` task
    (of builder ``b``), (its shard's bytes, its whole bytes)."""
    hit = b.memo.gathered_bytes.get((kind, block))
    if hit is None:
        blk = b.profile.blocks[block]
        hit = []
        for owner, i in (blk.f_gather if kind == "F" else blk.b_gather):
            p = b.profile.params[owner][i]
            size = p.dtype.itemsize
            hit.append((shard_size(p.numel, b.dp) * size, p.numel * size))
        b.memo.gathered_bytes[(kind, block)] = hit
    return hit


def entries_of(b: StepContext, kind: str, k: int, block: str, gate: float,
               groups: Sequence[Tuple[float, int, float]]) -> List[Entry]:
    """The :data:`Entry` of each all-gather of ``block`` (at position
    ``k`` of a ``kind`` task), gated at ``gate`` and gathered in
    ``groups`` (each: its time, the position of its last all-gather, its
    end) that run one after another (:attr:`.gates.GatherPlan.items`):
    by parameter one per gathered parameter; by layer
    (:func:`item_bytes`) the unit's first, its gate the concatenation of
    its shards, which runs on the compute stream before ``gate``."""
    plan = gather_plan(b, kind, block)
    items = plan.items
    sizes = item_bytes(b, kind, block) if b.by_layer else param_bytes(b, kind, block)
    out: List[Entry] = []
    first = 0
    for time_s, upto, end in groups:
        at = end - time_s
        for j in range(first, upto + 1):
            if b.by_layer:
                read, shard, whole = sizes[j]
                gated = gate - plan.copy_in if j == 0 and plan.first is not None else gate
                out.append((k, read, shard, whole, gated, at, at + items[j]))
            else:
                shard, whole = sizes[j]
                out.append((k, j, shard, whole, gate, at, at + items[j]))
            at += items[j]
        first = upto + 1
    return out


def item_bytes(b: StepContext, kind: str, block: str) -> List[Tuple[int, int, int]]:
    """ZeRO-3 by layer: per all-gather of ``block`` in a ``kind`` task,
    the unit's first (:func:`~distsim.transforms.sync_policy.gather_groups`),
    (the position of the gathered parameter read first, whose read waits
    for it; its gate's bytes: the concatenated shards, or one shard; the
    bytes gathered)."""
    key = (kind, block, "items")
    hit = b.memo.gathered_bytes.get(key)
    if hit is None:
        from ..transforms.sync_policy import gather_groups
        blk = b.profile.blocks[block]
        params = [b.profile.params[owner][i]
                  for owner, i in (blk.f_gather if kind == "F" else blk.b_gather)]
        sizes = param_bytes(b, kind, block)
        hit = []
        for group in gather_groups([p.numel for p in params], b.dp, True):
            if len(group) > 1:
                hit.append((group[0],
                            sum(p.numel // b.dp * p.dtype.itemsize
                                for p in (params[j] for j in group)),
                            sum(sizes[j][1] for j in group)))
            else:
                hit.append((group[0],) + sizes[group[0]])
        b.memo.gathered_bytes[key] = hit
    return hit


def unit_shape(b: StepContext, kind: str, block: str, curve: GatherCurve) -> Optional[UnitShape]:
    """ZeRO-3 by layer: the :class:`UnitShape` of ``block``'s unit in a
    ``kind`` task on its template ``curve``, as LowerSPMD splits it: at
    the unit's first read, one ``chunk_split`` (:attr:`.gates.GatherPlan.split_s`)
    in place of that read's reshape makes every parameter of the unit,
    and the unit's later reads have no reshape; a parameter split out and
    never read is gone when the split ends. None: no unit, or it is not
    read."""
    key = (kind, block, id(curve))
    memo = b.memo.unit_shapes
    if key in memo:
        return memo[key]
    from ..transforms.sync_policy import gather_groups
    plan = gather_plan(b, kind, block)
    out = None
    if plan.first is not None and curve.reads[plan.first][0] != math.inf:
        blk = b.profile.blocks[block]
        gathered = blk.f_gather if kind == "F" else blk.b_gather
        unit = gather_groups([b.profile.params[o][i].numel for o, i in gathered], b.dp, True)[0]
        sizes = param_bytes(b, kind, block)
        r0, r1 = curve.reads[plan.first]
        moves = [(r1, plan.split_s - plan.reshape_s[plan.first])]
        pieces = []
        for j in unit[1:]:
            at, end = curve.reads[j]
            if at == math.inf:
                pieces.append((r0, r1, sizes[j][1]))
                continue
            moves.append((end, -plan.reshape_s[j]))
            pieces.append((r0, at, sizes[j][1]))
        moves.sort()
        move_at, move_by, total = [], [], 0.0
        for at, by in moves:
            total += by
            if move_at and move_at[-1] == at:
                move_by[-1] = total
            else:
                move_at.append(at)
                move_by.append(total)
        out = UnitShape(tuple(move_at), tuple(move_by), tuple(pieces))
    memo[key] = out
    return out


#: a block's gathers in a task (see :func:`note_peak`): (the position of
#: the block that reads them, the block's name, their gate's time, and
#: their groups: each (its time, the position of its last parameter, its
#: end), run one after another)
Issued = Tuple[int, str, float, Tuple[Tuple[float, int, float], ...]]


def note_peak(b: StepContext, key: tuple, k: int, curve: Optional[GatherCurve], t0: float,
              issued: List[Issued], kind: str, wait_all: bool = False,
              held: Optional[Sequence[Tuple[int, float]]] = None,
              units: Sequence[Tuple[int, float, float, bool]] = (),
              ran: Optional[tuple] = None, own: Optional[tuple] = None) -> Optional[tuple]:
    """:func:`block_peak` of block ``k`` of a ``kind`` task, the
    gathers ``issued`` so far, noted for the memory estimate, the most
    over the walks (:attr:`.state.Memo.gather_peaks`, ``key``: the task's
    kind, chunk shape, first backward or not); returns what it noted (a
    replay notes it again with :func:`note_again`). The block's own
    gathers are dropped from ``issued`` (read: gone from the next blocks).
    ``held``: the flat gradient copies earlier tasks left waiting for
    their reduce-scatters (bytes, end), each live until it ends; by layer,
    ``units``: the units of gradient shards the block meets
    (:func:`.units.held_units`), those pending when it starts settled
    where it completes its own unit (:func:`.units.unit_curve`); ``ran``:
    the op-by-op backward's block as the timeline ran it (its name,
    whether the first micro-batch's entries, and each entry's end:
    :func:`run_offsets`); ``own``: the task's flat gradient copies, those
    waiting as the block starts (bytes, end) and the block's (bytes, from
    when, end), each live until its reduce-scatter ends."""
    got = None
    if curve is not None:
        runs = ends = None
        ran_at = None
        if ran is not None:
            runs, ends = run_offsets(b, curve, ran), ran[2]
            ran_at = tuple([int((ends[i] - time_s - t0) * 1e13) for i, _, time_s in runs])
        if own is not None and own[0]:
            held = list(held or ()) + own[0]
        waiting = tuple([(nbytes, int((end - t0) * 1e13)) for nbytes, end in held
                         if end > t0]) if held else ()
        made_here = tuple([(nbytes, int((start - t0) * 1e13), int((end - t0) * 1e13))
                           for nbytes, start, end in own[1]]) if own is not None else ()
        met = tuple([(nbytes, int((start - t0) * 1e13), int((end - t0) * 1e13), before)
                     for nbytes, start, end, before in units]) if units else ()
        # the same block in the same place among its gathers (a steady
        # pipeline's tasks) worked out once; times to a tenth of a
        # picosecond (a replayed task's are its record's shifted, to rounding)
        sig = (id(curve), wait_all, kind, waiting, met, ran_at, made_here) + tuple(
            [(owner - k, block, int((gate - t0) * 1e13),
              tuple([int((end - t0) * 1e13) for _, _, end in groups]))
             for owner, block, gate, groups in issued])
        got = b.memo.block_peaks.get(sig)
        if got is None:
            entries = [e for owner, block, gate, groups in issued
                       for e in entries_of(b, kind, owner, block, gate, groups)]
            # a flat copy waiting: an entry of no block, whole until its end
            entries += [(-1, 0, 0, nbytes, 0.0, -math.inf, end) for nbytes, end in held or ()
                        if end > t0]
            if own is not None:
                entries += [(-1, 0, 0, nbytes, 0.0, start, end) for nbytes, start, end in own[1]]
            unit = None
            if b.by_layer:
                name = next((block for owner, block, _, _ in issued if owner == k), None)
                if name is not None:
                    if kind == "B" and b.scatter_each:
                        from .units import unit_curve
                        curve, settle = unit_curve(b, name, curve)
                        for nbytes, start, end, before in units:
                            if before and settle is not None:
                                # pending: settled where the block completes
                                # its unit, which waits for its reduce-scatter
                                entries.append((k, settle, 0, nbytes, start, start, end))
                            else:     # the block's own, or held through it
                                entries.append((k + 1, 0, 0, nbytes, start, start, start))
                    unit = unit_shape(b, kind, name, curve)
            # what the communication stream takes before the block's collectives
            comm_free = max([end for _, _, _, groups in issued for _, _, end in groups]
                            + [end for nbytes, end in held or ()]
                            + [end for _, _, end, before in units if before], default=-math.inf)
            # the op-by-op backward: its compute runs where the timeline ran them
            marks = [(tau, ends[i] - time_s) for i, tau, time_s in runs] if runs else None
            spans = point_spans(b, curve, name_of(issued, k)) if curve.points else None
            got = b.memo.block_peaks[sig] = block_peak(curve, k, t0, entries, wait_all, unit,
                                                       comm_free, marks, spans)
        note_again(b, key, k, got)
    drop = 0
    while drop < len(issued) and issued[drop][0] <= k:
        drop += 1
    del issued[:drop]
    return got


def name_of(issued: List[Issued], k: int) -> Optional[str]:
    """The name of block ``k`` among the gathers ``issued``."""
    return next((block for owner, block, _, _ in issued if owner == k), None)


def point_spans(b: StepContext, curve: GatherCurve, block: Optional[str]) -> Optional[np.ndarray]:
    """Per point of ``block``'s backward curve, how long what it counts
    stays once its op ends (:func:`block_peak`): the flattening of its
    parameter's gradient into the copy its reduce-scatter reads (0 for a
    point where no op ends)."""
    if block is None or not any(curve.point_ends):
        return None
    key = (block, id(curve))
    hit = b.memo.point_spans.get(key)
    if hit is None:
        hit = b.memo.point_spans[key] = np.array(
            [b.param_cost(block, i).flat[0] if end else 0.0
             for (i, _, _), end in zip(curve.points, curve.point_ends)])
    return hit


def run_offsets(b: StepContext, curve: GatherCurve, ran: tuple) -> List[Tuple[int, float, float]]:
    """The compute runs of a block's op-by-op backward (``ran``: the
    block's name, whether its entries are the first micro-batch's
    (:attr:`.blocks.Block.only`) or the last's, the entries' ends, their
    plan (:meth:`.backward.OpByOpBackward._segment_plan`)): per run, its
    position among the entries, its start's offset on ``curve`` and its
    time; the timeline's end of each entry, by position, gives where it
    ran (:func:`note_peak`; the runs of a block run one after another)."""
    name, only = ran[0], ran[1]
    key = (name, only, id(curve))
    runs = b.memo.run_offsets.get(key)
    if runs is None:
        blk = b.profile.blocks[name]
        plan = ran[3]
        runs = b.memo.run_offsets[key] = [
            (i, seg.at - curve.start, entry[1])
            for i, (seg, entry) in enumerate(zip(blk.only if only else blk.last, plan))
            if entry[0] == "c"]
    return runs


def note_again(b: StepContext, key: tuple, k: int, got: Optional[tuple]) -> None:
    """Note ``got`` (:func:`block_peak`'s) for block ``k`` of ``key``."""
    if got is None:
        return
    held = b.memo.gather_peaks.setdefault(key, {})
    peak, extra = got
    old = held.get(k)
    if old is None:
        held[k] = (peak, dict(extra))
        return
    best = old[1]
    for i, v in extra.items():
        if v > best.get(i, -math.inf):
            best[i] = v
    if peak > old[0]:
        held[k] = (peak, best)
