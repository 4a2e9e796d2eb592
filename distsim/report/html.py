"""``report.html``: one self-contained page (tables and charts inlined as
base64 PNG, no script, no server) for a run or a sweep.

* :func:`run_report_html` / :func:`write_run_report`: one simulation — the
  summary table, the configuration, the Gantt chart and the memory plot;
* :func:`sweep_report_html` / :func:`write_sweep_report`: a sweep — status
  counts, the best configurations, every chart of
  :mod:`distsim.report.sweep_charts`, and the points that were skipped or
  failed with their reason.
"""
from __future__ import annotations

import base64
import html
import io
import json
from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Sequence, Union

import pandas as pd
from matplotlib.figure import Figure

from distsim.fileio import PathLike, write_text_atomic
from distsim.report.figures import DPI
from distsim.report.summary import GB, MS, format_summary_table
from distsim.report.training_metrics import format_training_metrics
from distsim.report.sweep_charts import (CHART_FILES, breakdown_figure, heatmap_axes, ranked,
                                         heatmap_figure, objective, param_columns, pareto_figure,
                                         scaling_figure, throughput_column)

ImageLike = Union[Figure, bytes, str, Path]

_CSS = """
body { font-family: -apple-system, 'Segoe UI', Helvetica, Arial, sans-serif; margin: 2em auto;
       max-width: 1100px; color: #222; padding: 0 1em; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 2em; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; font-size: 0.85em; margin: 0.5em 0; }
th, td { border: 1px solid #ddd; padding: 3px 8px; text-align: right; }
th { background: #f3f3f3; } td.text, th.text { text-align: left; }
img { max-width: 100%; border: 1px solid #eee; margin: 0.5em 0; }
pre { background: #f7f7f7; padding: 0.8em; overflow-x: auto; font-size: 0.85em; }
.muted { color: #777; }
"""


def png_bytes(image: ImageLike) -> bytes:
    """PNG bytes of a Figure, of PNG bytes, or of a PNG file."""
    if isinstance(image, Figure):
        buf = io.BytesIO()
        image.savefig(buf, format="png", dpi=DPI)
        return buf.getvalue()
    if isinstance(image, bytes):
        return image
    return Path(image).read_bytes()


def img_tag(image: ImageLike, alt: str) -> str:
    data = base64.b64encode(png_bytes(image)).decode("ascii")
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'


def page(title: str, body: str) -> str:
    return ("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            f"<title>{html.escape(title)}</title>\n<style>{_CSS}</style>\n</head>\n<body>\n"
            f"<h1>{html.escape(title)}</h1>\n{body}\n</body>\n</html>\n")


def table_html(rows: Sequence[Mapping[str, Any]], columns: Sequence[str],
               text_columns: Sequence[str] = ()) -> str:
    """A plain HTML table; every cell escaped."""
    head = "".join(f'<th class="{"text" if c in text_columns else ""}">{html.escape(c)}</th>'
                   for c in columns)
    body = []
    for row in rows:
        cells = "".join(f'<td class="{"text" if c in text_columns else ""}">'
                        f"{html.escape(_cell(row.get(c)))}</td>" for c in columns)
        body.append(f"<tr>{cells}</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _cell(v: Any) -> str:
    if v is None or (isinstance(v, float) and v != v) or v is pd.NA:
        return ""
    if isinstance(v, float):
        return f"{int(v)}" if v.is_integer() and abs(v) < 1e15 else f"{v:.4g}"
    return str(v)


# -- a single run -------------------------------------------------------------------------
def run_report_html(result: Any, title: Optional[str] = None,
                    gantt: Optional[ImageLike] = None, memory: Optional[ImageLike] = None) -> str:
    """The page of one :class:`~distsim.api.SimulationResult`. ``gantt`` /
    ``memory``: the charts already drawn (a PNG file or bytes), so that
    :meth:`~distsim.api.SimulationResult.write_outputs` draws each once;
    drawn from the trace when not given."""
    from distsim.report.gantt import gantt_figure
    from distsim.report.memory_plot import memory_figure
    summary = result.summary()
    config = summary.get("config", {})
    title = title or (f"distsim: {config.get('model', 'model')} on "
                      f"{config.get('topology', 'topology')}")
    body = [f"<p>Step time <b>{summary['step_time_s'] * MS:.4g} ms</b> on "
            f"{summary.get('num_devices')} devices; peak memory "
            f"{summary.get('max_peak_memory_bytes', 0) / GB:.3g} GB per GPU"
            f"{' (<b>out of memory</b>)' if summary.get('oom') else ''}.</p>",
            "<h2>Summary</h2>",
            # as the CLI prints it: the table, then tokens/s, MFU, bubble, memory by category
            f"<pre>{html.escape(format_summary_table(summary) + format_training_metrics(summary))}"
            "</pre>",
            "<h2>Configuration</h2>",
            f"<pre>{html.escape(json.dumps(config, indent=2, default=str))}</pre>",
            "<h2>Timeline</h2>",
            img_tag(gantt if gantt is not None else gantt_figure(result.trace), "Gantt chart"),
            "<h2>Memory</h2>",
            img_tag(memory if memory is not None else memory_figure(result.trace),
                    "memory per device")]
    return page(title, "\n".join(body))


def write_run_report(result: Any, path: PathLike, title: Optional[str] = None,
                     gantt: Optional[ImageLike] = None, memory: Optional[ImageLike] = None
                     ) -> Path:
    """Write :func:`run_report_html` to ``path`` atomically."""
    write_text_atomic(path, run_report_html(result, title, gantt=gantt, memory=memory))
    return Path(path)


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
    params = param_columns(df)
    counts = df["status"].value_counts()
    body = []
    if description:
        body.append(f"<p>{html.escape(description)}</p>")
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
            ", ".join(f"{p}={_cell(best[p])}" for p in params)) +
            f"</b>: {best['step_time_s'] * MS:.4g} ms per step"
            + (f", {best[col]:.4g} {html.escape(label)}" if by_throughput else "") + ".</p>")
    rows = []
    for _, r in ok.head(top).iterrows():
        row = {p: r[p] for p in params}
        row.update({"step ms": r["step_time_s"] * MS, label.split(" ")[-1]: r[col],
                    "MFU": r["mfu"], "peak GB": r["max_peak_memory_bytes"] / GB,
                    "OOM": "yes" if not pd.isna(r["oom"]) and bool(r["oom"]) else "",
                    "exposed comm ms": r["exposed_communication_s"] * MS,
                    "bubble ms": r["bubble_s"] * MS})
        rows.append(row)
    cols = [*params, "step ms", label.split(" ")[-1], "MFU", "peak GB", "OOM",
            "exposed comm ms", "bubble ms"]
    body.append(f"<h2>{best_word} configurations (top {min(top, len(ok))} of {len(ok)} "
                "simulated)</h2>")
    body.append(table_html(rows, cols, text_columns=params) if rows
                else '<p class="muted">none</p>')
    for name, image in charts.items():
        body.append(f"<h2>{html.escape(name.capitalize())}</h2>")
        body.append(img_tag(image, name))
    rest = df[df["status"] != "ok"]
    if len(rest):
        body.append(f"<h2>Not simulated ({len(rest)})</h2>")
        body.append(table_html([{**{p: r[p] for p in params}, "status": r["status"],
                                 "reason": r["reason"]} for _, r in rest.iterrows()],
                               [*params, "status", "reason"],
                               text_columns=[*params, "status", "reason"]))
    return page(title, "\n".join(body))


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
