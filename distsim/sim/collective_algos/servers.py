"""A team split by server: what two-level and multi-channel algorithms
need of the topology."""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence


def node_groups(team: Sequence[int], topology) -> Optional[List[List[int]]]:
    """The team split by server (in team order), or None where it is not
    split evenly over several servers with several ranks each (one server,
    one rank per server, unequal groups)."""
    groups: Dict[int, List[int]] = {}
    for r in team:
        groups.setdefault(topology.node_of(r), []).append(r)
    sizes = {len(g) for g in groups.values()}
    if len(groups) < 2 or len(sizes) != 1 or sizes == {1}:
        return None
    return list(groups.values())


def server_groups(team: Sequence[int], network) -> Optional[List[List[int]]]:
    """:func:`node_groups`, kept per topology and team
    (:attr:`~distsim.sim.network.Network.team_plans`: the same at every
    size; do not modify the lists)."""
    known = network.team_plans
    key = ("servers", tuple(team))
    if key not in known:
        known[key] = node_groups(team, network.topology)
    return known[key]
