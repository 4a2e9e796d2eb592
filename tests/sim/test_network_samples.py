"""Link utilisation samples (``record_samples=True``): exact where flows are
simulated one by one, the mean use over a fast-forwarded run of steps or an
analytical transfer, and recording them leaves the fast path on.

The invariant that any honest utilisation timeline keeps: per link, the
integral of utilisation x capacity over time is the bytes the link carried."""
from collections import defaultdict

import pytest
import simpy

from distsim.ir.comm import CollectiveType as C
from distsim.sim.collectives import run_collective
from distsim.sim.network import Network
from distsim.topology import Topology, load_topology, topology_from_dict

DEVICE = {"name": "toy", "peak_flops": {"f32": 1e12}, "memory_bandwidth_Bps": 1e12,
          "memory_bytes": 1e9}
GB = 1e9


def private(name):
    """A private copy ("auto" choices are cached per topology object)."""
    t = load_topology(name)
    return Topology(t.name, t.graph.copy(), t.device_spec)


def run(topo, jobs, mode="flow", fast_steps=True, record_samples=True):
    """``jobs``: lists of actions run in sequence, jobs side by side:
    ``("wait", s)``, ``("send", src, dst, nbytes)``, ``(kind, ranks, nbytes, algo)``."""
    env = simpy.Environment()
    net = Network(env, topo, mode=mode, fast_steps=fast_steps, record_samples=record_samples)
    ends = [[] for _ in jobs]

    def job(i, actions):
        for a in actions:
            if a[0] == "wait":
                yield env.timeout(a[1])
            elif a[0] == "send":
                yield net.transfer(*a[1:])
            else:
                yield env.process(run_collective(env, net, a[0], tuple(a[1]), a[2],
                                                 algorithm=a[3]))
            ends[i].append(env.now)

    for i, actions in enumerate(jobs):
        env.process(job(i, actions))
    env.run()
    return net, ends, env.now


def integrals(net, end_s):
    """Per link: the integral of utilisation x capacity over [0, end_s]
    (a sample holds until the link's next one)."""
    cap = {(r.src, r.dst): r.bandwidth_Bps for r in net.link_records()}
    series = defaultdict(list)
    for s in net.link_samples():                 # appended in time order
        series[(s.src, s.dst)].append((s.time_s, s.utilisation))
    out = {}
    for link, pts in series.items():
        total = 0.0
        for (t, u), (t2, _) in zip(pts, pts[1:] + [(end_s, 0.0)]):
            total += u * (t2 - t)
        out[link] = total * cap[link]
    return out


def carried(net):
    return {(r.src, r.dst): r.bytes_carried for r in net.link_records() if r.bytes_carried}


RING = (C.ALL_REDUCE, range(4), GB, "ring")


@pytest.mark.parametrize("mode, fast", [("flow", False), ("flow", True), ("analytical", True)])
@pytest.mark.parametrize("jobs", [
    [[RING] * 3],                                                   # phantoms after step 1
    [[RING] * 2, [(C.ALL_REDUCE, range(4, 8), 0.5 * GB, "ring")] * 2],
    [[(C.ALL_REDUCE, range(8), 0.3 * GB, "tree")], [("send", 0, 5, 0.2 * GB)] * 2],
    [[("send", 0, 1, GB)], [("wait", 1e-3), ("send", 0, 1, GB), ("send", 2, 1, GB)]],
])
def test_integral_of_utilisation_is_the_bytes_carried(mode, fast, jobs):
    net, _, end = run(private("dgx-a100"), jobs, mode=mode, fast_steps=fast)
    got = integrals(net, end)
    want = carried(net)
    assert set(got) == set(want)
    for link, nbytes in want.items():
        assert got[link] == pytest.approx(nbytes, rel=1e-9), link
    utils = [s.utilisation for s in net.link_samples()]
    assert min(utils) >= 0.0
    if mode == "flow":
        assert max(utils) <= 1.0 + 1e-12         # max-min sharing never overfills a link


