"""gantt.png and pipeline.png: what they draw, read from the charts' data."""
import numpy as np
import pytest

import distsim
from distsim.report import gantt_figure, write_gantt
from distsim.report.gantt import AXIS_PX, MIN_PX, chart_figure, gantt_chart
from distsim.report.gantt_layout import BANDS, device_lanes, lane_tasks, full_window
from distsim.report.phases import KEYS, record_phases

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def pipeline_run():
    """tiny, dp 2 x tp 2 x pp 2, 1F1B, sequence parallel, selective
    recomputation: every phase and every kind but ZeRO."""
    return distsim.simulate(model="tiny", topology="dgx-a100", dp=2, tp=2, pp=2, sp=True,
                            recompute="selective", microbatches=4)


@pytest.fixture(scope="module")
def long_pipeline():
    """32 micro-batches: too many blocks to number over the whole step."""
    return distsim.simulate(model="tiny", topology="dgx-a100", dp=2, tp=2, pp=2,
                            global_batch=64, micro_batch=1)


def _keys_of(result, **where):
    phases = record_phases(result.trace, result.program)
    cols = result.trace.op_columns
    keys = phases.key[cols.label]
    return {KEYS[k] for k in np.unique(keys).tolist()}


def test_phases_and_kinds_come_from_the_program(pipeline_run):
    assert _keys_of(pipeline_run) == {"forward", "backward", "recompute", "optimizer",
                                      "TP", "SP", "DP", "pipeline p2p"}
    zero3 = distsim.simulate(model="tiny", topology="dgx-a100", dp=4, tp=2, zero=3)
    assert {"ZeRO", "TP"} <= _keys_of(zero3) and "DP" not in _keys_of(zero3)
    assert "SP" not in _keys_of(zero3)          # no sequence parallelism: TP collectives


def test_without_the_program_only_what_the_records_say(pipeline_run):
    phases = record_phases(pipeline_run.trace)
    keys = {KEYS[k] for k in np.unique(phases.key).tolist()}
    assert keys == {"compute", "recompute", "optimizer", "communication", "pipeline p2p"}
    assert not phases.known and (phases.microbatch == -1).all()


def test_every_communication_op_has_a_visible_bar(pipeline_run):
    """Each communication record lies inside a bar of its kind, on its
    lane and band, at least MIN_PX pixels wide."""
    chart = gantt_chart(pipeline_run.trace, pipeline_run.program)
    panel = chart.panels[0]
    phases = record_phases(pipeline_run.trace, pipeline_run.program)
    cols = pipeline_run.trace.op_columns
    lane_of = {lane.rank: i for i, lane in enumerate(chart.lanes)}
    bars = {(b.lane, b.band, b.key): b for b in panel.bars}
    comm = np.flatnonzero(np.array(cols.categories)[cols.category] == "communication")
    assert len(comm) > 100
    for i in comm.tolist():
        stream = cols.streams[cols.stream[i]]
        band = 2 if stream == "p2p" else 1
        b = bars[(lane_of[int(cols.rank[i])], band, KEYS[phases.key[cols.label[i]]])]
        start, end = cols.start_s[i] * 1e3, cols.end_s[i] * 1e3
        at = np.searchsorted(b.starts, start, side="right") - 1
        assert at >= 0 and b.starts[at] <= start + 1e-12
        assert b.starts[at] + b.widths[at] >= end - 1e-12
        assert b.widths[at] >= panel.min_width_ms * (1 - 1e-12)
    # MIN_PX pixels of the drawn axis
    axis = chart_figure(chart).axes[0].get_window_extent().width
    assert axis == pytest.approx(AXIS_PX)
    assert panel.min_width_ms == pytest.approx(chart.step_ms / AXIS_PX * MIN_PX)
    assert {BANDS[b.band] for b in panel.bars} == {"compute", "collectives", "p2p"}


