import gzip
import json

import pytest

from distsim.errors import ConfigError

from distsim.report import chrome_trace, chrome_trace_json, write_chrome_trace
from distsim.report.chrome_trace import stream_tids
from distsim.sim.trace import DeviceInfo, OpRecord, Trace


def _events(doc, ph):
    return [e for e in doc["traceEvents"] if e["ph"] == ph]


def test_document_shape(trace):
    doc = chrome_trace(trace)
    assert doc["displayTimeUnit"] == "ms"
    assert doc["otherData"]["step_time_s"] == 10.0
    assert doc["otherData"]["meta"]["model"] == "mlp"
    for e in doc["traceEvents"]:
        assert {"ph", "pid", "tid", "name"} <= e.keys()


def test_one_process_per_device_one_thread_per_stream(trace):
    meta = _events(chrome_trace(trace, include_links=False), "M")
    procs = {e["pid"]: e["args"]["name"] for e in meta if e["name"] == "process_name"}
    assert procs == {0: "gpu0", 1: "gpu1"}
    sort = {e["pid"]: e["args"]["sort_index"] for e in meta if e["name"] == "process_sort_index"}
    assert sort == {0: 0, 1: 1}
    threads = sorted((e["pid"], e["tid"], e["args"]["name"]) for e in meta
                     if e["name"] == "thread_name")
    # gpu0's compute ops [0,4) and [3,6) overlap, as do gpu1's comm ops [2,3)
    # and [2.5,4): the second of each goes on an extra thread (the slices of
    # one thread must nest), tid 2, the first after compute 0 and comm 1
    assert threads == [(0, 0, "compute"), (0, 1, "comm"), (0, 2, "compute (2)"),
                       (1, 0, "compute"), (1, 1, "comm"), (1, 2, "comm (2)")]


def test_complete_events_in_microseconds(trace):
    xs = _events(chrome_trace(trace), "X")
    assert len(xs) == len(trace.ops)
    mm1 = next(e for e in xs if e["name"] == "mm1")      # overlaps mm0: a second thread
    assert mm1 == {"ph": "X", "pid": 0, "tid": 2, "name": "mm1", "cat": "compute", "ts": 3e6,
                   "dur": 3e6,
                   "args": {"op_type": "MatMul", "flops": 2e12, "bytes": 2e6, "detail": ""}}
    ar1 = next(e for e in xs if e["name"] == "ar1")
    assert (ar1["pid"], ar1["tid"], ar1["cat"], ar1["ts"], ar1["dur"]) == (1, 2, "communication",
                                                                           2.5e6, 1.5e6)
    assert ar1["args"]["detail"] == "ring" and ar1["args"]["bytes"] == 300.0
    # sorted by (pid, tid, ts)
    keys = [(e["pid"], e["tid"], e["ts"]) for e in xs]
    assert keys == sorted(keys)


def test_memory_counters(trace):
    cs = [e for e in _events(chrome_trace(trace), "C") if e["name"] == "memory"]
    assert [(e["pid"], e["ts"], e["args"]["live_bytes"]) for e in cs] == [
        (0, 0.0, 2**30), (0, 2e6, 3 * 2**30), (0, 7e6, 2 * 2**30), (1, 1e6, 5 * 2**30),
        (1, 3e6, 2**30)]


def test_link_counters_in_network_process(trace):
    doc = chrome_trace(trace)
    net = [e for e in _events(doc, "M")
           if e["name"] == "process_name" and e["args"]["name"] == "network"]
    assert [e["pid"] for e in net] == [2]
    links = [e for e in _events(doc, "C") if e["pid"] == 2]
    assert [(e["name"], e["ts"], e["args"]["utilisation"]) for e in links] == [
        ("link gpu0->nvswitch", 5e6, 0.5), ("link gpu0->nvswitch", 8e6, 0.0)]
    assert not [e for e in chrome_trace(trace, include_links=False)["traceEvents"] if e["pid"] == 2]


def test_extra_streams_get_stable_tids_after_compute_and_comm():
    t = Trace(devices=[DeviceInfo(0, "gpu0", 1)], ops=[
        OpRecord(0, "p2p", "s", "Send", "communication", 0.0, 1.0),
        OpRecord(0, "copy", "c", "Copy", "compute", 0.0, 1.0)])
    assert stream_tids(t) == {"compute": 0, "comm": 1, "copy": 2, "p2p": 3}


