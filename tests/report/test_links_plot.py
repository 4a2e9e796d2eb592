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


def _reference_grid(links, samples, end_s, bins):
    """The per-sample loop link_grid replaced (same semantics, slow)."""
    import numpy as np
    by_link = {}
    for s in samples:
        by_link.setdefault((s.src, s.dst), []).append(s)
    grid = np.zeros((len(links), bins))
    edges = np.linspace(0.0, end_s, bins + 1)
    for row, rec in enumerate(links):
        series = sorted(by_link.get((rec.src, rec.dst), []), key=lambda s: s.time_s)
        for k, s in enumerate(series):
            stop = series[k + 1].time_s if k + 1 < len(series) else end_s
            lo = np.searchsorted(edges, s.time_s, "right") - 1
            hi = np.searchsorted(edges, stop, "left")
            cells = grid[row, max(lo, 0):max(hi, lo + 1)]
            cells[:] = np.maximum(cells, s.utilisation)
    return grid


def test_link_grid_matches_the_per_sample_reference():
    import random

    import numpy as np

    from distsim.report.links import link_grid
    from distsim.sim.trace import LinkRecord, LinkSample
    rng = random.Random(3)
    links = [LinkRecord(f"a{i}", f"b{i}", 1.0, 1.0, 1.0, 1) for i in range(3)]
    for _ in range(60):
        end = rng.choice([1.0, 0.001])
        samples = [LinkSample(f"a{i}", f"b{i}",
                              rng.choice([rng.uniform(-0.1, 1.1), round(rng.random() * 50) / 50,
                                          0.0, 1.0]) * end, rng.random())
                   for i in range(4) for _ in range(rng.choice([0, 1, 3, 40, 300]))]
        rng.shuffle(samples)
        bins = rng.choice([1, 7, 200])
        assert np.array_equal(link_grid(links, samples, end, bins),
                              _reference_grid(links, samples, end, bins))


def _run_cli(tmp_path, monkeypatch, *extra):
    """``distsim simulate`` (MLP, dp 4, one node) with a spy on the two ways
    links.png can be drawn; returns (trace.json events, which way was drawn)."""
    import json

    import distsim.report.links as links_mod
    from distsim.cli import main
    drawn = []
    heatmap = links_mod._heatmap
    monkeypatch.setattr(links_mod, "_heatmap",
                        lambda *a, **k: (drawn.append("heatmap"), heatmap(*a, **k)))
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
