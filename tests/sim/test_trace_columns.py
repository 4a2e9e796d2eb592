"""Op records as columns (:class:`OpColumns`): the records a trace makes
from them on first use are the ones the simulator made eagerly before
(same values, same types, same order), a trace built from a list keeps
that list, and the symmetry expansion of the columns gives what copying
and re-sorting the records did. The references below are the per-record
definitions the columns replaced."""
import pickle
from itertools import product
from operator import itemgetter

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from distsim.bench.cases import _mlp_dp
from distsim.sim.records import CATEGORIES, STREAMS, expand_to_followers
from distsim.sim.simulator import SimulationOptions, Simulator, simulate_function
from distsim.sim.symmetry import class_members
from distsim.sim.trace import DeviceInfo, OpColumns, OpLabels, OpRecord, Trace
from distsim.topology import load_topology

TIME_ORDER = itemgetter(5, 0, 1, 6)   # (start, rank, stream, end): the records' order


# -- references: the records made one by one, as the simulator did ------------
def eager_records(sim: Simulator, start_s: np.ndarray, end_s: np.ndarray) -> list:
    """Every record of a finished run as a tuple, sorted by (start, rank,
    stream, end); then, under symmetry reduction, the followers' copies."""
    ix = sim.index
    # a fused kernel's op type is its parts (scale+mask+softmax)
    records = [OpRecord(int(ix.compute_rank[k]), "compute", op.name,
                        op.attrs.get("kernel") or op.op_type, "compute",
                        float(start_s[k]), float(end_s[k]), float(ix.compute_flops[k]),
                        float(ix.compute_bytes[k]), op.meta.get("detail", ""))
               for k, op in enumerate(ix.compute)]
    for coll in sim._finished:
        # a SendRecv is on its pair's point-to-point queue, shown as "p2p";
        # per group, a collective on its team's (n ranks d apart: comm-nxd)
        team = sorted(coll.op.attrs["ranks"])
        stream = "p2p" if coll.op.op_type == "comm.sendrecv" else \
            "comm" if sim.options.comm_streams == "shared" else \
            f"comm-{len(team)}x{team[1] - team[0]}"
        records += [OpRecord(r, stream, coll.op.name, coll.op.op_type, "communication",
                             coll.start_s, coll.end_s, 0.0, coll.sent[r], coll.used)
                    for r in coll.members]
    records.sort(key=TIME_ORDER)
    if sim._rep:
        records = expanded(records, class_members(sim._rep))
    return records


def expanded(records: list, members: dict) -> list:
    """Drop the followers' records, copy each representative's to its
    followers, sort again."""
    followers = {m for group in members.values() for m in group[1:]}
    kept = [r for r in records if r.rank not in followers]
    copies = [r._replace(rank=m) for r in kept for m in members.get(r.rank, (r.rank,))[1:]]
    return sorted(kept + copies, key=TIME_ORDER)


def run_with_eager(program, topo, **options):
    """The trace, and the records made one by one from the same run."""
    seen = {}
    original = Simulator._records

    def spy(self, start_s, end_s):
        seen["sim"], seen["times"] = self, (start_s.copy(), end_s.copy())
        return original(self, start_s, end_s)

    Simulator._records = spy
    try:
        trace = simulate_function(program, topo, options=SimulationOptions(**options))
    finally:
        Simulator._records = original
    return trace, eager_records(seen["sim"], *seen["times"])


def _types(records):
    return {tuple(type(x) for x in r) for r in records}


A100 = load_topology("dgx-a100")


