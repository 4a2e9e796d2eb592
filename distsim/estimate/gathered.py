"""ZeRO-3's gathered parameters in the estimator's memory, placed in time.

LowerSPMD gates each gathered parameter on the compute before the block
that issues its all-gather (a ``depend`` whose result, the shard, lives
until the gather ends), all-gathers it on the communication stream (the
whole parameter lives from the gather's start until the reshape of its
first use ends) and reshapes it where a block first reads it. Gathers run
one after another, so at a block's peak some may not have started (only
their gates are live), one may be running (its gate and its result) and
the rest done; the reads wait for theirs. A parameter gathered over no
team (an expert's with ep = dp) has no all-gather: its gate, the whole
parameter, lives until its reshape ends. From a block's gates to its
compute's start the stage holds what is gated, gathered and still
waiting then (a flat gradient copy of the block before), nothing of the
block's own curve yet.

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
(:func:`.gathered_walk.unit_shape`). With a reduce-scatter per micro-batch the
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


#: the template's compute ops that make values and have a time, by start:
#: (their starts, (program position, op) each): :func:`timed_makers`
Makers = Tuple[List[float], List[Tuple[int, Op]]]


def timed_makers(producer: Dict[int, Op], times) -> Makers:
    """The distinct compute ops of ``producer`` (id(value) -> the op making
    it) with a time in ``times``, sorted by start (ties in program order):
    worked out once per template, so that each :func:`gather_curve` finds
    the ops starting in its window by bisection, not by a pass over the
    whole template."""
    ops = [o for o in {id(o): o for o in producer.values()}.values()
           if not is_communication(o) and o.name in times]
    ranked = sorted((times[o.name][0], i) for i, o in enumerate(ops))
    return [t for t, _ in ranked], [(i, ops[i]) for _, i in ranked]


def _position(ranked: Tuple[int, Op]) -> int:
    return ranked[0]


def gather_curve(ops: List[Op], times, samples: Sequence[Tuple[float, int]],
                 stamps: Sequence[float], base: float, gathered: Sequence[Tuple[str, int]],
                 params, producer: Dict[int, Op],
                 points: Sequence[Tuple[int, float, float, bool]] = (),
                 made: Sequence[Tuple[Tuple[int, ...], float, float, float, float]] = (),
                 *, makers: Makers) -> Optional[GatherCurve]:
    """The :class:`GatherCurve` of a template block's ``ops`` (rank 0, its
    group), over ``base`` bytes; ``gathered``: the block's gathered
    parameters (owner block, index); ``producer``: id(value) -> the op
    making it (``makers``: its :func:`timed_makers`); ``points``:
    (parameter index, template time, live bytes, whether an op ends there)
    extra candidates; ``made``: the ops making final gradients (indices,
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
    starts, ranked = makers
    window = ranked[bisect_left(starts, t_c0):bisect_left(starts, t_end)]
    others = [o for _, o in sorted(window, key=_position) if id(o) not in mine]
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
    """ZeRO-3 by layer, a block's unit in its task
    (:func:`.gathered_walk.unit_shape`),
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
    # at an event, every change within a picosecond after it counts too: two
    # gathers back to back meet at one time, the second's start its end less
    # its time, which rounding may put a hair before the first's end (the
    # first's gate freed there: 125 MiB at llama3-8b's head, dp 8)
    last = np.searchsorted(times, times + 1e-12, side="right")
    v_ev = np.searchsorted(pts, times, side="right") - 1
    inside = (v_ev >= 0) & (times < when(curve.end))
    best = float((vals + g_pts).max())
    if inside.any():
        best = max(best, float((vals[v_ev[inside]] + held[last[inside]]).max()))
    # from the block's own gates until its compute starts: nothing of the
    # block above its baseline yet, what is gated, gathered and waiting
    # then (a parameter gathered over no team is whole from its gate)
    entering = min((e[4] for e in own), default=math.inf)
    before = (times >= entering) & (v_ev < 0)
    if before.any():
        best = max(best, float(held[last[before]].max()))
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
