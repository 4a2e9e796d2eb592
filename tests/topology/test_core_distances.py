"""Two-level distances to separators (distsim.topology.core_distances) equal
a full reverse Dijkstra for every node and separator where they apply, are
refused where a path through a server beats the switches' own network, and
routes stay those of the per-pair reference either way."""
import random

import networkx as nx
import pytest

from distsim.topology import load_topology
from distsim.topology.builders import add_duplex, build_dgx
from distsim.topology.core_distances import INF, two_level
from distsim.topology.routing import reverse_dijkstra_all

from test_routing_equivalence import _assert_same, _fresh, _pairs


def _every_distance_matches(topo):
    oracle = topo._routing_oracle()
    levels = oracle.levels()
    assert levels is not None
    for s in oracle.separators:
        exact = reverse_dijkstra_all(oracle.radj, s)
        column = levels.through([(s, 0)])
        assert [column[v] for v in range(len(exact))] == list(exact), topo._names[s]


@pytest.mark.parametrize("params", [
    {"nodes": 6, "nodes_per_leaf": 2, "spines": 3, "network": "fat-tree",
     "oversubscription": 2.0},
    {"nodes": 5, "nodes_per_leaf": 2, "spines": 2, "network": "rail"},
    {"nodes": 4, "network": "single"},
])
def test_two_level_distances_equal_a_full_search(params):
    _every_distance_matches(_fresh(build_dgx(params)))


def test_the_default_clusters_take_the_two_level_path():
    for name in ("dgx-a100-x4", "dgx-a100-x16"):
        assert load_topology(name)._routing_oracle().levels() is not None


def _server_shortcut() -> nx.DiGraph:
    """Two servers whose NICs sit on two leaves joined by a slow spine: a
    path leaf a -> NIC -> GPU -> NVSwitch -> GPU -> NIC -> leaf b through
    a server is cheaper than leaf a -> spine -> leaf b."""
    g = nx.DiGraph()
    for n in range(2):
        g.add_node(f"nvs{n}", kind="switch", node_index=n)
        for k in range(2):
            rank = 2 * n + k
            g.add_node(f"gpu{rank}", kind="device", rank=rank, node_index=n)
            g.add_node(f"nic{rank}", kind="nic", node_index=n)
            add_duplex(g, f"gpu{rank}", f"nvs{n}", 300e9, 0.5e-6)
            add_duplex(g, f"gpu{rank}", f"nic{rank}", 100e9, 0.5e-6)
            add_duplex(g, f"nic{rank}", f"leaf{k}", 100e9, 1e-6)
    g.add_node("leaf0", kind="switch")
    g.add_node("leaf1", kind="switch")
    g.add_node("spine", kind="switch")
    add_duplex(g, "leaf0", "spine", 1e9, 1e-6)
    add_duplex(g, "leaf1", "spine", 1e9, 1e-6)
    return g


def test_a_cheaper_way_through_a_server_falls_back_to_the_full_table():
    t = _fresh(_server_shortcut())
    oracle = t._routing_oracle(separators=["leaf0", "leaf1", "spine"])
    assert oracle.levels() is None
    # the routes between servers cross the other server, as the reference says
    _assert_same(t, _pairs(t))


@pytest.mark.parametrize("seed", range(3))
def test_random_separator_sets_are_exact_or_refused(seed):
    """Any separator set: where the two levels are taken, every distance
    equals the full search's; routes always equal the reference."""
    rnd = random.Random(seed)
    g = build_dgx({"nodes": 3, "nodes_per_leaf": 2, "spines": 2})
    t = _fresh(g)
    nodes = sorted(g.nodes)
    seps = rnd.sample(nodes, rnd.randrange(1, len(nodes) // 3))
    oracle = t._routing_oracle(separators=seps)
    if oracle.levels() is not None:
        _every_distance_matches(t)
    _assert_same(t, _pairs(t, limit=200, seed=seed), keys=(0, 5))


def test_unreachable_separators_read_inf():
    # one leaf reachable from nowhere else: the core is not connected
    adj = [[(1, 1)], [(0, 1)], [(3, 1)], [(2, 1)]]     # 0-1 and 2-3, separators 1 and 3
    levels = two_level(adj, [1, 3])
    assert levels is not None       # no region touches two separators: nothing to check
    to_1, to_3 = levels.through([(1, 0)]), levels.through([(3, 0)])
    assert to_3[0] == INF and to_1[0] == 1 and to_1[1] == 0
