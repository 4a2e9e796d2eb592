"""NCCL's protocols (distsim.sim.protocols) by hand: the times below are
written from the model's formulas on small topologies whose figures are
round numbers, in both network modes."""
from __future__ import annotations

import pytest
import simpy

from distsim.errors import ConfigError, TopologyError
from distsim.ir.comm import CollectiveType as C
from distsim.sim.collective_algos import Phase
from distsim.sim.collective_algos.ring import ring_allreduce
from distsim.sim.collective_bench import benchmark_collective
from distsim.sim.network import Network
from distsim.sim.protocols import with_protocol
from distsim.topology import topology_from_dict

DEVICE = {"name": "toy", "peak_flops": {"f32": 1e12}, "memory_bandwidth_Bps": 1e12,
          "memory_bytes": 1e9}
MB = 1e6

#: 100 GB/s NVLink of which NCCL reaches 80 %; Simple (10 us once, 3 us a
#: step, the pipeline's fill: the time a GPU takes to send its bytes, up to
#: 100 us) and LL (half the wire, 5 us once, 0.5 us a step); NVLS at half the
#: links' rate, 20 us once, 4 us a step, up to 250 us of fill
COLLECTIVES = {
    "link_efficiency": {"nvlink": 0.8},
    "protocols": {
        "simple": {"efficiency": 1.0, "base_latency_us": 10, "hop_latency_us": {"nvlink": 3},
                   "pipeline_us": 100},
        "ll": {"efficiency": 0.5, "base_latency_us": 5, "hop_latency_us": {"nvlink": 0.5}}},
    "nvls": {"efficiency": 0.5, "base_latency_us": 20, "hop_latency_us": {"nvlink": 4},
             "pipeline_us": 250},
}


def switch8(collectives=COLLECTIVES):
    """8 GPUs on one switch, 100 GB/s and 1 us each way (2 us a path)."""
    return topology_from_dict({
        "device": DEVICE, "devices": {"count": 8}, "switches": ["sw"],
        "links": [{"src": "gpu{0..7}", "dst": "sw", "bandwidth_GBps": 100, "latency_us": 1,
                   "transport": "nvlink"}],
        "collectives": collectives}, "switch8.yaml")


def run(kind, nbytes, topo, algorithm="auto", mode="flow"):
    out = benchmark_collective(kind, nbytes, topo, algorithm=algorithm, mode=mode)
    return out["time_s"], out["protocol"]


# Ring all-reduce of S over 8 ranks: each rank sends 1.75 S in 14 steps of
# S/8, each step 2 us of path latency.
#   Simple: 80 GB/s; 10 + 14 (2 + 3) = 80 us, + min(1.75 S / 80 GB/s, 100 us)
#           once (the pipeline's fill), + 1.75 S / 80 GB/s
#   LL:     40 GB/s;  5 + 14 (2 + 0.5) = 40 us, + 1.75 S / 40 GB/s
# Until the fill reaches 100 us (1.75 S = 8 MB) it doubles Simple's transfer
# term, so LL is faster by 40 us; past it the two meet at
# 140 us = 1.75 S / 80 GB/s, S = 6.4 MB.


@pytest.mark.parametrize("mode", ["flow", "analytical"])
def test_ring_allreduce_switches_protocol_at_the_crossover(mode):
    topo = switch8()
    t, proto = run(C.ALL_REDUCE, 4 * MB, topo, "ring", mode)
    assert proto == "LL" and t == pytest.approx(40e-6 + 7e6 / 40e9, rel=1e-9)     # 215 us
    # Simple would take 80 + 87.5 + 87.5 = 255 us
    t, proto = run(C.ALL_REDUCE, 16 * MB, topo, "ring", mode)
    assert proto == "Simple" and t == pytest.approx(180e-6 + 28e6 / 80e9, rel=1e-9)  # 530 us
    # LL would take 40 + 700 = 740 us; either side of 6.4 MB the other one
    assert run(C.ALL_REDUCE, 6.3 * MB, topo, "ring", mode)[1] == "LL"
    assert run(C.ALL_REDUCE, 6.5 * MB, topo, "ring", mode)[1] == "Simple"


