"""Gantt charts of a simulated step: ``gantt.png`` (a lane per device) and
``pipeline.png`` (a lane per pipeline stage).

Each lane has a tall compute band, coloured by phase (forward, backward,
weight gradients of a split backward,
recomputation, optimizer), and two thin bands below it: the collectives,
coloured by kind (TP, SP, DP, ZeRO; a row per process group's stream under
``--comm-streams per-group``, where they overlap), and the pipeline
sends/receives. The
layout is data (:mod:`distsim.report.gantt_layout`; :func:`gantt_chart`
returns it), drawn here with one ``broken_barh`` per (lane, band, key), so
a 250,000-op trace draws in about a second.

The first panel shows the whole step; every op is drawn at least
:data:`MIN_PX` pixels wide (ops closer than that merge), which the title
says. When the micro-batch blocks are too narrow there to carry their
numbers, a second panel zooms on the step's first milliseconds, at true
width, numbered (the pipeline warm-up and steady state: the classic 1F1B
picture); the first panel shades that window and both titles give it.
Lanes of devices that stand for others (``--symmetry``) say which.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, List, Optional, Sequence, Tuple

import numpy as np

from distsim.fileio import PathLike
from distsim.report.figures import save_png
from distsim.report.gantt_layout import (Bars, Lane, Task, device_lanes, full_window, lane_bars,
                                         lane_tasks, min_width_ms, stage_lanes, zoom_window)
from distsim.report.phases import (COMM_KEYS, COMPUTE_KEYS, KEY_COLOURS, RecordPhases,
                                   record_phases)
from distsim.report.summary import MS, step_time_of
from distsim.sim.trace import Trace

if TYPE_CHECKING:     # matplotlib is imported when a chart is drawn (``import distsim`` stays fast)
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

#: the narrowest bar, in pixels: shorter ops are widened to it
MIN_PX = 2.0
#: the faintest bar: a merged bar is as opaque as the share of it that ops cover, at least this
MIN_ALPHA = 0.35
#: pixels a micro-batch block needs per character of its number
CHAR_PX = 7.0
FIG_WIDTH_IN = 14.0
DPI = 100
_LEFT, _RIGHT = 0.13, 0.80
AXIS_PX = FIG_WIDTH_IN * DPI * (_RIGHT - _LEFT)
#: band extents in a lane [y, y + 1): (top, height)
_BAND_Y = ((0.06, 0.50), (0.60, 0.15), (0.78, 0.15))


@dataclass
class Panel:
    """One panel: its window (ms), bars, tasks and minimum bar width (ms)."""

    window: Tuple[float, float]
    bars: List[Bars]
    tasks: List[Task]
    min_width_ms: float
    title: str


@dataclass
class GanttChart:
    """What a Gantt chart draws: the lanes shown (of ``total_lanes``) and
    one or two panels (the whole step, then the zoom if any)."""

    view: str
    lanes: List[Lane]
    total_lanes: int
    panels: List[Panel]
    step_ms: float


def _lanes(trace: Trace, phases: RecordPhases, view: str) -> List[Lane]:
    if view == "devices":
        return device_lanes(trace)
    if view == "stages":
        return stage_lanes(trace, phases)
    raise ValueError(f"view: must be 'devices' or 'stages', got {view!r}")


def gantt_chart(trace: Trace, program: Any = None, view: str = "devices",
                max_lanes: int = 32, phases: Optional[RecordPhases] = None) -> GanttChart:
    """The layout of a Gantt chart of ``trace`` (``program``: the simulated
    program, whose op metadata gives phases, kinds and micro-batches)."""
    phases = phases if phases is not None else record_phases(trace, program)
    every = _lanes(trace, phases, view)
    lanes = every[:max_lanes]
    step_ms = step_time_of(trace) * MS
    whole = full_window(trace)
    tasks = lane_tasks(trace, phases, lanes, whole)
    zoom = zoom_window(tasks, whole[1], AXIS_PX)
    what = "a lane per device" if view == "devices" else "a lane per pipeline stage"
    shown = (f"; first {len(lanes)} of {len(every)} "
             f"{'devices' if view == 'devices' else 'stages'}" if len(lanes) < len(every) else "")
    title = (f"Step time {step_ms:,.3f} ms: {what}{shown}; ops shorter than {MIN_PX:g} px "
             "drawn that wide; merged runs of sparse ops fainter")
    if zoom:
        title += f"; zoom below: {zoom[0]:,.1f}-{zoom[1]:,.1f} ms"
    panels = [_panel(trace, phases, lanes, whole, tasks, title)]
    if zoom:
        panels.append(_panel(trace, phases, lanes, zoom, None,
                             f"Zoom: {zoom[0]:,.1f}-{zoom[1]:,.1f} ms of {step_ms:,.1f} ms, "
                             "micro-batch numbers on forward and backward blocks"))
    return GanttChart(view, lanes, len(every), panels, step_ms)


def _panel(trace: Trace, phases: RecordPhases, lanes: Sequence[Lane],
           window: Tuple[float, float], tasks: Optional[List[Task]], title: str) -> Panel:
    width = min_width_ms(window, AXIS_PX, MIN_PX)
    if tasks is None:
        tasks = lane_tasks(trace, phases, lanes, window)
    return Panel(window, lane_bars(trace, phases, lanes, window, width), tasks, width, title)


def _colours(bars: Bars) -> np.ndarray:
    """RGBA per bar: the key's colour, as opaque as the share of the bar's
    span that its ops cover (at least :data:`MIN_ALPHA`, so that none
    vanishes): a lone op is opaque however short, merged sparse ops faint."""
    from matplotlib.colors import to_rgba
    colours = np.tile(to_rgba(KEY_COLOURS[bars.key]), (len(bars.starts), 1))
    colours[:, 3] = np.clip(bars.share(), MIN_ALPHA, 1.0)
    return colours


def _draw_panel(ax: "Axes", chart: GanttChart, panel: Panel,
                zoom: Optional[Tuple[float, float]]) -> None:
    for bars in panel.bars:
        top, height = _BAND_Y[bars.band]
        height /= bars.rows                   # a band's rows: one per communication stream
        top += bars.row * height
        ax.broken_barh(list(zip(bars.starts.tolist(), bars.widths.tolist())),
                       (bars.lane + top, height), facecolors=_colours(bars), linewidth=0)
    px_per_ms = AXIS_PX / max(panel.window[1] - panel.window[0], 1e-12)
    top, height = _BAND_Y[0]
    for task in panel.tasks:
        text = str(task.microbatch)
        half = task.label_width_ms / 2
        lo = max(task.label_ms - half, panel.window[0])
        hi = min(task.label_ms + half, panel.window[1])
        if (hi - lo) * px_per_ms >= CHAR_PX * len(text) + 3:
            ax.text((lo + hi) / 2, task.lane + top + height / 2, text, ha="center",
                    va="center", fontsize=7, color="white", clip_on=True)
    n = len(chart.lanes)
    ax.set_yticks([i + _BAND_Y[0][0] + _BAND_Y[0][1] / 2 for i in range(n)])
    ax.set_yticklabels([lane.label for lane in chart.lanes], fontsize=7)
    ax.set_ylim(n, 0)
    for i in range(1, n):
        ax.axhline(i, color="#dddddd", linewidth=0.6)
    ax.set_xlim(*panel.window)
    ax.set_xlabel("time (ms)")
    ax.grid(axis="x", alpha=0.3)
    ax.set_title(panel.title, fontsize=9, loc="left")
    if zoom is not None:
        ax.axvspan(zoom[0], zoom[1], color="#000000", alpha=0.06, linewidth=0)


def _legend(ax: "Axes", chart: GanttChart) -> None:
    """One legend: the compute phases, then the communication kinds drawn."""
    from matplotlib.patches import Patch
    keys = {b.key for p in chart.panels for b in p.bars}
    rows = max((b.rows for p in chart.panels for b in p.bars), default=1)
    collectives = (f"collectives (a row per\nprocess group: {rows})" if rows > 1
                   else "collectives")
    handles = []
    for header, group in (("compute (tall bars)", COMPUTE_KEYS),
                          (f"communication (thin bars:\n{collectives}, then p2p)", COMM_KEYS)):
        shown = [k for k in group if k in keys]
        if shown:
            handles.append(Patch(visible=False, label=header))
            handles += [Patch(color=KEY_COLOURS[k], label=k) for k in shown]
    if handles:
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)


def chart_figure(chart: GanttChart) -> "Figure":
    """Draw a :class:`GanttChart`: its panels one above the other."""
    from matplotlib.figure import Figure
    n = max(len(chart.lanes), 1)
    lane_in = 0.5 if n <= 4 else 0.42 if n <= 16 else 0.3
    top_in, bottom_in = 0.35, 0.6          # a panel's title; its time axis
    panel_in = lane_in * n + top_in + bottom_in
    height = panel_in * len(chart.panels) + 0.1
    fig = Figure(figsize=(FIG_WIDTH_IN, height), dpi=DPI)
    zoom = chart.panels[1].window if len(chart.panels) > 1 else None
    for i, panel in enumerate(chart.panels):
        bottom = height - 0.05 - panel_in * (i + 1) + bottom_in
        ax = fig.add_axes((_LEFT, bottom / height, _RIGHT - _LEFT, lane_in * n / height))
        _draw_panel(ax, chart, panel, zoom if i == 0 else None)
        if i == 0:
            _legend(ax, chart)
    return fig


def gantt_figure(trace: Trace, program: Any = None, view: str = "devices",
                 max_lanes: int = 32) -> "Figure":
    """The Gantt chart as a matplotlib ``Figure`` (not saved)."""
    return chart_figure(gantt_chart(trace, program, view, max_lanes))


def write_gantt(trace: Trace, path: PathLike, program: Any = None, view: str = "devices",
                max_lanes: int = 32) -> None:
    """Write a Gantt chart of ``trace`` as a PNG to ``path`` (atomically)."""
    save_png(gantt_figure(trace, program, view, max_lanes), path)


def has_stages(trace: Trace, phases: RecordPhases) -> bool:
    """Whether the trace's records belong to more than one pipeline stage."""
    return len(set(np.unique(phases.stage[phases.stage >= 0]).tolist())) > 1
