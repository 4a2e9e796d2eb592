"""``report.html`` of one run, and the notebook view of a result.

The page: headline figures, the summary and the per-device split as
tables, memory by category, the busiest links, the configuration, every
chart (Gantt by device, by pipeline stage, memory, links) and how to open
``trace.json`` in Perfetto. Self-contained: charts inlined as base64 PNG,
no script, no server.
"""
from __future__ import annotations

import html
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from distsim.fileio import PathLike, write_text_atomic
from distsim.report.html_parts import (ImageLike, cards, img_tag, key_value_table, page,
                                       table_html)
from distsim.report.memory_categories import CATEGORIES, CATEGORY_LABELS
from distsim.report.summary import GB, MS, device_groups

#: strategy keys of a run's config (the rest but the simulation's are the model's)
STRATEGY_KEYS = ("dp", "tp", "pp", "sp", "zero", "recompute", "microbatches", "schedule",
                 "virtual_stages", "bucket_mb", "global_batch", "micro_batch", "optimizer",
                 "partition", "prefetch", "zero3_unit", "order", "symmetry", "coarsen",
                 "fusion", "ep", "tp_overlap", "fp32_grads", "p2p_scatter")
SIMULATION_KEYS = ("topology", "network_mode", "collective_algo", "comm_streams", "launch",
                   "comm_order", "p2p")

CHART_TITLES = {"gantt": ("Timeline by device", "gantt.png"),
                "pipeline": ("Timeline by pipeline stage", "pipeline.png"),
                "memory": ("Memory", "memory.png"), "links": ("Network links", "links.png")}


def _pct(x: Optional[float]) -> str:
    return "" if x is None else f"{100 * x:.1f} %"


def _ms(x: float) -> str:
    return f"{x * MS:,.3f} ms" if x * MS < 100 else f"{x * MS:,.1f} ms"


def headline(summary: Mapping[str, Any]) -> List[Tuple[str, str]]:
    """The boxes at the top: step time, throughput, MFU, memory, waiting."""
    step = summary["step_time_s"]
    items = [("step time", _ms(step))]
    if "tokens_per_s" in summary:
        items.append(("tokens / s", f"{summary['tokens_per_s']:,.0f}"))
    if "mfu" in summary:
        items.append(("MFU", _pct(summary["mfu"])))
    items.append(("peak memory per GPU", f"{summary['max_peak_memory_bytes'] / GB:.2f} GB"))
    items.append(("exposed communication", _pct(summary["exposed_communication_s"] / step)
                  if step > 0 else "-"))
    if summary.get("bubble_fraction"):
        items.append(("pipeline bubble", _pct(summary["bubble_fraction"])))
    items.append(("devices", f"{summary['num_devices']:,}"))
    return items


def figures_table(summary: Mapping[str, Any]) -> str:
    """The summary's fleet-wide figures, with units."""
    step = summary["step_time_s"]

    def share(key: str) -> str:
        return f"{_ms(summary[key])} ({_pct(summary[key] / step) if step > 0 else '-'})"
    items = [("step time", _ms(step)), ("devices", f"{summary['num_devices']:,}")]
    if "tokens_per_step" in summary:
        items += [("tokens per step", f"{summary['tokens_per_step']:,}"),
                  ("tokens / s", f"{summary['tokens_per_s']:,.0f}")]
    if "mfu" in summary:
        items.append(("MFU / HFU", f"{_pct(summary['mfu'])} / {_pct(summary['hfu'])}"))
    items += [("compute (mean per device)", share("compute_s")),
              ("communication (mean)", share("communication_s")),
              ("exposed communication (mean)", share("exposed_communication_s")),
              ("idle (mean)", share("idle_s"))]
    if summary.get("bubble_fraction"):
        items.append(("pipeline bubble", _pct(summary["bubble_fraction"])))
    items.append(("highest peak memory",
                  f"{summary['max_peak_memory_bytes'] / GB:.2f} GB on rank "
                  f"{summary.get('max_peak_memory_rank')}"))
    items.append(("out of memory", "yes, mostly " + str(summary.get("oom_category"))
                  if summary.get("oom") else "no"))
    return key_value_table(items, "Means are over devices (each simulated device weighted "
                                  "by the devices it stands for).")


def device_table(summary: Mapping[str, Any]) -> str:
    """The per-device split: consecutive identical devices share a row."""
    step = summary["step_time_s"]
    rows = []
    for label, ranks, d in device_groups(dict(summary)):
        row: Dict[str, Any] = {"device": label, "peak GB": d["peak_memory_bytes"] / GB,
                               "capacity GB": d["capacity_bytes"] / GB}
        for key, name in (("compute_s", "compute"), ("communication_s", "comm"),
                          ("exposed_communication_s", "exposed comm"), ("idle_s", "idle")):
            row[f"{name} ms"] = d[key] * MS
            row[f"{name} %"] = 100 * d[key] / step if step > 0 else None
        row["OOM"] = "OOM" if d["oom"] else ""
        if "represents" in d:
            row["stands for"] = d["represents"]
        rows.append(row)
    columns = ["device", "peak GB", "capacity GB", "compute ms", "compute %", "comm ms",
               "comm %", "exposed comm ms", "exposed comm %", "idle ms", "idle %", "OOM"]
    if any("stands for" in r for r in rows):
        columns.append("stands for")
    return table_html(rows, columns, text_columns=["device", "OOM"])


