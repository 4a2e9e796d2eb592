"""The estimator's timeline keeps one span for items that run back to back
on a stream (most of an op-by-op backward): the time split it reports is
that of one span per item, and a span is never extended across a mark
(where a record starts) or a replayed run (whose spans come after it)."""
from __future__ import annotations

import random

import pytest

from distsim.estimate import spans as estimate_spans
from distsim.estimate.engine import Timeline
from distsim.estimate.time_split import stage_breakdown
from distsim.estimate.spans import spans as stream_spans
from distsim.intervals import merged_overlap


class _AllSealed(list):
    """Seals that seal every span: each item keeps a span of its own."""

    def __getitem__(self, i):
        return 1 << 62

    def __setitem__(self, i, value):
        pass


def _spans_of(tl, stage=0, comm=False):
    if comm:
        s, e = stream_spans(tl.comm_runs[stage], tl.comm_starts[stage], tl.comm_ends[stage])
    else:
        s, e = stream_spans(tl.compute_runs[stage], tl.compute_starts[stage],
                            tl.compute_ends[stage])
    return list(zip(list(s), list(e)))


def test_back_to_back_items_share_a_span():
    tl = Timeline(1)
    tl.compute(0, 1.0)
    tl.compute(0, 2.0)                     # starts at 1.0, where the first ends
    tl.compute(0, 1.0, ready=4.0)          # a gap: a span of its own
    tl.compute_pieces(0, [(1.0, None, False), (0.5, None, False)], 5.0)
    assert _spans_of(tl) == [(0.0, 3.0), (4.0, 6.5)]
    assert tl.busy[0] == 5.5
    tl.comm_on(0, 1.0)
    tl.comm_on(0, 1.0)
    tl.comm([0, 0], 2.0, ready=2.0)        # a team of one stage, listed twice
    assert _spans_of(tl, comm=True) == [(0.0, 4.0)]
    assert tl.comm_s[0] == 4.0


def test_a_compute_item_that_waits_inside_ends_its_span_at_its_busy_part():
    tl = Timeline(1)
    # 2 s of which 1.5 s compute (then it waits on a tensor-parallel
    # collective): the next item starts at 2.0, not where the busy part ends
    tl.compute(0, 2.0, busy_s=1.5, holds_comm=True)
    tl.compute(0, 1.0)
    assert _spans_of(tl) == [(0.0, 1.5), (2.0, 3.0)]


def test_a_mark_seals_the_spans_before_it_and_a_record_replays_whole():
    tl = Timeline(2)
    tl.compute(0, 1.0)
    mark = tl.mark(0)
    tl.compute(0, 1.0)                     # back to back with the span before the mark
    tl.compute(0, 1.0)                     # back to back within the record: merged
    tl.comm_on(0, 0.5, ready=1.0)
    record = tl.since(0, mark, 1.0)
    assert _spans_of(tl) == [(0.0, 1.0), (1.0, 3.0)]
    assert [list(x) for x in record[:4]] == [[0.0], [2.0], [0.0], [0.5]]
    tl.replay(1, record, 10.0)
    assert _spans_of(tl, 1) == [(10.0, 12.0)]
    assert _spans_of(tl, 1, comm=True) == [(10.0, 10.5)]


def test_an_item_after_a_replayed_run_does_not_extend_the_span_before_it():
    tl = Timeline(2)
    mark = tl.mark(0)
    tl.compute(0, 0.0)                     # a record of one empty compute item
    record = tl.since(0, mark, 0.0)
    tl.compute(1, 1.0)                     # stage 1: a span ending at 1.0
    tl.replay(1, record, 1.0)              # the run: 1.0 .. 1.0
    tl.compute(1, 1.0)                     # starts at 1.0, after the run
    assert _spans_of(tl, 1) == [(0.0, 1.0), (1.0, 1.0), (1.0, 2.0)]
    # a copy keeps the seals, and later items merge again
    copy = tl.copy()
    copy.compute(1, 1.0)
    assert _spans_of(copy, 1) == [(0.0, 1.0), (1.0, 1.0), (1.0, 3.0)]


def _random_walk(tl, rng):
    """A stage's items at random: compute runs (some waiting inside on the
    communication stream), collectives, and transfers to the next stage."""
    for _ in range(400):
        kind = rng.random()
        ready = rng.choice([0.0, tl.free[0], tl.free[1], tl.end * rng.random()])
        if kind < 0.5:
            t = rng.choice([1.0, 0.25, 0.5])
            tl.compute(0, t, ready, busy_s=t * 0.5 if kind < 0.1 else None,
                       holds_comm=kind < 0.1)
        elif kind < 0.8:
            tl.comm_on(0, rng.choice([0.5, 0.125]), ready)
        elif kind < 0.9:
            tl.compute_pieces(0, [(0.5, None, False), (0.25, 0.125, True)], ready)
        else:
            tl.p2p_chain(0, 1, [0.375], ready, 0.0)


