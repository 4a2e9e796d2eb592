"""Live memory of each device over a simulated step.

Memory samples are step functions (``live_bytes`` holds from ``time_s``
until the rank's next sample; zero before its first), so they are drawn
with ``where="post"`` steps and extended to the end of the step. Each
distinct device capacity is a dashed horizontal line with its value in the
legend, so an OOM shows as a curve crossing it; a capacity more than
:data:`OFF_SCALE` times the highest peak (a small model on an 80 GB GPU)
is named in the legend as off scale instead, and the axis is scaled to the
curves, in GB, MB, kB or bytes (drawn, the line would squash every curve
to a flat line at zero).

Up to ``max_lines`` devices get one line each. Past that the plot shows the
max-min envelope over all devices (shaded) and the curve of the device
with the highest peak, and the title says so.

A curve with more than ``max_points`` change points is drawn binned
(:func:`downsample_max`): the highest live bytes in each of ``max_points``
equal time bins, so peaks (and an OOM) stay visible while a 50,000-sample
curve draws as a few thousand points.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, List, Tuple

import numpy as np

from distsim.fileio import PathLike
from distsim.report.figures import save_png
from distsim.report.memory_categories import draw_peak_bars, oom_line, peak_bars
from distsim.report.summary import GB, MS, group_label, step_time_of
from distsim.sim.trace import Trace

if TYPE_CHECKING:     # matplotlib is imported when a plot is drawn
    from matplotlib.figure import Figure

#: a capacity more than this many times the highest peak is named in the
#: legend, not drawn (see the module docstring)
OFF_SCALE = 20
#: the y axis unit: the largest whose size the highest peak reaches
UNITS = ((GB, "GB"), (1e6, "MB"), (1e3, "kB"), (1.0, "bytes"))


def axis_unit(peak_bytes: float) -> Tuple[float, str]:
    """``(bytes per unit, name)`` for a y axis whose curves peak at
    ``peak_bytes``: GB down to bytes, so a 300 kB curve reads in kB."""
    return next(((size, name) for size, name in UNITS if peak_bytes >= size), UNITS[-1])

Curve = Tuple[np.ndarray, np.ndarray]  # (times_s, live_bytes), sorted, step-post


def memory_curves(trace: Trace) -> Dict[int, Curve]:
    """Per rank, the step function of live bytes from time 0 to the step end.

    A point at 0 (zero bytes, unless a sample sits there) and one at the end
    (repeating the last value) are added, so every curve spans the step.
    Of several samples at the same time the last one recorded wins.
    """
    samples = trace.memory_columns
    ranks = sorted({d.rank for d in trace.devices} | set(samples.rank.tolist()))
    n = len(samples)
    if n:  # (rank, time, live) columns; sorted by rank, time, then recording order
        r, t, v = (samples.rank.astype(float), samples.time_s,
                   samples.live_bytes.astype(float))
        order = np.lexsort((np.arange(n), t, r))
        r, t, v = r[order], t[order], v[order]
        last = np.ones(n, dtype=bool)           # the last sample of each (rank, time) wins
        last[:-1] = (r[1:] != r[:-1]) | (t[1:] != t[:-1])
        r, t, v = r[last], t[last], v[last]
        bounds = np.searchsorted(r, np.asarray(ranks, dtype=float), side="left")
        stops = np.searchsorted(r, np.asarray(ranks, dtype=float), side="right")
        end = max(step_time_of(trace), float(t.max()))
    else:
        end = step_time_of(trace)
    curves: Dict[int, Curve] = {}
    for k, rank in enumerate(ranks):
        if n and stops[k] > bounds[k]:
            times, values = t[bounds[k]:stops[k]], v[bounds[k]:stops[k]]
            if times[0] > 0:
                times, values = np.r_[0.0, times], np.r_[0.0, values]
        else:
            times, values = np.zeros(1), np.zeros(1)
        curves[rank] = (np.r_[times, end], np.r_[values, values[-1]])
    return curves


def downsample_max(curve: Curve, bins: int) -> Curve:
    """The step function ``curve`` on ``bins`` equal bins of its time span,
    each bin holding the highest value the curve takes inside it; a curve
    with at most ``bins`` points is returned as it is."""
    times, values = curve
    if bins <= 0 or len(times) <= bins:
        return curve
    t0, t1 = float(times[0]), float(times[-1])
    if t1 <= t0:
        return curve
    edges = np.linspace(t0, t1, bins + 1)
    # the value holding at each bin's left edge ...
    at_edge = np.searchsorted(times, edges[:-1], side="right") - 1
    top = values[np.clip(at_edge, 0, None)].copy()
    # ... and every value that starts inside the bin
    idx = np.clip(np.searchsorted(edges, times, side="right") - 1, 0, bins - 1)
    np.maximum.at(top, idx, values)
    return (np.append(edges[:-1], t1), np.append(top, values[-1]))


def envelope(curves: Dict[int, Curve]) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(times, min, max)`` of several step functions on the union of their
    change points; memory is O(points), one vectorised pass per curve."""
    grid = np.unique(np.concatenate([t for t, _ in curves.values()]))
    lo = np.full(grid.shape, np.inf)
    hi = np.full(grid.shape, -np.inf)
    for times, values in curves.values():
        idx = np.searchsorted(times, grid, side="right") - 1
        vals = np.where(idx >= 0, values[np.clip(idx, 0, None)], 0.0)
        np.minimum(lo, vals, out=lo)
        np.maximum(hi, vals, out=hi)
    return grid, lo, hi


