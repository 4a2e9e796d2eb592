import numpy as np
import pytest

from distsim.errors import ConfigError

from distsim.report import memory_figure, write_memory_plot
from distsim.report.memory_plot import envelope, memory_curves

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
GiB = 2**30


def test_curves_are_step_functions_spanning_the_step(trace):
    curves = memory_curves(trace)
    t0, v0 = curves[0]
    assert t0.tolist() == [0.0, 2.0, 7.0, 10.0]
    assert v0.tolist() == [GiB, 3 * GiB, 2 * GiB, 2 * GiB]
    t1, v1 = curves[1]
    assert t1.tolist() == [0.0, 1.0, 3.0, 10.0]  # zero before the first sample
    assert v1.tolist() == [0, 5 * GiB, GiB, GiB]


def test_envelope_exact():
    curves = {0: (np.array([0.0, 2.0, 4.0]), np.array([1.0, 3.0, 3.0])),
              1: (np.array([0.0, 1.0, 4.0]), np.array([2.0, 0.0, 0.0]))}
    grid, lo, hi = envelope(curves)
    assert grid.tolist() == [0.0, 1.0, 2.0, 4.0]
    assert lo.tolist() == [1.0, 0.0, 0.0, 0.0]
    assert hi.tolist() == [2.0, 1.0, 3.0, 3.0]


def test_lines_capacity_and_labels(trace):
    ax = memory_figure(trace).axes[0]
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    # gpu1 peaks highest (5 GiB): its line is drawn thicker and named so
    assert labels == ["gpu0", "gpu1 (highest peak)", f"capacity {4 * GiB / 1e9:.2f} GB",
                      f"capacity {10 * GiB / 1e9:.2f} GB"]
    caps = [line for line in ax.get_lines() if line.get_linestyle() == "--"]
    assert sorted(line.get_ydata()[0] for line in caps) == [4 * GiB / 1e9, 10 * GiB / 1e9]
    assert ax.get_xlabel() == "time (ms)" and ax.get_ylabel() == "live memory (GB)"


def test_many_devices_plot_envelope_and_say_so(many):
    ax = memory_figure(many(20), max_lines=16).axes[0]
    assert ax.get_title() == "Live memory per device (envelope of 20 devices)"
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    # peaks of 3 GiB on 80 GiB devices: 3.75 %, the capacity off scale (OFF_SCALE 20)
    assert sorted(labels) == [f"capacity {80 * GiB / 1e9:.2f} GB (off scale: the peak is 3.8 % "
                              "of it)", "gpu2 (highest peak)", "min-max over 20 devices"]


def test_writes_a_png(trace, tmp_path):
    path = tmp_path / "memory.png"
    write_memory_plot(trace, path)
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC and len(data) > 5000


