"""One collective's time alone (:func:`collective_time`) is what a plain
simulation of that collective alone gives, to the bit, in both network
modes; ``auto`` takes the algorithm whose flow-model time alone is
smallest, by brute force over every algorithm; solo replay and the
estimator's collective costs read that same time."""
from __future__ import annotations

import pytest
import simpy

from distsim.estimate.costs import Collectives
from distsim.ir.comm import CollectiveType as C
from distsim.sim.collective_algos import ALGORITHMS
from distsim.sim.collectives import ROOTED, run_collective
from distsim.sim.network import Network
from distsim.sim.solo import solo_run
from distsim.sim.solo_time import collective_time, run_together
from distsim.topology import Topology, load_topology

SIZES = (1e3, 3.3e6, 1e9)
TEAMS = {
    "dgx-a100": [(0, 1), (7, 2, 5, 0), tuple(range(8))],
    # 4 servers of 8: one rank per server, and two per server (hierarchical)
    "dgx-a100-x4": [(0, 9), (0, 8, 16, 24), tuple(range(0, 32, 4)), tuple(range(32))],
    "torus-4x4": [(0, 1), (0, 5, 10, 15), tuple(range(16))],
    # a chain and a tree of 4 are equally fast here, but for the last bit
    "pcie-tree-4gpu": [(0, 1, 2, 3)],
}


def _fresh(name: str) -> Topology:
    """A private copy: times, routes and auto's choices are kept per topology."""
    topo = load_topology(name)
    return Topology(topo.name, topo.graph.copy(), topo.device_spec)


def _root(kind, team):
    if kind is C.SEND_RECV:
        return team[0]
    return team[-1] if kind in ROOTED else None


def _team(kind, team):
    return team[:2] if kind is C.SEND_RECV else team


def plain(topo, mode, kind, team, nbytes, algorithm, **network):
    """The collective alone on a network of its own: (seconds, algorithm)."""
    env = simpy.Environment()
    net = Network(env, topo, mode=mode, **network)
    proc = env.process(run_collective(env, net, kind, team, nbytes, root=_root(kind, team),
                                      algorithm=algorithm))
    env.run()
    return env.now, proc.value


@pytest.mark.parametrize("mode", ["flow", "analytical"])
@pytest.mark.parametrize("name", sorted(TEAMS))
def test_collective_time_is_the_plain_simulation_alone_to_the_bit(name, mode):
    topo = _fresh(name)
    checked = 0
    for kind, table in ALGORITHMS.items():
        for team in TEAMS[name]:
            team = _team(kind, team)
            for nbytes in SIZES:
                for algorithm in list(table) + ["auto"]:
                    got = collective_time(topo, mode, kind, team, nbytes, _root(kind, team),
                                          algorithm)
                    assert got == plain(topo, mode, kind, team, nbytes, algorithm), \
                        (kind, team, nbytes, algorithm)
                    assert got[0] > 0
                    checked += 1
    # (every kind's algorithms and auto: 25) x 3 sizes, per team
    assert checked == 75 * len(TEAMS[name])


def test_flow_time_matches_the_flow_by_flow_simulation():
    # the plain simulation fast-forwards repeated steps; stepping every
    # flow gives the same times but for the clock's rounding
    topo = _fresh("dgx-a100-x4")
    for kind in (C.ALL_REDUCE, C.ALL_GATHER, C.BROADCAST):
        for algorithm in ALGORITHMS[kind]:
            team = tuple(range(32))
            t, used = collective_time(topo, "flow", kind, team, 64e6, _root(kind, team), algorithm)
            slow = plain(topo, "flow", kind, team, 64e6, algorithm, fast_steps=False)
            # NVLS applies inside one server of an NVLS topology: elsewhere the ring
            assert used == slow[1] == (algorithm if algorithm != "nvls" else "ring")
            assert t == pytest.approx(slow[0], rel=1e-12)


def _fastest(topo, kind, team, nbytes):
    """Brute force: every algorithm that applies, simulated alone in the
    flow model; the smallest time, the first in the kind's table of those
    within rounding (1e-12) of it."""
    times = {}
    for algorithm in ALGORITHMS[kind]:
        t, used = plain(topo, "flow", kind, team, nbytes, algorithm)
        if used == algorithm:                 # not a fallback to another
            times[algorithm] = t
    least = min(times.values())
    return next(a for a, t in times.items() if t <= least * (1 + 1e-12)), times


