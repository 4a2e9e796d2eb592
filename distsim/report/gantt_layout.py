"""What the Gantt charts draw, as data: lanes, bars, micro-batch tasks and
the zoom window (:mod:`distsim.report.gantt` draws them).

A **lane** is one device (the device view) or one pipeline stage, drawn
from one device of the stage (the stage view). Each lane has three bands:
compute (tall), collectives and point-to-point sends (thin, below it).
Under ``comm_streams: per-group`` the collectives of two groups run at
once on one device: the collectives band then has a row per group stream
(the trace's ``comm-<team>`` names, in name order, the same rows in every
lane), so that neither hides the other.
Bars are coloured by key (:mod:`distsim.report.phases`: the compute phase
or the communication kind).

Every bar is drawn at least a minimum width wide (a pixel or two at the
chart's scale), so that each op is visible however short, and ops of one
key closer than half that width are merged into one bar; the chart says so. A
**task** is a run of consecutive compute records of one micro-batch in
one direction (forward; backward with its recomputation; the weight
gradients of a split backward) on a lane: the block that carries the
micro-batch number in a pipeline picture.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from distsim.report.phases import KEYS, RecordPhases, rank_stages
from distsim.report.summary import MS, rank_ranges, step_time_of
from distsim.sim.trace import COMPUTE_STREAM, P2P_STREAM, Trace

#: bands of a lane: compute, collectives, point-to-point
BANDS: Tuple[str, ...] = ("compute", "collectives", "p2p")
#: a gap inside a task longer than this share of it splits the stretches its number may sit on
GAP_SHARE = 0.2
_FORWARD, _BACKWARD, _WEIGHT, _RECOMPUTE = (KEYS.index(k) for k in (
    "forward", "backward", "weight gradients", "recompute"))


@dataclass(frozen=True)
class Lane:
    """One lane: the records of device ``rank``, labelled ``label``;
    ``ranks``: the devices it stands for (itself with no reduction)."""

    rank: int
    label: str
    ranks: Tuple[int, ...]


@dataclass
class Bars:
    """Bars of one key on one band of one lane, in ms: ``starts``, ``widths``
    (each at least the minimum width), ``spans`` (from the first op's start
    to the last op's end: the width before widening) and ``covered`` (the
    op time behind each bar)."""

    lane: int
    band: int
    key: str
    starts: np.ndarray
    widths: np.ndarray
    spans: np.ndarray
    covered: np.ndarray
    #: the row within the band (a communication stream of its own) and the band's rows
    row: int = 0
    rows: int = 1

    def share(self) -> np.ndarray:
        """The share of each bar's span that its ops cover (1 for a bar of
        one op, or of ops without gaps)."""
        return np.divide(np.minimum(self.covered, self.spans), self.spans,
                         out=np.ones(len(self.spans)), where=self.spans > 0)


@dataclass(frozen=True)
class Task:
    """A micro-batch's forward (``backward`` False) or backward block on a
    lane, in ms; ``label_ms``: where its number goes, the middle of its
    longest stretch without a gap longer than :data:`GAP_SHARE` of the
    block (a block that waits halfway, for the next stage's gradient, is
    mostly empty in its middle)."""

    lane: int
    start_ms: float
    end_ms: float
    microbatch: int
    backward: bool
    label_ms: float = 0.0
    label_width_ms: float = 0.0


def _prefix(name: str) -> str:
    m = re.match(r"^(.*?)(\d+)$", name)
    return m.group(1) if m else ""


def _stands_for(name: str, ranks: Sequence[int]) -> str:
    """``gpu64-127`` for the ranks a device stands for."""
    return _prefix(name) + rank_ranges(ranks).replace(",", f",{_prefix(name)}")


def _represented(trace: Trace) -> Dict[int, Tuple[int, ...]]:
    rep = trace.meta.get("represented_ranks") or {}
    return {int(r): tuple(sorted(int(m) for m in ranks)) for r, ranks in rep.items()}


def device_lanes(trace: Trace) -> List[Lane]:
    """A lane per device, by rank; a device that stands for others (a
    program reduced by ``--symmetry``) says which."""
    names = {d.rank: d.name for d in trace.devices}
    ranks = sorted(set(names) | set(np.unique(trace.op_columns.rank).tolist()))
    represented = _represented(trace)
    lanes = []
    for r in ranks:
        name = names.get(r, f"gpu{r}")
        group = represented.get(r, (r,))
        label = name if len(group) <= 1 else \
            f"{name}\nfor {len(group)}: {_stands_for(name, group)}"
        lanes.append(Lane(r, label, group))
    return lanes


def stage_lanes(trace: Trace, phases: RecordPhases) -> List[Lane]:
    """A lane per pipeline stage, drawn from the stage's lowest rank; empty
    when no record knows its stage (no program, or a model without stages)."""
    stages = rank_stages(trace, phases)
    names = {d.rank: d.name for d in trace.devices}
    represented = _represented(trace)
    lanes = []
    for s in sorted(set(stages.values())):
        ranks = sorted(r for r, st in stages.items() if st == s)
        group = sorted({m for r in ranks for m in represented.get(r, (r,))})
        name = names.get(ranks[0], f"gpu{ranks[0]}")
        label = f"stage {s}: {name}" + (f"\nof {_stands_for(name, group)}"
                                         if len(group) > 1 else "")
        lanes.append(Lane(ranks[0], label, tuple(group)))
    return lanes


def _band_codes(streams: Sequence[str]) -> np.ndarray:
    return np.array([0 if s == COMPUTE_STREAM else 2 if s == P2P_STREAM else 1
                     for s in streams], dtype=np.int64)


def _row_codes(streams: Sequence[str], used: np.ndarray) -> Tuple[np.ndarray, int]:
    """The row of each stream within its band, and the collectives band's
    rows: one per communication stream that has records (``used``: the
    stream codes of the records), one under ``shared``, one per group
    stream under ``per-group``; compute and p2p have one row."""
    bands = _band_codes(streams)
    comm = sorted(streams[i] for i in np.unique(used).tolist() if bands[i] == 1)
    row = {s: i for i, s in enumerate(comm)}
    return np.array([row.get(s, 0) for s in streams], dtype=np.int64), max(len(comm), 1)


def _lane_records(trace: Trace, lanes: Sequence[Lane], window: Tuple[float, float]
                  ) -> Tuple[np.ndarray, np.ndarray]:
    """Positions (in the op columns) of the records on ``lanes`` that meet
    ``window`` (ms), and the lane number of each."""
    columns = trace.op_columns
    lane_of = np.full(int(columns.rank.max()) + 1 if len(columns) else 1, -1, np.int64)
    for i, lane in enumerate(lanes):
        if lane.rank < len(lane_of):
            lane_of[lane.rank] = i
    lane = lane_of[columns.rank] if len(columns) else np.zeros(0, np.int64)
    t0, t1 = window[0] / MS, window[1] / MS
    keep = (lane >= 0) & (columns.end_s >= t0) & (columns.start_s <= t1)
    positions = np.flatnonzero(keep)
    return positions, lane[positions]


def merge_spans(starts: np.ndarray, ends: np.ndarray,
                gap: float) -> Tuple[List[Tuple[float, float]], np.ndarray]:
    """Bars ``(start, width)`` covering the spans ``[starts, ends]``, where
    spans that overlap or lie less than ``gap`` apart become one bar, and
    for each bar the share of it the spans cover (0..1)."""
    if len(starts) == 0:
        return [], np.zeros(0)
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], ends[order]
    reach = np.maximum.accumulate(e)
    new = np.empty(len(s), dtype=bool)
    new[0] = True
    new[1:] = s[1:] > reach[:-1] + gap
    first = np.flatnonzero(new)
    last = np.r_[first[1:], len(s)] - 1
    lo, hi = s[first], reach[last]
    width = hi - lo
    covered = np.add.reduceat(np.maximum(e - s, 0.0), first)
    fill = np.where(width > 0, np.minimum(covered / np.where(width > 0, width, 1.0), 1.0), 1.0)
    return list(zip(lo.tolist(), width.tolist())), fill


def lane_bars(trace: Trace, phases: RecordPhases, lanes: Sequence[Lane],
              window: Tuple[float, float], min_width_ms: float) -> List[Bars]:
    """The bars of ``lanes`` in ``window`` (ms): per (lane, band, row, key),
    ops closer than half ``min_width_ms`` merged, every bar at least that
    wide."""
    columns = trace.op_columns
    positions, lane = _lane_records(trace, lanes, window)
    if not len(positions):
        return []
    band = _band_codes(columns.streams)[columns.stream[positions]]
    row_of, rows = _row_codes(columns.streams, columns.stream)
    row = row_of[columns.stream[positions]]
    key = phases.key[columns.label[positions]]
    order = np.lexsort((columns.start_s[positions], key, row, band, lane))
    positions, lane, band, row, key = (positions[order], lane[order], band[order], row[order],
                                       key[order])
    cut = np.flatnonzero((np.diff(lane) != 0) | (np.diff(band) != 0) | (np.diff(row) != 0)
                         | (np.diff(key) != 0)) + 1
    out = []
    for group in np.split(np.arange(len(positions)), cut):
        p = positions[group]
        starts, ends = columns.start_s[p] * MS, columns.end_s[p] * MS
        merged, _ = merge_spans(starts, ends, min_width_ms / 2)
        lo = np.array([m[0] for m in merged])
        width = np.array([m[1] for m in merged])
        # op time under each merged bar: the spans are sorted, so each bar's
        # ops are a contiguous run, cut where a new bar starts
        first = np.searchsorted(starts, lo, side="left")
        covered = np.add.reduceat(np.maximum(ends - starts, 0.0), first) if len(first) \
            else np.zeros(0)
        g = group[0]
        out.append(Bars(int(lane[g]), int(band[g]), KEYS[int(key[g])], lo,
                        np.maximum(width, min_width_ms), width, covered, int(row[g]),
                        rows if band[g] == 1 else 1))
    return out


def lane_tasks(trace: Trace, phases: RecordPhases, lanes: Sequence[Lane],
               window: Tuple[float, float]) -> List[Task]:
    """The micro-batch tasks on the compute band of ``lanes`` that meet
    ``window`` (ms): runs of consecutive compute records (by start) of one
    micro-batch, forward, backward (recomputation counts as backward) or
    weight gradients (a split backward's second part, ``backward`` too)."""
    columns = trace.op_columns
    positions, lane = _lane_records(trace, lanes, window)
    key, mb, _ = phases.of_records(columns.label[positions])
    compute = _band_codes(columns.streams)[columns.stream[positions]] == 0
    keep = compute & (mb >= 0) & np.isin(key, (_FORWARD, _BACKWARD, _WEIGHT, _RECOMPUTE))
    positions, lane, key, mb = positions[keep], lane[keep], key[keep], mb[keep]
    if not len(positions):
        return []
    start, end = columns.start_s[positions] * MS, columns.end_s[positions] * MS
    backward = key != _FORWARD
    # 0 forward, 1 backward (with its recomputation), 2 weight gradients:
    # a split backward's two parts are blocks of their own
    part = backward.astype(np.int64) + (key == _WEIGHT)
    order = np.lexsort((end, start, lane))
    start, end, lane, mb, backward, part = (a[order] for a in (start, end, lane, mb, backward,
                                                               part))
    new = np.ones(len(start), bool)
    new[1:] = (lane[1:] != lane[:-1]) | (mb[1:] != mb[:-1]) | (part[1:] != part[:-1])
    first = np.flatnonzero(new)
    task_end = np.maximum.reduceat(end, first)
    task_of = np.cumsum(new) - 1
    # stretches without a long gap: a new one where a record starts more than
    # GAP_SHARE of its task's span after the task's ops so far ended (the
    # short waits for tensor-parallel collectives do not count)
    shift = lane * (float(end.max()) + 1.0)           # each lane's running end on its own
    reach = np.maximum.accumulate(end + shift) - shift
    span = (task_end - start[first])[task_of]
    cut = new.copy()
    cut[1:] |= start[1:] - reach[:-1] > GAP_SHARE * span[1:]
    seg = np.flatnonzero(cut)
    seg_lo, seg_hi = start[seg], np.maximum.reduceat(end, seg)
    seg_task = task_of[seg]
    # per task, its longest stretch (the first of equal ones)
    order = np.lexsort((-(seg_hi - seg_lo), seg_task))
    best = order[np.r_[True, seg_task[order][1:] != seg_task[order][:-1]]]
    return [Task(int(lane[f]), float(start[f]), float(e), int(mb[f]), bool(backward[f]),
                 float((seg_lo[b] + seg_hi[b]) / 2), float(seg_hi[b] - seg_lo[b]))
            for f, e, b in zip(first.tolist(), task_end.tolist(), best.tolist())]


def zoom_window(tasks: Sequence[Task], step_ms: float, axis_px: float,
                label_px: float = 24.0) -> Optional[Tuple[float, float]]:
    """A window from the step's start in which the median task is
    ``label_px`` pixels wide (so that its micro-batch number can be read),
    or None when it already is over the whole step (or there are no tasks)."""
    if not tasks or step_ms <= 0:
        return None
    median = float(np.median([t.end_ms - t.start_ms for t in tasks]))
    if median <= 0:
        return None
    width = median * axis_px / label_px
    return None if width >= step_ms else (0.0, width)


def min_width_ms(window: Tuple[float, float], axis_px: float, px: float) -> float:
    """``px`` pixels of an axis ``axis_px`` wide that shows ``window`` (ms)."""
    return (window[1] - window[0]) / axis_px * px if axis_px > 0 else 0.0


def full_window(trace: Trace) -> Tuple[float, float]:
    step_ms = step_time_of(trace) * MS
    return (0.0, step_ms if step_ms > 0 else 1.0)
