"""What fills memory at each device's peak: the right panel of ``memory.png``.

The simulator records, per device, the bytes of each category (weights,
gradients, optimizer state, activations, temporaries) live at the moment
of its peak (``trace.meta["peak_memory_by_category"]``, the summary's
``memory_by_category``). Consecutive ranks with the same split share a
bar (``gpu0-3``); past :data:`MAX_BARS` bars, those of the highest peaks
are kept, the device that peaks highest always among them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Dict, List, Optional, Tuple

from distsim.report.summary import GB, group_label
from distsim.sim.trace import Trace

if TYPE_CHECKING:
    from matplotlib.axes import Axes

#: memory categories, bottom of the stack first
CATEGORIES: Tuple[str, ...] = ("weights", "gradients", "optimizer", "activations", "temporaries")
CATEGORY_LABELS = {"weights": "weights", "gradients": "gradients",
                   "optimizer": "optimizer state", "activations": "activations",
                   "temporaries": "temporaries"}
CATEGORY_COLOURS = {"weights": "#4e79a7", "gradients": "#59a14f", "optimizer": "#b07aa1",
                    "activations": "#f28e2b", "temporaries": "#bab0ac"}
MAX_BARS = 16


@dataclass(frozen=True)
class PeakBar:
    """One bar: ``label`` (``gpu0-3``), its ranks, bytes per category at the
    peak, the peak and the capacity."""

    label: str
    ranks: Tuple[int, ...]
    by_category: Dict[str, int]
    peak: int
    capacity: int


def peak_bars(trace: Trace) -> Tuple[List[PeakBar], int]:
    """The bars (by rank) and how many groups there were in all."""
    split = {int(r): {str(k): int(v) for k, v in c.items()}
             for r, c in (trace.meta.get("peak_memory_by_category") or {}).items()}
    peaks = trace.peak_memory()
    devices = sorted(trace.devices, key=lambda d: d.rank)
    groups: List[Tuple[List[str], List[int], Dict[str, int], int, int]] = []
    for d in devices:
        cats = split.get(d.rank, {})
        peak = peaks.get(d.rank, 0)
        if groups and groups[-1][2] == cats and groups[-1][3] == peak \
                and groups[-1][4] == d.capacity_bytes and groups[-1][1][-1] == d.rank - 1:
            groups[-1][0].append(d.name)
            groups[-1][1].append(d.rank)
        else:
            groups.append(([d.name], [d.rank], cats, peak, d.capacity_bytes))
    represented = {int(r): len(m) for r, m in
                   (trace.meta.get("represented_ranks") or {}).items()}
    bars = [PeakBar(group_label(names, ranks) + _stands_for(ranks, represented), tuple(ranks),
                    cats, peak, cap)
            for names, ranks, cats, peak, cap in groups]
    if len(bars) > MAX_BARS:
        keep = sorted(range(len(bars)), key=lambda i: (-bars[i].peak, i))[:MAX_BARS]
        bars = [bars[i] for i in sorted(keep)]
    return bars, len(groups)


def _stands_for(ranks: List[int], represented: Dict[int, int]) -> str:
    """`` (for 64)`` when the devices stand for others (``--symmetry``)."""
    n = sum(represented.get(r, 1) for r in ranks)
    return f" (for {n})" if n > len(ranks) else ""


def oom_line(bars: List[PeakBar]) -> Optional[str]:
    """The sentence naming the overflow of the device that peaks highest,
    and its largest category; None when every device fits."""
    over = [b for b in bars if b.capacity > 0 and b.peak > b.capacity]
    if not over:
        return None
    worst = max(over, key=lambda b: (b.peak, -b.ranks[0]))
    line = (f"OUT OF MEMORY: {worst.label} peaks at {worst.peak / GB:.2f} GB, over its "
            f"{worst.capacity / GB:.2f} GB")
    if worst.by_category:
        cat, size = max(worst.by_category.items(), key=lambda kv: (kv[1], kv[0]))
        line += f"; largest: {CATEGORY_LABELS.get(cat, cat)} ({size / GB:.2f} GB)"
    return line


def draw_peak_bars(ax: "Axes", bars: List[PeakBar], total: int, unit: float,
                   unit_name: str, drawn_capacities: List[int]) -> None:
    """Horizontal stacked bars, one per group, top to bottom by rank."""
    top = max(bars, key=lambda b: (b.peak, -b.ranks[0])) if bars else None
    labelled = set()
    for i, bar in enumerate(bars):
        left = 0.0
        for cat in CATEGORIES + tuple(sorted(set(bar.by_category) - set(CATEGORIES))):
            size = bar.by_category.get(cat, 0) / unit
            if size > 0:
                ax.barh(i, size, left=left, color=CATEGORY_COLOURS.get(cat, "#9c9c9c"),
                        height=0.7,
                        label=None if cat in labelled else CATEGORY_LABELS.get(cat, cat))
                labelled.add(cat)
                left += size
    for cap in drawn_capacities:
        ax.axvline(cap / unit, linestyle="--", color="#e15759", linewidth=1.0)
        ax.text(cap / unit, len(bars) - 0.55, "capacity ", color="#e15759", fontsize=7,
                ha="right", va="bottom")
    ax.set_yticks(range(len(bars)))
    ax.set_yticklabels([b.label + (" (highest)" if b is top and len(bars) > 1 else "")
                        for b in bars], fontsize=7)
    ax.set_ylim(len(bars) - 0.5, -0.5)
    ax.set_xlabel(f"memory at the device's peak ({unit_name})")
    shown = f" ({len(bars)} of {total} groups: the highest peaks)" if total > len(bars) else ""
    ax.set_title(f"By category at each device's peak{shown}", fontsize=9, loc="left")
    handles, labels = ax.get_legend_handles_labels()
    by_label = dict(zip(labels, handles))
    order = [CATEGORY_LABELS[c] for c in CATEGORIES if CATEGORY_LABELS[c] in by_label]
    order += [k for k in by_label if k not in order]
    if order:
        ax.legend([by_label[k] for k in order], order, loc="upper left",
                  bbox_to_anchor=(0.0, -0.16), ncol=3, fontsize=7, frameon=False)
    ax.grid(axis="x", alpha=0.3)
