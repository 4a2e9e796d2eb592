"""The estimator's two extrapolation timelines share their common start
(one walk, forked: Builder.resume), and give what two separate walks give,
to the bit (to rounding where the second replays the first's last
backwards); no timeline item has a negative duration."""
from __future__ import annotations

import pytest

from distsim.estimate import point as est
from distsim.estimate import replay as estimate_replay
from distsim.estimate.timeline import Builder, shared_prefix

GPT2 = {"model": "gpt2", "layers": 4, "global_batch": 64, "micro_batch": 1,
        "network_mode": "analytical", "topology": "dgx-a100"}
STRATEGIES = [dict(dp=2, tp=2, pp=2), dict(dp=2, pp=4, zero=1, bucket_mb=1),
              dict(dp=2, pp=4, zero=2), dict(dp=2, pp=4, zero=3),
              dict(dp=2, pp=2, tp=2, schedule="interleaved"), dict(dp=8, pp=1)]


@pytest.mark.parametrize("strategy", STRATEGIES,
                         ids=[",".join(f"{k}={v}" for k, v in s.items()) for s in STRATEGIES])
def test_the_forked_walk_is_two_walks(monkeypatch, strategy):
    case = est.resolve({**GPT2, **strategy})
    profile = est._profile_for(case)
    m1, m2 = est.extrapolation_lengths(case.strategy)
    m = case.microbatches
    assert m > m2 + 1
    a = est._run_timeline(est._with_microbatches(case, m1), profile)
    b = est._run_timeline(est._with_microbatches(case, m2), profile)
    expected = {k: a[k] + (m - m1) * (b[k] - a[k]) / (m2 - m1) for k in a}
    # the second timeline replays the first's last backwards (shifted)
    assert est.timeline_figures(case, profile) == pytest.approx(expected, rel=1e-12, abs=1e-15)
    # each emitted: to the bit
    monkeypatch.setattr(estimate_replay, "_MIN_BLOCKS", 10 ** 9)
    monkeypatch.setattr(estimate_replay.ReplayedBackward, "_block_replay",
                        lambda self, *args: (None, None))
    assert est.timeline_figures(case, profile) == expected


def test_the_shared_start_is_most_of_the_shorter_walk():
    case = est.resolve({**GPT2, "dp": 2, "pp": 4})
    profile = est._profile_for(case)
    m1, m2 = est.extrapolation_lengths(case.strategy)
    w1 = Builder(est._with_microbatches(case, m1), profile).walk()
    w2 = Builder(est._with_microbatches(case, m2), profile).walk()
    n = shared_prefix(w1, w2, m1 - 1)
    # 1F1B on 4 stages, 5 micro-batches: each stage's tasks agree until its
    # last backward; the stages drain one after another
    assert len(w1.order) // 2 < n < len(w1.order)
    assert w1.order[:n] == w2.order[:n]
    assert all(not (kind == "B" and mb == m1 - 1) for _, (kind, mb, _), _, _ in w1.order[:n])


@pytest.mark.parametrize("zero", [2, 3])
def test_zero_accumulation_items_never_run_backwards(zero):
    # ZeRO 2/3 with a reduce-scatter per micro-batch accumulate on the 1/dp
    # shard instead of the whole gradient (cheaper than the template's
    # accumulation, which the op-by-op backward leaves out): no item of
    # negative length, each stream in time order
    case = est.resolve({**GPT2, "dp": 8, "zero": zero, "global_batch": 32})
    profile = est._profile_for(case)
    b = Builder(case, profile)
    assert b.ctx.scatter_each and case.microbatches > 2
    tl = b.build()
    for stage in range(case.strategy.pp):
        starts, ends = tl.compute_starts[stage], tl.compute_ends[stage]
        assert all(e >= s for s, e in zip(starts, ends))
        assert all(x <= y for x, y in zip(starts, starts[1:]))
        assert all(x <= y for x, y in zip(tl.comm_starts[stage], tl.comm_ends[stage]))


def test_extrapolation_lengths():
    from distsim.transforms.strategy import Strategy
    # past a full pipeline: pp + 1 and pp + 2 micro-batches; 2 and 3 without
    # one; three and four rounds of pp when interleaved
    assert est.extrapolation_lengths(Strategy(dp=2, pp=4)) == (5, 6)
    assert est.extrapolation_lengths(Strategy(dp=8)) == (2, 3)
    assert est.extrapolation_lengths(Strategy(dp=2, pp=4, schedule="interleaved",
                                              virtual_stages=2)) == (12, 16)
    # ZB-H1, ZeRO 3 by layer over dp: a micro-batch later
    assert est.extrapolation_lengths(Strategy(dp=2, pp=4, schedule="zb-h1", zero=3,
                                              zero3_unit="layer")) == (6, 7)
    assert est.extrapolation_lengths(Strategy(dp=2, pp=4, schedule="zb-h1", zero=3)) == (5, 6)
