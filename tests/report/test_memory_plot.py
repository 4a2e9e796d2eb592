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
    assert labels == ["gpu0", "gpu1", f"capacity {4 * GiB / 1e9:.2f} GB", f"capacity {10 * GiB / 1e9:.2f} GB"]
    caps = [line for line in ax.get_lines() if line.get_linestyle() == "--"]
    assert sorted(line.get_ydata()[0] for line in caps) == [4 * GiB / 1e9, 10 * GiB / 1e9]
    assert ax.get_xlabel() == "time (ms)" and ax.get_ylabel() == "live memory (GB)"


def test_many_devices_plot_envelope_and_say_so(many):
    ax = memory_figure(many(20), max_lines=16).axes[0]
    assert ax.get_title() == "Live memory per device (envelope of 20 devices)"
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert sorted(labels) == [f"capacity {80 * GiB / 1e9:.2f} GB", "gpu2 (highest peak)",
                              "min-max over 20 devices"]


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