def test_deterministic_bytes_regardless_of_record_order(trace, tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    write_chrome_trace(trace, a)
    trace.ops.reverse()
    trace.memory.reverse()
    write_chrome_trace(trace, b)
    assert a.read_bytes() == b.read_bytes()
    assert json.loads(a.read_text()) == chrome_trace(trace)


def test_gzip_output_is_the_same_json_and_deterministic(trace, tmp_path):
    write_chrome_trace(trace, tmp_path / "t.json.gz")
    first = (tmp_path / "t.json.gz").read_bytes()
    write_chrome_trace(trace, tmp_path / "t.json.gz")
    assert (tmp_path / "t.json.gz").read_bytes() == first
    assert gzip.decompress(first).decode() == chrome_trace_json(trace)


def test_non_finite_numbers_become_null():
    t = Trace(devices=[DeviceInfo(0, "gpu0", 1)],
              ops=[OpRecord(0, "compute", "a", "X", "compute", 0.0, 1.0, float("inf"),
                            float("nan"))])
    x = _events(json.loads(chrome_trace_json(t)), "X")[0]
    assert x["args"]["flops"] is None and x["args"]["bytes"] is None


def test_failed_write_leaves_no_file(trace, tmp_path, monkeypatch):
    target = tmp_path / "trace.json"
    target.write_text("old")

    def boom(*args, **kwargs):
        raise RuntimeError("injected")
    monkeypatch.setattr(gzip, "GzipFile", boom)
    with pytest.raises(RuntimeError):
        write_chrome_trace(trace, tmp_path / "trace.json.gz")
    blocker = tmp_path / "notadir"
    blocker.write_text("")
    with pytest.raises(ConfigError, match='cannot write'):
        write_chrome_trace(trace, blocker / "trace.json")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notadir", "trace.json"]
    assert target.read_text() == "old"


def test_a_representative_names_the_devices_it_stands_for():
    # a program reduced by --symmetry: gpu0 stands for 0-3 and 8-9, gpu4 for itself and 5
    trace = Trace([DeviceInfo(0, "gpu0", 0), DeviceInfo(4, "gpu4", 0)],
                  [OpRecord(0, "compute", "a", "matmul", "compute", 0.0, 1.0, 0.0, 0.0, ""),
                   OpRecord(4, "compute", "b", "matmul", "compute", 0.0, 1.0, 0.0, 0.0, "")],
                  meta={"represented_ranks": {0: [0, 1, 2, 3, 8, 9], 4: [5, 4]}})
    labels = {e["pid"]: e["args"]["labels"] for e in _events(chrome_trace(trace), "M")
              if e["name"] == "process_labels"}
    assert labels == {0: "stands for 6 devices: gpu0-3, gpu8-9",
                      4: "stands for 2 devices: gpu4-5"}
    # without a reduction there is no label
    plain = Trace(trace.devices, trace.ops)
    assert not [e for e in _events(chrome_trace(plain), "M") if e["name"] == "process_labels"]


def _p2p(rank, name, start, end, nbytes):
    return OpRecord(rank, "p2p", name, "comm.sendrecv", "communication", start, end, 0.0,
                    nbytes, "direct")


def test_a_send_recv_is_an_arrow_from_the_sender_to_the_receiver():
    devices = [DeviceInfo(r, f"gpu{r}", 0) for r in range(3)]
    ops = [_p2p(0, "x_m0", 1e-6, 2e-6, 1024.0), _p2p(1, "x_m0", 1e-6, 2e-6, 0.0),
           # received first in the list, sent by gpu2: the direction is the bytes'
           _p2p(1, "y_m0", 3e-6, 4e-6, 0.0), _p2p(2, "y_m0", 3e-6, 4e-6, 512.0),
           _p2p(0, "lonely", 5e-6, 6e-6, 64.0),                      # its peer not simulated
           _p2p(0, "empty", 7e-6, 7e-6, 0.0), _p2p(2, "empty", 7e-6, 7e-6, 0.0)]  # 0 bytes
    doc = chrome_trace(Trace(devices, ops))
    p2p_tid = stream_tids(Trace(devices, ops))["p2p"]
    flows = [e for e in doc["traceEvents"] if e["ph"] in ("s", "f")]
    assert [(e["ph"], e["id"], e["pid"], e["tid"], e["name"], e["ts"]) for e in flows] == [
        ("s", 0, 0, p2p_tid, "x_m0", 1.0), ("f", 0, 1, p2p_tid, "x_m0", 1.0),
        ("s", 1, 2, p2p_tid, "y_m0", 3.0), ("f", 1, 1, p2p_tid, "y_m0", 3.0)]
    assert all(e["bp"] == "e" for e in flows if e["ph"] == "f")


def test_no_arrow_to_a_slice_the_truncated_trace_does_not_show():
    devices = [DeviceInfo(r, f"gpu{r}", 0) for r in range(2)]
    ops = [_p2p(0, "a", 1e-6, 2e-6, 8.0), _p2p(1, "a", 1e-6, 2e-6, 0.0),
           _p2p(0, "b", 9e-6, 10e-6, 8.0), _p2p(1, "b", 9e-6, 10e-6, 0.0)]
    doc = chrome_trace(Trace(devices, ops), max_trace_records=2)   # keeps the first two ops
    assert [e["name"] for e in doc["traceEvents"] if e["ph"] in ("s", "f")] == ["a", "a"]
