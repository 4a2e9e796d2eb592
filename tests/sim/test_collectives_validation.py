"""Every collective against its alpha-beta formula (HARDWARE.md) on an
uncontended switch, for p in {2, 4, 8, 64} and 1 KB .. 1 GB; contention
cases against what max-min sharing predicts. Expected values are the
formulas, written by hand."""
import math

import pytest

from distsim.ir.comm import CollectiveType as C
from distsim.sim.collective_algos.schedule import pipeline_chunks
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


# --------------------------------------------------------------------------
# Pipelined chain and tree broadcast / reduce. The message moves in c chunks
# of S/c, one hop per step; a step ends when its slowest flow is delivered.
# On the star every path is two hops (alpha = 2 us), and a step in which
# some rank sends (or receives) k flows at once takes alpha + k S/(cB)
# (max-min sharing of that rank's one link; the flows are equal).
# c is the pipeline depth the algorithm chooses (pipeline_chunks, pinned by
# hand in test_chunk_counts_by_hand).

def chain_time(p, S):
    """A chain of p-1 hops, c chunks: chunk j crosses hop i in step i+j, so
    c+p-2 steps, each with one flow per rank: (c+p-2)(alpha + S/(cB))."""
    c = pipeline_chunks(p, S, ALPHA, B)
    return (c + p - 2) * (ALPHA + S / (c * B))


def tree_time(p, S):
    """Heap tree over p ranks (children 2i+1, 2i+2), height H = floor(log2 p).
    Broadcast: the hop into depth d carries chunk j in step d-1+j: c+H-1
    steps. A parent sends to both its children in one step, so a step takes
    alpha + 2S/(cB), except where every active parent has one child: when p
    is a power of two the deepest level is a single rank, so the last step
    (only that hop active) takes alpha + S/(cB), and for p = 2 every step
    does. Reduce is the mirror image (the first step single).
    The algorithm picks c for the two-flow step: pipeline_chunks(H+1, S, alpha, B/2)."""
    H = int(math.log2(p))
    c = pipeline_chunks(H + 1, S, ALPHA, B / 2)
    single = 0
    if p & (p - 1) == 0:
        single = c if p == 2 else 1
    return (c + H - 1 - single) * (ALPHA + 2 * S / (c * B)) + single * (ALPHA + S / (c * B))


@pytest.mark.parametrize("p", PS)
@pytest.mark.parametrize("S", SIZES)
@pytest.mark.parametrize("kind", [C.BROADCAST, C.REDUCE])
def test_chain_broadcast_and_reduce_formula(p, S, kind):
    for root in (0, p - 1):
        t = benchmark_collective(kind, S, star(p), algorithm="ring", root=root)
        assert t["algorithm"] == "ring"
        assert t["time_s"] == pytest.approx(chain_time(p, S), rel=0.01)


@pytest.mark.parametrize("p", PS)
@pytest.mark.parametrize("S", SIZES)
@pytest.mark.parametrize("kind", [C.BROADCAST, C.REDUCE])
def test_tree_broadcast_and_reduce_formula(p, S, kind):
    t = benchmark_collective(kind, S, star(p), algorithm="tree")
    assert t["algorithm"] == "tree"
    assert t["time_s"] == pytest.approx(tree_time(p, S), rel=0.01)


@pytest.mark.parametrize("kind", [C.BROADCAST, C.REDUCE])
def test_tree_on_a_team_that_is_not_a_power_of_two(kind):
    # p = 6: H = 2 and the deepest level (positions 3..5) has a parent with
    # two children, so every one of the c+1 steps takes alpha + 2S/(cB)
    p, S = 6, 1e8
    c = pipeline_chunks(3, S, ALPHA, B / 2)
    assert c > 1
    t = benchmark_collective(kind, S, star(p), algorithm="tree")["time_s"]
    assert t == pytest.approx((c + 1) * (ALPHA + 2 * S / (c * B)), rel=0.01)


