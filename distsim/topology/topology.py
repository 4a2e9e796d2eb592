"""Topology: the hardware as a directed networkx graph, plus routing.

Nodes are display names (``gpu0``, ``nvswitch0``, ``nic3``, ``leaf0.1``)
with a ``kind`` attribute in :data:`NODE_KINDS`; device nodes also carry
``rank`` (0..n-1) and ``node_index`` (the server they sit in). Edges are
directed links with ``bandwidth_Bps`` and ``latency_s`` and optionally a
``transport`` (``nvlink``, ``pcie``, ``network``: which of the
``collectives:`` figures apply to it); a duplex cable is two edges.

Routing is shortest path where each link costs the time a byte takes on it
(an integer, ``ceil(1e13 / bandwidth_Bps)``, like OSPF's reference-bandwidth
cost), so NVLink is preferred over PCIe and equal-cost paths compare exactly.
Among equal-cost next hops a flow picks one by a stable hash of
``(src, dst, key, hop)``: ECMP, deterministic from run to run.

The least costs to a destination come from :mod:`.routing`: one resumable
search per destination, shared by all sources, and where the topology has
an inter-server network, distances through it shared by all destinations
(a 1024-GPU cluster needs tens of graph searches, not one per pair). They
are exact, so the routes are those of a plain per-pair search.
"""
from __future__ import annotations

import math
import zlib
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import networkx as nx
import numpy as np

from ..cost.device import DeviceSpec
from ..errors import TopologyError
from .collective_spec import TRANSPORTS, CollectiveSpec
from .routing import DistancesTo, SeparatorOracle, network_separators

#: nodes with at least this many links choose their next hop in one gather
#: (:meth:`Topology._wide_choices`)
WIDE_NODE = 64

NODE_KINDS = ("device", "switch", "nic", "host")
REFERENCE_BANDWIDTH_Bps = 1e13
#: The largest routing cost of one link: a least-cost path has at most
#: MAX_NODES links, and its summed cost must stay below the routing's
#: "unreachable" marker (2^60), so 10^12 per link leaves room to spare.
MAX_LINK_COST = 10 ** 12
#: The slowest link a topology may have: its cost is
#: REFERENCE_BANDWIDTH_Bps / MIN_BANDWIDTH_Bps = MAX_LINK_COST (10 B/s,
#: far below any real link; a typo such as ``1.0e-300`` is refused).
MIN_BANDWIDTH_Bps = REFERENCE_BANDWIDTH_Bps / MAX_LINK_COST
#: The largest latency of one link (an hour; real links take microseconds),
#: so that a path's summed latency stays finite.
MAX_LATENCY_s = 3600.0
Route = Tuple[Tuple[str, str], ...]


def link_cost(bandwidth_Bps: float) -> int:
    """Routing cost of a link: the integer time a byte takes on it, in units
    of ``1 / REFERENCE_BANDWIDTH_Bps`` seconds (at least 1)."""
    return max(1, math.ceil(REFERENCE_BANDWIDTH_Bps / bandwidth_Bps - 1e-9))


def stable_hash(*parts: Any) -> int:
    """A hash that is the same in every process (unlike ``hash(str)``)."""
    return zlib.crc32("\x1f".join(map(str, parts)).encode("utf-8"))


