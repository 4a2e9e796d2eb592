"""Fast-forwarded steps (phantoms holding their links) give exactly the
step-by-step simulation: the same end times and the same link statistics,
with several phantoms at once on disjoint links, phantoms materialised by
traffic that arrives on one of their links, and random overlapping
collectives on small topologies."""
import pytest
import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

from distsim.ir.comm import CollectiveType as C
from distsim.sim.collectives import run_collective
from distsim.sim.network import Network
from distsim.topology import Topology
from distsim.topology import load_topology as _load

GB = 1e9
_TOPOLOGIES = {}


def load_topology(name):
    """A private copy: "auto" decisions are cached per topology object, and
    the loader's shared topologies must not see this file's teams."""
    if name not in _TOPOLOGIES:
        topo = _load(name)
        _TOPOLOGIES[name] = Topology(topo.name, topo.graph.copy(), topo.device_spec)
    return _TOPOLOGIES[name]


def simulate(topo, jobs, fast_steps):
    """``jobs``: lists of actions run in sequence, all jobs side by side.
    An action is ``("wait", seconds)``, ``("send", src, dst, nbytes)`` or
    ``(kind, ranks, nbytes, algorithm)`` (a broadcast's root is its last
    rank). Returns (each action's end time
    per job, link statistics, flows started)."""
    env = simpy.Environment()
    net = Network(env, topo, fast_steps=fast_steps)
    ends = [[] for _ in jobs]

    def job(i, actions):
        for action in actions:
            if action[0] == "wait":
                yield env.timeout(action[1])
            elif action[0] == "send":
                yield net.transfer(*action[1:])
            else:
                kind, ranks, nbytes, algo = action
                root = ranks[-1] if kind is C.BROADCAST else None
                yield env.process(run_collective(env, net, kind, tuple(ranks), nbytes,
                                                 root=root, algorithm=algo))
            ends[i].append(env.now)

    for i, actions in enumerate(jobs):
        env.process(job(i, actions))
    env.run()
    links = {(r.src, r.dst): (r.bytes_carried, r.busy_s, r.peak_flows)
             for r in net.link_records()}
    return ends, links, net.flows_started


def assert_same(topo, jobs):
    """Fast path on == off; returns (flows started fast, flows started slow)."""
    fast_ends, fast_links, fast_n = simulate(topo, jobs, True)
    slow_ends, slow_links, slow_n = simulate(topo, jobs, False)
    assert len(fast_ends) == len(slow_ends)
    for f, s in zip(fast_ends, slow_ends):
        assert f == pytest.approx(s, rel=1e-9, abs=1e-15)
    assert sorted(fast_links) == sorted(slow_links)
    for link, (b, busy, peak) in slow_links.items():
        fb, fbusy, fpeak = fast_links[link]
        assert fb == pytest.approx(b, rel=1e-9), link
        assert fbusy == pytest.approx(busy, rel=1e-9, abs=1e-15), link
        assert fpeak == peak, link
    return fast_n, slow_n


def ring(ranks, nbytes=GB, kind=C.ALL_REDUCE):
    return (kind, tuple(ranks), nbytes, "ring")


def test_switch_off_runs_every_step_as_flows():
    topo = load_topology("dgx-a100")
    _, _, fast = simulate(topo, [[ring(range(4))] * 3], True)
    _, _, slow = simulate(topo, [[ring(range(4))] * 3], False)
    assert slow == 3 * 6 * 4 and fast < slow


def test_two_concurrent_rings_on_disjoint_halves_of_a_node():
    topo = load_topology("dgx-a100")
    jobs = [[ring(range(4))] * 4, [ring(range(4, 8))] * 4]
    fast, slow = assert_same(topo, jobs)
    # the old fast path needed an idle network: both halves now run as
    # phantoms after each one's first clean step
    assert fast <= 2 * 4 and slow == 2 * 4 * 6 * 4


