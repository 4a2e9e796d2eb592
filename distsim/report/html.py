"""``report.html``: one self-contained page (tables and charts inlined as
base64 PNG, no script, no server) for a run or a sweep.

* :func:`run_report_html` / :func:`write_run_report` (in
  :mod:`distsim.report.run_page`): one simulation;
* :func:`sweep_report_html` / :func:`write_sweep_report`: a sweep — status
  counts, the best configurations (simulated and estimated rows told
  apart), every chart of :mod:`distsim.report.sweep_charts`, and the points
  that were skipped or failed with their reason.
"""
from __future__ import annotations

import html
from pathlib import Path
from typing import Dict, Mapping, Optional, Sequence

import pandas as pd

from distsim.fileio import PathLike, write_text_atomic
from distsim.report.html_parts import (ImageLike, fixed_formatter, img_tag, page,  # noqa: F401
                                       png_bytes, table_html)
from distsim.report.run_page import (result_html, run_report_html,  # noqa: F401  (re-exported)
                                     write_run_report)
from distsim.report.summary import GB, MS
from distsim.report.sweep_charts import (CHART_FILES, breakdown_figure, heatmap_axes, ranked,
                                         heatmap_figure, objective, param_columns, pareto_figure,
                                         scaling_figure, throughput_column)
from distsim.report.sweep_labels import split_options


# -- a sweep -------------------------------------------------------------------------------
def sweep_report_html(df: pd.DataFrame, title: str = "distsim sweep",
                      charts: Optional[Mapping[str, ImageLike]] = None,
                      heatmap: Optional[Sequence[str]] = None, hue: Optional[str] = None,
                      top: int = 20, description: str = "") -> str:
    """The page of a sweep DataFrame; ``charts`` (name -> Figure / PNG
    bytes / PNG path) default to the four sweep charts built here."""
    if charts is None:
        x, y = heatmap_axes(df, heatmap)
        charts = {"heatmap": heatmap_figure(df, x, y), "scaling": scaling_figure(df, hue),
                  "pareto": pareto_figure(df), "breakdown": breakdown_figure(df)}
    every = [p for p in param_columns(df) if p != "fidelity"]
    varying, fixed = split_options(df, every)
    params = varying or every     # the columns that tell the rows apart
    fixed = [p for p in fixed if p not in params]
    counts = df["status"].value_counts()
    body = []
    if description:
        body.append(f"<p>{html.escape(description)}</p>")
    if fixed and len(df):
        body.append("<p>Every configuration: " + html.escape(", ".join(
            f"{p}={_param(df[p].iloc[0])}" for p in fixed)) + ".</p>")
    body.append("<p>" + ", ".join(f"{int(n)} {html.escape(str(s))}" for s, n in counts.items())
                + f" of {len(df)} configurations.</p>")
    ok = ranked(df)     # best first: step time at a common batch, else throughput
    col, label = throughput_column(df)
    # "fastest" only when every point trains the same batch; else "best" by throughput
    by_throughput = objective(df).higher
    best_word = "Highest-throughput" if by_throughput else "Fastest"
    fits = ok[~ok["oom"].fillna(False).astype(bool)]
    if len(fits):
        best = fits.iloc[0]
        body.append(f"<p>{best_word} configuration that fits in memory: <b>" + html.escape(
            ", ".join(f"{p}={_param(best[p])}" for p in params)) +
            f"</b>: {best['step_time_s'] * MS:,.1f} ms per step"
            + (f", {best[col]:,.0f} {html.escape(label)}" if by_throughput else "")
            + f" ({_how(best)}).</p>")
    rows = []
    unit = label.split(" ")[-1].strip("()")
    for _, r in ok.head(top).iterrows():
        row = {p: _param(r[p]) for p in params}
        row.update({"step ms": r["step_time_s"] * MS, unit: r[col],
                    "MFU %": 100 * r["mfu"] if not pd.isna(r["mfu"]) else None,
                    "peak GB": r["max_peak_memory_bytes"] / GB,
                    "OOM": "yes" if not pd.isna(r["oom"]) and bool(r["oom"]) else "",
                    "exposed comm ms": r["exposed_communication_s"] * MS,
                    "bubble ms": r["bubble_s"] * MS, "how": _how(r)})
        rows.append(row)
    cols = [*params, "how", "step ms", unit, "MFU %", "peak GB", "OOM",
            "exposed comm ms", "bubble ms"]
    shown = ok.head(top)
    hows = pd.Series([_how(r) for _, r in shown.iterrows()], dtype=object)
    made = ", ".join(f"{int((hows == h).sum())} {h}" for h in ("simulated", "estimated")
                     if (hows == h).any())
    body.append(f"<h2>{best_word} configurations (top {len(shown)} of {len(ok)} that ran"
                + (f"; {made}" if made else "") + ")</h2>")
    formats = {"peak GB": fixed_formatter(2), "MFU %": fixed_formatter(1)}
    body.append(table_html(rows, cols, text_columns=[*params, "how", "OOM"], formats=formats)
                if rows else '<p class="muted">none</p>')
    for name, image in charts.items():
        body.append(f"<h2>{html.escape(name.capitalize())}</h2>")
        body.append(img_tag(image, name))
    rest = df[df["status"] != "ok"]
    if len(rest):
        body.append(f"<h2>Not run ({len(rest)})</h2>")
        body.append(table_html([{**{p: r[p] for p in params}, "status": r["status"],
                                 "reason": r["reason"]} for _, r in rest.iterrows()],
                               [*params, "status", "reason"],
                               text_columns=[*params, "status", "reason"]))
    return page(title, "\n".join(body))


def _param(v):
    """An option's value as the spec gave it (an integer read as a float: as an integer)."""
    return int(v) if isinstance(v, float) and v.is_integer() else v


def _how(row) -> str:
    """``simulated`` or ``estimated`` (the sweep's ``fidelity`` column)."""
    return "estimated" if row.get("fidelity") == "estimate" else "simulated"


def write_sweep_report(df: pd.DataFrame, path: PathLike, title: str = "distsim sweep",
                       charts: Optional[Mapping[str, ImageLike]] = None,
                       heatmap: Optional[Sequence[str]] = None, hue: Optional[str] = None,
                       description: str = "") -> Path:
    """Write ``report.html`` for a sweep (atomically)."""
    write_text_atomic(path, sweep_report_html(df, title, charts, heatmap, hue,
                                              description=description))
    return Path(path)


def charts_from_dir(out_dir: PathLike) -> Dict[str, Path]:
    """The sweep chart PNGs present in ``out_dir``, by name."""
    out = Path(out_dir)
    return {name: out / f for name, f in CHART_FILES.items() if (out / f).is_file()}
