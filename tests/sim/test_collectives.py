"""Collective times against the alpha-beta formulas of HARDWARE.md, on an
uncontended single switch (expected values from the formulas, by hand)."""
import pytest
import simpy

from distsim.errors import ConfigError, TopologyError
from distsim.ir.comm import CollectiveType as C
from distsim.sim.collective_algos.schedule import pipeline_chunks
from distsim.sim.collectives import bytes_sent_per_rank, run_collective
from distsim.sim.network import Network
from distsim.topology import load_topology, topology_from_dict

DEVICE = {"name": "toy", "peak_flops": {"f32": 1e12}, "memory_bandwidth_Bps": 1e12,
          "memory_bytes": 1e9}
B = 100e9           # bytes/s per link per direction
LINK_LAT = 1e-6     # per hop; a step gpu -> switch -> gpu costs alpha = 2 us
ALPHA = 2 * LINK_LAT


def star(p):
    return topology_from_dict({"device": DEVICE, "builder": "star",
                               "params": {"devices": p, "link_GBps": B / 1e9,
                                          "latency_us": LINK_LAT * 1e6}}, "star.yaml")


def simulate(topology, kind, nbytes, ranks=None, root=None, algorithm="auto", mode="flow"):
    env = simpy.Environment()
    net = Network(env, topology, mode=mode)
    ranks = tuple(ranks if ranks is not None else topology.ranks)
    out = {}

    def go():
        out["algo"] = yield env.process(run_collective(env, net, kind, ranks, nbytes, root,
                                                       algorithm))

    env.process(go())
    env.run()
    return env.now, out["algo"]


@pytest.mark.parametrize("p", [2, 4, 8])
@pytest.mark.parametrize("S", [1e3, 1e6, 1e9])
def test_ring_allreduce_matches_formula(p, S):
    t, algo = simulate(star(p), C.ALL_REDUCE, S, algorithm="ring")
    assert algo == "ring"
    assert t == pytest.approx(2 * (p - 1) / p * S / B + 2 * (p - 1) * ALPHA, rel=0.01)


def test_ring_allreduce_on_dgx_a100():
    # NVSwitch: 300 GB/s per GPU per direction, 0.5 us per hop -> 1 us a
    # path; NCCL's Simple protocol (topologies/dgx-a100.yaml): 1.0 us more
    # a step, 8.4 us once, adding GPUs held to 235 GB/s of bus bandwidth,
    # and the pipeline's fill: the time a GPU takes to send its bytes, up to 200 us
    t, _ = simulate(load_topology("dgx-a100"), C.ALL_REDUCE, 1e9, algorithm="ring")
    sent = 2 * 7 / 8 * 1e9
    assert t == pytest.approx(8.4e-6 + 200e-6 + 14 * (1e-6 + 1.0e-6) + sent / 235e9,
                              rel=1e-9)


@pytest.mark.parametrize("kind", [C.ALL_GATHER, C.REDUCE_SCATTER])
def test_ring_allgather_reducescatter(kind):
    p, S = 8, 64e6
    t, _ = simulate(star(p), kind, S, algorithm="ring")
    assert t == pytest.approx((p - 1) * ALPHA + (p - 1) / p * S / B, rel=0.01)


def test_alltoall_pairwise():
    p, S = 8, 64e6
    t, algo = simulate(star(p), C.ALL_TO_ALL, S)
    assert algo == "direct"
    assert t == pytest.approx((p - 1) * ALPHA + (p - 1) / p * S / B, rel=0.01)


@pytest.mark.parametrize("kind", [C.GATHER, C.SCATTER])
def test_gather_scatter_direct(kind):
    # all p-1 blocks of S/p cross the root's one link at once
    p, S = 8, 64e6
    t, _ = simulate(star(p), kind, S, root=3)
    assert t == pytest.approx(ALPHA + (p - 1) / p * S / B, rel=0.01)


