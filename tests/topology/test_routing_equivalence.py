"""Shared-distance routing (distsim.topology.routing) finds exactly the routes
of the original per-pair search, ECMP choices included.

The reference below is the original algorithm (one bounded reverse Dijkstra
per (src, dst) pair, then the ECMP walk), kept here verbatim so that the
routes are compared with what it computes, not with hard-coded paths.
"""
import heapq
import math
import random

import pytest

from distsim.topology import Topology, load_topology, stable_hash
from distsim.topology.builders import build_dgx, build_star, build_torus
from distsim.topology.routing import (INF, reverse_dijkstra_all, reverse_distances_batch)


def _reference_dijkstra(adj, start, stop):
    dist = {start: 0}
    done = {}
    heap = [(0, start)]
    limit = math.inf
    while heap:
        d, u = heapq.heappop(heap)
        if u in done:
            continue
        if d > limit:
            break
        done[u] = d
        if u == stop:
            limit = d
        for v, c in adj.get(u, ()):
            nd = d + c
            if nd < dist.get(v, math.inf) and nd <= limit:
                dist[v] = nd
                heapq.heappush(heap, (nd, v))
    return done


def reference_route(topo, src_rank, dst_rank, key=0):
    """The original Topology.route: a bounded search per pair."""
    src, dst = topo.device_node(src_rank), topo.device_node(dst_rank)
    if src == dst:
        return ()
    to_dst = _reference_dijkstra(topo._radj, dst, stop=src)
    total = to_dst[src]
    path = []
    node, spent = src, 0
    while node != dst:
        choices = [v for v, c in topo._adj[node]
                   if spent + c + to_dst.get(v, math.inf) == total]
        nxt = choices[stable_hash(src, dst, key, node) % len(choices)] \
            if len(choices) > 1 else choices[0]
        spent += next(c for v, c in topo._adj[node] if v == nxt)
        path.append((node, nxt))
        node = nxt
    return tuple(path)


def _fresh(graph, name="t"):
    """A topology of its own (load_topology shares cached instances)."""
    return Topology(name, graph, load_topology("dgx-a100").device_spec)


def _pairs(topo, limit=None, seed=0):
    n = topo.num_devices
    pairs = [(a, b) for a in range(n) for b in range(n)]
    if limit is not None and len(pairs) > limit:
        pairs = random.Random(seed).sample(pairs, limit)
    return pairs


def _assert_same(topo, pairs, keys=(0, 1, 7)):
    for a, b in pairs:
        for k in keys:
            assert topo.route(a, b, k) == reference_route(topo, a, b, k), (a, b, k)


def test_dgx_a100_x4_routes_unchanged():
    t = load_topology("dgx-a100-x4")
    assert t._routing_oracle().separators           # distances through the network are shared
    _assert_same(t, _pairs(t))


def test_torus_routes_unchanged():
    t = load_topology("torus-4x4")
    _assert_same(t, _pairs(t))
    t3 = load_topology("torus-4x4x4")
    _assert_same(t3, _pairs(t3, limit=600))


@pytest.mark.parametrize("network,spines", [("rail", 2), ("rail", 3), ("fat-tree", 2),
                                            ("single", 1)])
def test_fat_trees_with_ecmp_unchanged(network, spines):
    g = build_dgx({"nodes": 6, "nodes_per_leaf": 2, "spines": spines, "network": network,
                   "oversubscription": 2.0})
    t = _fresh(g)
    assert t._routing_oracle().separators
    _assert_same(t, _pairs(t, limit=700))


def test_ecmp_spreads_over_spines_as_before():
    t = _fresh(build_dgx({"nodes": 4, "nodes_per_leaf": 1, "spines": 4}))
    routes = {t.route(0, 9, key=k) for k in range(32)}
    assert len(routes) > 1
    for k in range(32):
        assert t.route(0, 9, key=k) == reference_route(t, 0, 9, k)