def test_samples_leave_the_fast_path_on_and_the_times_unchanged():
    jobs = [[RING] * 4, [(C.ALL_REDUCE, range(4, 8), 0.5 * GB, "ring")] * 4]
    plain, plain_ends, _ = run(private("dgx-a100"), jobs, record_samples=False)
    fast, fast_ends, _ = run(private("dgx-a100"), jobs)
    slow, slow_ends, _ = run(private("dgx-a100"), jobs, fast_steps=False)
    assert fast_ends == plain_ends
    assert fast_ends == [pytest.approx(s, rel=1e-9) for s in slow_ends]
    assert fast.flows_started == plain.flows_started < slow.flows_started
    # a few samples per link and run of steps, not per step: 4 runs x 6 steps x 4
    # flows each way would be 4 x 24 x 2 samples per ring link step by step
    assert len(fast.link_samples()) < len(slow.link_samples()) / 4


def pairs(latency_us):
    return topology_from_dict({"device": DEVICE, "devices": {"count": 4}, "links": [
        {"src": "gpu0", "dst": "gpu1", "bandwidth_GBps": 10, "latency_us": latency_us},
        {"src": "gpu2", "dst": "gpu3", "bandwidth_GBps": 10, "latency_us": latency_us},
        {"src": "gpu1", "dst": "gpu2", "bandwidth_GBps": 1, "latency_us": 0}]}, "pairs.yaml")


def test_a_phantom_samples_its_mean_use_and_hands_over_to_real_flows():
    """Ten steps of 0.1 GB on a 10 GB/s link with 100 us latency (0.01 s
    transmitting, 0.0101 s a step) and a 0.1 GB intruder at t = 0.035."""
    env = simpy.Environment()
    net = Network(env, pairs(100), record_samples=True)

    def steps():
        yield from net.run_steps(((0, 1, 0.1 * GB),), 10)

    def intruder():
        yield env.timeout(0.035)
        yield net.transfer(0, 1, 0.1 * GB)

    env.process(steps())
    env.process(intruder())
    env.run()
    link = [(s.time_s, s.utilisation) for s in net.link_samples() if s.src == "gpu0"]
    # steps 2..10 are fast-forwarded from 0.0101: a phantom sampled at its
    # mean use, 0.1 GB per 0.0101 s; the intruder materialises it at 0.035,
    # 0.0249 s in: two whole steps (0.2 GB) and 0.0047 s of the third at the
    # full 10 GB/s (0.047 GB), so its sample is rewritten to the use it had,
    # 0.247 GB over 10 GB/s x 0.0249 s
    expected = [(0.0, 1.0),              # the first step, as a real flow at full rate
                (0.01, 0.0),             # its last byte left; latency until 0.0101
                (0.0101, 0.247 / (10 * 0.0249)),   # the phantom, up to 0.035
                (0.035, 0.0),            # the intruder materialises the phantom...
                (0.035, 1.0)]            # ...which shares the link with it: 5 + 5 GB/s
    assert link[:5] == [pytest.approx(e, rel=1e-9) for e in expected]
    # the last steps, alone again, are a phantom too: it holds the link
    # (latency included in its mean) until the end
    assert link[-2][1] == pytest.approx(0.1 / (10 * 0.0101), rel=1e-9)
    assert link[-1] == pytest.approx((env.now, 0.0), rel=1e-9)
    # so the samples integrate to the bytes carried: 10 steps and the intruder
    assert integrals(net, env.now)[("gpu0", "gpu1")] == pytest.approx(1.1 * GB, rel=1e-9)


def test_analytical_uses_add_up_past_one_where_contention_is_ignored():
    # two 1 GB transfers on the same 10 GB/s link at once: analytical mode
    # gives each the full rate, so the link shows 2.0 for 0.1 s
    env = simpy.Environment()
    net = Network(env, pairs(0), mode="analytical", record_samples=True)
    net.transfer(0, 1, GB)
    net.transfer(0, 1, GB)
    env.run()
    link = [(s.time_s, s.utilisation) for s in net.link_samples() if s.src == "gpu0"]
    assert link == [(0.0, 1.0), (0.0, 2.0), (pytest.approx(0.1), 1.0),
                    (pytest.approx(0.1), 0.0)]
