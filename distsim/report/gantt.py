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
50,000 ops draws as a few thousand bars.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Dict, List, Optional, Tuple

import numpy as np

from distsim.fileio import PathLike
from distsim.report.chrome_trace import stream_tids
from distsim.report.figures import CATEGORY_COLOURS, OTHER_COLOUR, save_png
from distsim.report.summary import MS, step_time_of
from distsim.sim.trace import COMM_STREAM, COMPUTE_STREAM, Trace

if TYPE_CHECKING:     # matplotlib is imported when a chart is drawn (``import distsim`` stays fast)
    from matplotlib.figure import Figure

Row = Tuple[int, str]  # (rank, stream)


def gantt_rows(trace: Trace) -> List[Row]:
    """Every ``(rank, stream)`` row of the chart, in display order."""
    tids = stream_tids(trace)
    rows = {(d.rank, s) for d in trace.devices for s in (COMPUTE_STREAM, COMM_STREAM)}
    rows |= {(op.rank, op.stream) for op in trace.ops}
    return sorted(rows, key=lambda r: (r[0], tids[r[1]]))


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
    index = {row: i for i, row in enumerate(rows)}
    spans: Dict[Tuple[int, str], Tuple[List[float], List[float]]] = {}
    for op in trace.ops:
        i = index.get((op.rank, op.stream))
        if i is not None:
            key = (i, op.category)
            row = spans.get(key)
            if row is None:
                row = spans[key] = ([], [])
            row[0].append(op.start_s)
            row[1].append(op.end_s)
    gap = step_time_of(trace) * MS / resolution if resolution else 0.0
    bars: Dict[Tuple[int, str], Tuple[List[Tuple[float, float]], Optional[np.ndarray]]] = {}
    for key, (starts, ends) in spans.items():
        if len(starts) > 1 and gap > 0:
            bars[key] = merge_spans(np.asarray(starts) * MS, np.asarray(ends) * MS, gap)
        else:
            bars[key] = (sorted((a * MS, (b - a) * MS) for a, b in zip(starts, ends)), None)

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