def test_a_small_message_is_latency_bound():
    # 8 bytes under LL: 5 us once and 14 steps of 2.5 us; the bytes add
    # 14 x 1 B / 40 GB/s = 0.35 ns
    t, proto = run(C.ALL_REDUCE, 8, switch8(), "ring")
    assert proto == "LL" and t == pytest.approx(40e-6 + 14 / 40e9, rel=1e-12)


def test_nvls_allreduce_formula():
    # each GPU's link carries S (1 + 1/p) = 72 MB each way at 100 x 0.8 x
    # 0.5 = 40 GB/s: 20 us once, the fill (1800 us, up to 250), one step of
    # 2 + 4 us, and 72 MB / 40 GB/s = 1800 us: 2076 us
    for mode in ("flow", "analytical"):
        t, proto = run(C.ALL_REDUCE, 64 * MB, switch8(), "nvls", mode)
        assert proto == "NVLS" and t == pytest.approx(2076e-6, rel=1e-9)


def test_nvls_needs_its_figures_and_one_server():
    no_nvls = {k: v for k, v in COLLECTIVES.items() if k != "nvls"}
    out = benchmark_collective(C.ALL_REDUCE, 64 * MB, switch8(no_nvls), algorithm="nvls")
    assert out["algorithm"] == "ring"             # falls back to the kind's first
    two = topology_from_dict({"device": DEVICE, "builder": "dgx",
                              "params": {"nodes": 2}, "collectives": COLLECTIVES}, "x2.yaml")
    out = benchmark_collective(C.ALL_REDUCE, 64 * MB, two, algorithm="nvls")
    assert out["algorithm"] == "ring"


def test_adding_ranks_are_held_to_the_reduce_cap():
    # reduce_busbw 60 GB/s: an all-reduce's ranks send at 60, an all-gather's
    # (no adding) at the links' 80; the all-gather: 7 steps of S/8, each rank
    # sending 0.875 S. At 64 MB both fill for the full 100 us.
    topo = switch8({**COLLECTIVES, "reduce_busbw_GBps": 60})
    S = 64 * MB
    t, _ = run(C.ALL_REDUCE, S, topo, "ring")
    assert t == pytest.approx(80e-6 + 100e-6 + 1.75 * S / 60e9, rel=1e-9)
    t, _ = run(C.ALL_GATHER, S, topo, "ring")
    assert t == pytest.approx(10e-6 + 7 * 5e-6 + 100e-6 + 0.875 * S / 80e9, rel=1e-9)


def test_a_rank_crossing_two_kinds_of_link_waits_their_mean():
    # rank 0 sends 3 MB over NVLink (1 us of path, 1 us a step) and 1 MB over
    # the network (3 us of path, 10 us a step): the step's latency is
    # 3/4 x 2 + 1/4 x 13 = 4.75 us, as NCCL counts a ring's intra- and
    # inter-server steps; wire bytes are each flow's over its efficiency
    topo = topology_from_dict({
        "device": DEVICE, "devices": {"count": 3, "per_node": 2}, "switches": ["nvs", "ib"],
        "links": [{"src": "gpu{0..1}", "dst": "nvs", "bandwidth_GBps": 100, "latency_us": 0.5,
                   "transport": "nvlink"},
                  {"src": ["gpu0", "gpu2"], "dst": "ib", "bandwidth_GBps": 10,
                   "latency_us": 1.5, "transport": "network"}],
        "collectives": {"link_efficiency": {"nvlink": 0.5, "network": 0.8},
                        "protocols": {"simple": {"hop_latency_us": {"nvlink": 1,
                                                                    "network": 10}}}}},
        "two.yaml")
    net = Network(simpy.Environment(), topo)
    (phase,) = with_protocol(net, C.ALL_GATHER, [Phase(((0, 1, 3 * MB), (0, 2, MB)), 1)],
                             topo.collectives.protocols[0])
    assert phase.latency_s == pytest.approx(4.75e-6)
    assert [f[2] for f in phase.flows] == pytest.approx([6 * MB, 1.25 * MB])


