"""Topology files, builders, routing and bad input."""

import pytest

from distsim.errors import ConfigError, TopologyError
from distsim.topology import TOPOLOGY_DIR, load_topology

FILES = sorted(TOPOLOGY_DIR.glob("*.yaml"))


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_every_topology_file_loads_and_verifies(path):
    t = load_topology(str(path))
    assert t.num_devices >= 2
    assert t.ranks == list(range(t.num_devices))
    for r in t.ranks:      # every device reaches its neighbours both ways
        nxt = (r + 1) % t.num_devices
        for a, b in ((r, nxt), (nxt, r)):
            route = t.route(a, b)
            assert route[0][0] == t.device_node(a) and route[-1][1] == t.device_node(b)
            assert t.path_bandwidth_Bps(route) > 0
    assert t.device_spec.memory_bytes > 0
    assert t.describe(bisection=t.num_devices <= 64)["num_devices"] == t.num_devices


def test_dgx_a100_figures():
    t = load_topology("dgx-a100")
    assert (t.num_devices, t.num_nodes, t.devices_per_node) == (8, 1, 8)
    route = t.route(0, 5)
    assert route == (("gpu0", "nvswitch0"), ("nvswitch0", "gpu5"))
    assert t.path_bandwidth_Bps(route) == 300e9
    assert t.path_latency_s(route) == pytest.approx(1e-6)
    assert t.device_spec.peak_flops["bf16"] == 312e12
    assert t.device_spec.memory_bandwidth_Bps == 2.039e12
    kinds = {k for _, k in t.graph.nodes(data="kind")}
    assert kinds == {"device", "switch", "nic", "host"}
    # 4 GPUs on each side, 300 GB/s each into the NVSwitch, plus the two PCIe
    # switches of each half at 32 GB/s each up to the host
    assert t.bisection_bandwidth_Bps() == pytest.approx(4 * 300e9 + 2 * 32e9)


def test_cluster_names_build_n_nodes():
    t = load_topology("dgx-a100-x4")
    assert (t.num_devices, t.num_nodes, t.devices_per_node) == (32, 4, 8)
    assert t.node_of(9) == 1 and t.device_node(9) == "gpu9"
    route = t.route(1, 9)        # same rail, other node: through NICs and the rail leaf
    names = [a for a, _ in route] + [route[-1][1]]
    assert "nic1" in names and "leaf1.0" in names and "nic9" in names
    assert t.path_bandwidth_Bps(route) == 25e9
    assert load_topology("dgx-h100-x2").num_devices == 16


def test_routes_are_cached_and_deterministic():
    t = load_topology("dgx-a100-x2")
    assert t.route(3, 12, key=5) is t.route(3, 12, key=5)
    assert t.route(0, 0) == ()


def _write(tmp_path, text, name="x.yaml"):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


DEVICE = """device: {name: toy, peak_flops: {f32: 1.0e+12}, memory_bandwidth_Bps: 1.0e+12,
         memory_bytes: 1.0e+9}
"""


def test_bad_bandwidth_names_file_and_field(tmp_path):
    path = _write(tmp_path, DEVICE + """devices: [a, b]
links:
  - {src: a, dst: b, bandwidth_GBps: 10, latency_us: 1}
  - {src: b, dst: a, bandwidth_GBps: 10, latency_us: 1}
  - {src: a, dst: b, bandwidth_GBps: 0, latency_us: 1}
""")
    with pytest.raises(ConfigError,
                       match=r"x\.yaml: links\[2\]\.bandwidth_GBps: must be positive, got 0$"):
        load_topology(path)


def test_missing_fields(tmp_path):
    with pytest.raises(ConfigError, match=r"x\.yaml: device: missing required field"):
        load_topology(_write(tmp_path, "devices: [a, b]\nlinks: []\n"))
    with pytest.raises(ConfigError, match=r"links\[0\]\.dst: missing required field"):
        load_topology(_write(tmp_path, DEVICE + "devices: [a, b]\nlinks: [{src: a}]\n"))
    with pytest.raises(ConfigError, match=r"links\[0\]: give exactly one of bandwidth_GBps"):
        load_topology(_write(tmp_path, DEVICE + "devices: [a, b]\nlinks: [{src: a, dst: b}]\n"))
    with pytest.raises(ConfigError, match=r"device\.memory_bytes: missing required field"):
        load_topology(_write(tmp_path, "device: {name: t, peak_flops: {f32: 1}, "
                                       "memory_bandwidth_Bps: 1}\nbuilder: star\n"))


