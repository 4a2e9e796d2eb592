"""The chart of a :class:`~distsim.report.compare.Comparison`: a bar per
run in four panels: where the step's time goes (mean compute, exposed
communication, idle: they add up to the step time), throughput with MFU,
peak memory by category (of the device that peaks highest) with the
capacity, and the mean use of the busiest links."""
from __future__ import annotations

from typing import TYPE_CHECKING, List

from distsim.report.memory_categories import CATEGORIES, CATEGORY_COLOURS, CATEGORY_LABELS
from distsim.report.summary import GB, MS

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

TIME_PARTS = (("compute_s", "compute", "#4e79a7"),
              ("exposed_communication_s", "exposed communication", "#e15759"),
              ("idle_s", "idle (incl. bubble)", "#bab0ac"))


#: a capacity more than this many times the highest peak is named, not drawn
OFF_SCALE = 3


def _legend_below(ax: "Axes") -> None:
    handles, labels = ax.get_legend_handles_labels()
    ax.legend(handles, labels, fontsize=7, loc="upper left", bbox_to_anchor=(0.0, -0.32),
              ncol=len(labels), frameon=False)


def _time(ax: "Axes", comparison, labels: List[str]) -> None:
    for i, run in enumerate(comparison.runs):
        left = 0.0
        for key, name, colour in TIME_PARTS:
            width = run.summary.get(key, 0.0) * MS
            ax.barh(i, width, left=left, color=colour, height=0.6, label=name if i == 0 else None)
            left += width
        ax.text(left, i, f" {run.summary['step_time_s'] * MS:,.1f} ms", va="center", fontsize=8)
    ax.set_xlabel("ms per step (mean over devices)")
    ax.set_title("Step time", loc="left", fontsize=10)
    _legend_below(ax)
    ax.margins(x=0.18)


def _compact(x: float) -> str:
    """``1.25M``, ``750k``: a tick label that stays short."""
    for scale, unit in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= scale:
            return f"{x / scale:g}{unit}"
    return f"{x:g}"


def _throughput(ax: "Axes", comparison) -> None:
    key = "tokens_per_s" if any("tokens_per_s" in r.summary for r in comparison.runs) else None
    for i, run in enumerate(comparison.runs):
        s = run.summary
        value = s.get(key, 0.0) if key else (1.0 / s["step_time_s"] if s["step_time_s"] else 0.0)
        ax.barh(i, value, color="#59a14f", height=0.6)
        text = f" {value:,.0f}" if key else f" {value:,.2f}"
        if s.get("mfu") is not None:
            text += f"  (MFU {100 * s['mfu']:.1f} %)"
        ax.text(value, i, text, va="center", fontsize=8)
    ax.set_xlabel("tokens / s" if key else "steps / s")
    from matplotlib.ticker import FuncFormatter
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: _compact(x)))
    ax.set_title("Throughput", loc="left", fontsize=10)
    ax.margins(x=0.35)


def _memory(ax: "Axes", comparison) -> None:
    caps = set()
    labelled = set()
    for i, run in enumerate(comparison.runs):
        s = run.summary
        cats = (s.get("memory_by_category") or {}).get(str(s.get("max_peak_memory_rank")), {})
        left = 0.0
        if not cats:
            ax.barh(i, s["max_peak_memory_bytes"] / GB, color="#9c9c9c", height=0.6)
            left = s["max_peak_memory_bytes"] / GB
        for c in CATEGORIES:
            width = cats.get(c, 0) / GB
            if width > 0:
                ax.barh(i, width, left=left, color=CATEGORY_COLOURS[c], height=0.6,
                        label=None if c in labelled else CATEGORY_LABELS[c])
                labelled.add(c)
                left += width
        ax.text(left, i, f" {s['max_peak_memory_bytes'] / GB:.1f} GB"
                + (" OOM" if s.get("oom") else ""), va="center", fontsize=8,
                color="#c0392b" if s.get("oom") else "black")
        caps.update(d.get("capacity_bytes", 0) for d in s.get("devices", []))
    peak = max(r.summary["max_peak_memory_bytes"] for r in comparison.runs)
    drawn = [c for c in sorted(caps) if c and c <= OFF_SCALE * peak]
    for cap in drawn:
        ax.axvline(cap / GB, linestyle="--", color="#e15759", linewidth=1.0)
    far = [c for c in sorted(caps) if c and c not in drawn]
    ax.set_xlabel("GB at the peak (the device that peaks highest)"
                  + ("; dashed: capacity" if drawn else "")
                  + "".join(f"; capacity {c / GB:.0f} GB off scale" for c in far))
    ax.set_title("Peak memory", loc="left", fontsize=10)
    if labelled:
        _legend_below(ax)
    ax.margins(x=0.2)


def _links(ax: "Axes", comparison) -> None:
    for i, run in enumerate(comparison.runs):
        links = run.summary.get("links") or []
        mean = 100 * sum(k["utilisation"] for k in links) / len(links) if links else 0.0
        top = 100 * links[0]["utilisation"] if links else 0.0
        ax.barh(i, mean, color="#f28e2b", height=0.6, label="16 busiest: mean" if i == 0 else None)
        ax.plot([top], [i], marker="|", markersize=14, color="#000000",
                label="busiest link" if i == 0 else None)
        ax.text(max(mean, top), i, f" {mean:.1f} %", va="center", fontsize=8)
    ax.set_xlabel("mean utilisation over the step (%)")
    ax.set_title("Network links", loc="left", fontsize=10)
    _legend_below(ax)
    ax.margins(x=0.2)


def comparison_figure(comparison) -> "Figure":
    """The chart (see the module docstring)."""
    from matplotlib.figure import Figure
    labels = comparison.labels
    n = len(labels)
    fig = Figure(figsize=(13, 3.0 + 1.0 * n), dpi=100)
    axes = fig.subplots(2, 2)
    _time(axes[0][0], comparison, labels)
    _throughput(axes[0][1], comparison)
    _memory(axes[1][0], comparison)
    _links(axes[1][1], comparison)
    for ax in axes.flat:
        ax.set_yticks(range(n))
        ax.set_yticklabels(labels, fontsize=8)
        ax.set_ylim(n - 0.5, -0.5)
        ax.grid(axis="x", alpha=0.3)
    fig.suptitle(f"{' vs '.join(labels)} (baseline: {labels[0]})", fontsize=11)
    fig.tight_layout()
    return fig
