"""Parametric topology builders: DGX-style nodes and clusters, tori, PCIe trees.

Each builder turns a few named parameters (the ``params`` of a
``builder:`` topology file, units in the parameter name) into a
:class:`networkx.DiGraph` in the shape :class:`~distsim.topology.Topology`
expects. Builders check their parameters and raise ``ConfigError`` naming
``where.param``; the YAML loader passes the file name as ``where``.

Naming: devices ``gpu{rank}``; per server ``nvswitch{n}``, ``host{n}``,
PCIe switches ``pcie{n*S+j}``, NICs ``nic{n*G+k}``; network switches
``ib0`` (single switch), ``leaf{rail}.{i}`` or ``leaf{i}`` and ``spine{j}``.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Dict, List, Mapping, Tuple

import networkx as nx

from ..cost.device import finite_float
from ..errors import ConfigError

GB = 1e9
US = 1e-6

#: The most devices a topology may have (builders and YAML files alike): far
#: beyond today's clusters, and small enough that a typo (``dgx-a100-x1000000``,
#: ``count: 100000000``) is one clear error instead of minutes of building a
#: graph that exhausts memory.
MAX_DEVICES = 65_536
#: The most nodes (devices, switches, NICs, hosts) one name range or file may declare.
MAX_NODES = 4 * MAX_DEVICES

Params = Dict[str, Any]


def check_device_count(count: int, where: str, how: str = "") -> None:
    """A ConfigError when ``count`` devices is more than :data:`MAX_DEVICES`."""
    if count > MAX_DEVICES:
        raise ConfigError(f"{where}: {count:,} devices{f' ({how})' if how else ''} is more than "
                          f"the {MAX_DEVICES:,} devices distsim simulates")


def add_duplex(g: nx.DiGraph, a: str, b: str, bandwidth_Bps: float, latency_s: float,
               transport: str | None = None) -> None:
    """A cable: one directed link each way with the same figures (and the
    kind of link, ``transport``, where known)."""
    extra = {} if transport is None else {"transport": transport}
    g.add_edge(a, b, bandwidth_Bps=float(bandwidth_Bps), latency_s=float(latency_s), **extra)
    g.add_edge(b, a, bandwidth_Bps=float(bandwidth_Bps), latency_s=float(latency_s), **extra)


class _Checked:
    """Reads builder parameters with defaults and one-line errors."""

    def __init__(self, params: Mapping[str, Any], defaults: Mapping[str, Any], where: str):
        unknown = sorted(set(params) - set(defaults))
        if unknown:
            raise ConfigError(f"{where}.{unknown[0]}: unknown parameter "
                              f"(allowed: {', '.join(defaults)})")
        self.values = {**defaults, **params}
        self.where = where

    def num(self, key: str, positive: bool = True, integer: bool = False) -> float:
        v = self.values[key]
        ok = finite_float(v) is not None    # a number, not NaN, inf or a 400-digit int
        if ok and integer:
            ok = float(v).is_integer()
        if not ok or v < 0 or (positive and v == 0):
            need = "a positive " if positive else "a non-negative "
            need += "integer" if integer else "number"
            raise ConfigError(f"{self.where}.{key}: must be {need}, got {v!r}")
        return int(v) if integer else float(v)

    def choice(self, key: str, allowed: Tuple[str, ...]) -> str:
        v = self.values[key]
        if v not in allowed:
            raise ConfigError(f"{self.where}.{key}: must be one of {', '.join(allowed)}, got {v!r}")
        return str(v)

    def dims(self, key: str) -> List[int]:
        v = self.values[key]
        if not isinstance(v, (list, tuple)) or len(v) not in (1, 2, 3) or \
                not all(isinstance(x, int) and not isinstance(x, bool) and x >= 1 for x in v):
            raise ConfigError(f"{self.where}.{key}: must be a list of 1 to 3 positive "
                              f"integers, got {v!r}")
        return list(v)


# --------------------------------------------------------------------------- dgx
DGX_DEFAULTS: Params = {
    "nodes": 1, "gpus_per_node": 8, "nvlink_GBps": 300.0, "nvlink_latency_us": 0.5,
    "pcie_GBps": 32.0, "pcie_latency_us": 0.5, "gpus_per_pcie_switch": 2,
    "nic_GBps": 25.0, "nics_per_node": 8, "network_latency_us": 1.0,
    "network": "rail", "nodes_per_leaf": 16, "spines": 1, "oversubscription": 1.0,
}


def build_dgx(params: Mapping[str, Any], where: str = "builder") -> nx.DiGraph:
    """DGX-style servers: GPUs on one NVSwitch, GPU pairs on PCIe switches
    under the host, GPU k with its own NIC k (for k < ``nics_per_node``; the
    GPU-NIC link is the PCIe path through their shared switch, which is not
    a bottleneck in a DGX), NICs joined by a network when ``nodes > 1``:

    - ``network: single``: every NIC on one switch ``ib0``;
    - ``network: rail`` (rail-optimised fat tree): NIC k of each server on
      the leaf of rail k (``nodes_per_leaf`` servers a leaf), leaves joined
      by ``spines`` spine switches;
    - ``network: fat-tree``: all NICs of ``nodes_per_leaf`` consecutive
      servers on one leaf, leaves joined by spines.

    A leaf's uplink capacity is its downlink capacity divided by
    ``oversubscription``, spread evenly over the spines (``spines: 1`` is
    the ideal, perfectly balanced core; more spines show ECMP collisions).
    """
    p = _Checked(params, DGX_DEFAULTS, where)
    nodes, gpn = p.num("nodes", integer=True), p.num("gpus_per_node", integer=True)
    nics = p.num("nics_per_node", positive=False, integer=True)
    per_pcie = p.num("gpus_per_pcie_switch", integer=True)
    nv_bw, nv_lat = p.num("nvlink_GBps") * GB, p.num("nvlink_latency_us", False) * US
    pcie_bw, pcie_lat = p.num("pcie_GBps") * GB, p.num("pcie_latency_us", False) * US
    nic_bw, net_lat = p.num("nic_GBps") * GB, p.num("network_latency_us", False) * US
    network = p.choice("network", ("rail", "fat-tree", "single"))
    npl, spines = p.num("nodes_per_leaf", integer=True), p.num("spines", integer=True)
    oversub = p.num("oversubscription")
    if nics > gpn:
        raise ConfigError(f"{where}.nics_per_node: at most gpus_per_node ({gpn}), got {nics}")
    if nodes > 1 and nics == 0:
        raise ConfigError(f"{where}.nics_per_node: servers of a multi-node cluster need NICs")
    check_device_count(nodes * gpn, where, f"nodes {nodes} x gpus_per_node {gpn}")
    g = nx.DiGraph()
    switches_per_node = math.ceil(gpn / per_pcie)
    for n in range(nodes):
        host, nvs = f"host{n}", f"nvswitch{n}"
        g.add_node(host, kind="host", node_index=n)
        if gpn > 1:
            g.add_node(nvs, kind="switch", node_index=n)
        for j in range(switches_per_node):
            sw = f"pcie{n * switches_per_node + j}"
            g.add_node(sw, kind="switch", node_index=n)
            add_duplex(g, sw, host, pcie_bw, pcie_lat, "pcie")
        for k in range(gpn):
            rank = n * gpn + k
            gpu = f"gpu{rank}"
            g.add_node(gpu, kind="device", rank=rank, node_index=n)
            if gpn > 1:
                add_duplex(g, gpu, nvs, nv_bw, nv_lat, "nvlink")
            add_duplex(g, gpu, f"pcie{n * switches_per_node + k // per_pcie}", pcie_bw, pcie_lat,
                       "pcie")
            if k < nics:
                nic = f"nic{n * nics + k}"
                g.add_node(nic, kind="nic", node_index=n)
                add_duplex(g, gpu, nic, pcie_bw, pcie_lat, "pcie")   # GPUDirect RDMA via PCIe
    if nodes > 1:
        _add_network(g, nodes, nics, nic_bw, net_lat, network, npl, spines, oversub)
    return g


def _add_network(g: nx.DiGraph, nodes: int, nics: int, nic_bw: float, lat: float,
                 network: str, npl: int, spines: int, oversub: float) -> None:
    """Join the NICs of all servers (see :func:`build_dgx`)."""
    if network == "single":
        g.add_node("ib0", kind="switch")
        for i in range(nodes * nics):
            add_duplex(g, f"nic{i}", "ib0", nic_bw, lat, "network")
        return
    leaves_per_group = math.ceil(nodes / npl)
    leaves: List[Tuple[str, int]] = []    # (name, NIC ports down)
    for n in range(nodes):
        for k in range(nics):
            if network == "rail":
                leaf, ports = f"leaf{k}.{n // npl}", npl
            else:
                leaf, ports = f"leaf{n // npl}", npl * nics
            if leaf not in g:
                g.add_node(leaf, kind="switch")
                leaves.append((leaf, ports))
            add_duplex(g, f"nic{n * nics + k}", leaf, nic_bw, lat, "network")
    if network == "rail" and nics == 1 and leaves_per_group == 1:
        return
    if network == "fat-tree" and leaves_per_group == 1:
        return
    for s in range(spines):
        g.add_node(f"spine{s}", kind="switch")
    for leaf, ports in leaves:
        up_bw = ports * nic_bw / oversub / spines
        for s in range(spines):
            add_duplex(g, leaf, f"spine{s}", up_bw, lat, "network")


# --------------------------------------------------------------------------- torus
TORUS_DEFAULTS: Params = {"dims": [4, 4], "link_GBps": 45.0, "latency_us": 1.0,
                          "wraparound": True, "devices_per_host": 1}


def build_torus(params: Mapping[str, Any], where: str = "builder") -> nx.DiGraph:
    """A 1D/2D/3D torus (TPU-style): each device links to its neighbours
    along every dimension (with wrap-around links unless ``wraparound``
    is false, which gives a mesh). ``devices_per_host`` consecutive ranks
    share a ``node_index``."""
    p = _Checked(params, TORUS_DEFAULTS, where)
    dims = p.dims("dims")
    bw, lat = p.num("link_GBps") * GB, p.num("latency_us", False) * US
    per_host = p.num("devices_per_host", integer=True)
    wrap = p.values["wraparound"]
    if not isinstance(wrap, bool):
        raise ConfigError(f"{where}.wraparound: must be true or false, got {wrap!r}")
    total = math.prod(dims)
    check_device_count(total, f"{where}.dims", "x".join(map(str, dims)))
    g = nx.DiGraph()

    def coords(r: int) -> List[int]:
        out = []
        for d in dims:
            out.append(r % d)
            r //= d
        return out

    def rank_of(c: List[int]) -> int:
        r, scale = 0, 1
        for x, d in zip(c, dims):
            r += x * scale
            scale *= d
        return r

    for r in range(total):
        g.add_node(f"gpu{r}", kind="device", rank=r, node_index=r // per_host)
    for r in range(total):
        c = coords(r)
        for axis, d in enumerate(dims):
            if d == 1 or (not wrap and c[axis] == d - 1):
                continue
            nb = list(c)
            nb[axis] = (c[axis] + 1) % d
            if d == 2 and c[axis] == 1:
                continue        # a 2-ring has one cable, not two
            add_duplex(g, f"gpu{r}", f"gpu{rank_of(nb)}", bw, lat)
    return g


# --------------------------------------------------------------------------- pcie
PCIE_DEFAULTS: Params = {"gpus": 4, "gpus_per_switch": 2, "pcie_GBps": 32.0,
                         "uplink_GBps": 32.0, "latency_us": 0.5}


def build_pcie_tree(params: Mapping[str, Any], where: str = "builder") -> nx.DiGraph:
    """A workstation without NVLink: GPUs on PCIe switches (``gpus_per_switch``
    each) whose uplinks meet at the host's root complex."""
    p = _Checked(params, PCIE_DEFAULTS, where)
    gpus, per = p.num("gpus", integer=True), p.num("gpus_per_switch", integer=True)
    bw, up = p.num("pcie_GBps") * GB, p.num("uplink_GBps") * GB
    lat = p.num("latency_us", False) * US
    check_device_count(gpus, f"{where}.gpus")
    g = nx.DiGraph()
    g.add_node("host0", kind="host", node_index=0)
    for j in range(math.ceil(gpus / per)):
        g.add_node(f"pcie{j}", kind="switch", node_index=0)
        add_duplex(g, f"pcie{j}", "host0", up, lat, "pcie")
    for r in range(gpus):
        g.add_node(f"gpu{r}", kind="device", rank=r, node_index=0)
        add_duplex(g, f"gpu{r}", f"pcie{r // per}", bw, lat, "pcie")
    return g


