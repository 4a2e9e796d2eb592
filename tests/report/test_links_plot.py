"""links.png from a real simulated run, with and without samples."""
import pytest
import simpy

from distsim.ir.comm import CollectiveType as C
from distsim.report.links import busiest, plot_links
from distsim.sim.collectives import run_collective
from distsim.sim.network import Network
from distsim.topology import load_topology


def test_links_png_with_and_without_samples(tmp_path):
    for samples in (False, True):
        env = simpy.Environment()
        net = Network(env, load_topology("dgx-a100"), record_samples=samples)
        env.process(run_collective(env, net, C.ALL_REDUCE, (0, 1, 2, 3), 1e8, algorithm="ring"))
        env.run()
        records = net.link_records()
        assert len(busiest(records, 4)) == 4
        out = tmp_path / f"links{samples}.png"
        plot_links(records, out, samples=net.link_samples(), end_s=env.now)
        assert out.read_bytes()[:4] == b"\x89PNG"
        assert bool(net.link_samples()) == samples


def _reference_means(links, samples, end_s, bins, steps=4000):
    """Per-bin means by brute force: the step function sampled at the
    midpoints of ``steps`` equal slices of each bin."""
    import numpy as np
    grid = np.zeros((len(links), bins))
    width = end_s / bins
    for row, rec in enumerate(links):
        series = sorted((s for s in samples if (s.src, s.dst) == (rec.src, rec.dst)),
                        key=lambda s: s.time_s)
        times = np.array([s.time_s for s in series])
        values = np.array([s.utilisation for s in series])
        for b in range(bins):
            t = b * width + (np.arange(steps) + 0.5) * width / steps
            k = np.searchsorted(times, t, side="right") - 1
            grid[row, b] = np.where(k >= 0, values[np.clip(k, 0, None)], 0.0).mean() \
                if len(times) else 0.0
    return grid


def test_link_utilisation_is_the_mean_of_each_bin():
    import random

    import numpy as np

    from distsim.report.links import link_utilisation
    from distsim.sim.trace import LinkRecord, LinkSample
    rng = random.Random(3)
    links = [LinkRecord(f"a{i}", f"b{i}", 1.0, 1.0, 1.0, 1) for i in range(3)]
    for _ in range(20):
        # times on a grid of 1/50 of the step, so the midpoint sums are exact
        samples = [LinkSample(f"a{i}", f"b{i}", rng.randrange(0, 50) / 50, rng.random())
                   for i in range(4) for _ in range(rng.choice([0, 1, 3, 40]))]
        rng.shuffle(samples)
        bins = rng.choice([1, 5, 10])
        got = link_utilisation(links, samples, 1.0, bins)
        assert np.allclose(got, _reference_means(links, samples, 1.0, bins, steps=200),
                           atol=1e-12)


def test_the_plotted_means_are_the_summary_utilisation():
    """links.png draws the links summary.json lists, in its order, and the
    mean of each plotted row (equal bins) is the summary's utilisation."""
    import numpy as np

    import distsim
    from distsim.report.links import link_chart
    result = distsim.simulate(model="tiny", topology="dgx-a100", dp=2, tp=2, pp=2,
                              record_links=True)
    summary = result.summary()
    chart = link_chart(result.trace.links, result.trace.link_samples, result.step_time_s)
    assert [(k.src, k.dst) for k in chart.links] == \
        [(k["src"], k["dst"]) for k in summary["links"]]
    assert len(chart.links) == len(summary["links"]) > 0
    utilisation = np.array([k["utilisation"] for k in summary["links"]])
    assert np.allclose(chart.grid.mean(axis=1), utilisation, rtol=1e-9, atol=0)
    assert np.allclose(chart.mean, utilisation, rtol=1e-12, atol=0)
    # a mean, not a maximum: the busiest bin is below 1 for links that are
    # saturated only in short bursts
    assert chart.grid.max() <= 1.0 + 1e-9


def _run_cli(tmp_path, monkeypatch, *extra):
    """``distsim simulate`` (MLP, dp 4, one node) with a spy on what
    links.png was drawn from; returns (trace.json events, "heatmap" when
    drawn over time)."""
    import json

    import distsim.report.links as links_mod
    from distsim.cli import main
    drawn = []
    figure = links_mod.link_figure

    def spy(chart):
        if chart.grid is not None:
            drawn.append("heatmap")
        return figure(chart)
    monkeypatch.setattr(links_mod, "link_figure", spy)
    out = tmp_path / "out"
    code = main(["simulate", "--layers", "2", "--hidden", "256", "--batch", "64", "--dp", "4",
                 "--out", str(out), *extra])
    assert code == 0
    assert (out / "links.png").read_bytes()[:4] == b"\x89PNG"
    events = json.loads((out / "trace.json").read_text())["traceEvents"]
    return events, drawn


def test_simulate_cli_draws_link_use_over_time_and_writes_link_counters(tmp_path, monkeypatch):
    events, drawn = _run_cli(tmp_path, monkeypatch)
    assert drawn == ["heatmap"]                       # utilisation over time, not bars
    links = [e for e in events if e["ph"] == "C" and e["name"].startswith("link ")]
    assert links, "trace.json has no link counters"
    # the gradient all-reduce over NVSwitch: GPU links carry traffic, the
    # utilisation is a share of the link (max-min never passes 1) and some
    # link is (nearly) saturated at some point
    assert {e["name"] for e in links} >= {"link gpu0->nvswitch0", "link nvswitch0->gpu1"}
    utils = [e["args"]["utilisation"] for e in links]
    assert all(0.0 <= u <= 1.0 + 1e-9 for u in utils) and max(utils) > 0.9
    network = {e["pid"] for e in links}
    assert len(network) == 1 and network.isdisjoint({e["pid"] for e in events if e["ph"] == "X"})


def test_no_link_samples_flag_falls_back_to_busy_bars(tmp_path, monkeypatch):
    events, drawn = _run_cli(tmp_path, monkeypatch, "--no-link-samples")
    assert drawn == []
    assert not [e for e in events if e["ph"] == "C" and e["name"].startswith("link ")]


def test_api_records_links_only_when_asked():
    import distsim
    small = dict(layers=2, hidden=256, batch=64, dp=4)
    off = distsim.simulate(**small)
    on = distsim.simulate(record_links=True, **small)
    assert off.trace.link_samples == [] and on.trace.link_samples
    # recording changes no time (to rounding: without samples, a collective
    # that runs alone ends at start + its solo duration, one addition
    # instead of the clock's step-by-step sum)
    assert on.step_time_s == pytest.approx(off.step_time_s, rel=1e-12)
    assert {(s.src, s.dst) for s in on.trace.link_samples} == \
        {(r.src, r.dst) for r in on.trace.links}