def test_pipeline_of_collectives_on_disjoint_links():
    """Four pipeline stages of two GPUs each on two servers: all-reduces
    inside each stage, activations sent on to the next stage between them,
    stages starting staggered like a 1F1B warm-up."""
    topo = load_topology("dgx-a100-x2")
    stages = [(0, 1), (8, 9), (2, 3), (10, 11)]
    jobs = []
    for s, team in enumerate(stages):
        actions = [("wait", s * 1e-3)]
        for _ in range(3):
            actions.append(ring(team, 0.5 * GB))
            if s + 1 < len(stages):
                actions.append((C.SEND_RECV, (team[0], stages[s + 1][0]), 0.1 * GB, "direct"))
        jobs.append(actions)
    fast, slow = assert_same(topo, jobs)
    assert fast < slow


@pytest.mark.parametrize("at", [0.0, 1e-6, 0.0031, 0.00333, 0.005, 0.0101, 0.0135, 0.02])
def test_flow_arriving_on_a_phantoms_link_materialises_it(at):
    """A ring of 4 runs twice (the second time as one phantom); a transfer
    on one of its links arrives at various points: before it, inside a
    step, in a step's latency tail, at a step boundary, after it."""
    topo = load_topology("dgx-a100")
    jobs = [[ring(range(4)), ring(range(4))],
            [("wait", at), ("send", 1, 2, 0.3 * GB), ("send", 5, 6, 0.1 * GB)]]
    assert_same(topo, jobs)


def test_phantom_materialised_by_another_collective_on_its_links():
    topo = load_topology("dgx-a100")
    jobs = [[ring(range(4))] * 3,
            [("wait", 0.012), ring((0, 1), 0.2 * GB), ring((2, 3), 0.2 * GB)],
            [ring(range(4, 8))] * 2]
    fast, slow = assert_same(topo, jobs)
    assert fast < slow


TOPOLOGIES = ("dgx-a100", "pcie-tree-4gpu", "torus-4x4", "dgx-a100-x2")
SIZES = (0.0, 1e5, 3e7, 2e8)
KINDS = ((C.ALL_REDUCE, "ring"), (C.ALL_REDUCE, "tree"), (C.ALL_REDUCE, "auto"),
         (C.ALL_GATHER, "ring"), (C.BROADCAST, "ring"), (C.ALL_TO_ALL, "direct"))


@st.composite
def workloads(draw):
    topo = load_topology(draw(st.sampled_from(TOPOLOGIES)))
    n = topo.num_devices
    jobs = []
    for _ in range(draw(st.integers(1, 4))):
        actions = []
        if draw(st.booleans()):
            actions.append(("wait", draw(st.sampled_from((0.0, 1e-6, 1e-4, 2.5e-3)))))
        team = draw(st.lists(st.integers(0, n - 1), min_size=2, max_size=min(n, 6),
                             unique=True))
        for _ in range(draw(st.integers(1, 4))):
            what = draw(st.integers(0, 9))
            if what == 0:
                actions.append(("wait", draw(st.sampled_from((1e-6, 1e-4, 1e-3)))))
            elif what == 1:
                src, dst = draw(st.sampled_from(team)), draw(st.integers(0, n - 1))
                actions.append(("send", src, dst, draw(st.sampled_from(SIZES))))
            else:
                kind, algo = draw(st.sampled_from(KINDS))
                once = (kind, tuple(team), draw(st.sampled_from(SIZES)), algo)
                actions += [once] * draw(st.integers(1, 3))   # repeats become phantoms
        jobs.append(actions)
    return topo, jobs


@settings(deadline=None, derandomize=True, database=None, max_examples=120)
@given(workloads())
def test_random_overlapping_collectives_fast_path_equals_step_by_step(work):
    topo, jobs = work
    assert_same(topo, jobs)


def test_planned_collectives_are_kept_and_bad_ones_reported_every_time():
    from distsim.errors import ConfigError, TopologyError
    topo = load_topology("dgx-a100")
    env = simpy.Environment()
    net = Network(env, topo)
    for _ in range(2):
        env.process(run_collective(env, net, C.ALL_REDUCE, (0, 1, 2, 3), GB))
    env.run()
    assert list(net.schedules) == [(C.ALL_REDUCE, (0, 1, 2, 3), GB, None, "auto")]
    for _ in range(2):
        with pytest.raises(ConfigError, match="names a rank twice"):
            next(run_collective(env, net, C.ALL_REDUCE, (0, 1, 1), GB))
        with pytest.raises(TopologyError, match=r"team rank \[1\]"):
            next(run_collective(env, net, C.ALL_REDUCE, (0, [1]), GB))
