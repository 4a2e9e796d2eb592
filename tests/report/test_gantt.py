import pytest

from distsim.report import gantt_figure, write_gantt
from distsim.report.gantt import gantt_rows

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_rows_are_device_streams_in_rank_order(trace):
    assert gantt_rows(trace) == [(0, "compute"), (0, "comm"), (1, "compute"), (1, "comm")]


def test_labels_colours_legend_title(trace):
    fig = gantt_figure(trace)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == [
        "gpu0 compute", "gpu0 comm", "gpu1 compute", "gpu1 comm"]
    assert ax.get_xlabel() == "time (ms)"
    assert ax.get_title() == "Step time 10000.000 ms"
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["compute", "communication"]
    colours = {tuple(c.get_facecolor()[0]) for c in ax.collections}
    assert len(colours) == 2
    assert ax.get_xlim() == (0.0, 10000.0)


def test_max_rows_truncates_and_says_so(many):
    ax = gantt_figure(many(5), max_rows=4).axes[0]
    assert len(ax.get_yticklabels()) == 4
    assert ax.get_title() == "Step time 6000.000 ms (first 4 of 10 rows shown)"


def test_writes_a_png(trace, tmp_path):
    path = tmp_path / "sub" / "gantt.png"
    write_gantt(trace, path)
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC and len(data) > 5000
    write_gantt(trace, path)
    assert path.read_bytes() == data  # deterministic


def test_failed_write_leaves_no_file(trace, tmp_path, monkeypatch):
    from matplotlib.figure import Figure

    def boom(self, fname, **kwargs):
        with open(fname, "wb") as f:
            f.write(PNG_MAGIC)  # a partial file, then a failure
        raise RuntimeError("injected")
    monkeypatch.setattr(Figure, "savefig", boom)
    with pytest.raises(RuntimeError):
        write_gantt(trace, tmp_path / "gantt.png")
    assert list(tmp_path.iterdir()) == []
