"""The slices of one trace thread must nest (Trace Event format); a stream
whose ops overlap (``p2p``: one queue per direction of each pair of ranks, so a
pipeline stage sends to the next stage while it receives from the one
before) is
spread over extra threads, one per lane. Expected tids worked out by hand."""
from distsim.report import chrome_trace
from distsim.sim.trace import DeviceInfo, OpRecord, Trace

US = 1e-6


def _doc(ops):
    return chrome_trace(Trace(devices=[DeviceInfo(0, "gpu0", 1)], ops=ops, step_time_s=20 * US),
                        include_links=False)


def _p2p(name, start_us, end_us):
    return OpRecord(0, "p2p", name, "comm.sendrecv", "communication", start_us * US, end_us * US)


def test_overlapping_p2p_transfers_go_on_a_second_thread():
    # send [0, 10) and receive [5, 15) overlap: the receive goes on a second
    # lane; a third transfer [12, 20) finds the first lane free (10 <= 12).
    # tids: compute 0, comm 1, p2p 2; the extra lane takes the next, 3.
    doc = _doc([_p2p("send", 0, 10), _p2p("recv", 5, 15), _p2p("send2", 12, 20)])
    tid = {e["name"]: e["tid"] for e in doc["traceEvents"] if e["ph"] == "X"}
    assert tid == {"send": 2, "recv": 3, "send2": 2}
    threads = sorted((e["tid"], e["args"]["name"]) for e in doc["traceEvents"]
                     if e["ph"] == "M" and e["name"] == "thread_name")
    assert threads == [(0, "compute"), (1, "comm"), (2, "p2p"), (3, "p2p (2)")]


def test_ops_back_to_back_and_instants_stay_on_their_stream():
    # [0, 10) then [10, 20) touch without overlapping; a zero-length pack at
    # 4 us sits inside the first and overlaps nothing: one thread, tid 0.
    ops = [OpRecord(0, "compute", "a", "MatMul", "compute", 0.0, 10 * US),
           OpRecord(0, "compute", "pack", "pack", "compute", 4 * US, 4 * US),
           OpRecord(0, "compute", "b", "MatMul", "compute", 10 * US, 20 * US)]
    doc = _doc(ops)
    assert {e["name"]: e["tid"] for e in doc["traceEvents"] if e["ph"] == "X"} == \
        {"a": 0, "pack": 0, "b": 0}
    assert sorted(e["args"]["name"] for e in doc["traceEvents"]
                  if e["ph"] == "M" and e["name"] == "thread_name") == ["comm", "compute"]


def test_a_stream_per_process_group_is_a_thread_and_no_comm_thread_is_left_empty():
    # comm_streams per-group: a TP all-reduce [2, 6) beside a DP one [0, 10),
    # each on its group's stream; tids: compute 0, (comm 1, unused), then
    # the other streams in name order: comm-2x1 2, comm-2x2 3
    ops = [OpRecord(0, "comm-2x2", "dp", "comm.allreduce", "communication", 0.0, 10 * US),
           OpRecord(0, "comm-2x1", "tp", "comm.allreduce", "communication", 2 * US, 6 * US)]
    doc = _doc(ops)
    assert {e["name"]: e["tid"] for e in doc["traceEvents"] if e["ph"] == "X"} == \
        {"dp": 3, "tp": 2}
    threads = sorted((e["tid"], e["args"]["name"]) for e in doc["traceEvents"]
                     if e["ph"] == "M" and e["name"] == "thread_name")
    assert threads == [(0, "compute"), (2, "comm-2x1"), (3, "comm-2x2")]
