import pytest
from hypothesis import given, settings, strategies as st

from distsim.report import gantt_figure, write_gantt
from distsim.report.gantt import _spans, gantt_rows
from distsim.sim.trace import DeviceInfo, OpColumns, OpLabels, OpRecord, Trace

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


# -- the bars' spans come from the op columns: same spans as a loop over the records --
def reference_spans(trace, rows):
    """(row number, category) -> (starts, ends), one record at a time."""
    index = {row: i for i, row in enumerate(rows)}
    spans = {}
    for op in trace.ops:
        i = index.get((op.rank, op.stream))
        if i is not None:
            starts, ends = spans.setdefault((i, op.category), ([], []))
            starts.append(op.start_s)
            ends.append(op.end_s)
    return spans


def reference_rows(trace):
    from distsim.report.chrome_trace import stream_tids
    tids = stream_tids(trace)
    rows = {(d.rank, s) for d in trace.devices for s in ("compute", "comm")}
    rows |= {(op.rank, op.stream) for op in trace.ops}
    return sorted(rows, key=lambda r: (r[0], tids[r[1]]))


def _as_lists(spans):
    return {k: (list(map(float, s)), list(map(float, e))) for k, (s, e) in spans.items()}


@st.composite
def traces(draw):
    devices = [DeviceInfo(r, f"gpu{r}", 1) for r in range(draw(st.integers(0, 3)))]
    times = st.integers(0, 5).map(float)
    ops = [OpRecord(draw(st.integers(0, 4)), draw(st.sampled_from(["compute", "comm", "copy"])),
                    f"op{i}", "T", draw(st.sampled_from(["compute", "communication", "x"])),
                    draw(times), draw(times))
           for i in range(draw(st.integers(0, 30)))]
    return Trace(devices, ops=ops, step_time_s=5.0)


@settings(max_examples=300, deadline=None)
@given(traces(), st.integers(1, 12))
def test_rows_and_spans_equal_the_per_record_ones(trace, max_rows):
    rows = gantt_rows(trace)
    assert rows == reference_rows(trace)
    shown = rows[:max_rows]
    assert _as_lists(_spans(trace.op_columns, shown)) == reference_spans(trace, shown)


@pytest.mark.parametrize("symmetry", [False, True])
def test_simulated_rows_and_spans_equal_the_per_record_ones(symmetry):
    from distsim.bench.cases import _mlp_dp
    from distsim.sim.simulator import SimulationOptions, simulate_function
    from distsim.topology import load_topology
    trace = simulate_function(_mlp_dp(8, 3), load_topology("dgx-a100"),
                              options=SimulationOptions(symmetry=symmetry))
    rows = gantt_rows(trace)
    spans = _spans(trace.op_columns, rows[:5])     # records not made yet: columns in time order
    assert rows == reference_rows(trace)
    assert _as_lists(spans) == reference_spans(trace, rows[:5])


@st.composite
def column_traces(draw):
    """Time-ordered columns, as the simulator makes them: not in record order."""
    from distsim.sim.records import CATEGORIES, STREAMS
    n = draw(st.integers(0, 30))
    def ints(lo, hi):
        return draw(st.lists(st.integers(lo, hi), min_size=n, max_size=n))
    rank, stream, category = ints(0, 3), ints(0, 1), ints(0, 1)
    start, length = ints(0, 5), ints(0, 2)
    cols = OpColumns(rank, stream, category, [float(s) for s in start],
                     [float(s + d) for s, d in zip(start, length)], [0.0] * n, [0.0] * n,
                     [0] * n, STREAMS, CATEGORIES, OpLabels(["op"], ["T"], [""]),
                     time_ordered=True)
    devices = [DeviceInfo(r, f"gpu{r}", 1) for r in range(draw(st.integers(0, 3)))]
    return Trace(devices, op_columns=cols, step_time_s=8.0)


@settings(max_examples=300, deadline=None)
@given(column_traces(), st.integers(1, 8))
def test_spans_of_time_ordered_columns_are_in_record_order(trace, max_rows):
    rows = gantt_rows(trace)
    shown = rows[:max_rows]
    spans = _spans(trace.op_columns, shown)
    assert rows == reference_rows(trace)
    assert _as_lists(spans) == reference_spans(trace, shown)
