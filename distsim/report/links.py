"""``links.png``: where the network was busy.

With utilisation samples (``Network(record_samples=True)``) the busiest
links are drawn as utilisation over time (one row each, a heatmap);
without, as bars of busy time and bytes carried per link.
"""
from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Optional, Sequence, Union

import numpy as np

from ..fileio import atomic_path
from ..sim.trace import LinkRecord, LinkSample


def busiest(records: Sequence[LinkRecord], top: int) -> List[LinkRecord]:
    return sorted(records, key=lambda r: (-r.busy_s, -r.bytes_carried, r.src, r.dst))[:top]


def link_grid(links: List[LinkRecord], samples: Sequence[LinkSample], end_s: float,
              bins: int = 200) -> np.ndarray:
    """``(len(links), bins)``: per link, the highest utilisation in each of
    ``bins`` equal time bins over ``[0, end_s]`` (a sample holds until the
    link's next one, the last until ``end_s``; 0 before the first).
    Vectorised per link, so a million samples cost a few numpy passes."""
    rows = {(rec.src, rec.dst): i for i, rec in enumerate(links)}
    times: Dict[int, List[float]] = {}
    utils: Dict[int, List[float]] = {}
    for s in samples:
        row = rows.get((s.src, s.dst))
        if row is not None:
            times.setdefault(row, []).append(s.time_s)
            utils.setdefault(row, []).append(s.utilisation)
    grid = np.zeros((len(links), bins))
    edges = np.linspace(0.0, end_s, bins + 1)
    for row in times:
        t = np.asarray(times[row], dtype=float)
        u = np.asarray(utils[row], dtype=float)
        order = np.argsort(t, kind="stable")
        t, u = t[order], u[order]
        stop = np.r_[t[1:], end_s]
        # the bins each sample covers: from the one holding its start to the
        # one holding its end (at least one)
        first = np.searchsorted(edges, t, "right") - 1
        hi = np.minimum(np.maximum(np.searchsorted(edges, stop, "left"), first + 1), bins)
        lo = np.maximum(first, 0)
        # a bin's maximum: the sample holding at its left edge, and every
        # sample starting inside it
        best = np.zeros(bins)
        starts = (lo < hi)
        np.maximum.at(best, lo[starts], u[starts])
        k = np.arange(bins)
        # the last sample started at or before the edge
        holder = np.searchsorted(t, edges[:-1], "right") - 1
        has = holder >= 0
        covered = has & (hi[np.clip(holder, 0, None)] > k)
        best[covered] = np.maximum(best[covered], u[holder[covered]])
        grid[row] = best
    return grid


def _heatmap(fig, ax, links: List[LinkRecord], samples: Sequence[LinkSample], end_s: float,
             bins: int = 200) -> None:
    grid = link_grid(links, samples, end_s, bins)
    im = ax.imshow(grid, aspect="auto", cmap="viridis", vmin=0, vmax=1, interpolation="nearest",
                   extent=(0, end_s * 1e3, len(links) - 0.5, -0.5))
    ax.set_xlabel("time (ms)")
    fig.colorbar(im, ax=ax, label="utilisation")


def plot_links(records: Sequence[LinkRecord], path: Union[str, Path],
               samples: Optional[Sequence[LinkSample]] = None, end_s: Optional[float] = None,
               top: int = 20, title: str = "busiest links") -> None:
    """Write ``links.png`` for the ``top`` busiest links (atomically). A bare
    matplotlib ``Figure`` (no pyplot: no global state, no GUI backend),
    imported here so that ``import distsim`` does not load matplotlib."""
    from matplotlib.figure import Figure
    links = busiest(records, top)
    end = end_s or max((r.busy_s for r in records), default=1.0) or 1.0
    fig = Figure(figsize=(10, 1.5 + 0.3 * max(len(links), 1)))
    ax = fig.subplots()
    labels = [f"{r.src} -> {r.dst}" for r in links]
    if samples:
        _heatmap(fig, ax, links, samples, end)
    elif links:
        y = np.arange(len(links))
        ax.barh(y, [r.busy_s / end * 100 for r in links], color="#4c72b0")
        for yi, r in zip(y, links):
            ax.text(1, yi, f"{r.bytes_carried / 1e9:.2f} GB, peak {r.peak_flows} flows",
                    va="center", fontsize=7, color="white")
        ax.set_xlim(0, 100)
        ax.invert_yaxis()
        ax.set_xlabel("busy time (% of the run)")
    ax.set_yticks(range(len(links)))
    ax.set_yticklabels(labels, fontsize=7)
    ax.set_title(title)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=90, bbox_inches="tight")
