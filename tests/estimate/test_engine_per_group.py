"""The estimator's timeline under ``per_group`` (one communication stream
per process group): the data-parallel stream and the tied embedding's run
beside the tensor-parallel stream a task holds. Times by hand."""
from distsim.estimate.engine import Timeline


def test_a_data_parallel_sync_does_not_wait_for_a_task_holding_the_tp_stream():
    for per_group, dp_start in ((True, 0.0), (False, 2.0)):
        tl = Timeline(2, per_group=per_group)
        # a task with tensor-parallel collectives inside: 0-2, both streams
        assert tl.compute(0, 2.0, holds_comm=True) == 2.0
        # a gradient's all-reduce ready at 0: beside it per group, after it shared
        assert tl.comm_on(0, 3.0, 0.0) == dp_start + 3.0
        # a tensor-parallel item ready at 0 waits for the task only per
        # group (2-3); shared, for the all-reduce too (5-6)
        assert tl.comm_on(0, 1.0, 0.0, tp=True) == (3.0 if per_group else 6.0)
        assert tl.run() == (3.0 if per_group else 6.0)


def test_per_group_the_tied_embedding_all_reduce_has_a_stream_of_its_own():
    tl = Timeline(2, per_group=True)
    tl.comm_on(0, 4.0, 0.0)             # stage 0's gradient all-reduce: 0-4
    tl.comm_on(1, 1.0, 0.0, tp=True)    # stage 1's tensor-parallel item: 0-1
    # the embedding all-reduce of stages 0 and 1, ready at 1: 1-2, behind neither
    assert tl.comm((0, 1), 1.0, 1.0) == 2.0
    assert tl.comm((0, 1), 1.0, 0.0) == 3.0   # its own group's queue: after it
    # stage 0 communicates 0-4 (the all-reduce covers the embedding's spans)
    part = tl.stage_breakdown(0, 4.0)
    assert part["communication_s"] == 4.0 and part["exposed_communication_s"] == 4.0
    # stage 1: 0-1 (TP), 1-3 (embedding)
    assert tl.stage_breakdown(1, 4.0)["communication_s"] == 3.0


def test_a_per_group_record_holds_the_data_parallel_stream_and_replays_it():
    tl = Timeline(2, per_group=True)
    assert tl.idle_by(0, 0.0)
    mark = tl.mark(0)
    tl.compute(0, 1.0)                  # 0-1
    tl.comm_on(0, 2.0, 1.0)             # a reduce-scatter on the data-parallel stream: 1-3
    tl.comm_on(0, 1.0, 0.0, tp=True)    # a tensor-parallel item: 0-1
    assert not tl.idle_by(0, 2.0) and tl.idle_by(0, 3.0)
    record = tl.since(0, mark, 0.0)
    tl.replay(1, record, 10.0)          # stage 1 from 10: the same items shifted
    assert tl.dp_free == [3.0, 13.0] and tl.free[2:] == [11.0, 11.0] and tl.run() == 13.0
    assert tl.group_starts[1] == [11.0] and tl.group_ends[1] == [13.0]
    assert tl.stage_breakdown(1, 13.0) == tl.stage_breakdown(0, 3.0) | {"idle_s": 10.0}
    # a task that put an item on a tied embedding's stream records nothing
    mark = tl.mark(0)
    tl.comm((0, 1), 1.0, 3.0)
    assert tl.since(0, mark, 3.0) is None


def test_zero3_entries_wait_for_the_gathers_they_read_not_the_tp_stream_for_gathers():
    from types import SimpleNamespace

    from distsim.estimate.gates import emit_entries
    tl = Timeline(1, per_group=True)
    tl.comm_on(0, 5.0, 0.0)     # the block's gathers on the data-parallel stream: 0-5
    plan = [("c", 1.0, (), -2, False, None),   # reads no gathered parameter: 0-1
            ("t", 2.0, (), 0, False, None),    # its all-reduce on the tp stream: 1-3
            ("c", 1.0, (), -2, False, 3.0),    # reads a parameter gathered by 5 - 3 = 2: 2-3
            ("c", 1.0, (1,), -2, False, 0.5),  # the all-reduce's result, a parameter
            ("t", 1.0, (), -1, False, None)]   # gathered by 4.5: 4.5-5.5; then 5.5-6.5
    assert emit_entries(SimpleNamespace(tl=tl), 0, plan, 5.0, 0.0, 0.0) == 5.5
    assert tl.free == [5.5, 6.5] and tl.run() == 6.5
