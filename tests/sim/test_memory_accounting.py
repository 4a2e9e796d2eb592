"""The per-device memory curve against its definition, event by event:
each value is live from its allocation to its free; at one time frees come
before allocations; a sample per time at which bytes come or go; the peak
is the first moment the largest live total is reached after an
allocation, with the live bytes of each category."""
import math

import numpy as np
from hypothesis import given, settings, strategies as st

from distsim.sim.memory import memory_accounting

CATEGORIES = ["weights", "activations", "gradients"]


def by_definition(device, size, category, alloc, free):
    events = []   # (device, time, 0 free / 1 alloc, value order, +-bytes, category)
    for i, (d, b, c, a, f) in enumerate(zip(device, size, category, alloc, free)):
        events.append((d, a, 1, i, b, c))
        if math.isfinite(f):
            events.append((d, f, 0, i, -b, c))
    events.sort(key=lambda e: e[:4])
    samples, peak, at_peak = [], {}, {}
    live, by_cat = {}, {}
    for d, t, kind, _, delta, c in events:
        live[d] = live.get(d, 0) + delta
        cats = by_cat.setdefault(d, {})
        cats[c] = cats.get(c, 0) + delta
        if samples and samples[-1][:2] == (d, t):
            samples[-1] = (d, t, live[d])
        elif delta or not samples or samples[-1][0] != d:
            # a sample per time at which bytes come or go, and the device's first
            samples.append((d, t, live[d]))
        if kind == 1 and live[d] > peak.get(d, -1):
            peak[d] = live[d]
            at_peak[d] = {CATEGORIES[k]: v for k, v in sorted(cats.items()) if v}
    return samples, peak, at_peak


@st.composite
def values(draw):
    n = draw(st.integers(1, 60))
    ints = st.integers(0, 6)
    device = draw(st.lists(st.integers(0, 3), min_size=n, max_size=n))
    size = draw(st.lists(st.integers(0, 50), min_size=n, max_size=n))
    category = draw(st.lists(st.integers(0, 2), min_size=n, max_size=n))
    alloc = draw(st.lists(ints, min_size=n, max_size=n))
    life = draw(st.lists(st.one_of(ints, st.just(None)), min_size=n, max_size=n))
    free = [math.inf if x is None else a + x for a, x in zip(alloc, life)]
    return device, size, category, [float(a) for a in alloc], free


@settings(max_examples=300, deadline=None)
@given(values())
def test_curve_peak_and_categories_match_the_definition(case):
    device, size, category, alloc, free = case
    out = memory_accounting(np.array(device), np.array(size), np.array(category),
                            np.array(alloc), np.array(free), CATEGORIES)
    samples, peak, at_peak = by_definition(device, size, category, alloc, free)
    assert [tuple(s) for s in out.samples.records()] == samples
    assert out.peak == peak
    assert out.peak_by_category == at_peak


def test_the_summary_has_the_peaks_with_or_without_the_curve():
    """record_memory=False drops the curve, not the peaks: the summary's
    per-device peak memory is the same either way (it used to read 0, the
    peaks being taken from the curve's samples only)."""
    from distsim.api import build_program
    from distsim.report.summary import summarize
    from distsim.sim.simulator import SimulationOptions, simulate_function

    program, _, topo = build_program("tiny", "dgx-a100", dp=2, tp=2, pp=2)
    with_curve = simulate_function(program, topo, options=SimulationOptions(record_memory=True))
    without = simulate_function(program, topo, options=SimulationOptions(record_memory=False))
    assert with_curve.memory and not without.memory
    peaks = {d["rank"]: d["peak_memory_bytes"] for d in summarize(with_curve)["devices"]}
    assert min(peaks.values()) > 0
    assert peaks == {d["rank"]: d["peak_memory_bytes"] for d in summarize(without)["devices"]}
    # and the peaks given are the curve's highest samples
    highest = {}
    for s in with_curve.memory:
        highest[s.rank] = max(highest.get(s.rank, 0), s.live_bytes)
    assert peaks == highest
