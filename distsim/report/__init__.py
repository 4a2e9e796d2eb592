"""Reports built from a simulator :class:`~distsim.sim.trace.Trace`.

* :func:`write_chrome_trace` / :func:`chrome_trace`: Chrome/Perfetto trace JSON,
  written streaming and summarised past ``max_trace_records`` timed records
  (:data:`~distsim.report.chrome_trace.DEFAULT_MAX_TRACE_RECORDS`);
* :func:`write_gantt`: Gantt chart PNG, a lane per device (or per pipeline
  stage), ops coloured by phase and kind of communication;
* :func:`write_memory_plot`: live memory per device PNG, capacity drawn, and
  the memory categories at each device's peak;
* :func:`summarize`, :func:`format_summary_table`, :func:`summary_dataframe`:
  the numbers (``summary.json``), a text table, a DataFrame.

Every writer is atomic (:mod:`distsim.fileio`) and deterministic.
"""
from distsim.report.chrome_trace import chrome_trace, chrome_trace_json, write_chrome_trace
from distsim.report.gantt import gantt_figure, write_gantt
from distsim.report.memory_plot import memory_figure, write_memory_plot
from distsim.report.summary import format_summary_table, summarize, summary_dataframe, write_summary

__all__ = [
    "chrome_trace", "chrome_trace_json", "write_chrome_trace",
    "gantt_figure", "write_gantt",
    "memory_figure", "write_memory_plot",
    "summarize", "format_summary_table", "summary_dataframe", "write_summary",
]
