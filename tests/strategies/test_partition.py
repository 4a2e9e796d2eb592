"""Pipeline stage partitioning: even by layers, or balanced by estimated
cost with the embedding counted in the first stage and the head in the
last (``--partition balanced``). Equivalence with the single-device step
is in test_equivalence.py."""
import pytest

import distsim
from distsim.errors import ConfigError
from distsim.transforms.pipeline import partition_balanced, partition_layers


def stage_costs(ranges, costs, first, last):
    out = [sum(costs[a:b]) for a, b in ranges]
    out[0] += first
    out[-1] += last
    return out


def test_balanced_partition_by_hand():
    # 6 layers of cost 1, embedding 1, head 2, 3 stages: the head's stage can
    # hold one layer (2 + 1 = 3), the embedding's two (1 + 2 = 3), the
    # middle the other three: every stage costs 3, the only way to reach 3
    costs = [1.0] * 6
    assert partition_balanced(costs, 3, first=1.0, last=2.0) == [(0, 2), (2, 5), (5, 6)]
    even = partition_layers(6, 3)
    assert even == [(0, 2), (2, 4), (4, 6)]
    assert max(stage_costs(even, costs, 1.0, 2.0)) == 4.0   # the head's stage: 2 + 2
    # heavy first and last layers each get a stage of their own
    assert partition_balanced([5, 1, 1, 1, 1, 5], 3) == [(0, 1), (1, 5), (5, 6)]
    # equal layers, nothing else: the even split
    assert partition_balanced([2.0] * 8, 4) == partition_layers(8, 4)
    assert partition_balanced([1.0] * 5, 1, first=3.0, last=3.0) == [(0, 5)]


def test_balanced_partition_is_optimal_against_brute_force():
    from itertools import combinations
    import random
    rng = random.Random(5)
    for _ in range(200):
        n = rng.randint(1, 8)
        k = rng.randint(1, n)
        costs = [rng.choice([0.0, 0.5, 1.0, 2.0, 3.0]) for _ in range(n)]
        first, last = rng.choice([0.0, 1.0, 4.0]), rng.choice([0.0, 2.0, 7.0])
        got = partition_balanced(costs, k, first, last)
        assert len(got) == k and got[0][0] == 0 and got[-1][1] == n
        assert all(b > a for a, b in got) and all(got[i][1] == got[i + 1][0] for i in range(k - 1))
        best = min(max(stage_costs(list(zip((0,) + cut, cut + (n,))), costs, first, last))
                   for cut in combinations(range(1, n), k - 1))
        assert max(stage_costs(got, costs, first, last)) == pytest.approx(best)


def test_balanced_partition_refuses_bad_input():
    with pytest.raises(ConfigError, match="3 pipeline stages .* only 2 layers"):
        partition_balanced([1.0, 1.0], 3)
    with pytest.raises(ConfigError, match="non-negative"):
        partition_balanced([1.0, float("nan")], 2)


def test_balanced_partition_speeds_up_a_heavy_head():
    """Llama 3 8B: the output layer (vocabulary 128256 x 4096) costs about
    2.4 layers (2 V h against 2 (h (h + 2 kv d) + h^2 + 3 h ffn) per token),
    so with 8 layers on 4 stages the even split gives the last stage
    2 + 2.4 layers; balanced, it keeps 1 + 2.4 and the step shortens."""
    runs = {p: distsim.simulate(model="llama3-8b", topology="dgx-a100", dp=2, pp=4, layers=8,
                                seq=256, global_batch=8, partition=p, symmetry=True,
                                network_mode="analytical")
            for p in ("even", "balanced")}
    assert runs["even"].program.meta["stage_ranges"] == [(0, 2), (2, 4), (4, 6), (6, 8)]
    ranges = runs["balanced"].program.meta["stage_ranges"]
    assert ranges[-1] == (7, 8) and max(b - a for a, b in ranges) == 3
    assert runs["balanced"].step_time_s < 0.95 * runs["even"].step_time_s
    assert runs["balanced"].summary()["config"]["partition"] == "balanced"
