"""The estimator's timeline under ``per_group`` (one communication stream
per process group): the data-parallel stream and the tied embedding's run
beside the tensor-parallel stream a task holds. Times by hand."""
from distsim.estimate.engine import Timeline
from distsim.estimate.time_split import stage_breakdown


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
    part = stage_breakdown(tl, 0, 4.0)
    assert part["communication_s"] == 4.0 and part["exposed_communication_s"] == 4.0
    # stage 1: 0-1 (TP), 1-3 (embedding)
    assert stage_breakdown(tl, 1, 4.0)["communication_s"] == 3.0


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
    # its data-parallel span, kept as the record's shifted
    assert [(list(s + at), list(e + at)) for s, e, at in tl.group_runs[1]] == [([11.0], [13.0])]
    assert stage_breakdown(tl, 1, 13.0) == stage_breakdown(tl, 0, 3.0) | {"idle_s": 10.0}
    # a task that put an item on a tied embedding's stream records nothing
    mark = tl.mark(0)
    tl.comm((0, 1), 1.0, 3.0)
    assert tl.since(0, mark, 3.0) is None


def test_zero3_entries_wait_for_the_gathers_they_read_not_the_tp_stream_for_gathers():
    from types import SimpleNamespace

    from distsim.estimate.gates import EntryPlan, emit_entries
    tl = Timeline(1, per_group=True)
    tl.comm_on(0, 5.0, 0.0)     # the block's gathers on the data-parallel stream: 0-5
    plan = EntryPlan([("c", 1.0, (), -2, False, None),   # reads no gathered parameter: 0-1
            ("t", 2.0, (), 0, False, None),    # its all-reduce on the tp stream: 1-3
            ("c", 1.0, (), -2, False, 3.0),    # reads a parameter gathered by 5 - 3 = 2: 2-3
            ("c", 1.0, (1,), -2, False, 0.5),  # the all-reduce's result, a parameter
            ("t", 1.0, (), -1, False, None)])  # gathered by 4.5: 4.5-5.5; then 5.5-6.5
    assert emit_entries(SimpleNamespace(tl=tl), 0, plan, 5.0, 0.0, 0.0) == 5.5
    assert tl.free == [5.5, 6.5] and tl.run() == 6.5


def test_a_block_whose_gathers_end_early_enough_replays_the_first_such_block():
    from types import SimpleNamespace

    from distsim.estimate.gates import EntryPlan, emit_entries
    plan = EntryPlan([("c", 1.0, (), -2, False, None),   # 0-1
                      ("t", 2.0, (), 0, False, None),    # its all-reduce: 1-3
                      ("c", 1.0, (), -2, False, 0.5),    # reads a parameter gathered
                      ("c", 1.0, (1,), -2, False, None)])  # 0.5 before the gathers end: 1-2
    tl = Timeline(1, per_group=True)
    b = SimpleNamespace(tl=tl)
    # gathers done by the start: recorded; the gated run starts at 1, so
    # the gathers may end up to 1 + 0.5 after the block's start
    assert emit_entries(b, 0, plan, 0.0, 0.0, 0.0) == 4.0       # the last run 3-4
    assert plan.record is not None and plan.record[1:] == (4.0, 1.5)
    # from 4 (the tp stream done at 3), the gathers ending at 5.5: replayed
    assert emit_entries(b, 0, plan, 5.5, 0.0, 4.0) == 8.0
    assert tl.free == [8.0, 7.0] and len(tl.compute_runs[0]) == 1
    # ending later (10 from 8), the gated run waits for them: 9.5-10.5; last 11-12
    assert emit_entries(b, 0, plan, 10.0, 0.0, 8.0) == 12.0
    assert len(tl.compute_runs[0]) == 1
    # the same as every block emitted
    fresh = Timeline(1, per_group=True)
    emitted = EntryPlan(plan)
    emitted.replayable = False
    for gathered, before in ((0.0, 0.0), (5.5, 4.0), (10.0, 8.0)):
        emit_entries(SimpleNamespace(tl=fresh), 0, emitted, gathered, 0.0, before)
    assert fresh.free == tl.free and fresh.run() == tl.run() == 12.0
    assert stage_breakdown(fresh, 0, 12.0) == stage_breakdown(tl, 0, 12.0)