@pytest.mark.parametrize("comm_streams", ["shared", "per-group"])
@pytest.mark.parametrize("symmetry", [False, True])
@pytest.mark.parametrize("case", ["mlp", "gpt", "zero3"])
def test_lazy_records_equal_the_eager_ones(case, symmetry, comm_streams, small_program):
    program, topo = small_program(case)
    trace, eager = run_with_eager(program, topo, symmetry=symmetry, comm_streams=comm_streams)
    assert trace.num_ops == len(eager)
    records = trace.ops
    assert all(type(r) is OpRecord for r in records)
    assert records == eager
    assert repr(records) == repr(eager)           # the floats to the bit
    assert _types(records) == _types(eager) == {(int, str, str, str, str) + (float,) * 4 + (str,)}
    assert trace.ops is records                   # made once
    if symmetry:                                  # the reduction ran and was expanded
        assert trace.meta["simulated_devices"] < len(trace.devices)
        assert {r.rank for r in records} == {d.rank for d in trace.devices}


def test_records_are_made_only_when_asked():
    calls = []
    trace = simulate_function(_mlp_dp(4, 2), A100)
    labels = trace.op_columns.labels
    resolve = labels._resolve
    labels._resolve = lambda: calls.append(1) or resolve()
    assert trace.num_ops > 0 and not calls
    first = trace.ops
    assert calls == [1] and trace.ops is first and calls == [1]


def test_a_pickled_trace_carries_its_labels_not_the_program():
    trace = simulate_function(_mlp_dp(4, 2), A100)
    copy = pickle.loads(pickle.dumps(trace))
    assert copy.ops == trace.ops and copy == trace


# -- a trace built from a list ---------------------------------------------------
def _hand_records():
    return [OpRecord(1, "comm", "ar", "AllReduce", "communication", 2.5, 4.0, 0.0, 300.0, "ring"),
            OpRecord(0, "compute", "mm", "MatMul", "compute", 0, 4, 10, 6),   # ints stay ints
            OpRecord(0, "copy", "cp", "Copy", "memcpy", 1.0, 2.0)]


def test_a_trace_built_from_a_list_keeps_it():
    ops = _hand_records()
    trace = Trace([DeviceInfo(0, "gpu0", 1), DeviceInfo(1, "gpu1", 1)], ops=ops, step_time_s=4.0)
    assert trace.ops is ops and trace.num_ops == 3
    cols = trace.op_columns
    assert cols.rank.tolist() == [1, 0, 0]
    assert [cols.streams[c] for c in cols.stream] == ["comm", "compute", "copy"]
    assert [cols.categories[c] for c in cols.category] == ["communication", "compute", "memcpy"]
    assert cols.start_s.tolist() == [2.5, 0.0, 1.0] and cols.bytes.tolist() == [300.0, 6.0, 0.0]
    assert cols.records() == ops                  # same values, in list order
    assert trace.ops is ops                       # reading the columns made no new list
    assert Trace([], ops=list(ops)) == Trace([], ops=list(ops))
    assert Trace([]).ops == [] and Trace([]).num_ops == 0 and len(Trace([]).op_columns) == 0


def test_assigning_ops_replaces_the_columns():
    trace = simulate_function(_mlp_dp(4, 2), A100)
    cols = trace.op_columns
    new = _hand_records()
    trace.ops = new
    assert trace.ops is new and trace.op_columns is not cols and trace.num_ops == 3
    assert trace.op_columns.records() == new


def test_ops_and_columns_are_exclusive():
    cols = OpColumns.from_records(_hand_records())
    with pytest.raises(ValueError, match="not both"):
        Trace([], ops=[], op_columns=cols)
    with pytest.raises(ValueError, match="sorted streams"):
        OpColumns(cols.rank, cols.stream, cols.category, cols.start_s, cols.end_s, cols.flops,
                  cols.bytes, cols.label, ("comm", "compute", "copy")[::-1], cols.categories,
                  cols.labels, time_ordered=True)