@pytest.mark.parametrize("seed", range(4))
def test_the_time_split_is_that_of_one_span_per_item(seed):
    merged = Timeline(2)
    _random_walk(merged, random.Random(seed))
    apart = Timeline(2)
    apart.sealed = _AllSealed(apart.sealed)
    _random_walk(apart, random.Random(seed))
    assert len(merged.compute_starts[0]) < len(apart.compute_starts[0])
    assert len(merged.comm_starts[0]) < len(apart.comm_starts[0])
    step = apart.run()
    assert merged.run() == step
    # a stream's spans end in order (the time split relies on it)
    for tl in (merged, apart):
        for comm in (False, True):
            ends = [e for _, e in _spans_of(tl, comm=comm)]
            assert ends == sorted(ends)
    a, b = stage_breakdown(merged, 0, step), stage_breakdown(apart, 0, step)
    assert a == pytest.approx(b, rel=1e-12, abs=1e-12)
    # and, without transfers, what merged_overlap makes of one span per item
    compute = list(zip(apart.compute_starts[0], apart.compute_ends[0]))
    comm = list(zip(apart.comm_starts[0], apart.comm_ends[0]))
    hidden = merged_overlap(compute, comm)
    assert hidden > 0.0
    lone = Timeline(1)
    lone.compute_starts[0], lone.compute_ends[0] = [s for s, _ in compute], [e for _, e in compute]
    lone.comm_starts[0], lone.comm_ends[0] = [s for s, _ in comm], [e for _, e in comm]
    lone.busy[0], lone.comm_s[0], lone.waits[0] = apart.busy[0], apart.comm_s[0], apart.waits[0]
    assert stage_breakdown(lone, 0, step)["exposed_communication_s"] == pytest.approx(
        apart.waits[0] + apart.comm_s[0] - hidden, rel=1e-12)


@pytest.mark.parametrize("seed,items", [(0, 12), (1, 12), (0, 60), (1, 60), (2, 60)])
def test_a_streams_spans_are_its_lists_with_each_run_shifted_in_its_place(seed, items):
    # runs of a few records replayed at random places and origins, some
    # records several times: the spans, element by element, those of
    # inserting each run's record plus its origin where it was replayed
    # (a few runs and many: joined piece by piece, or by record)
    import numpy as np

    rng = random.Random(seed)
    records = [(np.array(sorted(rng.random() for _ in range(n))),) for n in (1, 3, 7)]
    records = [(r[0], r[0] + 0.5) for r in records]
    starts, ends, runs, expected = [], [], [], []
    for _ in range(items):
        if rng.random() < 0.4:
            rel_s, rel_e = rng.choice(records)
            origin = rng.random() * 100
            runs.append((len(starts), rel_s, rel_e, origin))
            expected.extend(zip((rel_s + origin).tolist(), (rel_e + origin).tolist()))
        else:
            x = rng.random() * 100
            starts.append(x)
            ends.append(x + 1.0)
            expected.append((x, x + 1.0))
    s, e = stream_spans(runs, starts, ends)
    assert list(zip(s.tolist(), e.tolist())) == expected
    assert (len(runs) <= estimate_spans._FEW_RUNS) == (items == 12)


def test_since_with_runs_keeps_the_runs_spans_in_stream_order():
    """Items, a replayed run, more items after a mark: ``since`` gives None,
    or with ``with_runs`` every span since the mark in stream order (the
    run's at its place), relative to the origin."""
    from distsim.estimate.engine import Timeline
    src = Timeline(1)
    m = src.mark(0)
    src.compute(0, 1.0, 0.0)                     # 0-1
    src.comm_on(0, 0.5, 1.0)                     # 1-1.5
    record = src.since(0, m, 0.0)
    tl = Timeline(1)
    tl.compute(0, 2.0, 0.0)                      # 0-2, before the mark
    mark = tl.mark(0)
    tl.compute(0, 1.0, 3.0)                      # 3-4
    tl.replay(0, record, 4.0)                    # 4-5 compute, 5-5.5 comm
    tl.compute(0, 0.25, 6.0)                     # 6-6.25
    tl.comm_on(0, 1.0, 7.0)                      # 7-8
    assert tl.since(0, mark, 3.0) is None
    c_s, c_e, m_s, m_e, sums, ends, group = tl.since(0, mark, 3.0, with_runs=True)
    assert c_s.tolist() == [0.0, 1.0, 3.0] and c_e.tolist() == [1.0, 2.0, 3.25]
    assert m_s.tolist() == [2.0, 4.0] and m_e.tolist() == [2.5, 5.0]
    assert sums[0] == 2.25 and sums[2] == 1.5 and ends == (3.25, 5.0) and group is None