# --------------------------------------------------------------------------- star
STAR_DEFAULTS: Params = {"devices": 8, "link_GBps": 300.0, "latency_us": 0.5,
                         "devices_per_node": 0}


def build_star(params: Mapping[str, Any], where: str = "builder") -> nx.DiGraph:
    """``devices`` devices on one ideal switch ``switch0``, one duplex link
    each: the uncontended textbook network of the alpha-beta formulas.
    ``devices_per_node`` (0: all in one) groups ranks into servers."""
    p = _Checked(params, STAR_DEFAULTS, where)
    n = p.num("devices", integer=True)
    bw, lat = p.num("link_GBps") * GB, p.num("latency_us", False) * US
    per_node = p.num("devices_per_node", positive=False, integer=True) or n
    check_device_count(n, f"{where}.devices")
    g = nx.DiGraph()
    g.add_node("switch0", kind="switch")
    for r in range(n):
        g.add_node(f"gpu{r}", kind="device", rank=r, node_index=r // per_node)
        add_duplex(g, f"gpu{r}", "switch0", bw, lat)
    return g


BUILDERS: Dict[str, Callable[[Mapping[str, Any], str], nx.DiGraph]] = {
    "dgx": build_dgx,
    "star": build_star,
    "torus": build_torus,
    "pcie-tree": build_pcie_tree,
}
