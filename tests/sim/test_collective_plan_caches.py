"""What a collective's plan keeps per topology and team, whatever its size
(a sweep times each team at dozens of sizes): the team's check, the
hierarchical levels, a tree's bounds and edges. Each is checked here against
the plan made with nothing kept, and a bad team still gets its error."""
from __future__ import annotations

import pytest
import simpy

from distsim.errors import ConfigError, TopologyError
from distsim.ir.comm import CollectiveType
from distsim.sim import collectives as coll
from distsim.sim.collective_algos import hierarchical, tree
from distsim.sim.network import Network
from distsim.sim.route_table import _ROUTE_TABLES
from distsim.topology import load_topology

AR, AG = CollectiveType.ALL_REDUCE, CollectiveType.ALL_GATHER


def _network(topo) -> Network:
    return Network(simpy.Environment(), topo, mode="analytical", link_stats=False)


def _forget(topo) -> None:
    _ROUTE_TABLES.pop(topo, None)        # the topology's routes and team plans
    tree._tree_edges.cache_clear()


def test_a_bad_team_is_refused_after_a_good_one_like_it_was_kept():
    topo = load_topology("dgx-a100-x2")
    net = _network(topo)
    coll.check_team(net, AR, (1, 2), None)
    with pytest.raises(TopologyError, match="team rank True is not a device"):
        coll.check_team(net, AR, (True, 2), None)       # equal to (1, 2) as a key
    with pytest.raises(TopologyError, match="team rank 99 is not a device"):
        coll.check_team(net, AR, (1, 99), None)
    with pytest.raises(ConfigError, match="names a rank twice"):
        coll.check_team(net, AR, (1, 2, 1), None)
    with pytest.raises(TopologyError, match=r"team rank \[1\] is not a device"):
        coll.check_team(net, AR, ([1], 2), None)          # unhashable: named, not a TypeError


@pytest.mark.parametrize("algo, kind, team", [
    (tree.double_tree_allreduce, AR, tuple(range(0, 16))),
    (tree.double_tree_allreduce, AR, tuple(range(15, -1, -2))),
    (hierarchical.hierarchical_allreduce, AR, tuple(range(0, 16))),
    (hierarchical.hierarchical_allgather, AG, tuple(range(0, 16, 2))),
    (hierarchical.hierarchical_allreduce, AR, (0, 1, 2, 8)),      # unequal groups: None
])
def test_plans_kept_per_team_are_the_plans_made_afresh(algo, kind, team):
    topo = load_topology("dgx-a100-x2")
    sizes = [3e3, 7e5, 123456789.0, 2e9]
    fresh = []
    for nbytes in sizes:
        _forget(topo)
        fresh.append(algo(team, nbytes, None, _network(topo)))
    _forget(topo)
    net = _network(topo)
    kept = [algo(team, nbytes, None, net) for nbytes in sizes]
    assert kept == fresh
    if algo is tree.double_tree_allreduce:      # the chunk count is each size's own
        assert len(fresh[0]) != len(fresh[-1])
