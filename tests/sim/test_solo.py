"""Collectives that run alone (sim/solo.py) take no events, and change
nothing: the same step time, op records, link totals and link samples as
running every collective through the network (``solo=False``), to
rounding (one addition of the solo duration instead of the clock's sum)."""
from __future__ import annotations

import pytest

from distsim.api import build_program
from distsim.sim.simulator import SimulationOptions, Simulator, simulate_function
from distsim.sim.solo import solo_teams
from distsim.sim.network import Network
from distsim.ir.comm import CollectiveType as C
import simpy

CASES = [
    ("mlp", "dgx-a100", dict(dp=8, layers=3, hidden=256, batch=64)),
    ("mlp", "dgx-a100-x2", dict(dp=16, layers=2, hidden=512, batch=64)),
    ("tiny", "dgx-a100", dict(dp=2, tp=2, pp=2, microbatches=4, global_batch=8)),
    ("tiny", "dgx-a100-x2", dict(dp=2, tp=4, pp=2, zero=3)),
    ("tiny", "dgx-a100-x2", dict(dp=4, tp=4, symmetry=True, coarsen=True)),
]


def _close(a, b):
    return a == pytest.approx(b, rel=1e-12, abs=1e-18)


@pytest.mark.parametrize("mode", ["flow", "analytical"])
@pytest.mark.parametrize("model,topology,strategy", CASES)
def test_solo_collectives_change_nothing(model, topology, strategy, mode):
    program, _, topo = build_program(model, topology, **strategy)
    runs = {solo: simulate_function(program, topo, options=SimulationOptions(
        network_mode=mode, solo=solo, record_links=True)) for solo in (False, True)}
    ref, fast = runs[False], runs[True]
    _assert_same(ref, fast)
    # link use over time: the solo path replays a collective's own run (its
    # first step flow by flow), the reference fast-forwards repeats as mean
    # use; either way each link's use integrates to the bytes it carried
    for trace in (ref, fast):
        carried = _integrals(trace)
        for r in trace.links:
            assert carried.get((r.src, r.dst), 0.0) == pytest.approx(r.bytes_carried, rel=1e-9)


def _assert_same(ref, fast):
    """The same step, op records (to rounding), memory and link totals."""
    assert _close(fast.step_time_s, ref.step_time_s)
    assert len(fast.ops) == len(ref.ops)
    key = lambda r: (r.rank, r.stream, r.name)  # noqa: E731
    for a, b in zip(sorted(ref.ops, key=key), sorted(fast.ops, key=key)):
        assert a[:5] == b[:5] and a[7:] == b[7:]
        assert _close(b.start_s, a.start_s) and _close(b.end_s, a.end_s)
    assert fast.meta["peak_memory_by_category"] == ref.meta["peak_memory_by_category"]
    links = {(r.src, r.dst): r for r in ref.links}
    assert {(r.src, r.dst) for r in fast.links} == set(links)
    for r in fast.links:
        a = links[(r.src, r.dst)]
        assert _close(r.bytes_carried, a.bytes_carried) and _close(r.busy_s, a.busy_s)
        assert r.peak_flows == a.peak_flows


def _integrals(trace):
    """Per link, the integral of utilisation x capacity over the samples."""
    capacity = {(r.src, r.dst): r.bandwidth_Bps for r in trace.links}
    by_link = {}
    for sample in trace.link_samples:
        by_link.setdefault((sample.src, sample.dst), []).append(sample)
    out = {}
    for link, samples in by_link.items():
        samples = sorted(samples, key=lambda x: x.time_s)   # stable: equal times keep order
        total = 0.0
        for a, b in zip(samples, samples[1:] + [None]):
            end = trace.step_time_s if b is None else b.time_s
            total += a.utilisation * capacity[link] * (end - a.time_s)
        out[link] = total
    return out


def test_teams_sharing_a_link_are_not_solo():
    """Two pairs on one server share the switch's links only if their
    routes overlap: 0-1 and 2-3 over NVSwitch do not; 0-1 and 0-2 do
    (gpu0's link to the switch)."""
    from distsim.topology import load_topology
    net = Network(simpy.Environment(), load_topology("dgx-a100"))
    plan = lambda ranks: (C.ALL_REDUCE, ranks, None, 1e6, "ring")  # noqa: E731
    assert solo_teams(net, [plan((0, 1)), plan((2, 3))]) == {(False, frozenset({0, 1})),
                                                              (False, frozenset({2, 3}))}
    assert solo_teams(net, [plan((0, 1)), plan((0, 2)), plan((4, 5))]) == \
        {(False, frozenset({4, 5}))}


