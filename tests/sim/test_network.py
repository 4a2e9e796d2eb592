"""Exact flow-model timelines, expected values worked out by hand."""
import pytest
import simpy

from distsim.errors import ConfigError, TopologyError
from distsim.sim.network import Network
from distsim.topology import topology_from_dict

DEVICE = {"name": "toy", "peak_flops": {"f32": 1e12}, "memory_bandwidth_Bps": 1e12,
          "memory_bytes": 1e9}
GB = 1e9


def topo(links, devices=4, switches=()):
    return topology_from_dict({"device": DEVICE, "devices": {"count": devices},
                               "switches": list(switches), "links": links}, "test.yaml")


def pairs(latency_us=0.0):
    """gpu0 <-> gpu1 and gpu2 <-> gpu3, 10 GB/s each, plus a slow bridge
    so that the graph is connected."""
    return topo([{"src": "gpu0", "dst": "gpu1", "bandwidth_GBps": 10, "latency_us": latency_us},
                 {"src": "gpu2", "dst": "gpu3", "bandwidth_GBps": 10, "latency_us": latency_us},
                 {"src": "gpu1", "dst": "gpu2", "bandwidth_GBps": 1, "latency_us": 0}])


def run_flows(t, flows, mode="flow", **kw):
    """flows: (start_s, src, dst, nbytes); returns delivery times in order."""
    env = simpy.Environment()
    net = Network(env, t, mode=mode, **kw)
    ends = [None] * len(flows)

    def one(i, start, src, dst, nbytes):
        yield env.timeout(start)
        yield net.transfer(src, dst, nbytes)
        ends[i] = env.now

    for i, f in enumerate(flows):
        env.process(one(i, *f))
    env.run()
    return ends, net


def test_one_flow_one_link():
    ends, _ = run_flows(pairs(), [(0, 0, 1, 1 * GB)])
    assert ends == [pytest.approx(0.1, rel=1e-12)]


def test_two_flows_share_a_link():
    ends, net = run_flows(pairs(), [(0, 0, 1, 1 * GB), (0, 0, 1, 1 * GB)])
    assert ends == [pytest.approx(0.2, rel=1e-12)] * 2
    rec = {(r.src, r.dst): r for r in net.link_records()}[("gpu0", "gpu1")]
    assert rec.bytes_carried == 2 * GB
    assert rec.busy_s == pytest.approx(0.2)
    assert rec.peak_flows == 2


def test_two_flows_on_disjoint_links():
    ends, _ = run_flows(pairs(), [(0, 0, 1, 1 * GB), (0, 2, 3, 1 * GB)])
    assert ends == [pytest.approx(0.1, rel=1e-12)] * 2


def test_late_flow_reshares():
    # A alone at 10 GB/s for 0.05 s (0.5 GB sent); then A and B at 5 GB/s:
    # A's last 0.5 GB takes 0.1 s -> 0.15; B has 0.5 GB left, alone at
    # 10 GB/s -> 0.05 s more -> 0.2.
    ends, _ = run_flows(pairs(), [(0, 0, 1, 1 * GB), (0.05, 0, 1, 1 * GB)])
    assert ends == [pytest.approx(0.15, rel=1e-12), pytest.approx(0.2, rel=1e-12)]


def test_max_min_with_two_bottlenecks():
    # f1 gpu0->gpu1 crosses gpu0->s (10) and s->gpu1 (4); f2 gpu0->gpu2 shares
    # gpu0->s; f3 gpu3->gpu1 shares s->gpu1. Max-min: s->gpu1 gives f1 = f3 =
    # 2 GB/s, so f2 gets 10 - 2 = 8 GB/s: f2 ends at 1/8 = 0.125 s. f1 and f3
    # stay at 2 GB/s (still bottlenecked by s->gpu1) and end at 0.5 s.
    t = topo([{"src": "gpu0", "dst": "s", "bandwidth_GBps": 10, "latency_s": 0},
              {"src": "s", "dst": "gpu1", "bandwidth_GBps": 4, "latency_s": 0},
              {"src": "s", "dst": "gpu2", "bandwidth_GBps": 10, "latency_s": 0},
              {"src": "gpu3", "dst": "s", "bandwidth_GBps": 10, "latency_s": 0}],
             switches=["s"])
    ends, _ = run_flows(t, [(0, 0, 1, GB), (0, 0, 2, GB), (0, 3, 1, GB)])
    assert ends == [pytest.approx(0.5), pytest.approx(0.125), pytest.approx(0.5)]