def test_bars_account_for_every_op(pipeline_run):
    """The op time behind the bars of a lane and key is that of its records."""
    chart = gantt_chart(pipeline_run.trace, pipeline_run.program)
    cols = pipeline_run.trace.op_columns
    covered = sum(float(b.covered.sum()) for b in chart.panels[0].bars)
    assert covered == pytest.approx(float((cols.end_s - cols.start_s).sum()) * 1e3, rel=1e-9)


def test_the_1f1b_picture_numbers_the_micro_batches(pipeline_run):
    """Stage 0 runs F0 F1 B0 F2 B1 F3 B2 B3, the last stage F0 B0 F1 B1 ..."""
    chart = gantt_chart(pipeline_run.trace, pipeline_run.program)
    tasks = chart.panels[-1].tasks

    def order(lane):
        return [("B" if t.backward else "F") + str(t.microbatch) for t in tasks
                if t.lane == lane]
    first = [i for i, lane in enumerate(chart.lanes) if lane.rank == 0][0]
    last = [i for i, lane in enumerate(chart.lanes) if lane.rank == 4][0]
    assert order(first) == ["F0", "F1", "B0", "F2", "B1", "F3", "B2", "B3"]
    assert order(last) == ["F0", "B0", "F1", "B1", "F2", "B2", "F3", "B3"]
    texts = {t.get_text() for t in gantt_figure(pipeline_run.trace, pipeline_run.program)
             .axes[0].texts}
    assert texts == {"0", "1", "2", "3"}          # wide enough to carry their numbers


def test_a_long_pipeline_zooms_on_a_window_and_says_so(long_pipeline):
    chart = gantt_chart(long_pipeline.trace, long_pipeline.program)
    assert len(chart.panels) == 2
    whole, zoom = chart.panels
    t0, t1 = zoom.window
    assert t0 == 0 and 0 < t1 < chart.step_ms
    assert f"zoom below: {t0:,.1f}-{t1:,.1f} ms" in whole.title
    assert zoom.title.startswith(f"Zoom: {t0:,.1f}-{t1:,.1f} ms of {chart.step_ms:,.1f} ms")
    # in the zoom, the median block is wide enough for its number
    widths = [(t.end_ms - t.start_ms) / (t1 - t0) * AXIS_PX for t in zoom.tasks
              if t.end_ms <= t1]
    assert np.median(widths) >= 20
    fig = chart_figure(chart)
    assert [ax.get_title(loc="left") for ax in fig.axes] == [whole.title, zoom.title]
    assert fig.axes[1].get_xlim() == pytest.approx((t0, t1))
    assert len(fig.axes[1].texts) > len(fig.axes[0].texts) > 0   # numbers where they fit


def test_stage_view_has_a_lane_per_stage(long_pipeline):
    chart = gantt_chart(long_pipeline.trace, long_pipeline.program, view="stages")
    assert [lane.label for lane in chart.lanes] == ["stage 0: gpu0\nof gpu0-3",
                                                    "stage 1: gpu4\nof gpu4-7"]
    assert [lane.ranks for lane in chart.lanes] == [(0, 1, 2, 3), (4, 5, 6, 7)]


def test_representatives_say_which_devices_they_stand_for():
    result = distsim.simulate(model="tiny", topology="dgx-a100-x2", dp=4, tp=2, pp=2,
                              symmetry=True)
    lanes = device_lanes(result.trace)
    represented = result.trace.meta["represented_ranks"]
    assert len(lanes) == len(represented) < 16
    for lane in lanes:
        assert lane.ranks == tuple(sorted(represented[lane.rank]))
        assert f"for {len(lane.ranks)}: gpu" in lane.label
    stages = gantt_chart(result.trace, result.program, view="stages").lanes
    assert [lane.ranks for lane in stages] == [tuple(range(8)), tuple(range(8, 16))]


def test_max_lanes_cuts_and_says_so(pipeline_run):
    chart = gantt_chart(pipeline_run.trace, pipeline_run.program, max_lanes=3)
    assert len(chart.lanes) == 3 and chart.total_lanes == 8
    assert "first 3 of 8 devices" in chart.panels[0].title


