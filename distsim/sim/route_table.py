"""What every network over one topology shares: its links numbered on
first use, the routes found over them, and what collectives work out on it
whatever the network (team plans, step loads, times alone, ``auto``'s
choices). A sweep times thousands of collectives, each on a network of its
own; each used to route its flows again."""
from __future__ import annotations

import weakref
from typing import Any, Dict, List, Tuple

from ..topology import Topology


class RouteTable:
    """A topology's links, routes and collective plans (see the module
    docstring); one per topology (:func:`route_table`)."""

    __slots__ = ("edges", "edge_index", "capacity", "routes", "route_infos",
                 "analytical_shapes", "step_loads", "team_plans", "solo_times",
                 "together_times",
                 "algorithm_choices", "flow_links", "step_shapes", "flow_loads",
                 "protocol_choices",
                 "__weakref__")

    def __init__(self) -> None:
        self.edges: List[Tuple[str, str]] = []
        self.edge_index: Dict[Tuple[str, str], int] = {}
        self.capacity: List[float] = []
        #: (src, dst, key) -> (link ids, path latency, bottleneck bandwidth)
        self.routes: Dict[Tuple[int, int, int], Tuple[Tuple[int, ...], float, float]] = {}
        #: (src, dst, key) -> (link ids, path latency, link capacities)
        self.route_infos: Dict[Tuple[int, int, int],
                               Tuple[Tuple[int, ...], float, Tuple[float, ...]]] = {}
        #: ((src, dst) pairs of a step, route key) -> each distinct
        #: (path latency, bottleneck bandwidth) of its flows
        self.analytical_shapes: Dict[tuple, Tuple[Tuple[float, float], ...]] = {}
        #: the (src, dst) pairs of a step -> its load on the links, for the
        #: bounds of :mod:`.solo_bounds`
        self.step_loads: Dict[Tuple[Tuple[int, int], ...], tuple] = {}
        #: what a collective's plan works out for a team whatever its size
        #: (its check, its server groups, a tree's bounds), by (what, team...):
        #: each team is planned at many sizes (:mod:`.collective_plan`)
        self.team_plans: Dict[tuple, Any] = {}
        #: (mode, kind, team, bytes, root, algorithm) -> (seconds, algorithm
        #: that ran) of a collective run alone (:mod:`.solo_time`)
        self.solo_times: Dict[tuple, Tuple[float, str]] = {}
        #: (mode, items, algorithm) -> each item's end, of collectives run
        #: together from their own starts (:func:`.solo_time.run_together`)
        self.together_times: Dict[tuple, Tuple[float, ...]] = {}
        #: (kind, team, bytes, root) -> the algorithm ``auto`` runs
        self.algorithm_choices: Dict[tuple, str] = {}
        #: (src, dst) -> (transport, bandwidth) of the route's slowest link
        #: (:func:`.protocols.flow_link`)
        self.flow_links: Dict[Tuple[int, int], Tuple[str, float]] = {}
        #: the (src, dst) pairs of a step -> what a protocol needs of their
        #: routes (:mod:`.protocols`)
        self.step_shapes: Dict[Tuple[Tuple[int, int], ...], Any] = {}
        #: the (src, dst) pairs of a step of unequal flows -> its flows' and
        #: links' loads as arrays (:class:`.solo_bounds._FlowLoads`)
        self.flow_loads: Dict[Tuple[Tuple[int, int], ...], tuple] = {}
        #: (kind, team, bytes, root, algorithm) -> the protocol it runs with
        self.protocol_choices: Dict[tuple, str] = {}


_ROUTE_TABLES: "weakref.WeakKeyDictionary[Topology, RouteTable]" = weakref.WeakKeyDictionary()


def route_table(topology: Topology) -> RouteTable:
    """The :class:`RouteTable` every network over ``topology`` shares."""
    table = _ROUTE_TABLES.get(topology)
    if table is None:
        table = _ROUTE_TABLES[topology] = RouteTable()
    return table
