"""Hierarchical (two-level) algorithms for teams spanning several servers.

The team is split by server (``topology.node_of``) into groups of equal
size g (in team order); rank k of every group forms rail k. All-reduce is
an intra-node ring reduce-scatter, an inter-node ring all-reduce of S/g on
every rail at once (each rail on its own NIC), and an intra-node ring
all-gather: the fast links carry the bulk, the network only S/g per rank.
All-gather and reduce-scatter use the two levels in the order that keeps
the network message small. Teams inside one server, or with unequal
groups, are not hierarchical: the functions return None.
"""
from __future__ import annotations

from typing import List, Optional, Tuple

from .ring import ring_allgather, ring_allreduce, ring_reducescatter
from .schedule import Schedule, parallel, sequential
from .servers import server_groups


def _each(algo, teams, nbytes, network) -> Schedule:
    return parallel([algo(t, nbytes, None, network) for t in teams])


def _levels(team, network) -> Optional[Tuple[List[List[int]], List[List[int]], int]]:
    """(server groups, rails, group size g), or None where a two-level
    algorithm does not apply (see :func:`.servers.node_groups`); kept per topology
    and team (:attr:`~distsim.sim.network.Network.team_plans`: the same at
    every size; do not modify the lists)."""
    known = network.team_plans
    key = ("levels", tuple(team))
    if key in known:
        return known[key]
    groups = server_groups(team, network)
    levels = None if groups is None else (groups, [list(r) for r in zip(*groups)],
                                          len(groups[0]))
    known[key] = levels
    return levels


def hierarchical_allreduce(team, nbytes, root, network) -> Optional[Schedule]:
    levels = _levels(team, network)
    if levels is None:
        return None
    groups, rails, g = levels
    return sequential(_each(ring_reducescatter, groups, nbytes, network),
                      _each(ring_allreduce, rails, nbytes / g, network),
                      _each(ring_allgather, groups, nbytes, network))


def hierarchical_allgather(team, nbytes, root, network) -> Optional[Schedule]:
    """Rails gather their S/g first (over the network), then each server
    gathers the full S over its fast links."""
    levels = _levels(team, network)
    if levels is None:
        return None
    groups, rails, g = levels
    return sequential(_each(ring_allgather, rails, nbytes / g, network),
                      _each(ring_allgather, groups, nbytes, network))


def hierarchical_reducescatter(team, nbytes, root, network) -> Optional[Schedule]:
    """Each server reduce-scatters S over its fast links, then each rail
    reduce-scatters its S/g over the network."""
    levels = _levels(team, network)
    if levels is None:
        return None
    groups, rails, g = levels
    return sequential(_each(ring_reducescatter, groups, nbytes, network),
                      _each(ring_reducescatter, rails, nbytes / g, network))