def test_a_trace_without_a_program_draws(trace):
    ax = gantt_figure(trace).axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["gpu0", "gpu1"]
    assert ax.get_xlim() == (0.0, 10000.0)
    assert ax.get_title(loc="left").startswith("Step time 10,000.000 ms: a lane per device")
    assert lane_tasks(trace, record_phases(trace), device_lanes(trace), full_window(trace)) == []


def test_writes_a_png(pipeline_run, tmp_path):
    path = tmp_path / "sub" / "gantt.png"
    write_gantt(pipeline_run.trace, path, pipeline_run.program)
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC and len(data) > 5000
    write_gantt(pipeline_run.trace, path, pipeline_run.program)
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


def test_a_number_sits_on_its_blocks_longest_stretch():
    """A backward that starts with one op and then waits for the next
    stage's gradient carries its number where its ops run, not in the gap."""
    from distsim.report.gantt_layout import Lane
    from distsim.report.phases import RecordPhases
    from distsim.sim.trace import DeviceInfo, OpRecord, Trace
    ops = [OpRecord(0, "compute", "a", "T", "compute", 0.0, 0.001),        # B0: a lone op,
           OpRecord(0, "compute", "b", "T", "compute", 0.005, 0.008),      # a wait, then 3 ms
           OpRecord(0, "compute", "c", "T", "compute", 0.008, 0.009),
           OpRecord(1, "compute", "d", "T", "compute", 0.0, 0.010)]        # another lane
    trace = Trace([DeviceInfo(0, "gpu0", 1), DeviceInfo(1, "gpu1", 1)], ops=ops,
                  step_time_s=0.01)
    labels = trace.op_columns.label
    n = int(labels.max()) + 1
    phases = RecordPhases(np.full(n, KEYS.index("backward")), np.zeros(n, np.int64),
                          np.zeros(n, np.int64), True)
    tasks = lane_tasks(trace, phases, [Lane(0, "gpu0", (0,)), Lane(1, "gpu1", (1,))],
                       (0.0, 10.0))
    assert [(t.lane, t.start_ms, t.end_ms) for t in tasks] == [(0, 0.0, 9.0), (1, 0.0, 10.0)]
    assert tasks[0].label_ms == pytest.approx(7.0) and tasks[0].label_width_ms == \
        pytest.approx(4.0)
    assert tasks[1].label_ms == pytest.approx(5.0)


def test_collectives_of_two_groups_that_overlap_get_a_row_each():
    """Under per-group streams a data-parallel gradient all-reduce runs
    beside the tensor-parallel ones of the backward on the same device:
    each group's stream has its own row of the collectives band, so
    neither bar is drawn over the other; under one shared stream they
    cannot overlap and the band has one row."""
    run = dict(model="gpt2", layers=2, seq=256, topology="dgx-a100", dp=4, tp=2,
               global_batch=8, micro_batch=1, bucket_mb=1)
    per_group = distsim.simulate(**run, comm_streams="per-group")
    streams = {r.stream for r in per_group.trace.ops if r.rank == 0}
    assert {"comm-2x1", "comm-4x2"} <= streams
    ops = [r for r in per_group.trace.ops if r.rank == 0 and r.stream.startswith("comm-")]
    assert any(a.stream != b.stream and a.start_s < b.end_s and b.start_s < a.end_s
               for a in ops for b in ops), "the setting should make two groups overlap"
    chart = gantt_chart(per_group.trace, per_group.program)
    collectives = [b for b in chart.panels[0].bars if b.band == BANDS.index("collectives")]
    assert {b.rows for b in collectives} == {2}
    rows = {(b.lane, b.key): b.row for b in collectives}
    assert rows[(0, "TP")] != rows[(0, "DP")]
    shared = distsim.simulate(**run)
    chart = gantt_chart(shared.trace, shared.program)
    assert {(b.row, b.rows) for b in chart.panels[0].bars} == {(0, 1)}