def test_latency_is_added_after_the_last_byte():
    ends, _ = run_flows(pairs(latency_us=1000), [(0, 0, 1, GB), (0, 1, 1, GB), (0, 0, 1, 0)])
    assert ends == [pytest.approx(0.101), 0.0, pytest.approx(0.001)]


def test_analytical_mode_ignores_sharing_and_agrees_when_unshared():
    shared, _ = run_flows(pairs(latency_us=10), [(0, 0, 1, GB), (0, 0, 1, GB)], mode="analytical")
    assert shared == [pytest.approx(0.1 + 1e-5)] * 2
    flows = [(0, 0, 1, GB), (0, 2, 3, 2 * GB)]
    a, _ = run_flows(pairs(latency_us=10), flows, mode="analytical")
    f, _ = run_flows(pairs(latency_us=10), flows, mode="flow")
    assert a == pytest.approx(f, rel=1e-12)
    assert a == [pytest.approx(0.1 + 1e-5), pytest.approx(0.2 + 1e-5)]


def test_bad_arguments():
    env = simpy.Environment()
    with pytest.raises(ConfigError, match="network mode"):
        Network(env, pairs(), mode="packet")
    net = Network(env, pairs())
    with pytest.raises(TopologyError, match="no device rank 9"):
        net.transfer(0, 9, 1)
    with pytest.raises(ConfigError, match="bytes must be >= 0"):
        net.transfer(0, 1, -1)


def _steps_with_intruder(fast_steps, record_samples=False):
    """Ten identical steps on gpu0->gpu1 (0.1 GB each: 0.01 s alone), and a
    foreign 0.1 GB flow on the same link at t = 0.035."""
    env = simpy.Environment()
    net = Network(env, pairs(latency_us=100), fast_steps=fast_steps,
                  record_samples=record_samples)
    ends = {}

    def steps():
        yield from net.run_steps(((0, 1, 0.1 * GB),), 10)
        ends["steps"] = env.now

    def intruder():
        yield env.timeout(0.035)
        yield net.transfer(0, 1, 0.1 * GB)
        ends["intruder"] = env.now

    env.process(steps())
    env.process(intruder())
    env.run()
    return ends, net


def test_fast_forwarded_steps_equal_step_by_step_simulation():
    fast, net_fast = _steps_with_intruder(fast_steps=True)
    slow, net_slow = _steps_with_intruder(fast_steps=False)
    assert fast == {k: pytest.approx(v, rel=1e-9) for k, v in slow.items()}
    # by hand: steps take 0.0101 s; at 0.035 step 4 is 0.0047 s in (0.047 GB
    # sent, 0.053 GB left). Sharing 5 GB/s: the step's rest takes 0.0106 s ->
    # 0.0456, its latency -> 0.0457; the intruder sent 0.053 GB by then and
    # has 0.047 GB left, sends 0.001 GB alone during that latency, then
    # shares with the next step: 0.046 GB at 5 GB/s -> 0.0457 + 0.0092 =
    # 0.0549, delivered at 0.0550.
    assert fast["intruder"] == pytest.approx(0.0550, rel=1e-9)
    fb = {(r.src, r.dst): r.bytes_carried for r in net_fast.link_records()}
    sb = {(r.src, r.dst): r.bytes_carried for r in net_slow.link_records()}
    assert fb == pytest.approx(sb)
    assert fb[("gpu0", "gpu1")] == pytest.approx(1.1 * GB)
