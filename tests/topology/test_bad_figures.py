"""Bad figures in a topology file are one ConfigError/TopologyError naming
the file and the field, never a silently wrong number or a crash later:
NaN, infinity and ints too large for a float in the device block and in
links; figures outside the ranges that keep every derived time finite
(a link slower than 10 B/s would overflow the routing costs)."""
from __future__ import annotations

import networkx as nx
import pytest

from distsim.cost.device import FIGURE_RANGES, device_spec_from_dict
from distsim.errors import ConfigError, TopologyError
from distsim.topology import Topology
from distsim.topology.builders import MAX_NODES
from distsim.topology.loader import topology_from_dict
from distsim.topology.routing import INF
from distsim.topology.topology import MAX_LATENCY_s, MAX_LINK_COST, MIN_BANDWIDTH_Bps, link_cost

DEVICE = {"name": "t", "peak_flops": {"f16": 1e12}, "memory_bandwidth_Bps": 1e12,
          "memory_bytes": 1e9}
NAN, INFINITY = float("nan"), float("inf")


def _topology(device=None, link=None, builder=None):
    data = {"name": "t", "device": {**DEVICE, **(device or {})}}
    if builder is not None:
        data.update(builder=builder[0], params=builder[1])
    else:
        # ``link`` overrides the figures of the one duplex link; None drops a key
        fields = {"src": "g0", "dst": "g1", "bandwidth_GBps": 10, "latency_us": 1, **(link or {})}
        data.update(devices=["g0", "g1"],
                    links=[{k: v for k, v in fields.items() if v is not None}])
    return topology_from_dict(data, "bad.yaml")


@pytest.mark.parametrize("field", ["memory_bandwidth_Bps", "memory_bytes", "launch_overhead_s",
                                   "matmul_efficiency", "vector_efficiency", "memory_efficiency"])
@pytest.mark.parametrize("value, shown", [(NAN, "nan"), (INFINITY, "inf"), (-INFINITY, "-inf"),
                                          (10 ** 400, "an integer of about 401 digits")])
def test_non_finite_device_figures_name_file_and_field(field, value, shown):
    with pytest.raises(ConfigError) as info:
        _topology(device={field: value})
    assert str(info.value) == f"bad.yaml: device.{field}: must be a finite number, got {shown}"


@pytest.mark.parametrize("value", [NAN, INFINITY, -INFINITY])
def test_non_finite_peak_flops_name_the_dtype(value):
    with pytest.raises(ConfigError, match=r"^bad\.yaml: device\.peak_flops\.bf16: must be a "
                                          r"finite number, got -?(nan|inf)$"):
        _topology(device={"peak_flops": {"f16": 1e12, "bf16": value}})


@pytest.mark.parametrize("field, value, message", [
    ("peak_flops", {"f16": 0.5}, "peak_flops.f16: must be at least 1, got 0.5"),
    ("peak_flops", {"f16": 0}, "peak_flops.f16: must be positive, got 0"),
    ("peak_flops", {"f16": -3.0}, "peak_flops.f16: must be positive, got -3.0"),
    ("memory_bandwidth_Bps", 1e-300, "memory_bandwidth_Bps: must be at least 1, got 1e-300"),
    ("memory_bytes", 0, "memory_bytes: must be positive, got 0"),
    ("memory_bytes", 2e18, "memory_bytes: must be between 1 and 1e+18, got 2e+18"),
    ("launch_overhead_s", 2.0, "launch_overhead_s: must be between 0 and 1, got 2.0"),
    ("launch_overhead_s", -1e-6, "launch_overhead_s: must be >= 0, got -1e-06"),
    ("matmul_efficiency", 0, "matmul_efficiency: must be in (0, 1], got 0"),
    ("memory_efficiency", 1.5, "memory_efficiency: must be in (0, 1], got 1.5"),
])
def test_device_figures_out_of_range(field, value, message):
    with pytest.raises(ConfigError) as info:
        _topology(device={field: value})
    assert str(info.value) == f"bad.yaml: device.{message}"


def test_the_edges_of_the_ranges_are_accepted():
    spec = device_spec_from_dict({**DEVICE, "peak_flops": {"f16": 1}, "memory_bandwidth_Bps": 1,
                                  "memory_bytes": 1e18, "launch_overhead_s": 0.0,
                                  "matmul_efficiency": 1}, "ok.yaml: device")
    assert spec.peak_flops == {"f16": 1.0} and spec.memory_bytes == 10 ** 18
    spec = device_spec_from_dict({**DEVICE, "launch_overhead_s": 1.0}, "ok.yaml: device")
    assert spec.launch_overhead_s == 1.0
    spec = device_spec_from_dict({**DEVICE, "host_launch_s": 1.0}, "ok.yaml: device")
    assert spec.host_launch_s == 1.0
    assert device_spec_from_dict({**DEVICE, "host_launch_s": 0}, "ok.yaml: device"
                                 ).host_launch_s == 0.0
    assert set(FIGURE_RANGES) == {"peak_flops", "memory_bandwidth_Bps", "memory_bytes",
                                  "launch_overhead_s", "host_launch_s", "matmul_efficiency",
                                  "vector_efficiency", "memory_efficiency",
                                  "memory_efficiency_by_op"}