def test_chunk_counts_by_hand():
    """c minimises (c+h-1)(alpha + S/(cB)) for h hops: c = sqrt((h-1) S/(alpha B)),
    rounded, at most 1024 and S/64KiB chunks, 1 for a single hop."""
    # chain of 64: sqrt(62 * 1e9 / (2e-6 * 100e9)) = sqrt(310000) = 556.8
    assert pipeline_chunks(64, 1e9, ALPHA, B) == 557
    # 1 MB: sqrt(310) = 17.6, but chunks of >= 65536 bytes allow only 15
    assert pipeline_chunks(64, 1e6, ALPHA, B) == 15
    # tree of 64 (H = 6) at B/2: sqrt(5 * 1e9 / (2e-6 * 50e9)) = sqrt(50000) = 223.6
    assert pipeline_chunks(7, 1e9, ALPHA, B / 2) == 224
    assert pipeline_chunks(2, 1e9, ALPHA, B) == 1            # one hop: nothing to overlap
    assert pipeline_chunks(8, 1e3, ALPHA, B) == 1            # below one chunk


# --------------------------------------------------------------------------
# Double binary tree all-reduce (NCCL): two heap trees, the second over the
# team reversed, each carrying S/2 in c chunks. In tree t a rank at depth d
# sends its partial sum of chunk j to its parent in step H-d+j (reduce up),
# and receives chunk j from its parent in step H+d-1+j (broadcast down):
# c+2H-1 steps. A step takes alpha + L S/(2cB), where L is the most flows
# one rank sends or receives in it over both trees (its one link shared
# max-min by equal flows). L is counted here from that definition; the
# algorithm picks c as if L were 4 (an inner rank of one tree and a leaf
# of the other, mid-pipeline): pipeline_chunks(2H+1, S/2, alpha, B/4).

