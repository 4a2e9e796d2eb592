"""The charts of one run and the page that shows them, written into a folder.

``gantt.png`` (a lane per device), ``pipeline.png`` (a lane per pipeline
stage; pipeline runs only), ``memory.png``, ``links.png`` and
``report.html``, each written atomically; the phases of the ops are read
once for both Gantt charts.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Dict

from distsim.errors import ConfigError
from distsim.report.figures import Chart, save_png
from distsim.report.gantt import chart_figure, gantt_chart, has_stages
from distsim.report.links import link_chart, link_figure, plot_links
from distsim.report.memory_plot import memory_figure, write_memory_plot
from distsim.report.phases import record_phases

#: the chart files, in the order they are drawn (pipeline.png: pipeline runs only)
CHART_FILES = {"gantt": "gantt.png", "pipeline": "pipeline.png", "memory": "memory.png",
               "links": "links.png"}


def run_chart(result: Any, name: str) -> Chart:
    """One chart of ``result`` (``gantt``, ``pipeline``, ``memory`` or
    ``links``), shown inline in a notebook."""
    trace, program = result.trace, result.program
    if name == "pipeline" and not has_stages(trace, record_phases(trace, program)):
        raise ConfigError("chart: pipeline: this run has no pipeline stages (pp 1)")
    if name in ("gantt", "pipeline"):
        fig = chart_figure(gantt_chart(trace, program, "devices" if name == "gantt"
                                       else "stages"))
    elif name == "memory":
        fig = memory_figure(trace)
    elif name == "links":
        fig = link_figure(link_chart(trace.links, trace.link_samples, trace.step_time_s))
    else:
        raise ConfigError(f"chart: unknown chart {name!r} (known: {', '.join(CHART_FILES)})")
    return Chart(fig)


def write_run_charts(result: Any, out: Path, paths: Dict[str, Path],
                     say: Callable[[str], None]) -> Dict[str, Path]:
    """Draw the charts of ``result`` (a :class:`~distsim.api.SimulationResult`)
    and ``report.html`` into ``out``; each path goes into ``paths`` before
    its file is written (so that a caller can remove what a failure left)."""
    from distsim.report.html import write_run_report
    trace, program = result.trace, result.program
    phases = record_phases(trace, program)
    drawn: Dict[str, Path] = {}
    for name, file in CHART_FILES.items():
        if name == "pipeline" and not has_stages(trace, phases):
            continue
        path = paths[name] = drawn[name] = out / file
        say(f"drawing {file}")
        if name in ("gantt", "pipeline"):
            view = "devices" if name == "gantt" else "stages"
            save_png(chart_figure(gantt_chart(trace, program, view, phases=phases)), path)
        elif name == "memory":
            write_memory_plot(trace, path)
        else:
            plot_links(trace.links, path, samples=trace.link_samples, end_s=trace.step_time_s)
    paths["report"] = out / "report.html"
    say("writing report.html")
    write_run_report(result, paths["report"], charts=drawn)
    return paths
