from distsim.report.intervals import (difference_length, intersection_length, merge_intervals,
                                      union_length)
from distsim.sim.trace import busy_time


def test_merge_joins_overlapping_and_touching_and_drops_empty():
    assert merge_intervals([(3, 6), (0, 4), (6, 7), (9, 9), (10, 8), (8, 9)]) == [(0, 7), (8, 9)]


def test_union_of_two_overlapping_intervals():
    assert union_length([(0.0, 4.0), (3.0, 6.0)]) == 6.0
    assert union_length([]) == 0.0


def test_union_agrees_with_trace_busy_time():
    spans = [(0.5, 1.0), (0.0, 0.25), (0.2, 0.6), (2.0, 3.0), (2.5, 2.75)]
    assert union_length(spans) == busy_time(spans) == 1.0 + 1.0


def test_intersection_and_difference():
    a = [(5.0, 8.0)]
    b = [(0.0, 4.0), (3.0, 6.0)]
    assert intersection_length(a, b) == 1.0
    assert difference_length(a, b) == 2.0
    assert intersection_length([(0, 10)], [(1, 2), (3, 4), (9, 12)]) == 3
    assert difference_length([(0, 1)], []) == 1
    assert difference_length([(0, 1)], [(0, 1)]) == 0
