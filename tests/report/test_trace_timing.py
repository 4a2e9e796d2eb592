"""Chrome trace timestamps: ``ts``/``dur`` in microseconds to the nanosecond,
with each slice ending exactly where its rounded end lies, so that ops
back to back on one stream never overlap in the file, and short ops do not
collapse to nothing. Expected values are worked out by hand below."""
from distsim.report import chrome_trace
from distsim.sim.trace import DeviceInfo, OpRecord, Trace


def _slices(trace: Trace) -> dict:
    return {e["name"]: (e["ts"], e["dur"])
            for e in chrome_trace(trace, include_links=False)["traceEvents"] if e["ph"] == "X"}


def _two_ops(a_start: float, boundary: float, b_end: float) -> Trace:
    """Op ``a`` then op ``b`` back to back on gpu0's compute stream."""
    return Trace(devices=[DeviceInfo(0, "gpu0", 1)], step_time_s=b_end, ops=[
        OpRecord(0, "compute", "a", "MatMul", "compute", a_start, boundary),
        OpRecord(0, "compute", "b", "Relu", "compute", boundary, b_end)])


def test_back_to_back_ops_do_not_overlap_after_rounding():
    # a: 5.0086 us -> 10.0104 us, b: 10.0104 us -> 15 us.
    # Rounded to the ns: a starts at 5.009, ends at 10.010; b starts at 10.010.
    # So a's dur is 10.010 - 5.009 = 5.001 (rounding the exact 5.0018 would
    # give 5.002 and end a at 10.011, 1 ns into b).
    slices = _slices(_two_ops(5.0086e-6, 10.0104e-6, 15e-6))
    assert slices["a"] == (5.009, 5.001)
    assert slices["b"] == (10.01, 4.99)
    ts_a, dur_a = slices["a"]
    assert round(ts_a + dur_a, 3) == slices["b"][0]


def test_sub_microsecond_ops_keep_their_length():
    # a: 0.25 us long, b: 4 ns long, both shown to the ns
    slices = _slices(_two_ops(1e-6, 1.25e-6, 1.254e-6))
    assert slices["a"] == (1.0, 0.25)
    assert slices["b"] == (1.25, 0.004)


def test_truncated_slice_uses_the_same_rounding():
    # 3 ops; a bound of 1 record keeps the first op (memory-less trace),
    # the next two (2.0006 us -> 3.0004 us, 3.0004 -> 4.0002) are summarised
    # in one slice from 2.001 to 4.000 (rounded ends): dur 1.999, not the
    # 2.000 that rounding the exact 1.9996 would give.
    ops = [OpRecord(0, "compute", "a", "MatMul", "compute", 0.0, 1e-6),
           OpRecord(0, "compute", "b", "MatMul", "compute", 2.0006e-6, 3.0004e-6),
           OpRecord(0, "compute", "c", "MatMul", "compute", 3.0004e-6, 4.0002e-6)]
    doc = chrome_trace(Trace(devices=[DeviceInfo(0, "gpu0", 1)], ops=ops, step_time_s=4.0002e-6),
                       include_links=False, max_trace_records=1)
    summary = [e for e in doc["traceEvents"] if e.get("cat") == "truncated" and e["ph"] == "X"]
    assert [(e["ts"], e["dur"], e["args"]["ops"]) for e in summary] == [(2.001, 1.999, 2)]
