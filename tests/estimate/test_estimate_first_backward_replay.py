"""ZeRO 2/3's first micro-batch backward, recorded on one stage and
replayed on the others.

With a reduce-scatter per micro-batch, each stage's first backward is
emitted op by op (each gradient flattened and reduce-scattered where it is
made). A stage runs one such task; where it starts with the stage's
communication stream idle it depends only on where it starts, so the
first stage of a chunk shape records it and the other stages of that shape
replay it, shifted. The figures (memory included) must be those of
emitting each again, to rounding.
"""
from __future__ import annotations

import pytest

from distsim.estimate import point as est
from distsim.estimate import replay as estimate_replay
from estimate_hooks import busy_communication_at_start, calls

BASE = {"model": "gpt3-1.3b", "topology": "dgx-a100-x2", "layers": 16, "seq": 512,
        "micro_batch": 1, "recompute": "none", "global_batch": 48}

FIGURES = ("step_time_s", "compute_s", "communication_s", "exposed_communication_s",
           "idle_s", "total_flops", "max_peak_memory_bytes")

# (options, the first backwards replayed: each estimate walks the
# extrapolation's shared start once and the memory walk once more)
CASES = [
    ({"dp": 2, "tp": 2, "pp": 4, "zero": 2}, "zero 2"),
    ({"dp": 2, "tp": 2, "pp": 4, "zero": 3}, "zero 3"),
    ({"dp": 2, "tp": 2, "pp": 4, "zero": 3, "prefetch": 2}, "zero 3, prefetch 2"),
    ({"dp": 2, "tp": 1, "pp": 8, "zero": 3, "recompute": "full"},
     "zero 3, recomputation first"),
    ({"dp": 4, "tp": 2, "pp": 2, "zero": 2, "schedule": "interleaved", "virtual_stages": 2},
     "zero 2, two chunks a stage"),
    ({"dp": 2, "tp": 2, "pp": 4, "zero": 2, "recompute": "full"},
     "zero 2, recomputation first, input later"),
]


def _emit_every_first_backward(monkeypatch):
    def emitted(self, stage, c, ready):
        return self.emit_last_backward(stage, c, self.ctx.blocks_of("B", c), ready,
                                       first_microbatch=True)
    monkeypatch.setattr(estimate_replay.ReplayedBackward, "first_backward", emitted)


@pytest.mark.parametrize("options,what", CASES, ids=[c[1] for c in CASES])
def test_a_replayed_first_backward_is_the_first_backward_emitted_again(monkeypatch, options,
                                                                       what):
    options = dict(BASE, **options)
    replays = calls(monkeypatch, "_replay_first")
    with_replays = est.estimate(options)
    assert replays, what          # the inner stages share one chunk shape
    _emit_every_first_backward(monkeypatch)
    emitted = est.estimate(options)
    for key in FIGURES:
        assert with_replays[key] == pytest.approx(emitted[key], rel=1e-12, abs=1e-12), key


def test_the_record_stands_for_inner_stages_only(monkeypatch):
    # 4 stages: the first holds the embedding and the last the head (shapes
    # of their own); of the two inner ones, stage 2 runs its first backward
    # first (1F1B: the later stages turn to backwards sooner) and records
    # it, stage 1 replays it
    replays = calls(monkeypatch, "_replay_first")
    est.estimate(dict(BASE, dp=2, tp=2, pp=4, zero=2))
    assert replays and {args[1] for args in replays} == {1}


@pytest.mark.parametrize("options", [{"zero": 3, "zero3_unit": "layer"}, {"zero": 2},
                                     {"zero": 1}],
                         ids=["by layer", "one micro-batch", "no reduce-scatter per micro-batch"])
def test_what_the_record_cannot_stand_for_is_emitted(monkeypatch, options):
    replays = calls(monkeypatch, "_replay_first")
    batch = {"global_batch": 2} if options == {"zero": 2} else {}
    est.estimate(dict(BASE, dp=2, tp=2, pp=4, **dict(options, **batch)))
    assert replays == []


def test_a_task_that_finds_the_communication_stream_busy_is_emitted(monkeypatch):
    replays = calls(monkeypatch, "_replay_first")
    busy_communication_at_start(monkeypatch, "first_backward")
    est.estimate(dict(BASE, dp=2, tp=2, pp=4, zero=2))
    assert replays == []


