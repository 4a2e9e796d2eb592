"""The shortcuts that make large collectives cheap give the same answers:
auto decisions shared by the networks over one topology, and at 128 GPUs
the choice is still the algorithm fastest alone in the flow model."""
import simpy

from distsim.ir.comm import CollectiveType as C
from distsim.sim.collectives import ALGORITHMS, run_collective
from distsim.sim.network import Network
from distsim.sim.solo_time import collective_time
from distsim.topology import Topology, load_topology


def _run(topo, algorithm, nbytes=64e6):
    env = simpy.Environment()
    net = Network(env, topo)
    proc = env.process(run_collective(env, net, C.ALL_REDUCE, tuple(topo.ranks), nbytes,
                                      algorithm=algorithm))
    env.run()
    return proc.value, env.now, net


def _fresh(topo):
    return Topology(topo.name, topo.graph.copy(), topo.device_spec)


def test_auto_decisions_are_shared_per_topology():
    # a private copy: the loader's shared one holds other tests' decisions
    topo = _fresh(load_topology("dgx-a100-x2"))
    a = Network(simpy.Environment(), topo)
    b = Network(simpy.Environment(), topo, mode="analytical")
    assert a.algorithm_choices is b.algorithm_choices
    other = Network(simpy.Environment(), _fresh(topo))
    assert other.algorithm_choices is not a.algorithm_choices
    name, _, net = _run(topo, "auto")
    assert net.algorithm_choices and set(net.algorithm_choices.values()) == {name}
    # a second network over the same topology reuses it and gets the same answer
    assert _run(topo, "auto")[:2] == _run(_fresh(topo), "auto")[:2]


def test_auto_takes_the_fastest_alone_at_128_gpus():
    # each algorithm simulated alone in the flow model, on a topology that
    # has made no decision yet; auto (bounds first, few simulations) agrees
    topo = load_topology("dgx-a100-x16")
    ranks = tuple(topo.ranks)
    for nbytes in (1e4, 1e9):
        times = {name: collective_time(_fresh(topo), "flow", C.ALL_REDUCE, ranks, nbytes,
                                       algorithm=name)[0]
                 for name in ALGORITHMS[C.ALL_REDUCE]}
        best = min(times, key=lambda n: (times[n], list(times).index(n)))
        assert _run(_fresh(topo), "auto", nbytes)[0] == best
    # one ring per NIC (NCCL's channels) is NIC-bound; hierarchical runs its
    # phases one after another
    assert best == "ring" and times["hierarchical"] > times["ring"]