def test_without_a_collectives_block_links_run_at_their_rate():
    topo = switch8(None)
    t, proto = run(C.ALL_REDUCE, 16 * MB, topo, "ring")
    assert proto is None and t == pytest.approx(14 * (2e-6 + 2e6 / 100e9), rel=1e-12)


def test_a_multi_server_ring_sends_one_eighth_over_each_nic():
    topo = topology_from_dict({"device": DEVICE, "builder": "dgx", "params": {"nodes": 2}},
                              "x2.yaml")
    net = Network(simpy.Environment(), topo)
    (phase,) = ring_allreduce(tuple(range(16)), 16e6, None, net)
    assert phase.count == 30
    sent = {}
    for src, dst, nbytes in phase.flows:
        sent.setdefault(src, []).append((dst, nbytes))
    # local rank k of each server: 7/8 of its S/16 to k+1 on its server,
    # 1/8 to rank k of the other server (over NIC k)
    assert sent[3] == [(4, 0.875e6), (11, 0.125e6)]
    # from the last server back to the first: local k + n (7 + 2 = 9, so 1)
    assert sent[15] == [(8, 0.875e6), (1, 0.125e6)]
    assert len(phase.flows) == 32


@pytest.mark.parametrize("block, message", [
    ({"protocols": {}}, r"collectives.protocols: give at least one of"),
    ({"protocols": {"simple": {"efficiency": 1.5}}},
     r"collectives.protocols.simple.efficiency: must be a finite number in \(0, 1\], got 1.5"),
    ({"protocols": {"simpel": {}}}, r"collectives.protocols.simpel: unknown field"),
    ({"protocols": {"ll": {"hop_latency_us": {"nvlink": -1}}}},
     r"collectives.protocols.ll.hop_latency_us.nvlink: must be a finite number >= 0, got -1"),
    ({"protocols": {"ll": {"hop_latency_us": {"infiniband": 1}}}},
     r"collectives.protocols.ll.hop_latency_us.infiniband: unknown field"),
    ({"protocols": {"ll": {}}, "link_efficiency": {"nvlink": 0}},
     r"collectives.link_efficiency.nvlink: must be a finite number in \(0, 1\], got 0"),
    ({"protocols": {"ll": {}}, "reduce_busbw_GBps": "fast"},
     r"collectives.reduce_busbw_GBps: must be a finite number > 0, got 'fast'"),
    ({"protocol": {}}, r"collectives.protocol: unknown field"),
])
def test_bad_collectives_blocks_are_one_line_errors(block, message):
    with pytest.raises(ConfigError, match=message):
        switch8(block)


def test_a_link_of_an_unknown_kind_is_refused():
    with pytest.raises(ConfigError, match=r"links\[0\].transport: must be one of nvlink, pcie, "
                                          r"network, got 'ib'"):
        topology_from_dict({"device": DEVICE, "devices": {"count": 2},
                            "links": [{"src": "gpu0", "dst": "gpu1", "bandwidth_GBps": 1,
                                       "latency_us": 1, "transport": "ib"}]}, "t.yaml")
    import networkx as nx

    from distsim.topology import Topology
    from distsim.cost.device import device_spec_from_dict
    g = nx.DiGraph()
    for r in range(2):
        g.add_node(f"gpu{r}", kind="device", rank=r)
    g.add_edge("gpu0", "gpu1", bandwidth_Bps=1e9, latency_s=0.0, transport="ib")
    g.add_edge("gpu1", "gpu0", bandwidth_Bps=1e9, latency_s=0.0)
    with pytest.raises(TopologyError, match="transport must be one of"):
        Topology("t", g, device_spec_from_dict(DEVICE, "d"))