def test_unreachable_devices_are_named(tmp_path):
    path = _write(tmp_path, DEVICE + """devices: {count: 4}
links:
  - {src: "gpu{0..1}", dst: "gpu{1..2}", bandwidth_GBps: 10, latency_us: 1}
""")
    with pytest.raises(TopologyError, match="devices gpu0 and gpu3 cannot reach each other"):
        load_topology(path)


def test_one_way_link_is_unreachable(tmp_path):
    path = _write(tmp_path, DEVICE + """devices: [a, b]
links: [{src: a, dst: b, bandwidth_GBps: 10, latency_us: 1, duplex: false}]
""")
    with pytest.raises(TopologyError, match="devices a and b cannot reach"):
        load_topology(path)


def test_unknown_node_in_link(tmp_path):
    path = _write(tmp_path, DEVICE + "devices: [a, b]\nlinks: [{src: a, dst: c, "
                                     "bandwidth_GBps: 1, latency_us: 0}]\n")
    with pytest.raises(TopologyError, match=r"links\[0\]\.dst: unknown node 'c'"):
        load_topology(path)


def test_malformed_yaml_and_unknown_names(tmp_path):
    with pytest.raises(ConfigError, match=r"x\.yaml:2:"):
        load_topology(_write(tmp_path, "name: x\n  bad: [\n"))
    with pytest.raises(ConfigError, match="unknown topology 'nope'.*dgx-a100"):
        load_topology("nope")
    with pytest.raises(ConfigError, match="topology file not found"):
        load_topology(str(tmp_path / "missing.yaml"))
    with pytest.raises(ConfigError, match=r"params\.nodes: must be a positive integer"):
        load_topology(_write(tmp_path, DEVICE + "builder: dgx\nparams: {nodes: 0}\n"))


def test_pcie_builder_and_explicit_file_agree():
    built, explicit = load_topology("pcie-tree-4gpu"), load_topology("workstation-4gpu-pcie")
    assert sorted(built.graph.edges) == sorted(explicit.graph.edges)
    route = built.route(0, 3)
    assert [a for a, _ in route] == ["gpu0", "pcie0", "host0", "pcie1"]
    assert built.path_bandwidth_Bps(route) == 32e9


def test_torus_neighbours_and_ecmp():
    t = load_topology("torus-4x4")
    assert t.num_devices == 16 and t.graph.out_degree("gpu0") == 4
    assert len(t.route(0, 1)) == 1 and len(t.route(0, 3)) == 1      # wrap-around
    # (0,0) -> (2,2): four hops, over several equal paths chosen by key
    paths = {t.route(0, 10, key=k) for k in range(16)}
    assert all(len(p) == 4 for p in paths) and len(paths) > 1
    assert load_topology("torus-4x4x4").graph.out_degree("gpu0") == 6


def test_with_ranks_first_renumbers_devices_and_keeps_the_links():
    """Ranks 0 and 8 of two DGX nodes become 0 and 1: the route between
    them is the old cross-node one, and every other device keeps its
    relative order after them."""
    from distsim.topology import load_topology
    topo = load_topology("dgx-a100-x2")
    moved = topo.with_ranks_first([0, 8])
    assert moved.device_node(0) == topo.device_node(0)
    assert moved.device_node(1) == topo.device_node(8)
    assert [moved.device_node(r) for r in range(2, 9)] == \
        [topo.device_node(r) for r in range(1, 8)]
    old, new = topo.route(0, 8), moved.route(0, 1)
    assert topo.path_latency_s(old) == pytest.approx(moved.path_latency_s(new))
    assert topo.path_bandwidth_Bps(old) == pytest.approx(moved.path_bandwidth_Bps(new))
    assert moved.node_of(1) != moved.node_of(0)
    with pytest.raises(TopologyError, match="repeat"):
        topo.with_ranks_first([3, 3])
