"""A Gantt chart of a simulated step: one row per device stream.

Rows are ``gpu3 compute`` / ``gpu3 comm`` (every device gets its compute and
comm rows, busy or not, plus any other stream it used), ordered by rank
then stream; bars are coloured by op category. Each row is drawn with one
``broken_barh`` per category, so a million-op trace stays fast. Past
``max_rows`` rows only the first ``max_rows`` are drawn, and the title says so.

Bars closer than a fraction of a pixel (``step / resolution``) are merged
before drawing (:func:`merge_spans`), each merged bar drawn with an opacity
equal to the share of it that ops cover (as anti-aliasing would draw the
separate slivers): the picture is the same at the saved size, but a row of
50,000 ops draws as a few thousand bars. The spans are read from the
trace's op columns (one sort groups them by row and category, each group
in record order), not from a record tuple per op.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Dict, List, Optional, Tuple

import numpy as np

from distsim.fileio import PathLike
from distsim.report.chrome_trace import stream_tids
from distsim.report.figures import CATEGORY_COLOURS, OTHER_COLOUR, save_png
from distsim.report.summary import MS, step_time_of
from distsim.sim.trace import COMM_STREAM, COMPUTE_STREAM, OpColumns, Trace

if TYPE_CHECKING:     # matplotlib is imported when a chart is drawn (``import distsim`` stays fast)
    from matplotlib.figure import Figure

Row = Tuple[int, str]  # (rank, stream)


def gantt_rows(trace: Trace) -> List[Row]:
    """Every ``(rank, stream)`` row of the chart, in display order."""
    tids = stream_tids(trace)
    rows = {(d.rank, s) for d in trace.devices for s in (COMPUTE_STREAM, COMM_STREAM)}
    columns = trace.op_columns
    n = len(columns.streams)
    used = np.unique(columns.rank * n + columns.stream).tolist()   # (rank, stream code), coded
    rows |= {(k // n, columns.streams[k % n]) for k in used}
    return sorted(rows, key=lambda r: (r[0], tids[r[1]]))


def _spans(columns: OpColumns, rows: List[Row]
           ) -> Dict[Tuple[int, str], Tuple[np.ndarray, np.ndarray]]:
    """``(row number, category) -> (starts, ends)`` of the ops on ``rows``,
    each in record order (the merged bars' opacities sum in that order)."""
    n = len(columns.streams)
    code = {s: c for c, s in enumerate(columns.streams)}
    row_of = {rank * n + code[stream]: i for i, (rank, stream) in enumerate(rows)
              if stream in code}
    if not row_of or not len(columns):
        return {}
    keys = np.array(sorted(row_of), dtype=np.int64)
    number = np.array([row_of[k] for k in keys.tolist()], dtype=np.int64)
    order = columns.order()
    key = columns.rank[order] * n + columns.stream[order]
    at = np.minimum(np.searchsorted(keys, key), len(keys) - 1)
    shown = keys[at] == key
    if not shown.any():
        return {}
    positions, row = order[shown], number[at[shown]]
    category = columns.category[positions]
    group = np.lexsort((category, row))           # by row, then category; record order kept
    positions, row, category = positions[group], row[group], category[group]
    cut = np.flatnonzero((np.diff(row) != 0) | (np.diff(category) != 0)) + 1
    firsts = [0] + cut.tolist()
    return {(int(row[f]), columns.categories[category[f]]): (starts, ends)
            for f, starts, ends in zip(firsts, np.split(columns.start_s[positions], cut),
                                       np.split(columns.end_s[positions], cut))}


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


def gantt_figure(trace: Trace, max_rows: int = 64, resolution: int = 8000) -> Figure:
    """The Gantt chart as a matplotlib ``Figure`` (not saved); bars less
    than ``step / resolution`` apart are drawn as one."""
    from matplotlib.colors import to_rgba
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    names = {d.rank: d.name for d in trace.devices}
    all_rows = gantt_rows(trace)
    rows = all_rows[:max_rows]
    spans = _spans(trace.op_columns, rows)
    gap = step_time_of(trace) * MS / resolution if resolution else 0.0
    bars: Dict[Tuple[int, str], Tuple[List[Tuple[float, float]], Optional[np.ndarray]]] = {}
    for key, (starts, ends) in spans.items():
        if len(starts) > 1 and gap > 0:
            bars[key] = merge_spans(starts * MS, ends * MS, gap)
        else:
            bars[key] = (sorted((a * MS, (b - a) * MS)
                                for a, b in zip(starts.tolist(), ends.tolist())), None)

    fig = Figure(figsize=(12, max(2.5, 1.5 + 0.3 * len(rows))))
    ax = fig.add_subplot()
    categories = set()
    for (i, category), (row_bars, fill) in sorted(bars.items(), key=lambda kv: kv[0]):
        categories.add(category)
        colour = CATEGORY_COLOURS.get(category, OTHER_COLOUR)
        if fill is not None and len(fill) and fill.min() < 1.0:
            colours = np.tile(to_rgba(colour), (len(fill), 1))
            colours[:, 3] = fill
            ax.broken_barh(row_bars, (i - 0.4, 0.8), facecolors=colours, linewidth=0)
        else:
            ax.broken_barh(row_bars, (i - 0.4, 0.8), facecolors=colour, linewidth=0)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([f"{names.get(r, f'gpu{r}')} {s}" for r, s in rows], fontsize=8)
    ax.set_ylim(len(rows) - 0.5, -0.5)  # first row on top
    step_ms = step_time_of(trace) * MS
    ax.set_xlim(0, step_ms if step_ms > 0 else 1.0)
    ax.set_xlabel("time (ms)")
    ax.grid(axis="x", alpha=0.3)
    title = f"Step time {step_ms:.3f} ms"
    if len(all_rows) > len(rows):
        title += f" (first {len(rows)} of {len(all_rows)} rows shown)"
    ax.set_title(title)
    shown = [c for c in CATEGORY_COLOURS] + sorted(categories - set(CATEGORY_COLOURS))
    ax.legend(handles=[Patch(color=CATEGORY_COLOURS.get(c, OTHER_COLOUR), label=c) for c in shown],
              loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    fig.tight_layout()
    return fig


def write_gantt(trace: Trace, path: PathLike, max_rows: int = 64) -> None:
    """Write the Gantt chart of ``trace`` as a PNG to ``path`` (atomically)."""
    save_png(gantt_figure(trace, max_rows), path)