def test_a_send_recv_and_a_collective_of_the_same_two_ranks_share_their_link():
    """A send/recv runs on the pair's p2p queue, beside the comm stream, so
    it can overlap an all-reduce of the same two ranks: they are two teams,
    and neither runs alone. Two GPUs joined by one 10 GB/s cable, both
    issued at 0, each 1 GB (5e8 f16):

    - all-reduce, ring of p = 2: 2 steps of S/2 = 0.5 GB each way;
    - send/recv: 1 GB on gpu0 -> gpu1.

    Link gpu0 -> gpu1 carries the send and the all-reduce's flow, 5 GB/s
    each: step 1 ends at 0.5 GB / 5 GB/s = 0.1 s (the send has 0.5 GB
    left); step 2 and the send share the link again, 0.5 GB each at
    5 GB/s: both end at 0.2 s. Run alone, each would take 0.1 s (the bug:
    the send/recv's team {0, 1} was taken for the all-reduce's, whose
    collectives run one after another, so both were timed as alone)."""
    from distsim.cost import CostModel, DeviceSpec
    from distsim.ir import DType, FunctionBuilder, TensorType
    from distsim.topology import topology_from_dict
    device = {"name": "t", "peak_flops": {"f16": 1e12}, "memory_bandwidth_Bps": 1e12,
              "memory_bytes": 10 ** 12}
    topo = topology_from_dict({"device": device, "devices": {"count": 2}, "links": [
        {"src": "gpu0", "dst": "gpu1", "bandwidth_GBps": 10, "latency_us": 0}]}, "pair.yaml")
    b = FunctionBuilder("send_and_reduce")
    x = b.input("x", TensorType((500_000_000,), DType.F16, 0))
    grads = [b.input(f"g{r}", TensorType((500_000_000,), DType.F16, r)) for r in (0, 1)]
    got = b.op("comm.sendrecv", [x], {"ranks": (0, 1)})
    summed = b.op("comm.allreduce", grads, {"ranks": (0, 1)})
    program = b.finish([got] + list(summed))
    spec = DeviceSpec(**device)
    for solo in (True, False):
        trace = simulate_function(program, topo, CostModel(spec), SimulationOptions(solo=solo))
        assert trace.step_time_s == pytest.approx(0.2, rel=1e-12)
        assert [r.end_s for r in trace.ops] == [pytest.approx(0.2, rel=1e-12)] * 4


SHARING = [
    # dp 2 x tp 2 on a PCIe tree: the two data-parallel teams' all-reduces
    # cross the same host links (not solo in the flow model)
    ("tiny", "workstation-4gpu-pcie", dict(dp=2, tp=2, microbatches=2, global_batch=4)),
    ("tiny", "dgx-a100-x2", dict(dp=2, tp=4, pp=2, zero=3)),
    ("mlp", "dgx-a100-x2", dict(dp=16, layers=2, hidden=512, batch=64)),
]


@pytest.mark.parametrize("model,topology,strategy", SHARING)
def test_analytical_collectives_all_run_alone_and_change_nothing(model, topology, strategy):
    """The analytical model shares nothing (a step takes its slowest flow's
    latency + bytes / bottleneck whatever else runs), so without link
    samples every collective takes the solo path, even where teams share
    links, and the step, op records and link totals are those of running
    each collective through the network."""
    program, _, topo = build_program(model, topology, **strategy)
    runs = {solo: simulate_function(program, topo, options=SimulationOptions(
        network_mode="analytical", solo=solo)) for solo in (False, True)}
    ref, fast = runs[False], runs[True]
    _assert_same(ref, fast)


def test_analytical_teams_sharing_links_take_the_solo_path():
    """On the PCIe workstation the data-parallel teams share links, so the
    flow model runs them through the network; the analytical one runs
    every collective alone (no events: the run has fewer of them)."""
    program, _, topo = build_program("tiny", "workstation-4gpu-pcie", dp=2, tp=2)
    sim_flow = Simulator(program, topo, options=SimulationOptions(network_mode="flow"))
    sim_flow._prepare()
    sim = Simulator(program, topo, options=SimulationOptions(network_mode="analytical"))
    sim._prepare()
    planned = [c for c in sim._collectives if c.plan is not None]
    assert planned and all(c.solo for c in planned)
    assert not all(c.solo for c in sim_flow._collectives if c.plan is not None)
