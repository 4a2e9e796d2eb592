"""A Gantt chart of a simulated step: one row per device stream.

Rows are ``gpu3 compute`` / ``gpu3 comm`` (every device gets its compute and
comm rows, busy or not, plus any other stream it used), ordered by rank
then stream; bars are coloured by op category. Each row is drawn with one
``broken_barh`` per category, so a million-op trace stays fast. Past
``max_rows`` rows only the first ``max_rows`` are drawn, and the title says so.
"""
from __future__ import annotations

from typing import Dict, List, Tuple

from matplotlib.figure import Figure
from matplotlib.patches import Patch

from distsim.fileio import PathLike
from distsim.report.chrome_trace import stream_tids
from distsim.report.figures import CATEGORY_COLOURS, OTHER_COLOUR, save_png
from distsim.report.summary import MS, step_time_of
from distsim.sim.trace import COMM_STREAM, COMPUTE_STREAM, Trace

Row = Tuple[int, str]  # (rank, stream)


def gantt_rows(trace: Trace) -> List[Row]:
    """Every ``(rank, stream)`` row of the chart, in display order."""
    tids = stream_tids(trace)
    rows = {(d.rank, s) for d in trace.devices for s in (COMPUTE_STREAM, COMM_STREAM)}
    rows |= {(op.rank, op.stream) for op in trace.ops}
    return sorted(rows, key=lambda r: (r[0], tids[r[1]]))


def gantt_figure(trace: Trace, max_rows: int = 64) -> Figure:
    """The Gantt chart as a matplotlib ``Figure`` (not saved)."""
    names = {d.rank: d.name for d in trace.devices}
    all_rows = gantt_rows(trace)
    rows = all_rows[:max_rows]
    index = {row: i for i, row in enumerate(rows)}
    bars: Dict[Tuple[int, str], List[Tuple[float, float]]] = {}
    for op in trace.ops:
        i = index.get((op.rank, op.stream))
        if i is not None:
            bars.setdefault((i, op.category), []).append((op.start_s * MS, (op.end_s - op.start_s) * MS))

    fig = Figure(figsize=(12, max(2.5, 1.5 + 0.3 * len(rows))))
    ax = fig.add_subplot()
    categories = set()
    for (i, category), spans in sorted(bars.items()):
        categories.add(category)
        ax.broken_barh(sorted(spans), (i - 0.4, 0.8), facecolors=CATEGORY_COLOURS.get(category, OTHER_COLOUR),
                       linewidth=0)
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
