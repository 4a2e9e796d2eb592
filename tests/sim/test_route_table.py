"""Networks over one topology share its routes (RouteTable), and an
analytical step is routed once per flow pattern, whatever its size: the
same numbers as routing every flow of every step again."""
import pytest
import simpy

from distsim.ir.comm import CollectiveType as C
from distsim.sim.network import Network
from distsim.topology import Topology, load_topology, topology_from_dict

GB = 1e9
DEVICE = {"name": "toy", "peak_flops": {"f32": 1e12}, "memory_bandwidth_Bps": 1e12,
          "memory_bytes": 1e9}


def _line():
    """gpu0 -> gpu1 at 10 GB/s with 2 us, gpu1 -> gpu2 at 5 GB/s with 3 us."""
    return topology_from_dict({"device": DEVICE, "devices": {"count": 3}, "links": [
        {"src": "gpu0", "dst": "gpu1", "bandwidth_GBps": 10, "latency_us": 2},
        {"src": "gpu1", "dst": "gpu2", "bandwidth_GBps": 5, "latency_us": 3}]}, "line.yaml")


def _fresh(topo):
    return Topology(topo.name, topo.graph.copy(), topo.device_spec)


def test_networks_over_one_topology_share_routes_not_traffic():
    topo = _fresh(load_topology("dgx-a100-x2"))
    a = Network(simpy.Environment(), topo)
    b = Network(simpy.Environment(), topo, mode="analytical")
    assert a.route_info(0, 9) is b.route_info(0, 9)
    assert Network(simpy.Environment(), _fresh(topo)).route_info(0, 9) is not a.route_info(0, 9)
    env = b.env
    env.process((lambda: (yield b.transfer(0, 9, GB)))())
    env.run()
    assert b.link_records() and not a.link_records()


def _collective_time(topo, kind, ranks, nbytes, **kw):
    from distsim.sim.collectives import run_collective
    env = simpy.Environment()
    net = Network(env, topo, mode="analytical", **kw)
    env.process(run_collective(env, net, kind, ranks, nbytes))
    env.run()
    return env.now, net


@pytest.mark.parametrize("kind", [C.ALL_REDUCE, C.ALL_GATHER, C.REDUCE_SCATTER, C.SEND_RECV])
def test_analytical_steps_without_link_totals_take_the_same_time(kind):
    topo = _fresh(load_topology("dgx-a100-x4"))
    ranks = (3, 17) if kind is C.SEND_RECV else tuple(topo.ranks)
    for nbytes in (1e3, 5e6, 3.3e9):
        with_stats, net = _collective_time(topo, kind, ranks, nbytes)
        without, bare = _collective_time(topo, kind, ranks, nbytes, link_stats=False)
        assert without == with_stats and with_stats > 0
        assert net.link_records() and not bare.link_records()


def test_analytical_step_by_hand_and_bad_ranks():
    net = Network(simpy.Environment(), _line(), mode="analytical", link_stats=False)
    # the slowest flow: 1 GB over 0 -> 2 at a 5 GB/s bottleneck, plus 5 us
    assert net.analytical_step_s([(0, 2, GB), (0, 1, GB)]) == 5e-6 + GB / 5e9
    assert net.analytical_step_s([(0, 1, 4 * GB), (0, 2, GB)]) == 2e-6 + 4 * GB / 10e9
    from distsim.errors import TopologyError
    with pytest.raises(TopologyError, match="no device rank 7"):
        net.analytical_step_s([(0, 7, GB)])