class Topology:
    """A cluster: devices, switches, NICs and hosts joined by directed links.

    Build one with :func:`distsim.topology.load_topology` or a builder in
    :mod:`distsim.topology.builders`; the constructor checks the graph
    (ranks 0..n-1, positive bandwidths, every device reaching every other).
    """

    def __init__(self, name: str, graph: nx.DiGraph, device_spec: DeviceSpec,
                 source: str = "<memory>", meta: Mapping[str, Any] | None = None,
                 collectives: CollectiveSpec | None = None) -> None:
        self.name = name
        self.graph = graph
        self.device_spec = device_spec
        self.source = source
        self.meta: Dict[str, Any] = dict(meta or {})
        #: what NCCL's protocols cost on these links (the file's
        #: ``collectives:`` block); None: collectives move at the links' rates
        self.collectives = collectives
        self._device_nodes: List[str] = []
        self._node_index: List[int] = []
        self._check()
        self._adj: Dict[str, List[Tuple[str, int]]] = {}
        self._radj: Dict[str, List[Tuple[str, int]]] = {}
        for u, v, data in graph.edges(data=True):
            cost = int(data.get("cost") or link_cost(data["bandwidth_Bps"]))
            self._adj.setdefault(u, []).append((v, cost))
            self._radj.setdefault(v, []).append((u, cost))
        for table in (self._adj, self._radj):
            for hops in table.values():
                hops.sort()
        self._routes: Dict[Tuple[int, int, int], Route] = {}
        self._check_reachable()
        self._oracle: SeparatorOracle | None = None

    # ------------------------------------------------------------------ checks
    def _check(self) -> None:
        where = self.source
        by_rank: Dict[int, str] = {}
        for node, data in self.graph.nodes(data=True):
            kind = data.get("kind")
            if kind not in NODE_KINDS:
                raise TopologyError(f"{where}: node '{node}': kind must be one of "
                                    f"{', '.join(NODE_KINDS)}, got {kind!r}")
            if kind == "device":
                rank = data.get("rank")
                if not isinstance(rank, int) or rank < 0:
                    raise TopologyError(f"{where}: device '{node}': rank must be an int >= 0")
                if rank in by_rank:
                    raise TopologyError(f"{where}: devices '{by_rank[rank]}' and '{node}' "
                                        f"both have rank {rank}")
                by_rank[rank] = node
        if not by_rank:
            raise TopologyError(f"{where}: no devices")
        if sorted(by_rank) != list(range(len(by_rank))):
            missing = sorted(set(range(len(by_rank))) - set(by_rank))
            raise TopologyError(f"{where}: device ranks must be 0..{len(by_rank) - 1}, "
                                f"rank {missing[0]} is missing")
        for u, v, data in self.graph.edges(data=True):
            self._check_link(u, v, data)
        self._device_nodes = [by_rank[r] for r in range(len(by_rank))]
        self._node_index = [int(self.graph.nodes[n].get("node_index", 0))
                            for n in self._device_nodes]

    def _check_link(self, u: str, v: str, data: Mapping[str, Any]) -> None:
        """A link's figures: a finite bandwidth of at least
        :data:`MIN_BANDWIDTH_Bps`, a finite latency of at most
        :data:`MAX_LATENCY_s`, an optional integer routing ``cost`` in
        1..:data:`MAX_LINK_COST`. The bounds keep every route cost and path
        latency finite (a least-cost path has at most :data:`MAX_NODES` links)."""
        where = f"{self.source}: link {u} -> {v}"
        for key, positive in (("bandwidth_Bps", True), ("latency_s", False)):
            val = data.get(key)
            if isinstance(val, bool) or not isinstance(val, (int, float)) or \
                    not math.isfinite(val) or val < 0 or (positive and val == 0):
                need = "positive" if positive else ">= 0"
                raise TopologyError(f"{where}: {key} must be finite and {need}, got {val!r}")
        if data["bandwidth_Bps"] < MIN_BANDWIDTH_Bps:
            raise TopologyError(f"{where}: bandwidth_Bps {data['bandwidth_Bps']!r} is below the "
                                f"minimum of {MIN_BANDWIDTH_Bps:g} B/s (its routing cost would "
                                f"overflow)")
        if data["latency_s"] > MAX_LATENCY_s:
            raise TopologyError(f"{where}: latency_s {data['latency_s']!r} is more than the "
                                f"maximum of {MAX_LATENCY_s:g} s")
        transport = data.get("transport")
        if transport is not None and transport not in TRANSPORTS:
            raise TopologyError(f"{where}: transport must be one of {', '.join(TRANSPORTS)}, "
                                f"got {transport!r}")
        cost = data.get("cost")
        if cost is not None:
            if isinstance(cost, bool) or not isinstance(cost, (int, float)) or \
                    not math.isfinite(cost) or not float(cost).is_integer() or \
                    not 1 <= cost <= MAX_LINK_COST:
                raise TopologyError(f"{where}: cost must be an integer from 1 to "
                                    f"{MAX_LINK_COST:g}, got {cost!r}")

    def _check_reachable(self) -> None:
        """Every device reaches every other one: the devices all lie in one
        strongly connected component."""
        first = self._device_nodes[0]
        comp = next(c for c in nx.strongly_connected_components(self.graph) if first in c)
        cut = [n for n in self._device_nodes if n not in comp]
        if cut:
            names = ", ".join(cut[:4]) + (" ..." if len(cut) > 4 else "")
            raise TopologyError(f"{self.source}: devices {first} and {names} cannot reach "
                                f"each other (no path both ways)")

    # ------------------------------------------------------------------ devices
    @property
    def num_devices(self) -> int:
        return len(self._device_nodes)

    @property
    def ranks(self) -> List[int]:
        return list(range(self.num_devices))

    @property
    def num_nodes(self) -> int:
        """Number of servers (distinct ``node_index`` values)."""
        return len(set(self._node_index))

    @property
    def devices_per_node(self) -> int:
        counts: Dict[int, int] = {}
        for n in self._node_index:
            counts[n] = counts.get(n, 0) + 1
        return max(counts.values())

    def device_node(self, rank: int) -> str:
        """The graph node name of device ``rank``."""
        self.check_rank(rank)
        return self._device_nodes[rank]

    def node_of(self, rank: int) -> int:
        """The server index device ``rank`` sits in."""
        self.check_rank(rank)
        return self._node_index[rank]

    def ranks_on_node(self, node_index: int) -> List[int]:
        return [r for r, n in enumerate(self._node_index) if n == node_index]

    def with_ranks_first(self, ranks: Sequence[int]) -> "Topology":
        """The same cluster with the devices of ``ranks`` renumbered
        ``0..len(ranks)-1`` (in that order) and the others after them in
        their own order: a program written for ranks ``0..k-1`` then runs
        on those devices (the sweep estimator times one tensor-parallel
        group of a mesh order that spreads it, e.g. ``dp-tp-pp``, so)."""
        for r in ranks:
            self.check_rank(r)
        first = set(ranks)
        if len(first) != len(ranks):
            raise TopologyError(f"{self.source}: ranks {list(ranks)} repeat a device")
        order = list(ranks) + [r for r in range(self.num_devices) if r not in first]
        graph = self.graph.copy()
        for new, old in enumerate(order):
            graph.nodes[self._device_nodes[old]]["rank"] = new
        return Topology(self.name, graph, self.device_spec, self.source, self.meta,
                        self.collectives)

    def check_rank(self, rank: int) -> None:
        if isinstance(rank, bool) or not isinstance(rank, int) or \
                not 0 <= rank < len(self._device_nodes):
            raise TopologyError(f"topology '{self.name}' has no device rank {rank!r} "
                                f"(ranks 0..{len(self._device_nodes) - 1})")

    # ------------------------------------------------------------------ routing
    def route(self, src_rank: int, dst_rank: int, key: int = 0) -> Route:
        """The directed edges from device ``src_rank`` to ``dst_rank`` along a
        least-cost path; equal-cost choices are spread by a stable hash of
        ``(src, dst, key)`` (ECMP). Cached."""
        cache_key = (src_rank, dst_rank, key)
        hit = self._routes.get(cache_key)
        if hit is not None:
            return hit
        src, dst = self.device_node(src_rank), self.device_node(dst_rank)
        route = self._ecmp_route(src, dst, key) if src != dst else ()
        self._routes[cache_key] = route
        return route

    def _ecmp_route(self, src: str, dst: str, key: int) -> Route:
        """Walk from ``src`` to ``dst`` over links that keep the least cost,
        choosing among equal ones by the stable hash."""
        oracle = self._routing_oracle()
        names, adj = self._names, self._iadj
        s, t = self._index[src], self._index[dst]
        to_dst = oracle.to(t)
        total = to_dst.reach(s)
        path: List[Tuple[str, str]] = []
        node, spent = s, 0
        # a node on a least-cost path is ``total - spent`` from ``dst``, so
        # its next hops that keep the least cost depend on the node and
        # ``dst`` only: routes to one destination share them
        hops = self._next_hops
        while node != t:
            choices = hops.get((node, t))
            if choices is None:
                choices = self._wide_choices(node, to_dst, total - spent) \
                    if len(adj[node]) >= WIDE_NODE else None
                if choices is None:
                    choices = [(v, c) for v, c in adj[node] if spent + c + to_dst(v) == total]
                hops[(node, t)] = choices
            v, c = choices[stable_hash(src, dst, key, names[node]) % len(choices)] \
                if len(choices) > 1 else choices[0]
            spent += c
            path.append((names[node], names[v]))
            node = v
        return tuple(path)

    def _wide_choices(self, node: int, to_dst: DistancesTo, remaining: int
                      ) -> Optional[List[Tuple[int, int]]]:
        """The next hops from a node with many links (a core switch) that
        keep the least cost ``remaining`` to the destination: the
        neighbours' distances in one gather (:meth:`DistancesTo.many`);
        None where that does not apply (the caller asks one by one)."""
        wide = self._wide.get(node)
        if wide is None:
            hops = self._iadj[node]
            nodes = np.fromiter((v for v, _ in hops), dtype=np.int64, count=len(hops))
            costs = np.fromiter((c for _, c in hops), dtype=np.int64, count=len(hops))
            wide = self._wide[node] = (nodes, costs, {v: i for i, (v, _) in enumerate(hops)})
        nodes, costs, position = wide
        dist = to_dst.many(nodes, position)
        if dist is None:
            return None
        hops = self._iadj[node]
        return [hops[i] for i in np.flatnonzero(costs + dist == remaining).tolist()]

    def _routing_oracle(self, separators: Sequence[str] | None = None) -> SeparatorOracle:
        """The least-cost oracle behind :meth:`route`, built on first use.
        ``separators`` replaces it by one over the given nodes (tests use
        it to check that every choice gives the same routes)."""
        if self._oracle is not None and separators is None:
            return self._oracle
        names = sorted(self.graph.nodes)
        self._names = names
        self._index = {n: i for i, n in enumerate(names)}
        index = self._index
        self._iadj = [[(index[v], c) for v, c in self._adj.get(n, ())] for n in names]
        radj: List[List[Tuple[int, int]]] = [[] for _ in names]
        for i, hops in enumerate(self._iadj):
            for v, c in hops:
                radj[v].append((i, c))
        if separators is not None:
            seps = {index[n] for n in separators}
        else:
            nodes = self.graph.nodes
            seps = network_separators([nodes[n]["kind"] for n in names],
                                      ["node_index" in nodes[n] for n in names],
                                      self._iadj, self.num_devices)
        self._oracle = SeparatorOracle(radj, self._iadj, seps)
        self._routes.clear()
        self._wide: Dict[int, Tuple[np.ndarray, np.ndarray, Dict[int, int]]] = {}
        #: (node, destination) -> the next hops from the node that keep the
        #: least cost to the destination (:meth:`_ecmp_route`)
        self._next_hops: Dict[Tuple[int, int], List[Tuple[int, int]]] = {}
        return self._oracle

    def path_latency_s(self, route: Sequence[Tuple[str, str]]) -> float:
        """Sum of the link latencies along ``route``."""
        edges = self.graph.edges
        return sum(edges[e]["latency_s"] for e in route)

    def path_bandwidth_Bps(self, route: Sequence[Tuple[str, str]]) -> float:
        """The bottleneck bandwidth of ``route`` (infinite for an empty one)."""
        edges = self.graph.edges
        return min((edges[e]["bandwidth_Bps"] for e in route), default=math.inf)

    def link(self, src: str, dst: str) -> Mapping[str, Any]:
        return self.graph.edges[src, dst]

    # ------------------------------------------------------------------ summary
    def bisection_bandwidth_Bps(self) -> float:
        """Minimum cut between the first and second half of the ranks, in
        one direction (a max-flow over the link bandwidths)."""
        n = self.num_devices
        if n < 2:
            return 0.0
        g = nx.DiGraph()
        g.add_edges_from((u, v, {"capacity": d["bandwidth_Bps"]})
                         for u, v, d in self.graph.edges(data=True))
        for r, node in enumerate(self._device_nodes):
            if r < n // 2:
                g.add_edge("__src__", node, capacity=math.inf)
            else:
                g.add_edge(node, "__dst__", capacity=math.inf)
        value, _ = nx.maximum_flow(g, "__src__", "__dst__")
        return float(value)

    def describe(self, bisection: bool = True) -> Dict[str, Any]:
        """A plain summary: devices, nodes, switches, link classes, bisection
        bandwidth (skipped with ``bisection=False`` on huge graphs)."""
        kinds: Dict[str, int] = {}
        for _, kind in self.graph.nodes(data="kind"):
            kinds[kind] = kinds.get(kind, 0) + 1
        classes: Dict[Tuple[str, str, float, float], int] = {}
        for u, v, d in self.graph.edges(data=True):
            cls = (self.graph.nodes[u]["kind"], self.graph.nodes[v]["kind"],
                   float(d["bandwidth_Bps"]), float(d["latency_s"]))
            classes[cls] = classes.get(cls, 0) + 1
        spec = self.device_spec
        out: Dict[str, Any] = {
            "name": self.name,
            "source": self.source,
            "device": spec.name,
            "num_devices": self.num_devices,
            "num_nodes": self.num_nodes,
            "devices_per_node": self.devices_per_node,
            "node_kinds": kinds,
            "num_links": self.graph.number_of_edges(),
            "link_classes": [
                {"from": a, "to": b, "bandwidth_Bps": bw, "latency_s": lat, "count": cnt}
                for (a, b, bw, lat), cnt in sorted(classes.items())],
            "device_peak_flops": dict(spec.peak_flops),
            "device_memory_bytes": spec.memory_bytes,
            "device_memory_bandwidth_Bps": spec.memory_bandwidth_Bps,
        }
        if bisection:
            out["bisection_bandwidth_Bps"] = self.bisection_bandwidth_Bps()
        return out

    def __repr__(self) -> str:
        return (f"Topology({self.name!r}, devices={self.num_devices}, nodes={self.num_nodes}, "
                f"links={self.graph.number_of_edges()})")
