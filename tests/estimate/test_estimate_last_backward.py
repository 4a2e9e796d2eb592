"""The last backward of a chunk, recorded once and replayed (ZeRO 0/1, and
ZeRO 2 with ``bucket_mb 0``).

An estimate of a long schedule walks two timelines, one micro-batch apart
(:func:`distsim.estimate.timeline_figures`), and both end with each
chunk's last backward emitted op by op with its gradient syncs. Where that
task starts with the stage's communication stream idle and no gradient of
the stage waiting for a bucket, it depends only on where it starts (and on
the buckets the stage flushed before it): the second timeline replays the
first's record, shifted. Where each gradient is synchronised on its own
(or not at all), the syncs are the same on every stage, so a record also
stands for the chunks of the same shape on the other stages, in the same
timeline. The figures must be those of emitting it again, to rounding, for
every way a gradient is synchronised.
"""
from __future__ import annotations

import pytest

from distsim.estimate import point as est
from distsim.estimate import replay as estimate_replay
from distsim.estimate.state import Memo
from estimate_hooks import busy_communication_at_start, calls

BASE = {"model": "gpt3-1.3b", "topology": "dgx-a100-x2", "layers": 16, "seq": 512,
        "micro_batch": 1, "recompute": "none"}

# (options, how each gradient is synchronised, the last backwards replayed)
CASES = [
    # four stages of four layers: the two middle chunks share a shape, so
    # the first timeline replays one of them and the second all four
    ({"dp": 2, "tp": 2, "pp": 4, "global_batch": 48, "zero": 0}, "each", 5),
    # one timeline (4 micro-batches): the middle chunks' one replay
    ({"dp": 2, "tp": 2, "pp": 4, "global_batch": 8, "zero": 0}, "each, one timeline", 1),
    ({"dp": 2, "tp": 2, "pp": 4, "global_batch": 48, "zero": 1, "bucket_mb": 60}, "bucket", 4),
    ({"dp": 2, "tp": 2, "pp": 4, "global_batch": 48, "zero": 2, "bucket_mb": 0}, "deferred",
     4),
    ({"dp": 1, "tp": 4, "pp": 4, "global_batch": 24, "zero": 0}, "local", 5),
    # a stage's second chunk finds the first's all-reduces still running:
    # emitted
    ({"dp": 4, "tp": 2, "pp": 2, "global_batch": 48, "zero": 0, "bucket_mb": 60,
      "schedule": "interleaved", "virtual_stages": 2}, "bucket, two chunks a stage", 2),
    ({"dp": 4, "tp": 4, "pp": 1, "global_batch": 48, "zero": 1, "recompute": "full"},
     "each, no pipeline, recomputation first", 1),
    # the stages before the last open with a recomputation and wait for
    # their input after it: recorded in two parts (from the compute
    # stream's end, from the input); the last stage's input is there
    ({"dp": 2, "tp": 2, "pp": 4, "global_batch": 48, "zero": 0, "recompute": "full"},
     "each, recomputation first, input later", 5),
    ({"dp": 2, "tp": 2, "pp": 4, "global_batch": 48, "zero": 1, "recompute": "selective",
      "bucket_mb": 60}, "bucket, recomputation first, input later", 4),
]

FIGURES = ("step_time_s", "compute_s", "communication_s", "exposed_communication_s",
           "idle_s", "total_flops", "max_peak_memory_bytes")


@pytest.mark.parametrize("options,route,replayed", CASES, ids=[c[1] for c in CASES])
def test_a_replayed_last_backward_is_the_last_backward_emitted_again(monkeypatch, options,
                                                                     route, replayed):
    options = dict(BASE, **options)
    replays = calls(monkeypatch, "_replay_last")
    with_replays = est.estimate(options)
    # a chunk's last backward is recorded by the first timeline and
    # replayed by the second, and by chunks of its shape (the chunks here
    # are long enough)
    assert len(replays) == replayed, route
    # nothing replayed: each emitted again
    monkeypatch.setattr(estimate_replay, "_MIN_BLOCKS", 10 ** 9)
    emitted = est.estimate(options)
    assert len(replays) == replayed
    for key in FIGURES:
        assert with_replays[key] == pytest.approx(emitted[key], rel=1e-12, abs=1e-12), key


def test_a_task_that_finds_the_communication_stream_busy_is_emitted(monkeypatch):
    # with the stage's communication stream still busy at the start, the
    # record would not stand for the task: nothing is recorded
    options = dict(BASE, dp=2, tp=2, pp=4, global_batch=48, zero=0)
    replays = calls(monkeypatch, "_replay_last")
    busy_communication_at_start(monkeypatch, "last_backward")
    est.estimate(options)
    assert replays == []


def test_short_last_backwards_are_replayed_only_where_replays_add_up(monkeypatch):
    # recording and replaying costs about what emitting three blocks does:
    # a chunk whose replays would emit fewer blocks is emitted instead
    options = dict(BASE, dp=1, tp=2, pp=8, global_batch=24, zero=0)   # 2 layers a stage
    replays = calls(monkeypatch, "_replay_last")
    est.estimate(options)
    # the first stage's chunk has the embedding too (three blocks), the
    # last's the head: a shape of their own, one replay each (by the second
    # timeline) would save three blocks: emitted in both timelines. The
    # six middle chunks of two layers share a shape: one records, the five
    # others and the second timeline's six replay
    assert len(replays) == 11
    assert {args[1] for args in replays} == set(range(1, 7))
    assert estimate_replay._MIN_BLOCKS == 4


@pytest.mark.parametrize("global_batch,recorded", [(8, 0), (48, 1)])
def test_a_chunk_of_its_own_shape_is_recorded_only_for_a_second_timeline(global_batch,
                                                                         recorded):
    # no pipeline, one chunk: 2 micro-batches, one timeline walked
    # directly, nothing to replay into; 12: two timelines, the second
    # replays the first's record
    case = est.resolve(dict(BASE, dp=4, tp=4, pp=1, global_batch=global_batch, zero=0))
    memo = Memo()
    est.timeline_figures(case, est._profile_for(case), memo)
    assert len(memo.last_backwards) == recorded


@pytest.mark.parametrize("early,replayed", [(1, [0, 2, 3]), (2, [0, 1, 3])])
def test_a_recomputation_that_would_run_past_the_input_is_emitted(monkeypatch, early, replayed):
    # the input of stage ``early`` comes right after its compute stream's
    # end, before its leading recomputation is over: stage 2's record of
    # the middle chunks does not stand for stage 1's task (1), and stage 2
    # records nothing (2: stage 1 records); in either timeline
    options = dict(BASE, dp=2, tp=2, pp=4, global_batch=48, zero=0, recompute="full")
    task = estimate_replay.ReplayedBackward.last_backward

    def early_input(self, stage, c, ready):
        if stage == early:
            ready = self.ctx.tl.free[2 * stage] + 1e-9
        return task(self, stage, c, ready)

    monkeypatch.setattr(estimate_replay.ReplayedBackward, "last_backward", early_input)
    replays = calls(monkeypatch, "_replay_last")
    with_replays = est.estimate(options)
    assert sorted(args[1] for args in replays) == replayed
    monkeypatch.setattr(estimate_replay, "_MIN_BLOCKS", 10 ** 9)
    emitted = est.estimate(options)
    assert len(replays) == 3
    for key in FIGURES:
        assert with_replays[key] == pytest.approx(emitted[key], rel=1e-12, abs=1e-12), key
