"""Each sweep chart and both HTML reports are produced and non-empty."""
from __future__ import annotations

import base64
import re

import pandas as pd
import pytest
from matplotlib.image import imread

import distsim
from distsim.cli import main
from distsim.report.html import write_run_report, write_sweep_report
from distsim.report.sweep_charts import (CHART_FILES, breakdown_table, heatmap_axes,
                                         pareto_front, write_sweep_charts)
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
    assert text.count("data:image/png;base64,") == 2 and "Step time" in text
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
