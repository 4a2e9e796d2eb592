"""Charts of a sweep (the DataFrame of :func:`distsim.sweep`).

"Best" is the objective of :func:`objective`: the shortest step when every
point trains the same number of samples per step (a fixed global batch,
what sweeps and searches of strategies have), otherwise the highest
throughput (tokens/s, else samples/s) -- a shorter step over a smaller
batch is not better. :func:`ranked` sorts points best first.

* :func:`heatmap_figure`: the best point over two chosen options (other
  options: the best feasible value), showing its step time at a common
  batch, else its throughput; cells say ``OOM`` when every simulated
  point there runs out of memory, ``-`` when none could be simulated;
* :func:`scaling_figure`: throughput against GPU count (the best feasible
  configuration per count, one line per ``hue`` value) with ideal linear
  scaling dashed;
* :func:`pareto_figure`: peak memory per GPU against the objective (step
  time, or throughput when batches differ), every simulated point, OOM
  points marked with a red cross, the Pareto front of the feasible ones
  drawn, the device capacity dashed;
* :func:`breakdown_figure`: per configuration (best first), the step
  split into compute / exposed communication / pipeline bubble / other idle,
  bars of points that run out of memory marked ``OOM``, each bar named by
  the options that differ among those shown (:mod:`distsim.report.sweep_labels`).

:func:`write_sweep_charts` writes all four PNGs. A chart with nothing to show
still renders, saying so, so a sweep where every point failed still gets
its report. Figures are plain :class:`~matplotlib.figure.Figure` objects.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from distsim.errors import ConfigError
from distsim.fileio import PathLike
from distsim.report.figures import CATEGORY_COLOURS, OTHER_COLOUR, save_png
from distsim.report.summary import GB, MS
from distsim.report.sweep_labels import config_labels, split_options, value_text

CHART_FILES = {"heatmap": "heatmap.png", "scaling": "scaling.png", "pareto": "pareto.png",
               "breakdown": "breakdown.png"}
BUBBLE_COLOUR = "#e15759"
OOM_COLOUR = "#d62728"


def param_columns(df: pd.DataFrame) -> List[str]:
    """The option columns of a sweep frame (between ``key`` and ``status``)."""
    cols = list(df.columns)
    if "key" in cols and "status" in cols:
        return cols[cols.index("key") + 1:cols.index("status")]
    return [c for c in cols if c not in ("index", "key", "status", "reason")]


def varying_params(df: pd.DataFrame) -> List[str]:
    """Option columns that take more than one value."""
    return split_options(df, param_columns(df))[0]


def simulated(df: pd.DataFrame) -> pd.DataFrame:
    return df[(df["status"] == "ok") & df["step_time_s"].notna()]


def feasible(df: pd.DataFrame) -> pd.DataFrame:
    ok = simulated(df)
    return ok[~ok["oom"].fillna(False).astype(bool)]


@dataclass(frozen=True)
class Objective:
    """What "best" means for a frame: ``column`` (``step_time_s`` or a
    throughput), ``higher`` (whether larger is better), ``label`` and
    ``scale`` (for display), ``batch`` (the common samples per step, or None)."""

    column: str
    higher: bool
    label: str
    scale: float
    batch: Optional[float]


def samples_per_step(df: pd.DataFrame) -> pd.Series:
    """Samples each point trains per step: the resolved global batch, else
    throughput x step time."""
    derived = (df["samples_per_s"] * df["step_time_s"]).round(6)
    if "resolved_global_batch" in df:
        known = pd.to_numeric(df["resolved_global_batch"], errors="coerce").astype("float64")
        return known.fillna(derived)
    return derived


def objective(df: pd.DataFrame) -> Objective:
    """Step time when every simulated point trains the same samples per
    step (then it ranks as throughput does), else throughput."""
    ok = simulated(df)
    sizes = set(samples_per_step(ok).dropna()) if len(ok) else set()
    if len(sizes) <= 1:
        batch = next(iter(sizes), None)
        return Objective("step_time_s", False, "step time (ms)", MS, batch)
    col, label = throughput_column(df)
    return Objective(col, True, label.replace("throughput (", "").rstrip(")"), 1.0, None)


def ranked(df: pd.DataFrame) -> pd.DataFrame:
    """The simulated points, best first by :func:`objective` (ties: index)."""
    ok = simulated(df)
    obj = objective(df)
    key = -ok[obj.column] if obj.higher else ok[obj.column]
    return ok.assign(_key=key.fillna(math.inf)).sort_values(["_key", "index"]).drop(
        columns="_key")


def _empty(ax, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, fontsize=12,
            color="#555555")
    ax.set_xticks([])
    ax.set_yticks([])


def _sort_key(values) -> List:
    """Numbers numerically, then the rest as text."""
    def key(v):
        try:
            return (0, float(v), "")
        except (TypeError, ValueError):
            return (1, 0.0, str(v))
    return sorted(values, key=key)


def heatmap_axes(df: pd.DataFrame, heatmap: Optional[Sequence[str]] = None) -> Tuple[str, str]:
    """The two options of the heatmap: ``heatmap`` if given, else the first
    two varying options (one varying option: it against itself is useless,
    so against the GPU count)."""
    if heatmap:
        x, y = heatmap
        for c in (x, y):
            if c not in df.columns:
                raise ConfigError(f"heatmap: {c!r} is not a column of the sweep")
        return x, y
    vary = varying_params(df)
    if len(vary) >= 2:
        return vary[0], vary[1]
    if len(vary) == 1:
        return vary[0], "num_devices"
    cols = param_columns(df)
    return (cols[0] if cols else "num_devices"), "num_devices"


def heatmap_figure(df: pd.DataFrame, x: str, y: str, value: Optional[str] = None) -> Figure:
    """For each (x, y), the best feasible point by :func:`objective`: its
    step time (ms) when every point trains the same batch, else its
    throughput. ``value`` forces a column (shown as is, lower is better)."""
    fig = Figure(figsize=(8, 6))
    ax = fig.add_subplot()
    obj = objective(df)
    if value is not None:
        obj = Objective(value, False, value, MS if value.endswith("_s") else 1.0, obj.batch)
    what = (f"{obj.label} at {obj.batch:g} samples per step" if obj.column == "step_time_s"
            and obj.batch else obj.label)
    title = f"Best {what}, over other options: {y} vs {x}"
    xs = _sort_key(df[x].dropna().unique()) if x in df else []
    ys = _sort_key(df[y].dropna().unique()) if y in df else []
    if not xs or not ys or simulated(df).empty:
        _empty(ax, "no configuration could be simulated")
        ax.set_title(title)
        return fig
    grid = np.full((len(ys), len(xs)), np.nan)
    text = [["-"] * len(xs) for _ in ys]
    ok = simulated(df)
    good = feasible(df)
    for i, yv in enumerate(ys):
        for j, xv in enumerate(xs):
            cell = good[(good[x] == xv) & (good[y] == yv)][obj.column].dropna()
            if len(cell):
                best = cell.max() if obj.higher else cell.min()
                grid[i, j] = best * obj.scale
                text[i][j] = _cell_text(grid[i, j])
            elif len(ok[(ok[x] == xv) & (ok[y] == yv)]):
                text[i][j] = "OOM"
    masked = np.ma.masked_invalid(grid)
    cmap = matplotlib.colormaps["viridis" if obj.higher else "viridis_r"].with_extremes(
        bad="#dddddd")
    image = ax.imshow(masked, cmap=cmap, aspect="auto", origin="lower")
    if np.isfinite(grid).any():
        fig.colorbar(image, ax=ax, label=obj.label)
    finite = grid[np.isfinite(grid)]
    mid = (finite.min() + finite.max()) / 2 if finite.size else 0
    for i in range(len(ys)):
        for j in range(len(xs)):
            value_ij = grid[i, j]
            dark = np.isfinite(value_ij) and (value_ij < mid if obj.higher else value_ij > mid)
            ax.text(j, i, text[i][j], ha="center", va="center", fontsize=8,
                    color="white" if dark else ("#b00000" if text[i][j] == "OOM" else "black"))
    ax.set_xticks(range(len(xs)), [value_text(v) for v in xs])
    ax.set_yticks(range(len(ys)), [value_text(v) for v in ys])
    ax.set_xlabel(x)
    ax.set_ylabel(y)
    ax.set_title(title)
    fig.tight_layout()
    return fig


def _cell_text(value: float) -> str:
    """3 significant digits, without an exponent for values of 100 and more."""
    return f"{value:.0f}" if abs(value) >= 100 else f"{value:.3g}"


def throughput_column(df: pd.DataFrame) -> Tuple[str, str]:
    """(column, axis label): tokens/s when the models report it, else samples/s."""
    if "tokens_per_s" in df and df["tokens_per_s"].notna().any():
        return "tokens_per_s", "throughput (tokens/s)"
    return "samples_per_s", "throughput (samples/s)"


def scaling_figure(df: pd.DataFrame, hue: Optional[str] = None) -> Figure:
    """Throughput against the number of GPUs (best feasible config per count)."""
    fig = Figure(figsize=(8, 5))
    ax = fig.add_subplot()
    col, label = throughput_column(df)
    good = feasible(df)
    good = good[good[col].notna() & good["num_devices"].notna()]
    ax.set_title("Scaling: throughput vs GPU count (best feasible configuration per count)")
    if good.empty:
        _empty(ax, "no feasible configuration")
        return fig
    groups = [(None, good)] if not hue or hue not in good else \
        [(v, good[good[hue] == v]) for v in _sort_key(good[hue].unique())]
    for name, part in groups:
        best = part.groupby("num_devices")[col].max().sort_index()
        lbl = "best" if name is None else f"{hue}={value_text(name)}"
        line = ax.plot(best.index, best.values, marker="o", label=lbl)[0]
        n0, t0 = best.index[0], best.values[0]
        ax.plot(best.index, t0 * best.index / n0, linestyle="--", linewidth=1,
                color=line.get_color(), alpha=0.6,
                label="ideal linear" if name is None else f"ideal ({value_text(name)})")
    counts = sorted(good["num_devices"].unique())
    if len(counts) > 1 and counts[0] > 0 and counts[-1] / counts[0] >= 4:
        ax.set_xscale("log", base=2)
    ax.set_xticks(counts, [value_text(c) for c in counts])
    ax.set_xlabel("GPUs")
    ax.set_ylabel(label)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def pareto_front(points: pd.DataFrame, x: str = "step_time_s",
                 y: str = "max_peak_memory_bytes", x_higher: bool = False) -> pd.DataFrame:
    """The points no other point beats on both ``x`` and ``y`` (lower is
    better; for ``x`` higher when ``x_higher``), sorted from the best ``x``."""
    front = []
    best_y = math.inf
    order = points.assign(_x=-points[x] if x_higher else points[x]).sort_values(["_x", y])
    for _, row in order.drop(columns="_x").iterrows():
        if row[y] < best_y:
            front.append(row)
            best_y = row[y]
    return pd.DataFrame(front)


def pareto_figure(df: pd.DataFrame) -> Figure:
    """Peak memory per GPU against the objective (:func:`objective`: step
    time at a common batch, else throughput); OOM points as red crosses."""
    fig = Figure(figsize=(8, 5))
    ax = fig.add_subplot()
    obj = objective(df)
    ax.set_title(f"Memory vs {obj.label} (Pareto front of the configurations that fit)")
    ok = simulated(df)
    ok = ok[ok["max_peak_memory_bytes"].notna() & ok[obj.column].notna()]
    if ok.empty:
        _empty(ax, "no configuration could be simulated")
        return fig
    good = feasible(ok)
    oom = ok[ok["oom"].fillna(False).astype(bool)]
    if len(good):
        ax.scatter(good[obj.column] * obj.scale, good["max_peak_memory_bytes"] / GB, s=22,
                   color=CATEGORY_COLOURS["compute"], alpha=0.7, label="fits in memory")
        front = pareto_front(good, obj.column, x_higher=obj.higher)
        ax.step(front[obj.column] * obj.scale, front["max_peak_memory_bytes"] / GB,
                where="post" if not obj.higher else "pre", color="black", linewidth=1.2,
                label="Pareto front")
    if len(oom):
        ax.scatter(oom[obj.column] * obj.scale, oom["max_peak_memory_bytes"] / GB, marker="x",
                   s=40, color=OOM_COLOUR, label="out of memory")
    caps = ok["memory_capacity_bytes"].dropna().unique()
    for cap in sorted(caps):
        ax.axhline(cap / GB, linestyle="--", color="#555555", linewidth=1,
                   label=f"capacity {cap / GB:.1f} GB")
    ax.set_xlabel(obj.label + (" (higher is better)" if obj.higher else ""))
    ax.set_ylabel("peak memory per GPU (GB)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def fitting_first(ok: pd.DataFrame) -> pd.DataFrame:
    """``ok`` (ranked) with the points that fit in memory first, each part
    in its order: the best configurations a user can run lead."""
    if "oom" not in ok.columns:
        return ok
    oom = ok["oom"].fillna(False).astype(bool)
    return pd.concat([ok[~oom], ok[oom]])


def breakdown_table(df: pd.DataFrame) -> pd.DataFrame:
    """Per simulated configuration, best first (:func:`ranked`), those that
    fit in memory before those that do not (:func:`fitting_first`):
    compute, exposed communication, bubble, other idle (seconds; they add
    up to the step time, means over devices)."""
    ok = fitting_first(ranked(df))
    bubble = ok["bubble_s"].fillna(0.0)
    out = pd.DataFrame({
        "index": ok["index"],
        "compute_s": ok["compute_s"].fillna(0.0),
        "exposed_communication_s": ok["exposed_communication_s"].fillna(0.0),
        "bubble_s": bubble,
        "idle_s": (ok["idle_s"].fillna(0.0) - bubble).clip(lower=0.0),
        "step_time_s": ok["step_time_s"],
    })
    return out


def breakdown_figure(df: pd.DataFrame, max_configs: int = 30) -> Figure:
    """Stacked bars of where the step goes, best configurations first, those
    that fit in memory before those that do not (marked ``OOM``). Each
    bar is named by the options that differ among the bars shown (aligned
    columns under a header of option names); the options they all share are
    said once, under the title."""
    ok = fitting_first(ranked(df)).head(max_configs)
    table = breakdown_table(ok)
    fig = Figure(figsize=(10, max(3.0, 0.32 * len(table) + 2.0)))
    ax = fig.add_subplot()
    shown = f" (best {max_configs} of {len(simulated(df))})" \
        if len(simulated(df)) > max_configs else ""
    title = "Where the step goes, per configuration" + shown
    if table.empty:
        ax.set_title(title)
        _empty(ax, "no configuration could be simulated")
        return fig
    names = config_labels(ok, param_columns(df))
    fig.suptitle(title, fontsize=12)      # laid out here, centred over the bars below
    ax.set_title("every configuration shown: " + names.shared_text(100) if names.shared else "",
                 fontsize=8, color="#333333", pad=30)
    ypos = np.arange(len(table))[::-1]
    left = np.zeros(len(table))
    parts = [("compute_s", "compute", CATEGORY_COLOURS["compute"]),
             ("exposed_communication_s", "exposed communication",
              CATEGORY_COLOURS["communication"]),
             ("bubble_s", "pipeline bubble", BUBBLE_COLOUR),
             ("idle_s", "other idle", OTHER_COLOUR)]
    for col, name, colour in parts:
        values = table[col].to_numpy() * MS
        if col == "bubble_s" and not values.any():
            continue
        ax.barh(ypos, values, left=left, color=colour, label=name, height=0.7)
        left += values
    # the header of option names sits on a tick of its own above the top bar
    ax.set_yticks([len(table), *ypos], [names.header, *names.labels], fontsize=7.5,
                  family="monospace")
    ax.get_yticklabels()[0].set_fontweight("bold")
    ax.tick_params(axis="y", length=0)
    ax.set_ylim(-0.6, len(table) + 0.4)
    oom = ok["oom"].fillna(False).astype(bool).to_numpy()
    for y, end in zip(ypos[oom], left[oom]):
        ax.text(end, y, " OOM", va="center", fontsize=7, color=OOM_COLOUR)
    # room for the OOM marks; a zero-width segment at the longest bar's end
    # would otherwise pin the axis there
    ax.set_xlim(0, max(left.max(), 1e-12) * (1.07 if oom.any() else 1.03))
    ax.set_xlabel("time per step (ms, mean over devices)")
    ax.legend(fontsize=8, loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=4,
              frameon=False)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    box = ax.get_position()
    fig.suptitle(title, fontsize=12, x=(box.x0 + box.x1) / 2)    # centred over the bars
    return fig


def write_sweep_charts(df: pd.DataFrame, out_dir: PathLike,
                       heatmap: Optional[Sequence[str]] = None,
                       hue: Optional[str] = None) -> Dict[str, Path]:
    """Write heatmap.png, scaling.png, pareto.png and breakdown.png into
    ``out_dir`` (each atomically). Returns the paths by chart name."""
    if hue is not None and (not isinstance(hue, str) or hue not in df.columns):
        raise ConfigError(f"hue: must be the name of a column of the sweep, got {hue!r}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    x, y = heatmap_axes(df, heatmap)
    figures = {"heatmap": heatmap_figure(df, x, y), "scaling": scaling_figure(df, hue),
               "pareto": pareto_figure(df), "breakdown": breakdown_figure(df)}
    paths = {}
    for name, fig in figures.items():
        paths[name] = out / CHART_FILES[name]
        save_png(fig, paths[name])
    return paths
