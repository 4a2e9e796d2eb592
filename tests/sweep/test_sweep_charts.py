"""Each sweep chart and both HTML reports are produced and non-empty."""
from __future__ import annotations

import base64
import re

import pandas as pd
from matplotlib.image import imread

import distsim
from distsim.cli import main
from distsim.report.html import write_run_report, write_sweep_report
from distsim.report.sweep_charts import (CHART_FILES, breakdown_table, heatmap_axes,
                                         heatmap_figure, objective, pareto_front, ranked,
                                         write_sweep_charts)
from sweep_fakes import TINY


def assert_png_drawn(path):
    assert path.stat().st_size > 5000
    pixels = imread(path)
    assert pixels.shape[0] > 100 and pixels.shape[1] > 100
    assert pixels.std() > 0.01                     # not a blank canvas


def with_oom(df: pd.DataFrame) -> pd.DataFrame:
    """The frame with its slowest simulated point marked out of memory."""
    df = df.copy()
    ok = df.index[df["status"] == "ok"]
    worst = df.loc[ok, "step_time_s"].idxmax()
    df.loc[worst, "oom"] = True
    return df


def test_every_chart_is_written(tiny_frame, tmp_path):
    paths = write_sweep_charts(with_oom(tiny_frame), tmp_path, heatmap=["dp", "tp"])
    assert set(paths) == set(CHART_FILES)
    for path in paths.values():
        assert_png_drawn(path)


def test_charts_of_a_sweep_where_nothing_ran(tiny_frame, tmp_path):
    nothing = tiny_frame[tiny_frame["status"] != "ok"]
    for path in write_sweep_charts(nothing, tmp_path).values():
        assert path.stat().st_size > 1000


def test_chart_helpers(tiny_frame):
    assert heatmap_axes(tiny_frame) == ("dp", "tp")
    points = pd.DataFrame({"step_time_s": [1, 2, 3, 4], "max_peak_memory_bytes": [9, 5, 7, 1]})
    assert list(pareto_front(points)["step_time_s"]) == [1, 2, 4]
    table = breakdown_table(tiny_frame)
    total = table[["compute_s", "exposed_communication_s", "bubble_s", "idle_s"]].sum(axis=1)
    assert (abs(total - table["step_time_s"]) <= 1e-9 + 1e-6 * table["step_time_s"]).all()


def test_sweep_report_is_self_contained(tiny_frame, tmp_path):
    path = write_sweep_report(with_oom(tiny_frame), tmp_path / "report.html", title="tiny")
    text = path.read_text()
    images = re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', text)
    assert len(images) == 4 and all(len(base64.b64decode(i)) > 1000 for i in images)
    assert "http" not in text and "<script" not in text
    assert "Fastest configuration that fits in memory" in text
    assert "constraint: dp &lt;= devices" in text               # skipped rows, escaped


def test_run_report(tmp_path):
    result = distsim.simulate(**TINY, hidden=64)
    text = write_run_report(result, tmp_path / "run.html").read_text()
    # the Gantt chart, memory and links (no pipeline: no pipeline.png)
    assert text.count("data:image/png;base64,") == 3 and "step time" in text
    assert "(gantt.png)" in text and "(memory.png)" in text and "(links.png)" in text
    assert result.html_report(tmp_path / "again.html").read_text() == text


def test_cli_sweep_writes_tables_charts_and_report(tmp_path, capsys):
    spec = tmp_path / "spec.yaml"
    spec.write_text("name: tiny\nbase: {model: mlp, network_mode: analytical, layers: 2, "
                    "batch: 64}\ngrid:\n  dp: [1, 2, 4]\n  hidden: [64, 128]\n"
                    "charts: {heatmap: [dp, hidden], hue: hidden}\n")
    out = tmp_path / "out"
    assert main(["sweep", str(spec), "--out", str(out), "--workers", "1", "--quiet"]) == 0
    printed = capsys.readouterr().out
    assert "tiny: 6 configurations: 6 ok" in printed and "1." in printed
    for name in ("results.csv", "results.parquet", "results.jsonl", "manifest.json",
                 "report.html", *CHART_FILES.values()):
        assert (out / name).stat().st_size > 0, name
    assert len(pd.read_csv(out / "results.csv")) == 6


