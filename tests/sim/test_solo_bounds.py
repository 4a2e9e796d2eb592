"""The bounds auto uses to skip simulating algorithms that cannot be
fastest bracket the flow model's time alone: by hand on a line of two
links, and against the simulation for every kind and algorithm on three
topologies."""
from __future__ import annotations


import math

import pytest
import simpy

from distsim.ir.comm import CollectiveType as C
from distsim.sim.collective_algos import ALGORITHMS, Phase
from distsim.sim.collectives import ROOTED, planned_schedule
from distsim.sim.network import Network
from distsim.sim.solo_bounds import _unequal_bounds, can_beat, schedule_bounds, step_load
from distsim.sim.solo_time import collective_time
from distsim.topology import load_topology, topology_from_dict

GB = 1e9
DEVICE = {"name": "toy", "peak_flops": {"f32": 1e12}, "memory_bandwidth_Bps": 1e12,
          "memory_bytes": 1e9}


def _line(second_GBps):
    """gpu0 -> gpu1 at 10 GB/s with 2 us, gpu1 -> gpu2 with 3 us."""
    return topology_from_dict({"device": DEVICE, "devices": {"count": 3}, "links": [
        {"src": "gpu0", "dst": "gpu1", "bandwidth_GBps": 10, "latency_us": 2},
        {"src": "gpu1", "dst": "gpu2", "bandwidth_GBps": second_GBps, "latency_us": 3}]},
        "line.yaml")


def _flow_step(topo, flows):
    env = simpy.Environment()
    net = Network(env, topo)
    env.process(net.run_steps(flows, 1))
    env.run()
    return env.now


def test_bounds_of_one_step_by_hand():
    topo = _line(20)
    net = Network(simpy.Environment(), topo, mode="analytical")
    # 0 -> 1 and 0 -> 2 share the first link (10 GB/s): 5 GB/s each, 0.2 s;
    # 0 -> 2 then has 5 us of latency, 0 -> 1 only 2 us
    flows = ((0, 1, GB), (0, 2, GB))
    lower, upper, steps = schedule_bounds(net, [Phase(flows, 1)])
    assert steps == 1
    # lower: the first link's 2 GB at 10 GB/s, then the smaller latency of its flows
    assert lower == pytest.approx(0.2 + 2e-6, rel=1e-12)
    # upper: 0 -> 2's latency and its most loaded link (2 flows over 10 GB/s)
    assert upper == pytest.approx(0.2 + 5e-6, rel=1e-12)
    assert _flow_step(topo, flows) == pytest.approx(0.2 + 5e-6, rel=1e-12)
    # twice the step: twice the bounds
    assert schedule_bounds(net, [Phase(flows, 2)])[:2] == pytest.approx((2 * lower, 2 * upper))


def test_a_step_limited_by_its_route_alone_and_unequal_flows():
    topo = _line(5)
    net = Network(simpy.Environment(), topo, mode="analytical")
    # one flow 0 -> 2: the 5 GB/s link, 5 us
    lower, upper, _ = schedule_bounds(net, [Phase(((0, 2, GB),), 1)])
    assert lower == pytest.approx(0.2 + 5e-6) and upper == pytest.approx(0.2 + 5e-6)
    # unequal flows, bounded flow by flow: the lower is the slowest route
    # alone (4 GB at 5 GB/s) and the links' loads (5 GB over 10 GB/s); the
    # upper gives each flow its route's worst fair share (1 of 2 flows on
    # the 10 GB/s link, 1 on the 5 GB/s one): 0 -> 1 by 0.2 s, 0 -> 2 by
    # 0.8 s, each plus its latency. The simulation takes 0.8 s + 5 us.
    flows = ((0, 1, GB), (0, 2, 4 * GB))
    lower, upper, _ = schedule_bounds(net, [Phase(flows, 1)])
    assert lower == pytest.approx(4 * GB / 5e9 + 5e-6)
    assert upper == pytest.approx(4 * GB / 5e9 + 5e-6)
    assert _flow_step(topo, flows) == pytest.approx(upper)
    # a step's own latency stands in for the flows' path latencies
    lower, upper, _ = schedule_bounds(net, [Phase(flows, 1, 1e-3)])
    assert (lower, upper) == pytest.approx((0.8 + 1e-3, 0.8 + 1e-3))
    # a flow to itself costs nothing
    assert schedule_bounds(net, [Phase(((1, 1, GB),), 3)]) == (0.0, 0.0, 3)


def test_step_load_counts_flows_per_link():
    net = Network(simpy.Environment(), _line(5), mode="analytical")
    per_link, per_flow, paths = step_load(((0, 1), (0, 2), (0, 2)), net)
    # first link: 3 flows over 10 GB/s, smallest latency 2 us; second: 2 over 5 GB/s, 5 us
    assert _flat(per_link) == pytest.approx([3 / 10e9, 2e-6, 2 / 5e9, 5e-6], rel=1e-12)
    # each flow: its latency, the most loaded link of its route (0 -> 2: the second)
    assert _flat(per_flow) == pytest.approx([2e-6, 3 / 10e9, 5e-6, 2 / 5e9], rel=1e-12)
    assert _flat(paths) == pytest.approx([2e-6, 10e9, 5e-6, 5e9], rel=1e-12)


