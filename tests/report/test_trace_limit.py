"""trace.json under a size bound: streamed to a temporary file and renamed,
summarised past ``max_trace_records`` (a time window on every device, one
``truncated`` slice per device stream for the rest, a global note), and
summary.json says so. The untruncated document is the same as before
streaming (checked against a dict-built reference)."""
from __future__ import annotations

import gzip
import importlib
import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import distsim
from distsim.errors import ConfigError
from distsim.report.gantt_layout import merge_spans
from distsim.report.memory_plot import downsample_max

ct = importlib.import_module("distsim.report.chrome_trace")


def _conftest():
    """This folder's conftest (by path: several test folders have one)."""
    spec = importlib.util.spec_from_file_location(
        "report_conftest", os.path.join(os.path.dirname(__file__), "conftest.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


make_many, make_trace = _conftest().make_many, _conftest().make_trace


def _x(doc, real=True):
    return [e for e in doc["traceEvents"] if e["ph"] == "X"
            and (e.get("cat") != ct.TRUNCATED_CATEGORY) == real]


def _reference(trace):
    """The document as the dict-based writer built it (field by field)."""
    tids = ct.stream_tids(trace)
    xs = [{"ph": "X", "pid": o.rank, "tid": tids[o.stream], "name": o.name, "cat": o.category,
           "ts": round(o.start_s * 1e6, 3),
           "dur": round(round(o.end_s * 1e6, 3) - round(o.start_s * 1e6, 3), 3),
           "args": {"op_type": o.op_type, "flops": ct._num(o.flops), "bytes": ct._num(o.bytes),
                    "detail": o.detail}}
          for o in sorted(trace.ops, key=lambda o: (o.rank, tids[o.stream], o.start_s, -o.end_s,
                                                    o.name))]
    cs = [{"ph": "C", "pid": s.rank, "tid": 0, "name": "memory", "ts": round(s.time_s * 1e6, 3),
           "args": {"live_bytes": int(s.live_bytes)}}
          for s in sorted(trace.memory, key=lambda s: (s.rank, s.time_s))]
    return xs, cs


def test_untruncated_document_matches_the_dict_reference():
    trace = make_trace()
    # the reference has one thread per stream: leave out the two ops that
    # overlap another of their stream (they get a thread of their own,
    # tests/report/test_trace_lanes.py)
    trace.ops = [o for o in trace.ops if o.name not in ("mm1", "ar1")]
    doc = ct.chrome_trace(trace)
    xs, cs = _reference(trace)
    assert _x(doc) == xs
    assert [e for e in doc["traceEvents"] if e["ph"] == "C" and e["name"] == "memory"] == cs
    assert "trace_truncated" not in doc["otherData"]
    assert not [e for e in doc["traceEvents"] if e["ph"] == "i"]


def test_plan_keeps_everything_under_the_limit_and_0_means_no_limit():
    trace = make_many(4, 50)                      # 400 ops + 8 memory samples
    assert not ct.plan_trace(trace, 408).truncated
    assert not ct.plan_trace(trace, 0).truncated
    plan = ct.plan_trace(trace, 100)
    assert plan.truncated and plan.records == 408 and plan.written <= 100


@pytest.mark.parametrize("limit", [1, 7, 50, 123])
def test_tiny_limit_gives_a_valid_summarised_trace(limit, tmp_path):
    trace = make_many(4, 50)
    path = tmp_path / "trace.json"
    plan = ct.write_chrome_trace(trace, path, max_trace_records=limit)
    doc = json.loads(path.read_text())                       # strict, complete JSON
    real = _x(doc)
    counters = [e for e in doc["traceEvents"] if e["ph"] == "C"]
    assert len(real) + len(counters) == plan.written <= limit
    cutoff_us = plan.cutoff_s * 1e6
    assert all(e["ts"] < cutoff_us for e in real + counters)    # one time window everywhere
    # every dropped op is accounted for, per device stream
    summaries = _x(doc, real=False)
    assert sum(e["args"]["ops"] for e in summaries) == len(trace.ops) - len(real)
    assert len({(e["pid"], e["tid"]) for e in summaries}) == len(summaries)
    for e in summaries:
        assert e["name"] == f"{e['args']['ops']} ops not shown (trace truncated)"
    note = [e for e in doc["traceEvents"] if e["ph"] == "i"]
    assert len(note) == 1 and note[0]["s"] == "g" and "trace truncated" in note[0]["name"]
    info = doc["otherData"]["trace_truncated"]
    assert info == {"truncated": True, "records": 408, "records_written": plan.written,
                    "max_trace_records": limit, "cutoff_s": plan.cutoff_s}
    # metadata (process / thread names) is always complete
    assert {e["pid"] for e in doc["traceEvents"] if e["name"] == "process_name"} == {0, 1, 2, 3}


def test_truncated_gzip_is_the_same_document(tmp_path):
    trace = make_many(3, 20)
    ct.write_chrome_trace(trace, tmp_path / "t.json", max_trace_records=10)
    ct.write_chrome_trace(trace, tmp_path / "t.json.gz", max_trace_records=10)
    assert gzip.decompress((tmp_path / "t.json.gz").read_bytes()) == \
        (tmp_path / "t.json").read_bytes()


def test_streamed_in_chunks_is_the_same_text(monkeypatch):
    trace = make_many(5, 30)
    whole = ct.chrome_trace_json(trace)
    monkeypatch.setattr(ct, "_CHUNK", 7)
    chunks = list(ct.chrome_trace_chunks(trace))
    assert len(chunks) > 10 and "".join(chunks) == whole


@pytest.mark.parametrize("bad", [-1, 1.5, "10", True])
def test_bad_limit_is_a_config_error(bad):
    with pytest.raises(ConfigError, match="--max-trace-records"):
        ct.check_max_trace_records(bad)


def test_api_and_summary_record_truncation(tmp_path):
    result = distsim.simulate(layers=2, hidden=64, batch=64, dp=2, network_mode="analytical",
                              max_trace_records=5)
    paths = result.write_outputs(tmp_path / "a", plots=False)
    summary = json.loads(paths["summary"].read_text())
    assert summary["trace_file"]["truncated"] is True
    assert summary["trace_file"]["max_trace_records"] == 5
    assert summary["trace_file"]["records_written"] <= 5
    doc = json.loads(paths["trace"].read_text())
    assert len(_x(doc)) <= 5 and doc["otherData"]["trace_truncated"]["truncated"]
    # a later write with no limit: everything, and the summary follows
    paths = result.write_outputs(tmp_path / "b", plots=False, max_trace_records=0)
    summary = json.loads(paths["summary"].read_text())
    assert summary["trace_file"]["truncated"] is False
    assert summary["trace_file"]["records_written"] == summary["trace_file"]["records"]
    assert len(_x(json.loads(paths["trace"].read_text()))) == len(result.trace.ops)


def test_default_limit_does_not_truncate_small_runs():
    result = distsim.simulate(layers=2, hidden=64, batch=64, dp=2, network_mode="analytical")
    info = result.summary()["trace_file"]
    assert info["truncated"] is False and info["max_trace_records"] == ct.DEFAULT_MAX_TRACE_RECORDS


def test_cli_flag_truncates_and_says_so(tmp_path):
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "distsim", "simulate", "--layers", "2",
                           "--hidden", "64", "--batch", "64", "--dp", "2", "--no-plots",
                           "--network-mode", "analytical", "--max-trace-records", "3",
                           "--json", "--out", str(out)], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["trace_file"]["truncated"] is True
    assert "--max-trace-records 3" in proc.stderr
    assert json.loads((out / "summary.json").read_text())["trace_file"]["records_written"] <= 3
    assert len(_x(json.loads((out / "trace.json").read_text()))) <= 3
    assert sorted(os.listdir(out)) == ["summary.json", "trace.json"]


def test_merge_spans_joins_close_bars_only():
    starts = np.array([0.0, 1.0, 1.05, 5.0, 2.0])
    ends = np.array([1.0, 1.04, 1.5, 6.0, 2.1])
    bars, fill = merge_spans(starts, ends, gap=0.1)
    assert bars == [(0.0, 1.5), (2.0, pytest.approx(0.1)), (5.0, 1.0)]
    assert fill.tolist() == pytest.approx([(1.0 + 0.04 + 0.45) / 1.5, 1.0, 1.0])
    assert merge_spans(np.array([]), np.array([]), 0.1)[0] == []


def test_downsample_max_keeps_every_peak():
    rng = np.random.default_rng(0)
    times = np.sort(rng.uniform(0, 10, 20_000))
    times[0] = 0.0
    values = rng.integers(0, 1000, len(times)).astype(float)
    values[12345] = 5000.0                                  # one short spike
    t, v = downsample_max((times, values), 500)
    assert len(t) == 501 and v.max() == 5000.0
    # each bin's value is the max of the curve over that bin
    for k in (0, 17, 250, 499):
        lo, hi = t[k], t[k + 1]
        inside = values[(times >= lo) & (times < hi)]
        before = values[np.searchsorted(times, lo, side="right") - 1]
        assert v[k] == max([before, *inside])
    small = (np.array([0.0, 1.0]), np.array([1.0, 2.0]))
    assert downsample_max(small, 500) is small