# -- time order and symmetry expansion on random columns -------------------------
@st.composite
def columns(draw, max_rank=5):
    """Time-ordered columns with many ties (small integer times)."""
    n = draw(st.integers(0, 40))
    def ints(lo, hi):
        return draw(st.lists(st.integers(lo, hi), min_size=n, max_size=n))
    rank, stream, start, length = ints(0, max_rank), ints(0, 1), ints(0, 4), ints(0, 2)
    flops, nbytes, label = ints(0, 3), ints(0, 3), ints(0, 2)
    labels = OpLabels(["a", "b", "c"], ["MatMul", "AllReduce", "Relu"], ["", "ring", "x"])
    return OpColumns(rank, stream, [1 - s for s in stream], [float(s) for s in start],
                     [float(s + d) for s, d in zip(start, length)], [f * 0.5 for f in flops],
                     [b / 3 for b in nbytes], label, STREAMS, CATEGORIES, labels,
                     time_ordered=True)


def column_order_records(cols: OpColumns) -> list:
    """The records one by one, in column order (no sorting)."""
    names, op_types, details = cols.labels.lists()
    return [OpRecord(int(cols.rank[i]), cols.streams[cols.stream[i]], names[cols.label[i]],
                     op_types[cols.label[i]], cols.categories[cols.category[i]],
                     float(cols.start_s[i]), float(cols.end_s[i]), float(cols.flops[i]),
                     float(cols.bytes[i]), details[cols.label[i]]) for i in range(len(cols))]


@settings(max_examples=300, deadline=None)
@given(columns())
def test_time_order_is_a_stable_sort_of_the_columns(cols):
    records = cols.records()
    assert records == sorted(column_order_records(cols), key=TIME_ORDER)
    by_rank = column_order_records(cols.take(cols.rank_order()))
    assert by_rank == sorted(records, key=itemgetter(0))   # grouped by rank, record order kept


@st.composite
def classes(draw, n_ranks=8):
    """A partition of 0..n_ranks-1 into symmetry classes, as rank -> representative."""
    heads = draw(st.lists(st.integers(0, 3), min_size=n_ranks, max_size=n_ranks))
    rep = {}
    for r, h in enumerate(heads):
        rep[r] = min(q for q in range(n_ranks) if heads[q] == h)
    return rep


@settings(max_examples=300, deadline=None)
@given(columns(max_rank=7), classes())
def test_symmetry_expansion_equals_copying_the_records(cols, rep):
    members = class_members(rep)
    result = expand_to_followers(cols, members)
    assert result.records() == expanded(cols.records(), members)


def test_symmetry_expansion_by_hand():
    labels = OpLabels(["a", "b"], ["MatMul", "AllReduce"], ["", "ring"])
    cols = OpColumns([0, 2, 0, 1], [1, 0, 0, 1], [0, 1, 1, 0], [0.0, 1.0, 1.0, 0.0],
                     [1.0, 2.0, 2.0, 3.0], [4.0, 0.0, 0.0, 5.0], [1.0, 7.0, 7.0, 2.0],
                     [0, 1, 1, 0], STREAMS, CATEGORIES, labels, time_ordered=True)
    out = expand_to_followers(cols, {0: (0, 2, 3), 1: (1,)})
    # rank 2's own record goes; rank 0's two records go to 2 and 3 as well
    assert [(r.rank, r.name, r.start_s) for r in out.records()] == [
        (0, "a", 0.0), (1, "a", 0.0), (2, "a", 0.0), (3, "a", 0.0),
        (0, "b", 1.0), (2, "b", 1.0), (3, "b", 1.0)]


def test_every_stream_and_category_code_names_itself():
    assert list(STREAMS) == sorted(STREAMS)
    for s, c in product(range(len(STREAMS)), range(len(CATEGORIES))):
        cols = OpColumns([0], [s], [c], [0.0], [1.0], [0.0], [0.0], [0],
                         STREAMS, CATEGORIES, OpLabels(["n"], ["t"], [""]), time_ordered=True)
        (rec,) = cols.records()
        assert (rec.stream, rec.category) == (STREAMS[s], CATEGORIES[c])