def _flat(pairs):
    return [x for pair in sorted(pairs) for x in pair]


def test_can_beat_allows_only_the_clocks_rounding():
    assert can_beat(1.0, 10, 1.0) and can_beat(1.0 + 1e-10, 10, 1.0)
    assert not can_beat(1.0 + 1e-6, 10, 1.0)
    # many steps of a tiny collective: the network finishes flows due within
    # 1e-12 s of each other together, so a lower bound may be off by that per step
    assert can_beat(2e-5 + 5e-10, 1000, 2e-5) and not can_beat(2e-5 + 5e-9, 1000, 2e-5)


TEAMS = {"dgx-a100": [(0, 1), (7, 2, 5, 0), tuple(range(8))],
         "dgx-a100-x4": [(0, 9), (0, 8, 16, 24), tuple(range(0, 32, 4)), tuple(range(32))],
         "torus-4x4": [(0, 5, 10, 15), tuple(range(16))]}


@pytest.mark.parametrize("name", sorted(TEAMS))
def test_every_algorithms_flow_time_alone_is_within_its_bounds(name):
    topo = load_topology(name)
    net = Network(simpy.Environment(), topo, mode="analytical", link_stats=False)
    tight = 0
    for kind, table in ALGORITHMS.items():
        for team in TEAMS[name]:
            team = team[:2] if kind is C.SEND_RECV else team
            root = team[0] if kind is C.SEND_RECV else (team[-1] if kind in ROOTED else None)
            for nbytes in (1e3, 3.3e6, 1e9):
                for algorithm in table:
                    used, schedule = planned_schedule(net, kind, team, nbytes, root, algorithm)
                    lower, upper, steps = schedule_bounds(net, schedule)
                    t = collective_time(topo, "flow", kind, team, nbytes, root, algorithm)[0]
                    assert lower * (1 - 1e-9) - 2e-12 * steps <= t <= upper * (1 + 1e-9), \
                        (kind, team, nbytes, used, lower, t, upper)
                    tight += upper <= lower * (1 + 1e-3)
    assert tight > 20


def _unequal_bounds_by_loop(net, flows, latency):
    """The bounds of a step of unequal flows as one loop over its flows (the
    module docstring's sums, one flow after the other)."""
    carried, least = {}, {}
    low = high = 0.0
    routes = [net.route(s, d) if s != d else None for s, d, _ in flows]
    count = {}
    for r in routes:
        for i in r[0] if r is not None else ():
            count[i] = count.get(i, 0) + 1
    for r, (_, _, nbytes) in zip(routes, flows):
        if r is None:
            continue
        links, lat, bottleneck = r
        lat = lat if latency is None else latency
        low = max(low, lat + nbytes / bottleneck)
        high = max(high, lat + nbytes * max(count[i] / net.link_capacity(i) for i in links))
        for i in links:
            carried[i] = carried.get(i, 0.0) + nbytes
            least[i] = min(least.get(i, math.inf), lat)
    for i, nbytes in carried.items():
        low = max(low, nbytes / net.link_capacity(i) + least[i])
    return low, high


def test_unequal_steps_bounds_equal_a_loop_over_their_flows():
    """The bounds of steps of unequal flows (trees and hierarchies under
    NCCL's protocols, whose wire bytes differ by link) are made with numpy
    over arrays kept per step: the same floats as the loop."""
    topo = load_topology("dgx-a100-x4")
    net = Network(simpy.Environment(), topo, mode="analytical", link_stats=False)
    n = topo.num_devices
    checked = 0
    for kind in (C.ALL_REDUCE, C.REDUCE_SCATTER, C.ALL_GATHER, C.BROADCAST):
        for team in (tuple(range(n)), tuple(range(0, n, 2)), (3, 0, 6, 1)[:n]):
            root = team[-1] if kind in ROOTED else None
            for nbytes in (7e3, 3.3e6, 1e9):
                for algorithm in ALGORITHMS[kind]:
                    _, schedule = planned_schedule(net, kind, team, nbytes, root, algorithm)
                    for flows, count, latency in schedule:
                        if len({b for _, _, b in flows}) < 2:
                            continue
                        for lat in (latency, 3e-6):
                            assert _unequal_bounds(net, flows, lat) == \
                                _unequal_bounds_by_loop(net, flows, lat)
                            checked += 1
    # a step with a flow to itself among them
    flows = ((0, 1, 5e6), (2, 2, 1e9), (1, 3, 2e6))
    assert _unequal_bounds(net, flows, None) == _unequal_bounds_by_loop(net, flows, None)
    assert checked > 50
