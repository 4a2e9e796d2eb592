"""ZeRO-3's accumulating backwards (micro-batches past the first),
replayed block by block.

Inside an accumulating backward that is emitted, each block that starts
with both streams of its stage free depends only on where it starts: the
first one of its kind is recorded and the next ones replay it, shifted,
with their gathers' ends and their gradients' final times (a task so
emitted is still recorded whole, its blocks' runs in the record). The
figures (memory included) must be those of emitting every block, to
rounding.
"""
from __future__ import annotations

import pytest

from distsim.estimate import point as est
from distsim.estimate import replay as estimate_replay
from estimate_hooks import calls

BASE = {"model": "gpt3-1.3b", "topology": "dgx-a100-x2", "layers": 16, "seq": 512,
        "micro_batch": 1, "recompute": "none", "global_batch": 48, "zero": 3}

FIGURES = ("step_time_s", "compute_s", "communication_s", "exposed_communication_s",
           "idle_s", "bubble_fraction", "total_flops", "max_peak_memory_bytes")

CASES = [
    ({"dp": 8, "tp": 2, "pp": 1}, "one stage"),
    ({"dp": 4, "tp": 2, "pp": 2}, "two stages"),
    ({"dp": 4, "tp": 2, "pp": 2, "prefetch": 2}, "two stages, prefetch 2"),
    ({"dp": 8, "tp": 2, "pp": 1, "prefetch": 0}, "no prefetch"),
    ({"dp": 4, "tp": 1, "pp": 4, "recompute": "full"}, "four stages, recomputation"),
    ({"dp": 8, "tp": 2, "pp": 1, "recompute": "selective", "micro_batch": 2},
     "one stage, selective recomputation"),
]


@pytest.mark.parametrize("options,what", CASES, ids=[c[1] for c in CASES])
def test_a_replayed_block_is_the_block_emitted_again(monkeypatch, options, what):
    options = dict(BASE, **options)
    replays = []
    replay = estimate_replay.ReplayedBackward._block_replay

    def counted(self, *args):
        done, recording = replay(self, *args)
        if done is not None:
            replays.append(args[2])
        return done, recording

    monkeypatch.setattr(estimate_replay.ReplayedBackward, "_block_replay", counted)
    with_replays = est.estimate(options)
    assert replays, what
    monkeypatch.setattr(estimate_replay.ReplayedBackward, "_block_replay",
                        lambda self, *args: (None, None))
    emitted = est.estimate(options)
    for key in FIGURES:
        assert with_replays[key] == pytest.approx(emitted[key], rel=1e-12, abs=1e-12), key


def test_a_task_recorded_with_replayed_blocks_is_replayed_whole(monkeypatch):
    """Four stages: the two inner ones share a chunk shape, so an inner
    stage's accumulating backward, emitted with its blocks replayed, is
    recorded whole (the blocks' runs in the record) and replayed whole by
    the other; the figures are those of emitting every task, every block."""
    options = dict(BASE, dp=2, tp=2, pp=4, global_batch=32)
    blocks = calls(monkeypatch, "_block_replay")
    tasks = calls(monkeypatch, "_replay")
    with_replays = est.estimate(options)
    # the inner stage that runs its backwards first (the later one in the
    # pipeline) replays blocks in the task it records; the other replays it
    assert 2 in {args[0] for args in blocks}
    assert 1 in {args[1] for args in tasks}

    def emitted(self, stage, c, mb, ready):
        return self.emit_last_backward(stage, c, self.ctx.blocks_of("B", c), ready,
                                       first_microbatch=True, accumulating=mb)

    monkeypatch.setattr(estimate_replay.ReplayedBackward, "accumulating_backward", emitted)
    emitted_all = est.estimate(options)
    for key in FIGURES:
        assert with_replays[key] == pytest.approx(emitted_all[key], rel=1e-12, abs=1e-12), key


@pytest.mark.parametrize("field", ["communication", "compute"])
def test_a_block_starting_with_a_stream_busy_is_emitted(monkeypatch, field):
    """Every other block finds its stage's communication stream still
    running (or its compute stream past the block before's end): its
    items then depend on more than where it starts, so it is emitted op by
    op, never replayed; the figures are those of emitting every block with
    the same streams."""
    options = dict(BASE, dp=8, tp=2, pp=1)
    replay = estimate_replay.ReplayedBackward._block_replay
    at = 1 if field == "communication" else 0
    late = 1e-2            # past the slack a block's compute has here

    def busy(self, stage, order, k, origin, *rest):
        if k % 2:
            self.ctx.tl.free[2 * stage + at] = origin + late
        return replay(self, stage, order, k, origin, *rest)

    monkeypatch.setattr(estimate_replay.ReplayedBackward, "_block_replay", busy)
    with_replays = est.estimate(options)

    def busy_emitted(self, stage, order, k, origin, *rest):
        if k % 2:
            self.ctx.tl.free[2 * stage + at] = origin + late
        return None, None

    monkeypatch.setattr(estimate_replay.ReplayedBackward, "_block_replay", busy_emitted)
    emitted = est.estimate(options)
    for key in FIGURES:
        assert with_replays[key] == pytest.approx(emitted[key], rel=1e-12, abs=1e-12), key