@pytest.mark.parametrize("by_op, message", [
    ({"layernorm": 0}, "device.memory_efficiency_by_op.layernorm: must be in (0, 1], got 0"),
    ({"layernorm": 1.5}, "device.memory_efficiency_by_op.layernorm: must be in (0, 1], got 1.5"),
    ({"softmax": NAN}, "device.memory_efficiency_by_op.softmax: must be a finite number, got nan"),
    ({"softmax": "fast"}, "device.memory_efficiency_by_op.softmax: expected a number, got 'fast'"),
    ({"layer_norm": 0.5}, "device.memory_efficiency_by_op.layer_norm: unknown op type"),
    ([0.5], "device.memory_efficiency_by_op: expected a mapping of op type to a fraction"),
])
def test_bad_per_op_memory_efficiency_names_the_op(by_op, message):
    with pytest.raises(ConfigError) as info:
        _topology(device={"memory_efficiency_by_op": by_op})
    assert str(info.value).startswith(f"bad.yaml: {message}")


# -- links ----------------------------------------------------------------------

@pytest.mark.parametrize("key, value, shown", [
    ("bandwidth_GBps", NAN, "nan"), ("bandwidth_GBps", INFINITY, "inf"),
    ("bandwidth_GBps", 1e300, "1e+300"),          # finite, but x 1e9 B/s is not
    ("bandwidth_Bps", 10 ** 400, None), ("latency_us", INFINITY, "inf"),
])
def test_non_finite_link_figures_name_the_field(key, value, shown):
    other = "bandwidth_GBps" if key.startswith("bandwidth") else "latency_us"
    with pytest.raises(ConfigError) as info:
        _topology(link={other: None, key: value})
    text = str(info.value)
    assert text.startswith(f"bad.yaml: links[0].{key}: must be a finite number, got ")
    if shown is not None:
        assert text.endswith(f"got {shown}")
    assert len(text) < 200


def test_routing_costs_cannot_overflow():
    # the slowest link's cost times the longest possible path stays below
    # the routing's "unreachable" marker
    assert link_cost(MIN_BANDWIDTH_Bps) == MAX_LINK_COST
    assert MAX_LINK_COST * MAX_NODES < INF


def test_a_link_slower_than_the_minimum_is_a_topology_error():
    with pytest.raises(TopologyError) as info:
        _topology(link={"bandwidth_GBps": 1.0e-300})
    assert str(info.value) == ("bad.yaml: link g0 -> g1: bandwidth_Bps 1e-291 is below the "
                               "minimum of 10 B/s (its routing cost would overflow)")
    with pytest.raises(TopologyError, match=r"bad\.yaml: link .* is below the minimum"):
        _topology(builder=("star", {"devices": 2, "link_GBps": 1.0e-300}))
    with pytest.raises(TopologyError, match="below the minimum"):
        _topology(link={"bandwidth_GBps": None, "bandwidth_Bps": 9.99})


def test_a_link_at_the_minimum_routes_and_carries_traffic():
    # a chain g0 - s - g1 at exactly 10 B/s: each hop costs MAX_LINK_COST
    topo = _topology(link={"bandwidth_GBps": None, "bandwidth_Bps": MIN_BANDWIDTH_Bps})
    assert topo.route(0, 1) == (("g0", "g1"),)
    assert topo.path_bandwidth_Bps(topo.route(1, 0)) == 10.0


def test_latency_past_an_hour_is_refused():
    with pytest.raises(TopologyError, match=r"link g0 -> g1: latency_s 3601\.0 is more than the "
                                            r"maximum of 3600 s"):
        _topology(link={"latency_us": None, "latency_s": 3601.0})
    assert _topology(link={"latency_us": None, "latency_s": MAX_LATENCY_s}).link(
        "g0", "g1")["latency_s"] == 3600.0


@pytest.mark.parametrize("cost", [0, -1, 2.5, "x", NAN, INFINITY, 10 ** 13, True])
def test_bad_routing_costs_are_refused(cost):
    with pytest.raises((TopologyError, ConfigError), match=r"link g0 -> g1: cost must be an "
                                                           r"integer from 1 to 1e\+12"):
        _topology(link={"cost": cost})


def test_a_hand_built_graph_is_checked_too():
    g = nx.DiGraph()
    g.add_node("a", kind="device", rank=0)
    g.add_node("b", kind="device", rank=1)
    g.add_edge("a", "b", bandwidth_Bps=1.0, latency_s=0.0)
    g.add_edge("b", "a", bandwidth_Bps=1e9, latency_s=0.0)
    spec = device_spec_from_dict(DEVICE, "x")
    with pytest.raises(TopologyError, match="link a -> b: bandwidth_Bps 1.0 is below the minimum"):
        Topology("hand", g, spec)


@pytest.mark.parametrize("value", [10 ** 400, NAN, INFINITY])
def test_builder_parameters_too_large_for_a_float(value):
    with pytest.raises(ConfigError, match=r"^bad\.yaml: params\.link_GBps: must be a positive "
                                          r"number, got "):
        _topology(builder=("star", {"devices": 2, "link_GBps": value}))