def test_a_replay_leaves_the_state_emitting_leaves(monkeypatch):
    # what later tasks read, as each first backward ends: the flat copies
    # still waiting for their reduce-scatters (bytes, end; here the
    # reduce-scatters over 16 ranks outlast the backward) and the memory
    # notes
    from distsim.estimate.timeline import Builder
    options = dict(BASE, topology="dgx-a100-x8", dp=16, tp=1, pp=4, zero=3, global_batch=192)
    first_backward = estimate_replay.ReplayedBackward.first_backward

    def walk():
        after = {}

        def noted(self, stage, c, ready):
            end = first_backward(self, stage, c, ready)
            after[stage] = (end, list(self.ctx.flats.get(stage, [])))
            return end

        monkeypatch.setattr(estimate_replay.ReplayedBackward, "first_backward", noted)
        case = est.resolve(options)
        b = Builder(case, est._profile_for(case))
        b.build()
        return b, after

    replays = calls(monkeypatch, "_replay_first")
    replayed, after_replays = walk()
    assert replays and any(after_replays[args[1]][1] for args in replays)
    _emit_every_first_backward(monkeypatch)
    first_backward = estimate_replay.ReplayedBackward.first_backward
    emitted, after_emitting = walk()
    assert replayed.ctx.memo.flat_inside == emitted.ctx.memo.flat_inside
    assert replayed.ctx.memo.flat_pending == emitted.ctx.memo.flat_pending
    assert after_replays.keys() == after_emitting.keys()
    for stage, (end, flats) in after_emitting.items():
        assert after_replays[stage][0] == pytest.approx(end, rel=1e-12)
        assert [n for n, _ in after_replays[stage][1]] == [n for n, _ in flats]
        assert [t for _, t in after_replays[stage][1]] == pytest.approx(
            [t for _, t in flats], rel=1e-12)


def test_a_recomputation_over_before_the_input_is_recorded_in_two_parts(monkeypatch):
    # with full recomputation stage 2's first backward opens with a layer's
    # recomputation and its input (stage 3's gradient) comes after it: the
    # record is the recomputation from the compute stream's end and the
    # rest from the input; stage 1 replays both parts
    leads = calls(monkeypatch, "_replay_lead")
    replays = calls(monkeypatch, "_replay_first")
    # the leads a first backward replays (the later backwards record theirs too)
    first_backward = estimate_replay.ReplayedBackward.first_backward
    of_first = []

    def noted(self, stage, c, ready):
        before = len(leads)
        end = first_backward(self, stage, c, ready)
        of_first.extend(leads[before:])
        return end

    monkeypatch.setattr(estimate_replay.ReplayedBackward, "first_backward", noted)
    est.estimate(dict(BASE, dp=2, tp=2, pp=4, zero=2, recompute="full"))
    assert {args[0] for args in of_first} == {1}
    assert {args[1] for args in replays} == {1}


def test_a_recomputation_that_would_run_past_the_input_is_emitted(monkeypatch):
    # stage 1's input comes right after its compute stream's end, before
    # the recomputation stage 2's record ran is over: emitted
    options = dict(BASE, dp=2, tp=2, pp=4, zero=2, recompute="full")

    def early_input(task):
        def first_backward(self, stage, c, ready):
            if stage == 1:
                ready = self.ctx.tl.free[2 * stage] + 1e-9
            return task(self, stage, c, ready)
        return first_backward

    def emitted(self, stage, c, ready):
        return self.emit_last_backward(stage, c, self.ctx.blocks_of("B", c), ready,
                                       first_microbatch=True)

    OpByOp = estimate_replay.ReplayedBackward
    monkeypatch.setattr(OpByOp, "first_backward", early_input(OpByOp.first_backward))
    replays = calls(monkeypatch, "_replay_first")
    with_replays = est.estimate(options)
    assert replays == []
    monkeypatch.setattr(OpByOp, "first_backward", early_input(emitted))
    every_emitted = est.estimate(options)
    for key in FIGURES:
        assert with_replays[key] == pytest.approx(every_emitted[key], rel=1e-12, abs=1e-12), key
