"""Values updated in place keep their bytes while the newest version of
them lives: the vectorized chain walk (pointer jumping) agrees with the
definition, one pair at a time from the newest."""
import numpy as np
from hypothesis import given, settings, strategies as st

from distsim.sim.value_lifetimes import hold_updated as _hold_updated


def one_pair_at_a_time(free, in_place):
    free = free.copy()
    for old, new in reversed(in_place):
        if free[new] > free[old]:
            free[old] = free[new]
    return free


@st.composite
def chains(draw):
    """Values 0..n-1 with free times; disjoint chains of increasing numbers."""
    n = draw(st.integers(2, 40))
    free = np.array(draw(st.lists(st.sampled_from([0.0, 1.0, 2.5, 4.0, np.inf]),
                                  min_size=n, max_size=n)))
    order = draw(st.permutations(range(n)))
    cuts = sorted(draw(st.sets(st.integers(1, n - 1), max_size=n // 2)))
    pairs = []
    for part in np.split(np.array(order), cuts):
        ranked = sorted(part.tolist())
        pairs += list(zip(ranked, ranked[1:]))
    return free, sorted(pairs)


@settings(max_examples=200, deadline=None)
@given(chains())
def test_chain_walk_matches_the_definition(case):
    free, pairs = case
    got = free.copy()
    _hold_updated(got, pairs)
    assert got.tolist() == one_pair_at_a_time(free, pairs).tolist()


def test_a_long_chain_ends_at_its_newest_value():
    # 0 -> 1 -> ... -> 99; only the newest is read late
    free = np.zeros(100)
    free[99] = 7.0
    _hold_updated(free, [(i, i + 1) for i in range(99)])
    assert (free == 7.0).all()


def test_a_value_updated_twice_takes_the_later_free():
    free = np.array([1.0, 3.0, 2.0])
    _hold_updated(free, [(0, 1), (0, 2)])   # not a chain: the pairwise path
    assert free.tolist() == [3.0, 3.0, 2.0]