def test_failed_write_leaves_no_file(trace, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(ConfigError, match='cannot write'):
        write_memory_plot(trace, blocker / "memory.png")
    assert [p.name for p in tmp_path.iterdir()] == ["file"]


def test_curves_last_sample_at_a_time_wins_in_any_order():
    from distsim.report.memory_plot import memory_curves
    from distsim.sim.trace import DeviceInfo, MemorySample, Trace
    t = Trace(devices=[DeviceInfo(0, "a", 1), DeviceInfo(5, "b", 1)],
              memory=[MemorySample(0, 1.0, 5), MemorySample(0, 1.0, 7), MemorySample(0, 0.5, 3),
                      MemorySample(2, 0.0, 9)], step_time_s=0.2)
    curves = {r: (a.tolist(), b.tolist()) for r, (a, b) in memory_curves(t).items()}
    assert curves == {0: ([0.0, 0.5, 1.0, 1.0], [0.0, 3.0, 7.0, 7.0]),
                      2: ([0.0, 1.0], [9.0, 9.0]),
                      5: ([0.0, 1.0], [0.0, 0.0])}


def _small_model_trace(peak_bytes: int, capacity_bytes: int):
    from distsim.sim.trace import DeviceInfo, MemorySample, Trace
    return Trace(devices=[DeviceInfo(0, "gpu0", capacity_bytes)], ops=[],
                 memory=[MemorySample(0, 0.0, peak_bytes // 2), MemorySample(0, 1.0, peak_bytes),
                         MemorySample(0, 2.0, 0)])


def test_a_capacity_far_above_the_peak_is_named_not_drawn_and_the_axis_fits_the_curve():
    # 300 kB on an 80 GB GPU: drawn, the 80 GB line would flatten the curve to 0
    ax = memory_figure(_small_model_trace(300_000, 80 * 10**9)).axes[0]
    assert ax.get_ylabel() == "live memory (kB)"
    drawn = [line for line in ax.get_lines() if len(line.get_ydata())
             and line.get_linestyle() == "--"]
    assert drawn == []
    assert ax.get_ylim()[1] < 80 * 10**9 / 1e3            # the axis stops near the curve
    curve = [line for line in ax.get_lines() if line.get_label() == "gpu0"][0]
    assert max(curve.get_ydata()) == 300.0                  # 300,000 bytes in kB
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    # 300 kB / 80 GB = 3.75e-6 = 0.000375 %
    assert labels == ["gpu0", "capacity 80.00 GB (off scale: the peak is 0.00038 % of it)"]


def test_a_capacity_within_twenty_peaks_is_drawn_in_the_unit_of_the_axis():
    # peak 5 MB, capacity 100 MB = 20 peaks: still drawn, both in MB
    ax = memory_figure(_small_model_trace(5 * 10**6, 100 * 10**6)).axes[0]
    assert ax.get_ylabel() == "live memory (MB)"
    caps = [line for line in ax.get_lines() if line.get_linestyle() == "--"]
    assert [line.get_ydata()[0] for line in caps] == [100.0]
    assert ax.get_ylim()[1] >= 100.0


def test_an_empty_device_names_its_capacity_as_off_scale():
    ax = memory_figure(_small_model_trace(0, 80 * 10**9)).axes[0]
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "capacity 80.00 GB (off scale: nothing is live)" in labels


def test_the_bars_are_the_summary_categories_and_an_overflow_is_named():
    """The category panel draws each device's memory_by_category (summary.json),
    and an out-of-memory run names the device and the summary's oom_category."""
    import distsim
    from distsim.report.memory_categories import oom_line, peak_bars
    result = distsim.simulate(model="tiny", topology="dgx-a100", dp=2, tp=2, pp=2,
                              microbatches=2)
    summary = result.summary()
    bars, total = peak_bars(result.trace)
    assert [b.ranks for b in bars] == [(0, 1, 2, 3), (4, 5, 6, 7)] and total == 2
    for b in bars:
        assert b.by_category == summary["memory_by_category"][str(b.ranks[0])]
        assert sum(b.by_category.values()) == b.peak
    assert oom_line(bars) is None
    fig = memory_figure(result.trace)
    assert fig.axes[1].get_title(loc="left") == "By category at each device's peak"
    assert [t.get_text() for t in fig.axes[1].get_yticklabels()] == ["gpu0-3 (highest)",
                                                                     "gpu4-7"]
    small = distsim.simulate(model="tiny", topology="dgx-a100", dp=8,
                             global_batch=8, micro_batch=1)
    for d in small.trace.devices:          # a device too small for its peak
        small.trace.devices[d.rank] = d._replace(capacity_bytes=1000)
    line = oom_line(peak_bars(small.trace)[0])
    worst = max(small.summary()["memory_by_category"]["0"].items(), key=lambda kv: kv[1])
    assert line.startswith("OUT OF MEMORY: gpu0-7 peaks at ") and "over its 0.00 GB" in line
    assert f"largest: {worst[0]}" in line
    assert memory_figure(small.trace)._suptitle.get_text() == line