def memory_table(summary: Mapping[str, Any]) -> str:
    """GB per memory category at each device's peak (grouped as the device table)."""
    by_rank = summary.get("memory_by_category") or {}
    rows = []
    for label, ranks, d in device_groups(dict(summary)):
        cats = by_rank.get(str(ranks[0]), {})
        row: Dict[str, Any] = {"device": label}
        for c in CATEGORIES:
            row[CATEGORY_LABELS[c]] = cats.get(c, 0) / GB
        row["peak GB"] = d["peak_memory_bytes"] / GB
        rows.append(row)
    return table_html(rows, ["device", *(CATEGORY_LABELS[c] for c in CATEGORIES), "peak GB"],
                      text_columns=["device"])


def links_table(summary: Mapping[str, Any]) -> str:
    rows = [{"link": f"{k['src']} -> {k['dst']}", "GB/s": k["bandwidth_Bps"] / GB,
             "GB carried": k["bytes_carried"] / GB, "busy ms": k["busy_s"] * MS,
             "mean utilisation %": 100 * k["utilisation"], "most flows at once": k["peak_flows"]}
            for k in summary.get("links") or ()]
    if not rows:
        return '<p class="muted">No traffic crossed the network.</p>'
    return table_html(rows, ["link", "GB/s", "GB carried", "busy ms", "mean utilisation %",
                             "most flows at once"], text_columns=["link"])


def _value(v: Any) -> str:
    if isinstance(v, (list, tuple)):
        return ", ".join(map(str, v))
    if isinstance(v, (int, float)) and not isinstance(v, bool) and float(v).is_integer() \
            and abs(v) >= 1e5:
        return f"{int(v):,}"
    return str(v)


def config_tables(config: Mapping[str, Any]) -> str:
    """The configuration as three tables: model, strategy, simulation
    (fields left unset are not listed)."""
    set_ = {k: v for k, v in config.items() if v is not None and v != ""}
    groups = [("Strategy", [k for k in STRATEGY_KEYS if k in set_]),
              ("Simulation", [k for k in SIMULATION_KEYS if k in set_])]
    taken = {k for _, keys in groups for k in keys}
    model = [k for k in set_ if k not in taken]
    parts = [key_value_table([(k, _value(set_[k])) for k in keys], caption)
             for caption, keys in [("Model", model)] + groups if keys]
    return '<div class="columns">' + "".join(parts) + "</div>"


def strategy_line(config: Mapping[str, Any]) -> str:
    """``dp 2 x tp 2 x pp 2, 1f1b, 64 micro-batches of 4``: the strategy in a line
    (``cp`` among the degrees when above 1, as it splits the devices; ``ep``
    after them, as it shares out the data-parallel ranks)."""
    degrees = " x ".join(f"{k} {config[k]}" for k in ("dp", "cp", "tp", "pp")
                         if config.get(k) is not None and (k != "cp" or config[k] > 1))
    extra = [str(config["schedule"]) if (config.get("pp") or 1) > 1 and config.get("schedule")
             else "", "sp" if config.get("sp") else "",
             f"ep {config['ep']}" if (config.get("ep") or 1) > 1 else "",
             f"cp {config.get('cp_comm') or 'allgather'}" if (config.get("cp") or 1) > 1 else "",
             f"ZeRO {config['zero']}" if config.get("zero") else "",
             f"recompute {config['recompute']}" if config.get("recompute") not in (None, "none")
             else ""]
    if config.get("microbatches"):
        extra.append(f"{config['microbatches']} micro-batches of {config.get('micro_batch')}")
    if config.get("symmetry"):
        extra.append("symmetry")
    return ", ".join([degrees] + [e for e in extra if e])


def _charts(result: Any, charts: Optional[Mapping[str, ImageLike]]) -> Dict[str, ImageLike]:
    """The charts to inline: those given, else drawn from the result."""
    if charts is not None:
        return dict(charts)
    from distsim.report.gantt import chart_figure, gantt_chart, has_stages
    from distsim.report.links import link_chart, link_figure
    from distsim.report.memory_plot import memory_figure
    from distsim.report.phases import record_phases
    trace, program = result.trace, getattr(result, "program", None)
    phases = record_phases(trace, program)
    out: Dict[str, ImageLike] = {"gantt": chart_figure(gantt_chart(trace, program,
                                                                   phases=phases))}
    if has_stages(trace, phases):
        out["pipeline"] = chart_figure(gantt_chart(trace, program, "stages", phases=phases))
    out["memory"] = memory_figure(trace)
    out["links"] = link_figure(link_chart(trace.links, trace.link_samples, trace.step_time_s))
    return out