@pytest.mark.parametrize("seed", range(4))
def test_any_separator_set_is_exact(seed):
    """The decomposition is exact for every separator choice, devices included."""
    rnd = random.Random(seed)
    graphs = [build_dgx({"nodes": 3, "nodes_per_leaf": 2, "spines": 2}),
              build_torus({"dims": [4, 3]}), build_star({"devices": 6})]
    for g in graphs:
        t = _fresh(g)
        nodes = sorted(g.nodes)
        seps = rnd.sample(nodes, rnd.randrange(0, max(2, len(nodes) // 3)))
        t._routing_oracle(separators=seps)
        _assert_same(t, _pairs(t, limit=300, seed=seed), keys=(0, 3))


def test_batched_distances_match_dijkstra():
    t = _fresh(build_dgx({"nodes": 3, "nodes_per_leaf": 2, "spines": 2}))
    oracle = t._routing_oracle()
    radj, adj = oracle.radj, oracle.adj
    targets = list(range(0, len(adj), 7))
    table = reverse_distances_batch(adj, targets)
    for j, s in enumerate(targets):
        assert list(table[:, j]) == list(reverse_dijkstra_all(radj, s))
    # a chain longer than the round limit gives None (the caller falls back)
    chain = [[(i + 1, 1)] for i in range(9)] + [[]]
    assert reverse_distances_batch(chain, [9], max_rounds=4) is None
    assert list(reverse_distances_batch(chain, [9])[:, 0]) == list(range(9, -1, -1))
    assert reverse_dijkstra_all([[], []], 0)[1] == INF


def test_separators_are_the_inter_server_network():
    star = _fresh(build_star({"devices": 8}))
    assert [star._names[s] for s in star._routing_oracle().separators] == ["switch0"]
    x2 = _fresh(build_dgx({"nodes": 2}))
    assert {x2._names[s] for s in x2._routing_oracle().separators} == \
        {f"leaf{k}.0" for k in range(8)} | {"spine0"}
    # no inter-server network: one resumable search per destination
    assert load_topology("dgx-a100")._routing_oracle().separators == []
    assert load_topology("torus-4x4")._routing_oracle().separators == []


def test_searches_without_separators_resume_per_destination():
    """Near sources first, then far ones: the search for a destination
    resumes, and the routes still match the per-pair reference."""
    t = _fresh(build_torus({"dims": [6, 6]}))
    for order in (range(1, 36), range(35, 0, -1)):
        for a in order:
            assert t.route(a, 0, 2) == reference_route(t, a, 0, 2)
        t._routing_oracle(separators=[])          # a fresh oracle for the next order


@pytest.mark.parametrize("seed", range(3))
def test_next_hops_in_one_gather_match_one_by_one(monkeypatch, seed):
    """Every node choosing its next hop by the vectorised gather (as core
    switches do) gives the reference routes, whatever the separators:
    the two-level columns, the general table (random separator sets,
    devices among them) and no separators at all (the one-by-one way)."""
    import distsim.topology.topology as topology_module
    monkeypatch.setattr(topology_module, "WIDE_NODE", 1)
    rnd = random.Random(seed)
    graphs = [build_dgx({"nodes": 6, "nodes_per_leaf": 2, "spines": 3, "network": "rail",
                         "oversubscription": 2.0}),
              build_torus({"dims": [4, 3]}), build_star({"devices": 6})]
    for g in graphs:
        for seps in (None, rnd.sample(sorted(g.nodes), len(g.nodes) // 4), []):
            t = _fresh(g)
            if seps is not None:
                t._routing_oracle(separators=seps)
            _assert_same(t, _pairs(t, limit=200, seed=seed), keys=(0, 5))


def test_wide_core_switches_route_as_before():
    """A spine with 80 leaves (past WIDE_NODE) takes the gathered choice and
    still finds the reference routes, ECMP spread included."""
    from distsim.topology.topology import WIDE_NODE
    t = _fresh(build_dgx({"nodes": 80, "nodes_per_leaf": 1, "spines": 2}))
    assert max(len(hops) for hops in t._adj.values()) >= WIDE_NODE
    _assert_same(t, _pairs(t, limit=150, seed=3), keys=(0, 1))


def test_routes_to_one_destination_share_their_next_hops():
    """A node's least-cost next hops toward a destination do not depend on
    where the route started: they are worked out once per (node,
    destination) and shared, and every route, ECMP choice included, is
    still the reference's."""
    t = _fresh(build_dgx({"nodes": 8, "nodes_per_leaf": 2, "spines": 4}))
    n = t.num_devices
    routes = [t.route(a, 0, k) for a in range(1, n) for k in (0, 3)]
    assert routes == [reference_route(t, a, 0, k) for a in range(1, n) for k in (0, 3)]
    hops_walked = {(u, v) for route in routes for u, v in route}
    # each node on those routes worked its choices out once, for device 0
    assert {t._names[node] for node, dst in t._next_hops} == {u for u, _ in hops_walked}
    assert len(t._next_hops) == len({u for u, _ in hops_walked})
    assert sum(map(len, routes)) > 2 * len(t._next_hops)
