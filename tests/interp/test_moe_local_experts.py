"""The mixture-of-experts kernels on one rank of the all-gather dispatcher
(``first_expert``, ``local_experts``, ``groups`` one per rank: an
expert-parallel group's tokens gathered) against the all-to-all
dispatcher's layout, with an expert's capacity binding so that choices are
dropped: rank ``r``'s slots are every rank's own dispatch of its tokens,
cut to ``r``'s experts and placed side by side in rank order; the partial
combines of the ``ep`` ranks sum to every rank's own combine."""
from __future__ import annotations

import numpy as np
import pytest

from distsim.interp.kernels import KERNELS

EP, TOKENS, EXPERTS, HIDDEN, CAPACITY = 2, 6, 4, 3, 2
ROUTE = {"top_k": 2, "capacity": CAPACITY}


def _ranks():
    rng = np.random.default_rng(1)
    x = [rng.normal(size=(TOKENS, HIDDEN)) for _ in range(EP)]
    p = [rng.dirichlet(np.ones(EXPERTS), size=TOKENS) for _ in range(EP)]
    return x, p


def _local(r):
    local = EXPERTS // EP
    return dict(ROUTE, capacity=EP * CAPACITY, groups=EP, first_expert=r * local,
                local_experts=local)


def test_capacity_binds():
    # 6 tokens x top 2 = 12 choices for 4 experts x 2 slots: some dropped
    x, p = _ranks()
    slots = KERNELS["moe_dispatch"](ROUTE, x[0], p[0])
    assert np.count_nonzero(np.any(slots != 0, axis=2)) < TOKENS * 2


@pytest.mark.parametrize("r", range(EP))
def test_local_slots_are_the_all_to_all_layout(r):
    x, p = _ranks()
    local = EXPERTS // EP
    own = [KERNELS["moe_dispatch"](ROUTE, xs, ps) for xs, ps in zip(x, p)]
    expected = np.concatenate([d[r * local:(r + 1) * local] for d in own], axis=1)
    got = KERNELS["moe_dispatch"](_local(r), np.concatenate(x), np.concatenate(p))
    np.testing.assert_array_equal(got, expected)


def test_partial_combines_sum_to_each_ranks_combine():
    x, p = _ranks()
    rng = np.random.default_rng(2)
    y = [rng.normal(size=(EXPERTS, CAPACITY, HIDDEN)) for _ in range(EP)]  # rank s's slots
    local = EXPERTS // EP
    total = sum(KERNELS["moe_combine"](
        _local(r), np.concatenate([ys[r * local:(r + 1) * local] for ys in y], axis=1),
        np.concatenate(p)) for r in range(EP))
    expected = np.concatenate([KERNELS["moe_combine"](ROUTE, ys, ps) for ys, ps in zip(y, p)])
    np.testing.assert_allclose(total, expected, rtol=1e-12)
