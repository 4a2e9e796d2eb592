"""Regenerate the charts of reports/charts/: three runs, drawn as `distsim
simulate` draws them, and two GPT-2 strategies compared.

    python reports/charts/make_charts.py            # every run (about a minute)
    python reports/charts/make_charts.py gpt2-pp2   # one

Each run's folder gets summary.json and the charts (gantt.png, pipeline.png
for a pipeline run, memory.png, links.png); trace.json and report.html are
left out (a run writes them; they are large). timings.json records how long
the simulation and each chart took on the machine that ran this.
"""
from __future__ import annotations

import gc
import json
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))     # this checkout's distsim

import distsim  # noqa: E402
from distsim.report.figures import save_png  # noqa: E402
from distsim.report.gantt import chart_figure, gantt_chart, has_stages  # noqa: E402
from distsim.report.links import plot_links  # noqa: E402
from distsim.report.memory_plot import write_memory_plot  # noqa: E402
from distsim.report.phases import record_phases  # noqa: E402
from distsim.report.summary import write_summary  # noqa: E402

#: name -> (the command it stands for, simulate()'s arguments)
RUNS = {
    "default": ("distsim simulate", {}),
    "gpt2-pp2": ("distsim simulate --model gpt2 --dp 2 --tp 2 --pp 2 --schedule 1f1b",
                 dict(model="gpt2", dp=2, tp=2, pp=2, schedule="1f1b")),
    "gpt3-175b": ("distsim simulate --model gpt3-175b --topology dgx-a100-x128 --tp 8 --pp 16 "
                  "--global-batch 1536 --micro-batch 1 --symmetry --coarsen",
                  dict(model="gpt3-175b", topology="dgx-a100-x128", tp=8, pp=16,
                       global_batch=1536, micro_batch=1, symmetry=True, coarsen=True)),
}
#: the second GPT-2 strategy, compared with gpt2-pp2
GPT2_DP8 = dict(model="gpt2", dp=8)


def timed(times: dict, key: str, work) -> None:
    """Run ``work()`` and record its seconds; a full collection first, so
    that a collector pass over the program's objects is not charged to it."""
    gc.collect()
    t = time.perf_counter()
    work()
    times[key] = time.perf_counter() - t


def draw(name: str, options: dict) -> dict:
    out = HERE / name
    out.mkdir(exist_ok=True)
    times = {}
    t = time.perf_counter()
    result = distsim.simulate(record_links=True, **options)
    times["simulate_s"] = time.perf_counter() - t
    write_summary(result.summary(), out / "summary.json")
    trace, program = result.trace, result.program
    phases = record_phases(trace, program)
    timed(times, "phases_s", lambda: record_phases(trace, program))
    views = ["devices"] + (["stages"] if has_stages(trace, phases) else [])
    for view in views:
        file = "gantt.png" if view == "devices" else "pipeline.png"
        timed(times, file, lambda: save_png(chart_figure(gantt_chart(
            trace, program, view, phases=phases)), out / file))
    timed(times, "memory.png", lambda: write_memory_plot(trace, out / "memory.png"))
    timed(times, "links.png", lambda: plot_links(trace.links, out / "links.png",
                                                 samples=trace.link_samples,
                                                 end_s=trace.step_time_s))
    times["op_records"] = trace.num_ops
    times["link_samples"] = len(trace.link_samples)
    print(f"{name}: " + ", ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v:,}"
                                  for k, v in times.items()))
    return times


def compare_gpt2() -> None:
    """gpt2-pp2 against data parallelism alone, as `distsim compare` shows it."""
    folder = HERE / "gpt2-dp8"
    folder.mkdir(exist_ok=True)
    write_summary(distsim.simulate(record_links=True, **GPT2_DP8).summary(),
                  folder / "summary.json")
    os.chdir(HERE)     # the table names the runs' files relative to this folder
    comparison = distsim.compare("gpt2-pp2", "gpt2-dp8")
    comparison.write_chart(HERE / "compare.png")
    (HERE / "compare.txt").write_text(comparison.table() + "\n")


def warm_up() -> float:
    """matplotlib's first figure of a process loads fonts and the renderer
    (about a second): paid here once, so that the timings are the charts'."""
    import io

    from matplotlib.figure import Figure
    t = time.perf_counter()
    fig = Figure()
    fig.subplots().text(0.5, 0.5, "x")
    fig.savefig(io.BytesIO(), format="png")
    return time.perf_counter() - t


def main(names: list) -> None:
    print(f"matplotlib's first figure: {warm_up():.2f} s")
    timings_file = HERE / "timings.json"
    timings = json.loads(timings_file.read_text()) if timings_file.is_file() else {}
    for name in names or list(RUNS):
        command, options = RUNS[name]
        timings[name] = {"command": command, **draw(name, options)}
    if not names or "gpt2-pp2" in names:
        compare_gpt2()
    timings_file.write_text(json.dumps(timings, indent=2, sort_keys=True) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
