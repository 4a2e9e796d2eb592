"""Memory samples as columns (:class:`MemoryColumns`): the tuples a trace
makes from them on first use are the samples as the simulator made them
one by one before, a trace built from a list keeps it, and copying a
representative's samples to its followers gives what copying and
re-sorting the tuples did (the reference below is that definition)."""
import pickle
from operator import itemgetter

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from distsim.sim.memory import copy_to_followers
from distsim.sim.trace import DeviceInfo, MemoryColumns, MemorySample, Trace


def copied_by_definition(samples, members):
    """Each follower gets its representative's samples; all sorted by
    (rank, time), stably."""
    extra = [MemorySample(m, s.time_s, s.live_bytes) for s in samples
             for m in members.get(s.rank, (s.rank,))[1:]]
    return sorted(samples + extra, key=itemgetter(0, 1))


@st.composite
def represented(draw):
    """Samples of a few representatives (one per time each, sorted by rank
    then time, as memory_accounting makes them) and their followers."""
    heads = draw(st.lists(st.integers(0, 5), min_size=1, max_size=4, unique=True))
    samples = []
    for r in sorted(heads):
        times = sorted(draw(st.lists(st.floats(0, 10, allow_nan=False), max_size=6,
                                     unique=True)))
        samples += [MemorySample(r, t, draw(st.integers(0, 2 ** 40))) for t in times]
    free = iter(range(6, 40))
    members = {h: (h,) + tuple(next(free) for _ in range(draw(st.integers(0, 3))))
               for h in heads}
    return samples, members


@settings(max_examples=200, deadline=None)
@given(represented())
def test_copying_to_followers_equals_copying_the_tuples(case):
    samples, members = case
    out = copy_to_followers(MemoryColumns.from_samples(samples), members)
    assert out.records() == copied_by_definition(samples, members)


def test_copying_to_followers_by_hand():
    cols = MemoryColumns([0, 0, 3], [0.0, 1.0, 0.5], [10, 20, 7])
    out = copy_to_followers(cols, {0: (0, 2), 3: (3,)})
    assert out.records() == [(0, 0.0, 10), (0, 1.0, 20), (2, 0.0, 10), (2, 1.0, 20),
                             (3, 0.5, 7)]


def test_records_are_python_numbers_in_sample_order():
    cols = MemoryColumns(np.array([1, 0]), np.array([2.5, 0.0]), np.array([5, 2 ** 40]))
    records = cols.records()
    assert records == [MemorySample(1, 2.5, 5), MemorySample(0, 0.0, 2 ** 40)]
    assert all(type(r) is MemorySample for r in records)
    assert [tuple(map(type, r)) for r in records] == [(int, float, int)] * 2


def test_columns_of_different_lengths_are_refused():
    with pytest.raises(ValueError, match="differ in length"):
        MemoryColumns([0, 1], [0.0], [1, 2])


DEVICES = [DeviceInfo(0, "gpu0", 100), DeviceInfo(1, "gpu1", 100)]


def test_a_trace_makes_the_samples_on_first_use_and_keeps_them():
    trace = Trace(DEVICES, memory_columns=MemoryColumns([0, 1], [0.0, 1.0], [3, 4]))
    assert trace._memory is None and trace.num_memory_samples == 2
    first = trace.memory
    assert first == [MemorySample(0, 0.0, 3), MemorySample(1, 1.0, 4)]
    assert trace.memory is first
    assert trace.peak_memory() == {0: 3, 1: 4}


def test_a_trace_built_from_a_list_keeps_it_and_gives_columns():
    samples = [MemorySample(1, 0.5, 9), MemorySample(0, 0.0, 2)]
    trace = Trace(DEVICES, memory=samples)
    assert trace.memory is samples
    cols = trace.memory_columns
    assert cols.rank.tolist() == [1, 0] and cols.time_s.tolist() == [0.5, 0.0]
    assert cols.live_bytes.tolist() == [9, 2]


def test_assigning_samples_replaces_the_columns():
    trace = Trace(DEVICES, memory_columns=MemoryColumns([0], [0.0], [1]))
    trace.memory = [MemorySample(1, 2.0, 5)]
    assert trace.memory_columns.rank.tolist() == [1]
    assert trace.num_memory_samples == 1


def test_samples_and_columns_are_exclusive():
    with pytest.raises(ValueError, match="memory or memory_columns"):
        Trace(DEVICES, memory=[], memory_columns=MemoryColumns())


def test_a_trace_with_columns_pickles_and_compares_as_its_samples():
    trace = Trace(DEVICES, memory_columns=MemoryColumns([0, 1], [0.0, 1.0], [3, 4]))
    back = pickle.loads(pickle.dumps(trace))
    assert back == trace
    assert back == Trace(DEVICES, memory=[MemorySample(0, 0.0, 3), MemorySample(1, 1.0, 4)])
