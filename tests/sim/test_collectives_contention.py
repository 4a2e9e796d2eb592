"""Concurrent collectives share links by max-min fairness."""
import pytest
import simpy

from distsim.ir.comm import CollectiveType as C
from distsim.sim.collectives import run_collective
from distsim.sim.network import Network
from distsim.topology import load_topology, topology_from_dict

DEVICE = {"name": "toy", "peak_flops": {"f32": 1e12}, "memory_bandwidth_Bps": 1e12,
          "memory_bytes": 1e9}


def run_together(topo, jobs):
    """jobs: (kind, ranks, nbytes, algorithm); returns each one's end time."""
    env = simpy.Environment()
    net = Network(env, topo)
    ends = [None] * len(jobs)

    def one(i, kind, ranks, nbytes, algo):
        yield env.process(run_collective(env, net, kind, tuple(ranks), nbytes, algorithm=algo))
        ends[i] = env.now

    for i, job in enumerate(jobs):
        env.process(one(i, *job))
    env.run()
    return ends


def test_disjoint_halves_of_a_node_do_not_slow_each_other():
    topo = load_topology("dgx-a100")
    alone = run_together(topo, [(C.ALL_REDUCE, range(4), 1e9, "ring")])[0]
    both = run_together(topo, [(C.ALL_REDUCE, range(4), 1e9, "ring"),
                               (C.ALL_REDUCE, range(4, 8), 1e9, "ring")])
    assert both == [pytest.approx(alone, rel=1e-9)] * 2
    # and alone it is the ring formula under NCCL's Simple protocol
    # (topologies/dgx-a100.yaml): 4 ranks, 1 us a path and 1.0 us a step,
    # 8.4 us once, 235 GB/s (adding GPUs), 200 us for the pipeline to fill
    sent = 1.5 * 1e9
    assert alone == pytest.approx(8.4e-6 + 200e-6 + 6 * 2.0e-6 + sent / 235e9,
                                  rel=1e-6)


def test_two_allreduces_sharing_nics_split_the_bandwidth():
    # two 2-rank rings across two servers on the same rail (GPU 0 and GPU 8,
    # and GPU 0 and GPU 8 again): both cross nic0 <-> leaf0.0 <-> nic8 at
    # 25 GB/s, of which NCCL reaches 96 % (topologies/dgx-a100.yaml); max-min
    # gives each half, so the bandwidth term doubles. The protocol's waits
    # (8.4 us once, 200 us for the pipeline to fill, 14 us a step over the
    # network) do not hold the links.
    topo = load_topology("dgx-a100-x2")
    S = 1e9
    alone = run_together(topo, [(C.ALL_REDUCE, (0, 8), S, "ring")])[0]
    rate = 0.96 * 25e9
    # 2(p-1) = 2 steps, 3 us a path (0.5 + 1 + 1 + 0.5)
    waits = 8.4e-6 + 200e-6 + 2 * (3e-6 + 14e-6)
    assert alone == pytest.approx(waits + 2 * (S / 2) / rate, rel=1e-6)
    shared = run_together(topo, [(C.ALL_REDUCE, (0, 8), S, "ring"),
                                 (C.ALL_REDUCE, (8, 0), S, "ring")])
    assert shared == [pytest.approx(waits + 2 * (S / 2) / (rate / 2), rel=1e-6)] * 2


def _cross_rack_time(oversubscription):
    """Servers 0,1 on leaf 0 and 2,3 on leaf 1 (single-NIC servers); each
    server in rack 0 sends 1 GB to its peer in rack 1."""
    topo = topology_from_dict({"device": DEVICE, "builder": "dgx", "params": {
        "nodes": 4, "gpus_per_node": 1, "nics_per_node": 1, "nodes_per_leaf": 2,
        "network": "fat-tree", "oversubscription": oversubscription,
        "network_latency_us": 0, "pcie_latency_us": 0}}, "ft.yaml")
    return run_together(topo, [(C.SEND_RECV, (0, 2), 1e9, "direct"),
                               (C.SEND_RECV, (1, 3), 1e9, "direct")])


def test_oversubscribed_fat_tree_slows_cross_rack_traffic_by_its_ratio():
    full = _cross_rack_time(1.0)
    tapered = _cross_rack_time(2.0)
    assert full == [pytest.approx(1e9 / 25e9)] * 2          # NIC-bound
    assert tapered == [pytest.approx(2 * 1e9 / 25e9)] * 2   # uplink 2 x 25 / 2


def test_ecmp_spreads_flows_over_spines_deterministically():
    params = {"nodes": 4, "nodes_per_leaf": 2, "spines": 4}
    topo = topology_from_dict({"device": DEVICE, "builder": "dgx", "params": params}, "e.yaml")
    spines = {next(b for a, b in topo.route(0, 16, key=k) if b.startswith("spine"))
              for k in range(32)}
    assert len(spines) > 1
    again = topology_from_dict({"device": DEVICE, "builder": "dgx", "params": params}, "e.yaml")
    assert [topo.route(0, 16, key=k) for k in range(8)] == \
           [again.route(0, 16, key=k) for k in range(8)]