def double_tree_time(p, S):
    depth = lambda i: int(math.log2(i + 1))         # noqa: E731 - heap position depth
    H = depth(p - 1)
    c = pipeline_chunks(2 * H + 1, S / 2, ALPHA, B / 4)
    total = 0.0
    for step in range(c + 2 * H - 1):
        sends, recvs = [0] * p, [0] * p
        for order in (list(range(p)), list(range(p))[::-1]):
            for i in range(1, p):
                d, child, parent = depth(i), order[i], order[(i - 1) // 2]
                if 0 <= step - (H - d) < c:            # reduce: child -> parent
                    sends[child] += 1
                    recvs[parent] += 1
                if 0 <= step - (H + d - 1) < c:        # broadcast: parent -> child
                    sends[parent] += 1
                    recvs[child] += 1
        total += ALPHA + max(sends + recvs) * S / (2 * c * B)
    return total


@pytest.mark.parametrize("p", PS)
@pytest.mark.parametrize("S", SIZES)
def test_double_tree_allreduce_formula(p, S):
    t = benchmark_collective(C.ALL_REDUCE, S, star(p), algorithm="tree")
    assert t["algorithm"] == "tree"
    assert t["time_s"] == pytest.approx(double_tree_time(p, S), rel=0.01)


@pytest.mark.parametrize("p", [4, 8, 64])
def test_double_tree_small_messages_take_2_log2_p_steps(p):
    # 1 KB: the bandwidth term is negligible; a heap tree over p positions
    # has height H = floor(log2 p); a reduce up and a broadcast down: 2H alpha
    height = int(math.log2(p))
    assert time_of(star(p), C.ALL_REDUCE, 1e3, "tree") == pytest.approx(
        2 * height * ALPHA, rel=0.01)


def test_double_tree_large_messages_keep_ring_bandwidth():
    # mid-pipeline every rank sends and receives 4 flows of S/(2c): 2S/B in
    # all, the ring's 2(p-1)/p S/B up to 1/p, plus (c+2H-1) alpha
    p, S = 64, 1e9
    ring = 2 * (p - 1) / p * S / B
    assert ring <= time_of(star(p), C.ALL_REDUCE, S, "tree") <= 1.1 * ring


def test_auto_picks_tree_small_and_ring_large():
    t = star(64)
    assert benchmark_collective(C.ALL_REDUCE, 1e3, t)["algorithm"] == "tree"
    assert benchmark_collective(C.ALL_REDUCE, 1e9, t)["algorithm"] == "ring"


# --------------------------------------------------------------------------
# Hierarchical (two-level) collectives on DGX servers of g = 8 GPUs: inside
# a server a ring over the NVSwitch (300 GB/s, two 0.5 us hops: 1 us a
# step); between servers one ring per rail, all rails at once, each on its
# own NIC (25 GB/s; GPU -> NIC 0.5 us, NIC -> leaf 1 us, and back: 3 us a
# step). Up to 16 servers share a leaf per rail (nodes_per_leaf); past that
# the ring's hops between leaves cross the spine, 2 us more: 5 us a step.
# All-reduce: reduce-scatter S inside (g-1 steps of S/g), all-reduce S/g on
# each rail (2(n-1) steps of S/(gn)), all-gather S inside.
# All-gather: the rails first (n-1 steps of S/(gn)), then inside (g-1 of S/g);
# reduce-scatter the mirror image, same time.

NODES = [2, 4, 8, 16, 32]
G = 8


def dgx(n):
    return topology_from_dict({"device": DEVICE, "builder": "dgx", "params": {"nodes": n}},
                              "dgx.yaml")


def intra(S):
    return (G - 1) * (1e-6 + S / G / 300e9)


def rail(n, S, steps):
    alpha = 3e-6 if n <= 16 else 5e-6
    return steps * (alpha + S / G / n / 25e9)


@pytest.mark.parametrize("n", NODES)
@pytest.mark.parametrize("S", SIZES)
def test_hierarchical_formulas(n, S):
    topo = dgx(n)
    expect = {C.ALL_REDUCE: 2 * intra(S) + rail(n, S, 2 * (n - 1)),
              C.ALL_GATHER: intra(S) + rail(n, S, n - 1),
              C.REDUCE_SCATTER: intra(S) + rail(n, S, n - 1)}
    for kind, want in expect.items():
        t = benchmark_collective(kind, S, topo, algorithm="hierarchical")
        assert t["algorithm"] == "hierarchical" and t["ranks"] == G * n
        assert t["time_s"] == pytest.approx(want, rel=0.01), kind


def test_multi_server_ring_runs_one_ring_per_nic():
    # one ring per GPU of a server (NCCL's channels), each crossing to the
    # next server once on its own rail: a step sends S/p/G over every NIC
    # (the network) and the rest over NVLink, so the ring is NIC-bound at
    # G x 25 GB/s, a path of 3 us between servers on one leaf (0.5 + 1 + 1
    # + 0.5) and 5 us through the spine (from the last server back to the
    # first where G does not divide n: the rails differ; and past a leaf's 16
    # servers)
    for n in NODES:
        p, S = G * n, 1e9
        latency = 3e-6 if n % G == 0 and n <= 16 else 5e-6
        want = 2 * (p - 1) * (latency + S / p / (G * 25e9))
        t = benchmark_collective(C.ALL_REDUCE, S, dgx(n), algorithm="ring")["time_s"]
        assert t == pytest.approx(want, rel=1e-9), n


def test_hierarchical_choice_and_fallback():
    topo = dgx(4)
    # the NIC-bound rings beat the three phases one after another at 1 GB
    assert benchmark_collective(C.ALL_REDUCE, 1e9, topo)["algorithm"] == "ring"
    assert benchmark_collective(C.ALL_REDUCE, 1e6, topo)["algorithm"] == "hierarchical"
    # inside one node it does not apply and falls back to the ring
    assert benchmark_collective(C.ALL_REDUCE, 1e9, topo, ranks=range(8),
                                algorithm="hierarchical")["algorithm"] == "ring"
