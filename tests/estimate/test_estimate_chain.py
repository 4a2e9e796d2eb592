"""Timeline.chain (the optimizer of ZeRO 1/2 in one call) against the
same items added one by one with Timeline.compute and Timeline.comm_on."""
import random

from distsim.estimate.engine import Timeline


def _state(tl: Timeline, stage: int) -> tuple:
    return (tl.free, tl.end, tl.busy, tl.comm_s, tl.compute_starts[stage], tl.compute_ends[stage],
            tl.comm_starts[stage], tl.comm_ends[stage], tl.waits, tl.tp_items, tl.sync_waits)


def test_a_chain_by_hand():
    """Compute 1 s from t=3, a 2 s transfer after it, 0.5 s of compute
    after that; the next chain (ready at 0) starts where the compute
    stream ends, 6.5 s, and waits for nothing."""
    tl = Timeline(1)
    tl.chain(0, [((False, 1.0), (True, 2.0), (False, 0.5)), ((False, 0.25),)], [3.0, 0.0])
    assert tl.compute_starts[0] == [3.0, 6.0]
    assert tl.compute_ends[0] == [4.0, 6.75]          # 6-6.5 and 6.5-6.75: one span
    assert tl.comm_starts[0] == [4.0] and tl.comm_ends[0] == [6.0]
    assert tl.busy[0] == 1.75 and tl.comm_s[0] == 2.0
    assert tl.free == [6.75, 6.0] and tl.end == 6.75


def test_chain_equals_items_one_by_one():
    rng = random.Random(7)
    for trial in range(200):
        stages = rng.randint(1, 3)
        a, b = Timeline(stages), Timeline(stages)
        stage = rng.randrange(stages)
        # some items before it, on both streams, and a sealed list (a mark)
        for tl in (a, b):
            r = random.Random(trial)
            for _ in range(r.randint(0, 4)):
                tl.compute(stage, r.choice([0.0, 0.5, 1.0]), r.choice([0.0, 2.0]))
                tl.comm_on(stage, r.choice([0.0, 0.75]), r.choice([0.0, 1.0, 5.0]))
            if r.random() < 0.3:
                tl.mark(stage)
        chains, readies = [], []
        for _ in range(rng.randint(1, 6)):
            chain = [(False, rng.choice([0.0, 0.125, 1.0, 3.0]))]
            if rng.random() < 0.7:
                chain.append((True, rng.choice([0.0, 0.5, 2.0])))
                chain.append((False, rng.choice([0.0, 0.25])))
            chains.append(tuple(chain))
            readies.append(rng.choice([0.0, 1.0, 4.0, 9.0, 20.0]))
        a.chain(stage, chains, readies)
        for chain, end in zip(chains, readies):
            for on_comm, t in chain:
                end = b.comm_on(stage, t, end) if on_comm else b.compute(stage, t, end)
        assert _state(a, stage) == _state(b, stage), (chains, readies)
