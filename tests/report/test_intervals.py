from distsim.intervals import (difference_length, intersection_length, merge_intervals,
                                      union_length)


def test_merge_joins_overlapping_and_touching_and_drops_empty():
    assert merge_intervals([(3, 6), (0, 4), (6, 7), (9, 9), (10, 8), (8, 9)]) == [(0, 7), (8, 9)]


def test_union_of_two_overlapping_intervals():
    assert union_length([(0.0, 4.0), (3.0, 6.0)]) == 6.0
    assert union_length([]) == 0.0


def test_union_of_unsorted_nested_and_touching_spans():
    spans = [(0.5, 1.0), (0.0, 0.25), (0.2, 0.6), (2.0, 3.0), (2.5, 2.75)]
    assert union_length(spans) == 1.0 + 1.0


def test_intersection_and_difference():
    a = [(5.0, 8.0)]
    b = [(0.0, 4.0), (3.0, 6.0)]
    assert intersection_length(a, b) == 1.0
    assert difference_length(a, b) == 2.0
    assert intersection_length([(0, 10)], [(1, 2), (3, 4), (9, 12)]) == 3
    assert difference_length([(0, 1)], []) == 1
    assert difference_length([(0, 1)], [(0, 1)]) == 0


def test_numpy_union_equals_the_interval_merge():
    """union_length_of (numpy, used by the summary) against the merge, on
    random spans including empty, reversed, touching and nested ones."""
    import numpy as np
    from distsim.intervals import union_length_of
    rng = np.random.default_rng(7)
    assert union_length_of(np.array([]), np.array([])) == 0.0
    assert union_length_of(np.array([0.0, 4.0, 6.0]), np.array([4.0, 6.0, 7.0])) == 7.0
    for _ in range(200):
        n = int(rng.integers(1, 40))
        starts = rng.integers(0, 50, n).astype(float)
        ends = starts + rng.integers(-3, 10, n)
        spans = list(zip(starts.tolist(), ends.tolist()))
        assert union_length_of(starts, ends) == union_length(spans)
