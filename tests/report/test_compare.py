"""distsim compare / distsim.compare: runs side by side, each figure read
from the summaries and its difference from the baseline."""
import json

import pytest

import distsim
from distsim.cli import main
from distsim.errors import ConfigError


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two strategies of tiny on one DGX: pipeline and data parallel."""
    root = tmp_path_factory.mktemp("runs")
    out = {}
    for name, kw in (("pipeline", dict(dp=2, tp=2, pp=2)), ("data", dict(dp=8))):
        result = distsim.simulate(model="tiny", topology="dgx-a100", record_links=True, **kw)
        result.write_outputs(root / name, plots=False)
        out[name] = (result, root / name)
    return out


def test_figures_and_differences_come_from_the_summaries(runs):
    (a, folder_a), (b, folder_b) = runs["pipeline"], runs["data"]
    c = distsim.compare(folder_a, folder_b / "summary.json")
    sa, sb = a.summary(), b.summary()
    assert c.labels == ["pipeline", "data"]
    assert c.values["step_time_ms"] == [sa["step_time_s"] * 1e3, sb["step_time_s"] * 1e3]
    assert c.values["tokens_per_s"] == [sa["tokens_per_s"], sb["tokens_per_s"]]
    assert c.values["mfu_pct"] == [100 * sa["mfu"], 100 * sb["mfu"]]
    assert c.values["bubble_pct"] == [100 * sa["bubble_fraction"], 0.0]
    assert c.values["peak_memory_gb"] == [sa["max_peak_memory_bytes"] / 1e9,
                                          sb["max_peak_memory_bytes"] / 1e9]
    worst = str(sb["max_peak_memory_rank"])
    assert c.values["peak_activations_gb"][1] == \
        sb["memory_by_category"][worst]["activations"] / 1e9
    assert c.values["busiest_link_pct"] == [100 * sa["links"][0]["utilisation"],
                                            100 * sb["links"][0]["utilisation"]]
    diff = c.difference("step_time_ms", 1)
    assert diff == c.values["step_time_ms"][1] - c.values["step_time_ms"][0]
    assert c.relative("step_time_ms", 1) == pytest.approx(100 * diff / c.values["step_time_ms"][0])


def test_the_table_marks_better_and_worse(runs):
    folder_a, folder_b = runs["pipeline"][1], runs["data"][1]
    c = distsim.compare(folder_a, folder_b)
    step = next(line for line in c.table().splitlines() if line.startswith("step time"))
    faster = c.values["step_time_ms"][1] < c.values["step_time_ms"][0]
    assert step.endswith("better" if faster else "worse")
    tokens = next(line for line in c.table().splitlines() if line.startswith("tokens/s"))
    assert tokens.endswith("better" if faster else "worse")    # the same batch: the inverse
    assert "pipeline (baseline)" in c.table() and "dp 2 x tp 2 x pp 2" in c.table()


def test_results_and_summaries_compare_too(runs):
    (a, _), (b, _) = runs["pipeline"], runs["data"]
    c = distsim.compare(a, b.summary(), labels=["pp", "dp"])
    assert c.labels == ["pp", "dp"] and "<table>" in c._repr_html_()
    twice = distsim.compare(a, a)
    assert twice.labels == ["tiny (1)", "tiny (2)"]
    assert all(twice.difference(m.key, 1) in (0.0, None) for m in twice.metrics)


def test_cli_table_json_and_chart(runs, tmp_path, capsys):
    folder_a, folder_b = runs["pipeline"][1], runs["data"][1]
    chart = tmp_path / "compare.png"
    assert main(["compare", str(folder_a), str(folder_b), "--chart", str(chart)]) == 0
    text = capsys.readouterr().out
    assert "step time" in text and "peak memory" in text and f"wrote {chart}" in text
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(["compare", str(folder_a), str(folder_b), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["baseline"] == "pipeline" and [r["label"] for r in data["runs"]] == \
        ["pipeline", "data"]
    step = next(m for m in data["metrics"] if m["key"] == "step_time_ms")
    assert step["difference"] == [step["values"][1] - step["values"][0]]
    assert step["lower_is_better"] is True and data["describe"]["strategy"][1].startswith("dp 8")


def test_the_chart_draws_each_run(runs):
    (a, _), (b, _) = runs["pipeline"], runs["data"]
    fig = distsim.compare(a, b, labels=["pp", "dp"]).figure()
    assert len(fig.axes) == 4
    for ax in fig.axes:
        assert [t.get_text() for t in ax.get_yticklabels()] == ["pp", "dp"]
    time_axis = fig.axes[0]
    # the stacked parts of each bar add up to the run's mean compute + exposed + idle
    widths = [p.get_width() for p in time_axis.patches]
    s = a.summary()
    assert sum(widths[:3]) == pytest.approx(
        (s["compute_s"] + s["exposed_communication_s"] + s["idle_s"]) * 1e3)


@pytest.mark.parametrize("make, message", [
    (lambda d: d, "no summary.json in this folder"),
    (lambda d: (d / "summary.json").write_text("{oops") and d / "summary.json",
     "not valid JSON (line 1"),
    (lambda d: (d / "summary.json").write_text('{"step_time_s": 1}') and d / "summary.json",
     "exposed_communication_s: missing or not a number"),
    (lambda d: d / "missing.json", "missing.json: no such file"),
])
def test_bad_runs_are_one_line_and_exit_2(runs, tmp_path, capsys, make, message):
    bad = make(tmp_path)
    assert main(["compare", str(runs["data"][1]), str(bad)]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_one_run_is_not_a_comparison(runs, capsys):
    assert main(["compare", str(runs["data"][1])]) == 2
    assert "give two runs or more (got 1)" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="2 labels for 3 runs"):
        distsim.compare(runs["data"][0], runs["data"][0], runs["data"][0], labels=["a", "b"])
