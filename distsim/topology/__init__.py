"""Hardware topologies: a networkx graph of devices, switches, NICs and
hosts joined by directed links, loaded from ``topologies/*.yaml`` or built
by a parametric builder (``dgx-a100-x16``), with shortest-path ECMP routing."""
from .builders import BUILDERS, build_dgx, build_pcie_tree, build_star, build_torus
from .loader import TOPOLOGY_DIR, known_topologies, load_topology, topology_from_dict
from .topology import NODE_KINDS, Route, Topology, link_cost, stable_hash

__all__ = [
    "BUILDERS", "NODE_KINDS", "Route", "TOPOLOGY_DIR", "Topology", "build_dgx",
    "build_pcie_tree", "build_star", "build_torus", "known_topologies", "link_cost",
    "load_topology",
    "stable_hash", "topology_from_dict",
]
