"""The estimator's shortcuts against the slow paths they replace: each
must give the same numbers (bit for bit), not merely close ones. How close
the estimator comes to the simulator is tests/estimate/test_estimate.py's."""
from __future__ import annotations

import dataclasses

import pytest

from distsim.estimate import point as est
from distsim.estimate import profile as ep

GPT2 = {"model": "gpt2", "layers": 4, "global_batch": 32, "network_mode": "analytical"}


def _profile_args(case: est.Case) -> tuple:
    c, S = case.config, case.strategy
    items = tuple(sorted(dataclasses.replace(c, global_batch=c.micro_batch).to_dict().items()))
    zero = 3 if S.zero == 3 else (1 if S.zero else 0)
    return (items, S.tp, S.sp, S.recompute, zero, c.micro_batch, S.pp > 1,
            case.topology_name, case.collective_algo, S.optimizer)


@pytest.mark.parametrize("strategy", [dict(dp=2, tp=4, zero=3, recompute="selective"),
                                      dict(dp=2, tp=2, pp=2, zero=1, sp=True),
                                      dict(dp=2, tp=4, pp=1, recompute="full", zero=2)])
def test_the_template_of_representatives_is_the_full_template(strategy):
    # the profile lowers tensor-parallel rank 0 only; its timeline is the
    # one it has among all its peers
    case = est.resolve({**GPT2, "topology": "dgx-a100", **strategy})
    args = _profile_args(case)
    full = dataclasses.asdict(ep.build_profile(*args, representatives=False))
    reps = dataclasses.asdict(ep.build_profile(*args, representatives=True))
    full.pop("wall_s")
    reps.pop("wall_s")
    assert reps == full


def test_a_collective_takes_the_same_time_whatever_was_timed_before():
    # each collective is timed from 0 on its own clock: a shared clock
    # would round a time by how far it had run, so a point's row would
    # depend on the points its worker had estimated before
    from distsim.ir.comm import CollectiveType
    from distsim.estimate.costs import Collectives
    from distsim.topology import load_topology
    topo = load_topology("dgx-a100-x2")
    team = tuple(range(0, 16, 2))
    alone = Collectives(topo, "auto").time(CollectiveType.ALL_REDUCE, team, 3e7 + 1)
    after = Collectives(topo, "auto")
    for nbytes in (1e6, 7e8, 123456789):
        after.time(CollectiveType.ALL_GATHER, tuple(range(16)), nbytes)
    assert after.time(CollectiveType.ALL_REDUCE, team, 3e7 + 1) == alone


def test_the_overlap_with_numpy_is_merged_overlap_to_the_bit():
    import random
    from distsim.intervals import merged_overlap
    from distsim.estimate.overlap import span_overlap
    rng = random.Random(3)

    def spans(n):
        t, out = rng.random() * 10, []
        for _ in range(n):
            t += rng.choice([0.0, rng.random(), rng.random() * 1e-3])
            d = rng.choice([0.0, rng.random(), rng.random() * 5])
            out.append((t, t + d))
            t += d
        return out

    for _ in range(500):
        a, b = spans(rng.randint(0, 120)), spans(rng.randint(0, 120))
        if a and b and rng.random() < 0.3:     # ends in common: the walk's tie rule
            b[rng.randrange(len(b))] = a[rng.randrange(len(a))]
            b.sort(key=lambda s: s[1])
        got = span_overlap([s for s, _ in a], [e for _, e in a],
                           [s for s, _ in b], [e for _, e in b])
        assert got == merged_overlap(a, b)