@pytest.mark.parametrize("name", sorted(TEAMS))
def test_auto_takes_the_algorithm_fastest_alone_in_the_flow_model(name):
    brute = _fresh(name)
    chosen = set()
    for kind in (C.ALL_REDUCE, C.ALL_GATHER, C.REDUCE_SCATTER, C.BROADCAST, C.REDUCE):
        for team in TEAMS[name]:
            for nbytes in (256.0, 16384.0, 1e6, 3e7, 1e9, 4e9):
                best, times = _fastest(brute, kind, team, nbytes)
                topo = _fresh(name)          # nothing timed or chosen on it yet
                for mode in ("analytical", "flow"):
                    t, used = collective_time(topo, mode, kind, team, nbytes,
                                              _root(kind, team), "auto")
                    assert used == best, (kind, team, nbytes, mode, times)
                    assert (t, used) == collective_time(topo, mode, kind, team, nbytes,
                                                        _root(kind, team), best)
                assert plain(topo, "flow", kind, team, nbytes, "auto") == (times[best], best)
                chosen.add((kind, best))
    # the sizes reach both sides of some crossover between algorithms
    assert len({best for _, best in chosen}) >= 2


def test_a_tie_to_the_last_bit_goes_to_the_kinds_first_algorithm():
    # a 4-rank chain and tree reduce take the same time on this PCIe tree,
    # but for the last bit of the clock's sums: the chain (ring) is first
    topo = _fresh("pcie-tree-4gpu")
    team = (0, 1, 2, 3)
    ring = collective_time(topo, "flow", C.REDUCE, team, 16384.0, 0, "ring")[0]
    tree = collective_time(topo, "flow", C.REDUCE, team, 16384.0, 0, "tree")[0]
    assert tree < ring and tree == pytest.approx(ring, rel=1e-15)
    assert collective_time(topo, "flow", C.REDUCE, team, 16384.0, 0) == (ring, "ring")


def test_auto_picks_by_the_flow_model_also_in_analytical_mode():
    # the analytical mode lets a tree's parent feed both children at full
    # bandwidth: there a 1 GB double tree on 8 A100s is 3x faster than the
    # ring; with the links shared it is slower, and auto runs the ring
    topo = _fresh("dgx-a100")
    team = tuple(range(8))
    tree_an = collective_time(topo, "analytical", C.ALL_REDUCE, team, 1e9, algorithm="tree")[0]
    ring_an = collective_time(topo, "analytical", C.ALL_REDUCE, team, 1e9, algorithm="ring")[0]
    tree = collective_time(topo, "flow", C.ALL_REDUCE, team, 1e9, algorithm="tree")[0]
    ring = collective_time(topo, "flow", C.ALL_REDUCE, team, 1e9, algorithm="ring")[0]
    assert tree_an * 3 < ring_an < tree and ring == pytest.approx(ring_an, rel=1e-12)
    assert collective_time(topo, "analytical", C.ALL_REDUCE, team, 1e9) == (ring_an, "ring")


@pytest.mark.parametrize("mode", ["flow", "analytical"])
@pytest.mark.parametrize("samples", [False, True])
def test_solo_replay_runs_the_collective_time(mode, samples):
    topo = _fresh("dgx-a100-x4")
    for kind, team, nbytes in [(C.ALL_REDUCE, tuple(range(32)), 7e7),
                               (C.ALL_REDUCE, (0, 8), 1e4),
                               (C.BROADCAST, tuple(range(8, 16)), 2e8),
                               (C.SEND_RECV, (3, 17), 5e6)]:
        root = _root(kind, team)
        run = solo_run(topo, mode, (kind, team, root, nbytes, "auto"), samples)
        assert (run.duration_s, run.algorithm) == \
            collective_time(topo, mode, kind, team, nbytes, root)
        assert run.links and bool(run.samples) == samples