def _trace_note(summary: Mapping[str, Any]) -> str:
    info = summary.get("trace_file") or {}
    text = ("<p><code>trace.json</code> holds every op, memory curve and link counter: open "
            '<a href="https://ui.perfetto.dev">ui.perfetto.dev</a> and drop the file on it (or '
            "<i>Open trace file</i>); each device is a process, each stream a thread, pipeline "
            "hand-offs are arrows. <code>chrome://tracing</code> reads it too.</p>")
    if info.get("truncated"):
        text += (f'<p class="muted">The trace is truncated: it holds '
                 f"{info.get('records_written', 0):,} of {info.get('records', 0):,} records "
                 f"(up to {info.get('cutoff_s', 0) * MS:,.1f} ms); the summary and the charts "
                 "cover the whole step.</p>")
    return text


def run_report_html(result: Any, title: Optional[str] = None,
                    charts: Optional[Mapping[str, ImageLike]] = None) -> str:
    """The page of one :class:`~distsim.api.SimulationResult`. ``charts``:
    name (``gantt``, ``pipeline``, ``memory``, ``links``) -> the chart
    already drawn (a PNG path, bytes or Figure); drawn here when not given."""
    summary = result.summary()
    config = summary.get("config", {})
    title = title or (f"distsim: {config.get('model', 'model')} on "
                      f"{config.get('topology', 'topology')}")
    body = [f"<p>{html.escape(strategy_line(config))}</p>", cards(headline(summary))]
    if summary.get("oom"):
        body.append(f'<p class="oom">Out of memory on ranks '
                    f"{html.escape(_ranks(summary.get('oom_ranks') or []))}: the highest peak "
                    f"is {summary['max_peak_memory_bytes'] / GB:.2f} GB, mostly "
                    f"{html.escape(str(summary.get('oom_category')))}.</p>")
    for note in summary.get("notes") or ():
        body.append(f'<p class="muted">Note: {html.escape(note)}</p>')
    body += ["<h2>Summary</h2>", figures_table(summary),
             "<h2>Per device</h2>", device_table(summary),
             "<h2>Memory at each device's peak (GB)</h2>", memory_table(summary)]
    drawn = _charts(result, charts)
    for name, (heading, file) in CHART_TITLES.items():
        if name in drawn:
            body += [f"<h2>{html.escape(heading)} <small class=\"muted\">({file})</small></h2>",
                     img_tag(drawn[name], heading)]
        if name == "links":
            body += ["<h3>Busiest links</h3>", links_table(summary)]
    body += ["<h2>Configuration</h2>", config_tables(config),
             "<h2>Every op: trace.json</h2>", _trace_note(summary)]
    return page(title, "\n".join(body))


def _ranks(ranks: Sequence[int]) -> str:
    from distsim.report.summary import rank_ranges
    return rank_ranges(ranks)


def write_run_report(result: Any, path: PathLike, title: Optional[str] = None,
                     charts: Optional[Mapping[str, ImageLike]] = None) -> Path:
    """Write :func:`run_report_html` to ``path`` atomically."""
    write_text_atomic(path, run_report_html(result, title, charts=charts))
    return Path(path)


#: the page's styles a notebook needs, scoped to the result's block
NOTEBOOK_CSS = """
.distsim-result .cards { display: flex; flex-wrap: wrap; gap: 0.6em; margin: 0.8em 0; }
.distsim-result .card { border: 1px solid #ddd; border-radius: 6px; padding: 0.4em 0.8em;
                        min-width: 8em; }
.distsim-result .card b { display: block; font-size: 1.25em; }
.distsim-result .card span { color: #666; font-size: 0.85em; }
.distsim-result td.text, .distsim-result th.text { text-align: left; }
.distsim-result caption { caption-side: top; text-align: left; color: #555; }
.distsim-result img { max-width: 100%; }
"""


def result_html(result: Any) -> str:
    """A result in a notebook: headline figures, the summary and the
    per-device tables, and the Gantt chart inline."""
    from distsim.report.gantt import gantt_figure
    summary = result.summary()
    config = summary.get("config", {})
    head = (f"<b>{html.escape(str(config.get('model', 'model')))}</b> on "
            f"<b>{html.escape(str(config.get('topology', 'topology')))}</b>: "
            f"{html.escape(strategy_line(config))}")
    return "\n".join([f'<div class="distsim-result"><style>{NOTEBOOK_CSS}</style>',
                      f"<div>{head}</div>", cards(headline(summary)), figures_table(summary),
                      device_table(summary),
                      img_tag(gantt_figure(result.trace, getattr(result, "program", None)),
                              "Gantt chart"), "</div>"])
