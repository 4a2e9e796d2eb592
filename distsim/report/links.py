"""``links.png``: how busy the busiest network links were.

The links are those ``summary.json`` lists (:func:`~distsim.report.summary.ranked_links`:
the :data:`~distsim.report.summary.TOP_LINKS` busiest, in its order). With
utilisation samples (``record_links``) each link is a row of a heatmap
whose cells are the **mean** utilisation over equal time bins (the integral
of the sampled step function over the bin, divided by its length), so the
mean of a row is the link's mean over the step, the ``utilisation`` that
``summary.json`` gives, which each row's label repeats. Without samples,
bars of each link's mean utilisation and busy time.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from distsim.fileio import atomic_path
from distsim.report.summary import MS, TOP_LINKS, ranked_links
from distsim.sim.trace import LinkRecord, LinkSample

if TYPE_CHECKING:     # matplotlib is imported when the chart is drawn
    from matplotlib.figure import Figure

#: time bins of the heatmap
BINS = 200


def busiest(records: Sequence[LinkRecord], top: int = TOP_LINKS) -> List[LinkRecord]:
    """The ``top`` busiest links, as summary.json ranks them."""
    return ranked_links(records)[:top]


def _series(links: Sequence[LinkRecord], samples: Sequence[LinkSample]
            ) -> Dict[int, Tuple[np.ndarray, np.ndarray]]:
    """Row -> (times, utilisations) of the samples of each of ``links``,
    sorted by time (samples at the same time kept in their order)."""
    rows = {(rec.src, rec.dst): i for i, rec in enumerate(links)}
    times: Dict[int, List[float]] = {}
    utils: Dict[int, List[float]] = {}
    for src, dst, t, u in samples:
        row = rows.get((src, dst))
        if row is not None:
            times.setdefault(row, []).append(t)
            utils.setdefault(row, []).append(u)
    out = {}
    for row in times:
        t = np.asarray(times[row], dtype=float)
        u = np.asarray(utils[row], dtype=float)
        order = np.argsort(t, kind="stable")
        out[row] = (t[order], u[order])
    return out


def integral_at(times: np.ndarray, values: np.ndarray, at: np.ndarray) -> np.ndarray:
    """The integral from 0 to each of ``at`` of the step function that is 0
    before ``times[0]`` and ``values[k]`` from ``times[k]`` on (of several
    samples at one time, the last holds)."""
    span = np.diff(times, append=times[-1])
    cum = np.r_[0.0, np.cumsum(values[:-1] * span[:-1])]     # integral up to times[k]
    k = np.searchsorted(times, at, side="right") - 1
    inside = k >= 0
    kk = np.clip(k, 0, None)
    return np.where(inside, cum[kk] + values[kk] * (at - times[kk]), 0.0)


def link_utilisation(links: Sequence[LinkRecord], samples: Sequence[LinkSample],
                     end_s: float, bins: int = BINS) -> np.ndarray:
    """``(len(links), bins)``: per link, the mean utilisation in each of
    ``bins`` equal time bins over ``[0, end_s]`` (a sample holds until the
    link's next one; 0 before the first). Per link a few numpy passes."""
    grid = np.zeros((len(links), bins))
    if end_s <= 0 or bins < 1:
        return grid
    edges = np.linspace(0.0, end_s, bins + 1)
    for row, (t, u) in _series(links, samples).items():
        grid[row] = np.diff(integral_at(t, u, edges)) / np.diff(edges)
    return grid


@dataclass
class LinkChart:
    """What links.png draws: the links, each one's mean utilisation over
    the step, and (with samples) the per-bin means and the bin width (s)."""

    links: List[LinkRecord]
    mean: np.ndarray
    grid: Optional[np.ndarray]
    bin_s: float
    end_s: float


def link_chart(records: Sequence[LinkRecord], samples: Optional[Sequence[LinkSample]],
               end_s: float, top: int = TOP_LINKS, bins: int = BINS) -> LinkChart:
    """The data of links.png (see the module docstring)."""
    links = busiest(records, top)
    mean = np.array([r.bytes_carried / (r.bandwidth_Bps * end_s) if end_s > 0 else 0.0
                     for r in links])
    grid = link_utilisation(links, samples, end_s, bins) if samples else None
    return LinkChart(links, mean, grid, end_s / bins if grid is not None else 0.0, end_s)


def _pct(x: float) -> str:
    return f"{100 * x:.3g} %" if x else "0 %"


def link_figure(chart: LinkChart) -> "Figure":
    """Draw a :class:`LinkChart`."""
    from matplotlib.figure import Figure
    n = len(chart.links)
    fig = Figure(figsize=(11, 1.6 + 0.28 * max(n, 1)), dpi=100)
    ax = fig.subplots()
    labels = [f"{r.src} -> {r.dst}   mean {_pct(m)}" for r, m in zip(chart.links, chart.mean)]
    if chart.grid is not None and n:
        top = max(float(chart.grid.max()), 0.01)
        im = ax.imshow(100 * chart.grid, aspect="auto", cmap="viridis", vmin=0, vmax=100 * top,
                       interpolation="nearest",
                       extent=(0, chart.end_s * MS, n - 0.5, -0.5))
        ax.set_xlabel("time (ms)")
        fig.colorbar(im, ax=ax, label="utilisation (%)", pad=0.01)
        title = (f"Mean utilisation per {chart.bin_s * MS:.3g} ms bin of the {n} busiest "
                 "links (summary.json's); each label: the mean over the step")
    elif n:
        y = np.arange(n)
        ax.barh(y, 100 * chart.mean, color="#4e79a7", height=0.6, label="mean utilisation")
        busy = [r.busy_s / chart.end_s * 100 if chart.end_s > 0 else 0.0 for r in chart.links]
        ax.scatter(busy, y, marker="|", s=120, color="#e15759", label="busy time")
        ax.set_xlim(0, 100)
        ax.invert_yaxis()
        ax.set_xlabel("% of the step")
        ax.legend(loc="lower right", fontsize=8)
        title = (f"The {n} busiest links (summary.json's): mean utilisation (bars) and time "
                 "with traffic (marks); no samples over time were recorded")
    else:
        ax.text(0.5, 0.5, "no traffic crossed the network", ha="center", va="center",
                transform=ax.transAxes)
        ax.set_xticks([])
        title = "Network links"
    ax.set_yticks(range(n))
    ax.set_yticklabels(labels, fontsize=7)
    ax.set_title(title, fontsize=9, loc="left")
    fig.tight_layout()
    return fig


def plot_links(records: Sequence[LinkRecord], path: Union[str, Path],
               samples: Optional[Sequence[LinkSample]] = None, end_s: Optional[float] = None,
               top: int = TOP_LINKS) -> LinkChart:
    """Write ``links.png`` for the ``top`` busiest links (atomically) and
    return what it shows; ``end_s``: the step time."""
    end = end_s or max((r.busy_s for r in records), default=1.0) or 1.0
    chart = link_chart(records, samples, end, top)
    fig = link_figure(chart)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=100)
    return chart