def test_the_estimators_collective_costs_are_the_analytical_time_alone():
    topo = _fresh("dgx-a100-x4")
    costs = Collectives(topo, "auto")
    for kind, team, nbytes in [(C.ALL_REDUCE, tuple(range(32)), 7e7),
                               (C.ALL_GATHER, tuple(range(0, 32, 8)), 1.5e6),
                               (C.SEND_RECV, (3, 17), 5e6)]:
        expected = plain(topo, "analytical", kind, team, nbytes, "auto")[0]
        assert costs.time(kind, team, nbytes) == expected > 0
    assert costs.time(C.ALL_REDUCE, (5,), 1e9) == costs.time(C.ALL_REDUCE, (1, 2), 0) == 0.0


def test_a_collective_that_moves_nothing_takes_no_time_and_bad_input_is_refused():
    from distsim.errors import ConfigError, TopologyError
    topo = _fresh("dgx-a100")
    assert collective_time(topo, "flow", C.ALL_REDUCE, (3,), 1e9) == (0.0, "none")
    assert collective_time(topo, "flow", C.ALL_REDUCE, (0, 1), 0.0, algorithm="ring") == \
        (0.0, "none")
    with pytest.raises(TopologyError, match="team rank 9 is not a device"):
        collective_time(topo, "flow", C.ALL_REDUCE, (0, 9), 1e6)
    with pytest.raises(TopologyError, match=r"team rank \[1\] is not a device"):
        collective_time(topo, "flow", C.ALL_REDUCE, ([1], 2), 1e6)
    with pytest.raises(ConfigError, match="unknown algorithm 'tree'"):
        collective_time(topo, "flow", C.ALL_GATHER, (0, 1), 1e6, algorithm="tree")


def test_run_together_shares_a_gpus_nic_as_max_min_flows_do():
    """Three DGX A100 servers: GPU 8 (server 1) sends 25 MB to GPU 0 and
    to GPU 16 through its one NIC (GPU -> PCIe -> NIC -> leaf, 25 GB/s at
    the NIC; 0.5 + 1 + 1 + 0.5 us of latency). Alone: 1 ms + 3 us. At
    once: each half the NIC, 2 ms + 3 us. The second 0.4 ms later: the
    first sends 10 MB alone, its other 15 MB at 12.5 GB/s (1.2 ms), done
    at 1.6 ms + 3 us; the second sent 15 MB by then, its last 10 MB alone
    (0.4 ms): 2 ms + 3 us. The two ways of one pair of GPUs do not share
    (each direction of a link is its own). (:func:`_fresh` has no
    ``collectives:`` block: links at their full rate, no protocol costs.)"""
    topo, n, lat = _fresh("dgx-a100-x3"), 25e6, 3e-6
    send = C.SEND_RECV
    alone = collective_time(topo, "flow", send, (8, 16), n, 8)[0]
    assert alone == pytest.approx(1e-3 + lat, rel=1e-12)
    both = run_together(topo, "flow", [(0.0, send, (8, 0), n, 8), (0.0, send, (8, 16), n, 8)])
    assert both == pytest.approx((2e-3 + lat, 2e-3 + lat), rel=1e-12)
    later = run_together(topo, "flow", [(0.0, send, (8, 0), n, 8), (4e-4, send, (8, 16), n, 8)])
    assert later == pytest.approx((1.6e-3 + lat, 2e-3 + lat), rel=1e-12)
    ways = run_together(topo, "flow", [(0.0, send, (8, 16), n, 8), (0.0, send, (16, 8), n, 16)])
    assert ways == pytest.approx((1e-3 + lat, 1e-3 + lat), rel=1e-12)
    # the analytical network shares nothing: each as alone
    assert run_together(topo, "analytical", [(0.0, send, (8, 0), n, 8),
                                             (4e-4, send, (8, 16), n, 8)]) == \
        pytest.approx((1e-3 + lat, 4e-4 + 1e-3 + lat), rel=1e-12)


@pytest.mark.parametrize("mode", ["flow", "analytical"])
def test_run_together_of_one_collective_is_its_time_alone(mode):
    """One item from time 0 takes :func:`collective_time`'s time, to the bit."""
    topo = _fresh("dgx-a100-x4")
    for kind, team, nbytes in ((C.SEND_RECV, (0, 9), 3.3e6), (C.ALL_REDUCE, tuple(range(0, 32, 4)),
                                                               1e9)):
        root = _root(kind, team)
        alone = collective_time(topo, mode, kind, team, nbytes, root)[0]
        assert run_together(topo, mode, [(0.0, kind, team, nbytes, root)]) == (alone,)
