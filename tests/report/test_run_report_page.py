"""report.html: the summary, the per-device split, memory by category, the
links and the configuration as HTML tables, every chart, the trace line;
and the notebook view of a result."""
import base64
import html
import re

import pytest

import distsim


@pytest.fixture(scope="module")
def pipeline_page(tmp_path_factory):
    result = distsim.simulate(model="tiny", topology="dgx-a100", pp=2, dp=2, tp=2,
                              microbatches=2, record_links=True)
    out = tmp_path_factory.mktemp("out")
    paths = result.write_outputs(out)
    return result, paths, paths["report"].read_text()


def _cells(page):
    """Every table cell's text."""
    return [html.unescape(c) for c in re.findall(r"<t[hd][^>]*>(.*?)</t[hd]>", page)]


def test_the_figures_are_table_cells(pipeline_page):
    result, _, page = pipeline_page
    s = result.summary()
    cells = _cells(page)
    assert f"{s['step_time_s'] * 1e3:,.3f} ms" in cells
    assert f"{s['tokens_per_s']:,.0f}" in cells
    assert f"{100 * s['mfu']:.1f} % / {100 * s['hfu']:.1f} %" in cells
    assert f"{100 * s['bubble_fraction']:.1f} %" in cells
    assert "<pre>" not in page                       # tables, not preformatted text


def test_per_device_rows_and_memory_categories(pipeline_page):
    result, _, page = pipeline_page
    s = result.summary()
    cells = _cells(page)
    # the two stages: identical devices share a row
    assert "gpu0-3" in cells and "gpu4-7" in cells
    for header in ("weights", "gradients", "optimizer state", "activations", "temporaries"):
        assert header in cells
    assert "most flows at once" in cells and f"{s['links'][0]['src']} -> " \
        f"{s['links'][0]['dst']}" in cells


def test_the_configuration_is_a_table(pipeline_page):
    result, _, page = pipeline_page
    cells = _cells(page)
    config = result.summary()["config"]
    for key in ("layers", "hidden", "dp", "tp", "pp", "schedule", "network_mode"):
        i = cells.index(key)
        assert cells[i + 1] == str(config[key])
    assert "json.dumps" not in page and '"layers":' not in page


def test_every_chart_and_the_trace_line(pipeline_page):
    _, paths, page = pipeline_page
    assert set(paths) >= {"gantt", "pipeline", "memory", "links", "report"}
    images = re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    inlined = [base64.b64decode(i) for i in images]
    for name in ("gantt", "pipeline", "memory", "links"):
        assert paths[name].read_bytes() in inlined, name     # the files, drawn once
        assert f"({paths[name].name})" in page
    assert "ui.perfetto.dev" in page and "trace.json" in page
    assert "<script" not in page


def test_a_run_without_a_pipeline_writes_no_pipeline_chart(tmp_path):
    paths = distsim.simulate(layers=2, hidden=64, batch=16, dp=2).write_outputs(tmp_path)
    assert "pipeline" not in paths and not (tmp_path / "pipeline.png").exists()


def test_the_notebook_view_is_html_tables_and_the_gantt_chart(pipeline_page):
    result, _, _ = pipeline_page
    view = result._repr_html_()
    assert "<table>" in view and "<pre>" not in view
    assert view.count("data:image/png;base64,") == 1
    assert "gpu0-3" in _cells(view)


def test_each_chart_draws_inline(pipeline_page):
    result, paths, _ = pipeline_page
    for name in ("gantt", "pipeline", "memory", "links"):
        assert result.chart(name)._repr_png_()[:8] == b"\x89PNG\r\n\x1a\n"
    from distsim.errors import ConfigError
    with pytest.raises(ConfigError, match="unknown chart 'pie'"):
        result.chart("pie")
    flat = distsim.simulate(layers=2, hidden=64, batch=16, dp=2)
    with pytest.raises(ConfigError, match="no pipeline stages"):
        flat.chart("pipeline")


def test_the_strategy_line_names_context_and_expert_parallelism():
    from distsim.report.run_page import strategy_line
    assert strategy_line({"dp": 2, "cp": 1, "tp": 2, "pp": 1}) == "dp 2 x tp 2 x pp 1"
    assert strategy_line({"dp": 2, "cp": 4, "tp": 2, "pp": 1, "cp_comm": "ring"}) \
        == "dp 2 x cp 4 x tp 2 x pp 1, cp ring"
    assert strategy_line({"dp": 8, "tp": 1, "pp": 1, "ep": 4, "zero": 1}) \
        == "dp 8 x tp 1 x pp 1, ep 4, ZeRO 1"
