import json

import pytest

from distsim.errors import ConfigError

from distsim.report import format_summary_table, summarize, summary_dataframe, write_summary
from distsim.report.summary import DEVICE_FIELDS, group_label, rank_ranges
from distsim.sim.trace import DeviceInfo, OpRecord, Trace

GiB = 2**30


def test_per_device_times_are_exact(trace):
    s = summarize(trace)
    d0, d1 = s["devices"]
    assert (d0["rank"], d0["name"], d1["rank"]) == (0, "gpu0", 1)
    assert d0["compute_s"] == 6.0            # union of [0,4) and [3,6)
    assert d0["communication_s"] == 3.0
    assert d0["exposed_communication_s"] == 2.0  # [5,8) minus compute [5,6)
    assert d0["idle_s"] == 2.0               # 10 - |[0,8)|
    assert d1["compute_s"] == 1.0
    assert d1["communication_s"] == 2.0      # union of [2,3) and [2.5,4)
    assert d1["exposed_communication_s"] == 2.0
    assert d1["idle_s"] == 7.0
    for d in (d0, d1):
        assert d["compute_s"] + d["exposed_communication_s"] + d["idle_s"] == s["step_time_s"]


def test_memory_flops_bytes_and_oom(trace):
    s = summarize(trace)
    d0, d1 = s["devices"]
    assert d0["peak_memory_bytes"] == 3 * GiB and d0["capacity_bytes"] == 10 * GiB and not d0["oom"]
    assert d1["peak_memory_bytes"] == 5 * GiB and d1["capacity_bytes"] == 4 * GiB and d1["oom"]
    assert d0["flops"] == 3e12 and d0["communication_bytes"] == 1e9 and d0["num_ops"] == 3
    assert d1["communication_bytes"] == 500.0
    assert s["max_peak_memory_bytes"] == 5 * GiB and s["max_peak_memory_rank"] == 1
    assert s["oom"] is True and s["oom_ranks"] == [1]


def test_top_level_fields_are_means_and_extremes(trace):
    s = summarize(trace)
    assert s["step_time_s"] == 10.0 and s["num_devices"] == 2
    assert s["compute_s"] == 3.5
    assert s["communication_s"] == 2.5
    assert s["exposed_communication_s"] == 2.0
    assert s["idle_s"] == 4.5
    assert s["max_exposed_communication_s"] == 2.0
    assert s["min_idle_s"] == 2.0
    assert s["total_flops"] == 3e12 + 5


def test_summary_is_strict_json_and_keeps_meta(trace, tmp_path):
    s = summarize(trace)
    assert s["meta"] == {"dp": 2, "model": "mlp", "nan": None, "shape": [1, 2]}
    text = json.dumps(s, allow_nan=False)
    assert json.loads(text) == s
    path = tmp_path / "out" / "summary.json"
    assert write_summary(trace, path) == s
    assert json.loads(path.read_text()) == s
    assert list(tmp_path.joinpath("out").iterdir()) == [path]


def test_step_time_falls_back_to_last_op_end():
    t = Trace(devices=[DeviceInfo(0, "gpu0", 1)],
              ops=[OpRecord(0, "compute", "a", "Relu", "compute", 1.0, 3.0)])
    s = summarize(t)
    assert s["step_time_s"] == 3.0 and s["devices"][0]["idle_s"] == 1.0


def test_empty_trace():
    s = summarize(Trace(devices=[]))
    assert s["num_devices"] == 0 and s["devices"] == [] and s["max_peak_memory_bytes"] == 0
    assert "step time: 0.000 ms" in format_summary_table(s)


def test_table_shows_ms_gb_and_percent(trace):
    table = format_summary_table(summarize(trace))
    assert table.splitlines()[0].startswith("step time: 10000.000 ms   devices: 2")
    assert "OOM on ranks 1" in table.splitlines()[0]
    row0 = next(line for line in table.splitlines() if line.startswith("gpu0 "))
    assert row0.split() == ["gpu0", f"{3 * GiB / 1e9:.2f}", f"{10 * GiB / 1e9:.2f}",
                            "6000.000", "60.0%", "3000.000", "30.0%", "2000.000", "20.0%",
                            "2000.000", "20.0%"]
    row1 = next(line for line in table.splitlines() if line.startswith("gpu1 "))
    assert row1.split()[-1] == "OOM"


def test_table_groups_identical_consecutive_devices(many):
    table = format_summary_table(summarize(many(8)))
    rows = [line.split()[0] for line in table.splitlines()[5:]]
    # memory peaks cycle 2,2,3 GiB by rank % 3 -> 0,1 | 2 | 3,4 | 5 | 6,7
    assert rows == ["gpu0-1", "gpu2", "gpu3-4", "gpu5", "gpu6-7"]


def test_table_elides_past_max_rows(many):
    table = format_summary_table(summarize(many(10)), max_rows=4)
    assert table.splitlines()[-1] == "(3 rows elided)"
    assert sum(1 for line in table.splitlines() if line.startswith("...")) == 1


def test_group_label_and_rank_ranges():
    assert group_label(["gpu0", "gpu1", "gpu2"], [0, 1, 2]) == "gpu0-2"
    assert group_label(["a", "b"], [4, 5]) == "a..b"
    assert group_label(["x"], [3]) == "x"
    assert rank_ranges([8, 0, 1, 2, 3, 10, 11]) == "0-3,8,10-11"
    assert rank_ranges([]) == ""


def test_dataframe_one_row_per_device(trace):
    s = summarize(trace)
    df = summary_dataframe(s)
    assert list(df.columns) == list(DEVICE_FIELDS)
    assert list(df["rank"]) == [0, 1]
    assert df.loc[0, "compute_s"] == 6.0 and bool(df.loc[1, "oom"]) is True
    assert df.attrs["step_time_s"] == 10.0


def test_write_summary_leaves_nothing_on_failure(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(ConfigError, match='cannot write'):
        write_summary({"step_time_s": 1.0}, blocker / "summary.json")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def test_write_summary_writes_non_finite_numbers_as_null(tmp_path):
    """Strict JSON: NaN and infinities become null (they used to raise
    ValueError after the whole simulation had run)."""
    write_summary({"step_time_s": float("nan"), "config": {"lr": float("inf")}},
                  tmp_path / "summary.json")
    assert json.loads((tmp_path / "summary.json").read_text()) == {
        "step_time_s": None, "config": {"lr": None}}
