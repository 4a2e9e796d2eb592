"""Every collective against its alpha-beta formula (HARDWARE.md) on an
uncontended switch, for p in {2, 4, 8, 64} and 1 KB .. 1 GB; contention
cases against what max-min sharing predicts. Expected values are the
formulas, written by hand."""
import math

import pytest

from distsim.ir.comm import CollectiveType as C
from distsim.sim.collective_bench import benchmark_collective
from distsim.topology import topology_from_dict

DEVICE = {"name": "toy", "peak_flops": {"f32": 1e12}, "memory_bandwidth_Bps": 1e12,
          "memory_bytes": 1e9}
B = 100e9
ALPHA = 2e-6          # two 1 us hops through the switch
SIZES = [1e3, 1e6, 1e9]
PS = [2, 4, 8, 64]


def star(p, per_node=0):
    return topology_from_dict({"device": DEVICE, "builder": "star",
                               "params": {"devices": p, "link_GBps": B / 1e9, "latency_us": 1,
                                          "devices_per_node": per_node}}, f"star{p}.yaml")


def time_of(topo, kind, S, algo, **kw):
    return benchmark_collective(kind, S, topo, algorithm=algo, **kw)["time_s"]


@pytest.mark.parametrize("p", PS)
@pytest.mark.parametrize("S", SIZES)
def test_ring_family(p, S):
    t = star(p)
    assert time_of(t, C.ALL_REDUCE, S, "ring") == pytest.approx(
        2 * (p - 1) * ALPHA + 2 * (p - 1) / p * S / B, rel=0.01)
    for kind in (C.ALL_GATHER, C.REDUCE_SCATTER):
        assert time_of(t, kind, S, "ring") == pytest.approx(
            (p - 1) * ALPHA + (p - 1) / p * S / B, rel=0.01)
    assert time_of(t, C.ALL_TO_ALL, S, "direct") == pytest.approx(
        (p - 1) * ALPHA + (p - 1) / p * S / B, rel=0.01)


@pytest.mark.parametrize("p", PS)
@pytest.mark.parametrize("S", SIZES)
def test_rooted_and_point_to_point(p, S):
    t = star(p)
    for kind in (C.GATHER, C.SCATTER):        # all blocks cross the root's link at once
        assert time_of(t, kind, S, "direct") == pytest.approx(ALPHA + (p - 1) / p * S / B,
                                                              rel=0.01)
    assert time_of(t, C.SEND_RECV, S, "direct") == pytest.approx(ALPHA + S / B, rel=0.01)
    # pipelined chain: between S/B + (p-1) alpha and its chunked optimum
    lo = S / B + (p - 1) * ALPHA
    hi = (math.sqrt(S / B) + math.sqrt(max(p - 2, 0) * ALPHA)) ** 2 + ALPHA
    for kind in (C.BROADCAST, C.REDUCE):
        assert lo * 0.99 <= time_of(t, kind, S, "ring") <= hi * 1.01


@pytest.mark.parametrize("p", [4, 8, 64])
def test_double_tree_small_messages_take_2_log2_p_steps(p):
    # 1 KB: the bandwidth term is negligible; a heap tree over p positions
    # has height H = floor(log2 p); a reduce up and a broadcast down: 2H alpha
    height = int(math.log2(p))
    assert time_of(star(p), C.ALL_REDUCE, 1e3, "tree") == pytest.approx(
        2 * height * ALPHA, rel=0.01)


def test_double_tree_large_messages_keep_ring_bandwidth():
    p, S = 64, 1e9
    ring = 2 * (p - 1) / p * S / B
    assert ring <= time_of(star(p), C.ALL_REDUCE, S, "tree") <= 1.1 * ring


def test_auto_picks_tree_small_and_ring_large():
    t = star(64)
    assert benchmark_collective(C.ALL_REDUCE, 1e3, t)["algorithm"] == "tree"
    assert benchmark_collective(C.ALL_REDUCE, 1e9, t)["algorithm"] == "ring"


def test_hierarchical_allreduce_formula():
    # 4 servers x 8 GPUs on the dgx builder: NVSwitch 300 GB/s, 1 us per
    # NVLink step; rails over NICs at 25 GB/s, 3 us per step (0.5 + 1 + 1 + 0.5)
    topo = topology_from_dict({"device": DEVICE, "builder": "dgx",
                               "params": {"nodes": 4}}, "dgx.yaml")
    S, g, n = 1e9, 8, 4
    intra = (g - 1) * (1e-6 + S / g / 300e9)
    inter = 2 * (n - 1) * (3e-6 + S / g / n / 25e9)
    t = benchmark_collective(C.ALL_REDUCE, S, topo, algorithm="hierarchical")
    assert t["algorithm"] == "hierarchical"
    assert t["time_s"] == pytest.approx(2 * intra + inter, rel=0.01)
    assert benchmark_collective(C.ALL_REDUCE, S, topo)["algorithm"] == "hierarchical"
    # inside one node it does not apply and falls back to the ring
    assert benchmark_collective(C.ALL_REDUCE, S, topo, ranks=range(8),
                                algorithm="hierarchical")["algorithm"] == "ring"


def test_hierarchical_allgather_formula():
    topo = topology_from_dict({"device": DEVICE, "builder": "dgx",
                               "params": {"nodes": 2}}, "dgx.yaml")
    S, g, n = 1e9, 8, 2
    expect = (n - 1) * (3e-6 + S / g / n / 25e9) + (g - 1) * (1e-6 + S / g / 300e9)
    for kind in (C.ALL_GATHER, C.REDUCE_SCATTER):
        t = benchmark_collective(kind, S, topo, algorithm="hierarchical")["time_s"]
        assert t == pytest.approx(expect, rel=0.01)