def test_sendrecv_is_one_flow():
    t, _ = simulate(star(4), C.SEND_RECV, 1e9, ranks=(2, 1))
    assert t == pytest.approx(ALPHA + 1e9 / B, rel=1e-9)


@pytest.mark.parametrize("kind", [C.BROADCAST, C.REDUCE])
def test_pipelined_chain(kind):
    p, S = 8, 256e6
    c = pipeline_chunks(p, S, ALPHA, B)
    assert c > 1
    t, _ = simulate(star(p), kind, S, root=0, algorithm="ring")
    assert t == pytest.approx((c + p - 2) * (ALPHA + S / c / B), rel=0.01)
    # the optimum of that formula: (sqrt(S/B) + sqrt((p-2) alpha))^2, which
    # tends to S/B + (p-2) alpha for large S
    assert t <= 1.01 * ((S / B) ** 0.5 + ((p - 2) * ALPHA) ** 0.5) ** 2


def test_one_rank_or_no_bytes_take_no_time():
    assert simulate(star(4), C.ALL_REDUCE, 1e9, ranks=(2,))[0] == 0.0
    assert simulate(star(4), C.ALL_REDUCE, 0)[0] == 0.0


def test_analytical_mode_agrees_on_uncontended_ring():
    flow, _ = simulate(star(8), C.ALL_REDUCE, 1e8, algorithm="ring")
    ana, _ = simulate(star(8), C.ALL_REDUCE, 1e8, algorithm="ring", mode="analytical")
    assert ana == pytest.approx(flow, rel=1e-9)


def test_bytes_sent_per_rank():
    assert bytes_sent_per_rank(C.ALL_REDUCE, 8, 800) == 1400
    assert bytes_sent_per_rank(C.ALL_GATHER, 4, 400) == 300
    assert bytes_sent_per_rank(C.ALL_REDUCE, 1, 800) == 0


def test_bad_teams():
    with pytest.raises(TopologyError, match="team rank 9"):
        simulate(star(4), C.ALL_REDUCE, 1e6, ranks=(0, 9))
    with pytest.raises(ConfigError, match="root 7 is not in the team"):
        simulate(star(4), C.BROADCAST, 1e6, root=7)
    with pytest.raises(ConfigError, match="unknown algorithm 'bogus'"):
        simulate(star(4), C.ALL_REDUCE, 1e6, algorithm="bogus")


def test_bytes_sent_by_each_rank():
    from distsim.sim.collectives import bytes_sent_by
    # the sender sends everything, the receiver nothing
    assert bytes_sent_by(C.SEND_RECV, (3, 5), 1024, None) == {3: 1024.0, 5: 0.0}
    # a gather of 400 bytes over 4 ranks: each non-root sends its 100
    assert bytes_sent_by(C.GATHER, (0, 1, 2, 3), 400, 2) == {0: 100.0, 1: 100.0, 2: 0.0,
                                                              3: 100.0}
    # a scatter: the root sends the 3 pieces that are not its own
    assert bytes_sent_by(C.SCATTER, (0, 1, 2, 3), 400, 0) == {0: 300.0, 1: 0.0, 2: 0.0, 3: 0.0}
    # a ring all-reduce: every rank sends 2(p-1)/p S
    assert bytes_sent_by(C.ALL_REDUCE, (0, 1, 2, 3), 800, None) == {r: 1200.0 for r in range(4)}


def test_a_send_recv_record_gives_the_sender_the_bytes():
    from distsim.ir import DType, Function, Op, TensorType, Value
    from distsim.sim.simulator import simulate_function
    from distsim.topology import load_topology
    t0, t1 = TensorType((256,), DType.F32, 0), TensorType((256,), DType.F32, 1)
    x, y = Value("x", t0), Value("y", t1)
    f = Function("send", [x], [Op("comm.sendrecv", [x], [y], {"ranks": (0, 1)})], [y])
    trace = simulate_function(f, load_topology("dgx-a100"))
    sent = {r.rank: r.bytes for r in trace.ops}
    assert sent == {0: 1024.0, 1: 0.0}
