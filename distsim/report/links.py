"""``links.png``: where the network was busy.

With utilisation samples (``Network(record_samples=True)``) the busiest
links are drawn as utilisation over time (one row each, a heatmap);
without, as bars of busy time and bytes carried per link.
"""
from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple, Union

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from ..fileio import atomic_path  # noqa: E402
from ..sim.trace import LinkRecord, LinkSample  # noqa: E402


def busiest(records: Sequence[LinkRecord], top: int) -> List[LinkRecord]:
    return sorted(records, key=lambda r: (-r.busy_s, -r.bytes_carried, r.src, r.dst))[:top]


def _heatmap(ax, links: List[LinkRecord], samples: Sequence[LinkSample], end_s: float,
             bins: int = 200) -> None:
    by_link: Dict[Tuple[str, str], List[LinkSample]] = {}
    for s in samples:
        by_link.setdefault((s.src, s.dst), []).append(s)
    grid = np.zeros((len(links), bins))
    edges = np.linspace(0.0, end_s, bins + 1)
    for row, rec in enumerate(links):
        series = sorted(by_link.get((rec.src, rec.dst), []), key=lambda s: s.time_s)
        for k, s in enumerate(series):
            stop = series[k + 1].time_s if k + 1 < len(series) else end_s
            lo, hi = np.searchsorted(edges, s.time_s, "right") - 1, np.searchsorted(edges, stop, "left")
            grid[row, max(lo, 0):max(hi, lo + 1)] = np.maximum(grid[row, max(lo, 0):max(hi, lo + 1)],
                                                               s.utilisation)
    im = ax.imshow(grid, aspect="auto", cmap="viridis", vmin=0, vmax=1, interpolation="nearest",
                   extent=(0, end_s * 1e3, len(links) - 0.5, -0.5))
    ax.set_xlabel("time (ms)")
    plt.colorbar(im, ax=ax, label="utilisation")


def plot_links(records: Sequence[LinkRecord], path: Union[str, Path],
               samples: Optional[Sequence[LinkSample]] = None, end_s: Optional[float] = None,
               top: int = 20, title: str = "busiest links") -> None:
    """Write ``links.png`` for the ``top`` busiest links (atomically)."""
    links = busiest(records, top)
    end = end_s or max((r.busy_s for r in records), default=1.0) or 1.0
    fig, ax = plt.subplots(figsize=(10, 1.5 + 0.3 * max(len(links), 1)))
    labels = [f"{r.src} -> {r.dst}" for r in links]
    if samples:
        _heatmap(ax, links, samples, end)
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
    plt.close(fig)
