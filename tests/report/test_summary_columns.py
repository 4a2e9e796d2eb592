"""The summary's per-device figures, computed from the trace's op columns
(one group-by for all devices), equal the per-record definition they
replaced, to the bit: on random hand-built traces and on simulated ones,
with and without symmetry reduction. And the summary (with its trace plan)
makes no record tuples."""
import json

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from distsim.api import build_program
from distsim.bench.cases import _mlp_dp
from distsim.report.chrome_trace import plan_trace, stream_tids
from distsim.intervals import union_length_of
from distsim.report.summary import summarize
from distsim.sim.simulator import SimulationOptions, simulate_function
from distsim.sim.records import CATEGORIES as SIM_CATEGORIES, STREAMS as SIM_STREAMS
from distsim.sim.trace import DeviceInfo, MemorySample, OpColumns, OpLabels, OpRecord, Trace
from distsim.topology import load_topology


def reference_device(rank, name, capacity, ops, peak, step_time_s):
    """One device's figures from its records, one by one (the definition)."""
    n = len(ops)
    starts = np.fromiter((op.start_s for op in ops), dtype=float, count=n)
    ends = np.fromiter((op.end_s for op in ops), dtype=float, count=n)
    is_compute = np.fromiter((op.category == "compute" for op in ops), dtype=bool, count=n)
    is_comm = np.fromiter((op.category == "communication" for op in ops), dtype=bool, count=n)
    compute_s = union_length_of(starts[is_compute], ends[is_compute])
    both = is_compute | is_comm
    exposed = union_length_of(starts[both], ends[both]) - compute_s
    busy = union_length_of(starts, ends)
    flops = np.fromiter((op.flops for op in ops), dtype=float, count=n)
    sent = np.fromiter((op.bytes for op in ops), dtype=float, count=n)
    return {"rank": rank, "name": name, "peak_memory_bytes": int(peak),
            "capacity_bytes": int(capacity), "oom": bool(peak > capacity),
            "compute_s": float(compute_s),
            "communication_s": float(union_length_of(starts[is_comm], ends[is_comm])),
            "exposed_communication_s": float(max(0.0, exposed)),
            "idle_s": float(max(0.0, step_time_s - busy)),
            "flops": float(flops.sum()), "communication_bytes": float(sent[is_comm].sum()),
            "num_ops": n}


def reference_devices(trace: Trace, step: float) -> list:
    peaks = trace.peak_memory()
    by_rank = {d.rank: [] for d in trace.devices}
    for op in trace.ops:
        by_rank.setdefault(op.rank, []).append(op)
    return [reference_device(d.rank, d.name, d.capacity_bytes, by_rank[d.rank],
                             peaks.get(d.rank, 0), step)
            for d in sorted(trace.devices, key=lambda d: d.rank)]


def _bits(obj) -> str:
    """Floats to the bit (json writes repr)."""
    return json.dumps(obj, sort_keys=True)


def check(trace: Trace) -> dict:
    summary = summarize(trace)
    devices = [{k: v for k, v in d.items() if k != "represents"} for d in summary["devices"]]
    assert _bits(devices) == _bits(reference_devices(trace, summary["step_time_s"]))
    return summary


# -- random hand-built traces ------------------------------------------------------
CATEGORIES = ["compute", "communication", "memcpy"]
STREAMS = ["compute", "comm", "copy"]


@st.composite
def traces(draw):
    n_devices = draw(st.integers(0, 4))
    devices = [DeviceInfo(r, f"gpu{r}", 100) for r in range(n_devices)]
    n = draw(st.integers(0, 40))
    times = st.floats(0, 10, allow_nan=False).map(lambda x: round(x, 1))
    ops = []
    for i in range(n):
        start = draw(times)
        end = draw(st.one_of(times, st.just(start)))          # reversed and empty ones too
        ops.append(OpRecord(draw(st.integers(0, 5)),             # ranks without a device too
                            draw(st.sampled_from(STREAMS)), f"op{i}", "T",
                            draw(st.sampled_from(CATEGORIES)), start, end,
                            draw(st.floats(0, 1e17)), draw(st.floats(0, 1e9)), ""))
    memory = [MemorySample(r, 0.0, draw(st.integers(0, 200))) for r in range(n_devices)]
    step = draw(st.sampled_from([0.0, 10.0]))                   # 0: the last op end
    return Trace(devices, ops=ops, memory=memory, step_time_s=step)


@settings(max_examples=400, deadline=None)
@given(traces())
def test_columnar_summary_equals_the_per_record_one(trace):
    check(trace)


@st.composite
def column_traces(draw):
    """Traces whose records are time-ordered columns, as the simulator
    makes them, not in record order; sums whose floats depend on the order."""
    n = draw(st.integers(0, 40))
    def ints(lo, hi):
        return draw(st.lists(st.integers(lo, hi), min_size=n, max_size=n))
    rank, stream, start, length = ints(0, 3), ints(0, 1), ints(0, 6), ints(0, 3)
    big = st.lists(st.floats(0, 1e18), min_size=n, max_size=n)
    cols = OpColumns(rank, stream, [1 - s for s in stream], [s / 10 for s in start],
                     [(s + d) / 10 for s, d in zip(start, length)], draw(big), draw(big),
                     [0] * n, SIM_STREAMS, SIM_CATEGORIES, OpLabels(["op"], ["T"], [""]),
                     time_ordered=True)
    devices = [DeviceInfo(r, f"gpu{r}", 100) for r in range(draw(st.integers(0, 4)))]
    return Trace(devices, op_columns=cols, step_time_s=draw(st.sampled_from([0.0, 1.0])))


@settings(max_examples=400, deadline=None)
@given(column_traces())
def test_columnar_summary_sums_in_record_order(trace):
    check(trace)


# -- simulated traces ------------------------------------------------------------------
A100 = load_topology("dgx-a100")


@pytest.mark.parametrize("symmetry", [False, True])
@pytest.mark.parametrize("case", ["mlp", "gpt", "zero3"])
def test_simulated_summary_equals_the_per_record_one(case, symmetry, small_program):
    program, topo = small_program(case)
    trace = simulate_function(program, topo, options=SimulationOptions(symmetry=symmetry))
    summary = check(trace)
    # the same figures from a trace rebuilt from the records (columns made from the list)
    again = Trace(trace.devices, ops=list(trace.ops), memory=trace.memory, links=trace.links,
                  step_time_s=trace.step_time_s, meta=trace.meta)
    assert _bits(summarize(again)) == _bits(summary)


def test_a_reduced_program_summary_equals_the_per_record_one():
    program, _, topo = build_program("gpt2", "dgx-a100", layers=2, seq=32, tp=2, pp=2, dp=2,
                                     symmetry=True, coarsen=True)
    trace = simulate_function(program, topo)
    summary = check(trace)
    assert summary["num_devices"] == 8 and len(summary["devices"]) < 8


def test_summary_and_trace_plan_make_no_records(monkeypatch):
    trace = simulate_function(_mlp_dp(8, 3), A100)

    def refuse(self):
        raise AssertionError("records made")

    monkeypatch.setattr(OpColumns, "records", refuse)
    summarize(trace)
    plan = plan_trace(trace, max_trace_records=10)
    assert plan.records == trace.num_ops + len(trace.memory) and plan.truncated
    assert stream_tids(trace) == {"compute": 0, "comm": 1}
    monkeypatch.undo()
    starts = sorted([op.start_s for op in trace.ops] + [s.time_s for s in trace.memory])
    assert plan.cutoff_s == starts[10]                    # the 11th earliest start