def frame(batches, steps):
    """Four points: dp 1 and 2, each at two batch sizes."""
    n = len(steps)
    return pd.DataFrame({
        "index": range(n), "key": [f"k{i}" for i in range(n)], "dp": [1, 1, 2, 2][:n],
        "batch": batches, "status": ["ok"] * n, "reason": [None] * n,
        "step_time_s": steps, "samples_per_s": [b / t for b, t in zip(batches, steps)],
        "tokens_per_s": [float("nan")] * n, "max_peak_memory_bytes": [1e9] * n,
        "oom": pd.array([False] * n, dtype="boolean"), "resolved_global_batch": batches,
        "compute_s": steps, "exposed_communication_s": [0.0] * n, "bubble_s": [0.0] * n,
        "idle_s": [0.0] * n})


def cells(fig):
    return [t.get_text() for t in fig.axes[0].texts]


def test_best_is_throughput_when_the_batch_differs():
    # dp=1: 8 samples in 1 s (8/s) or 64 in 4 s (16/s); dp=2: 8 in 0.5 s (16/s)
    # or 64 in 2 s (32/s). The shortest steps are the small batches, the best
    # points the large ones.
    df = frame([8, 64, 8, 64], [1.0, 4.0, 0.5, 2.0])
    obj = objective(df)
    assert (obj.column, obj.higher, obj.batch) == ("samples_per_s", True, None)
    assert list(ranked(df)["index"]) == [3, 1, 2, 0]
    fig = heatmap_figure(df.assign(model="m"), "dp", "model")
    assert cells(fig) == ["16", "32"] and "samples/s" in fig.axes[0].get_title()
    assert list(breakdown_table(df)["index"]) == [3, 1, 2, 0]


def test_best_is_the_shortest_step_at_a_common_batch():
    df = frame([64, 64, 64, 64], [1.0, 4.0, 0.5, 2.0])
    obj = objective(df)
    assert (obj.column, obj.higher, obj.batch) == ("step_time_s", False, 64)
    assert list(ranked(df)["index"]) == [2, 0, 3, 1]
    fig = heatmap_figure(df.assign(model="m"), "dp", "model")
    assert cells(fig) == ["1000", "500"]                   # ms
    assert "at 64 samples per step" in fig.axes[0].get_title()
    front = pareto_front(df.assign(max_peak_memory_bytes=[4, 3, 2, 1]), "samples_per_s",
                         x_higher=True)
    assert list(front["index"]) == [2, 3]                  # 128/s at 2 B, then 32/s at 1 B


def test_html_report_says_what_it_ranks_by():
    """A sweep whose points train different batches ranks by throughput, and
    its report says 'highest-throughput', not 'fastest' (the shortest step
    there is dp=2's small batch, index 2; the best point is index 3)."""
    from distsim.report.html import sweep_report_html
    mixed = frame([8, 64, 8, 64], [1.0, 4.0, 0.5, 2.0]).assign(mfu=0.5)
    text = sweep_report_html(mixed, charts={})
    assert "Highest-throughput configuration that fits in memory: <b>dp=2, batch=64</b>" in text
    assert "Fastest" not in text
    common = frame([64, 64, 64, 64], [1.0, 4.0, 0.5, 2.0]).assign(mfu=0.5)
    text = sweep_report_html(common, charts={})
    # the options every point shares are said once; the best names the rest
    assert "<p>Every configuration: batch=64.</p>" in text
    assert "Fastest configuration that fits in memory: <b>dp=2</b>: 500.0 ms per step " \
        "(simulated)" in text