def memory_figure(trace: Trace, max_lines: int = 16, max_points: int = 4000) -> Figure:
    """The memory plot as a matplotlib ``Figure`` (not saved); curves of
    more than ``max_points`` points are binned (:func:`downsample_max`).
    ``axes[0]``: live memory over time; ``axes[1]`` (when the trace has
    them): the categories at each device's peak."""
    from matplotlib.figure import Figure

    names = {d.rank: d.name for d in trace.devices}
    curves = {r: downsample_max(c, max_points) for r, c in memory_curves(trace).items()}
    peak = max((float(v.max()) for _, v in curves.values() if len(v)), default=0.0)
    capacities: List[int] = sorted({d.capacity_bytes for d in trace.devices
                                    if d.capacity_bytes > 0})
    drawn = [c for c in capacities if c <= OFF_SCALE * peak]
    unit, unit_name = axis_unit(max([peak] + drawn))
    bars, total_bars = peak_bars(trace)
    bars = bars if any(b.by_category for b in bars) else []
    fig = Figure(figsize=(14 if bars else 10, 5.5 if bars else 5))
    if bars:
        ax, bar_ax = fig.subplots(1, 2, gridspec_kw={"width_ratios": [2.1, 1]})
    else:
        ax, bar_ax = fig.add_subplot(), None
    title = "Live memory per device"
    top = max(curves, key=lambda r: (curves[r][1].max(), -r)) if curves else None
    if curves and len(curves) > max_lines:
        grid, lo, hi = envelope(curves)
        ax.fill_between(grid * MS, lo / unit, hi / unit, step="post", alpha=0.3,
                        color="#4e79a7", label=f"min-max over {len(curves)} devices")
        t, v = curves[top]
        ax.step(t * MS, v / unit, where="post", color="#4e79a7", linewidth=1.2,
                label=f"{names.get(top, f'gpu{top}')} (highest peak)")
        title += f" (envelope of {len(curves)} devices)"
    else:
        groups = same_curves(curves)
        colours = _line_colours(len(groups))
        for k, ranks in enumerate(groups):
            t, v = curves[ranks[0]]
            highest = top in ranks and len(groups) > 1
            label = group_label([names.get(r, f"gpu{r}") for r in ranks], ranks)
            ax.step(t * MS, v / unit, where="post", color=colours[k],
                    linewidth=1.8 if highest else 1.0, zorder=3 if highest else 2,
                    label=label + (" (highest peak)" if highest else ""))
    for cap in capacities:
        if cap in drawn:
            ax.axhline(cap / unit, linestyle="--", color="#e15759", linewidth=1.0,
                       label=f"capacity {cap / GB:.2f} GB")
        else:     # named only: an empty line gives the legend its entry
            why = (f"the peak is {100 * peak / cap:.2g} % of it" if peak > 0
                   else "nothing is live")
            ax.plot([], [], linestyle="--", color="#e15759", linewidth=1.0,
                    label=f"capacity {cap / GB:.2f} GB (off scale: {why})")
    step_ms = step_time_of(trace) * MS
    ax.set_xlim(0, step_ms if step_ms > 0 else None)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("time (ms)")
    ax.set_ylabel(f"live memory ({unit_name})")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0) if bar_ax is None else (0.0, -0.12),
                  fontsize=7, ncol=1 if bar_ax is None else 4, frameon=bar_ax is None)
    if bar_ax is not None:
        draw_peak_bars(bar_ax, bars, total_bars, unit, unit_name, drawn)
        bar_ax.set_xlim(0, max([b.peak for b in bars] + drawn) / unit * 1.05)
    oom = oom_line(peak_bars(trace)[0])
    if oom:
        fig.suptitle(oom, color="#c0392b", fontsize=11, fontweight="bold")
    fig.tight_layout()
    return fig


def same_curves(curves: Dict[int, Curve]) -> List[List[int]]:
    """Consecutive ranks whose curves are equal, grouped (one line each)."""
    groups: List[List[int]] = []
    for rank, (t, v) in curves.items():
        if groups and groups[-1][-1] == rank - 1:
            t0, v0 = curves[groups[-1][0]]
            if np.array_equal(t0, t) and np.array_equal(v0, v):
                groups[-1].append(rank)
                continue
        groups.append([rank])
    return groups


def _line_colours(n: int) -> List[Any]:
    """Distinct colours for up to 10 curves, a sequence (by rank) past that."""
    from matplotlib import colormaps
    if n <= 10:
        return [colormaps["tab10"](i) for i in range(n)]
    return [colormaps["viridis"](i / max(n - 1, 1)) for i in range(n)]


def write_memory_plot(trace: Trace, path: PathLike, max_lines: int = 16) -> None:
    """Write the memory plot of ``trace`` as a PNG to ``path`` (atomically)."""
    save_png(memory_figure(trace, max_lines), path)
