"""Draw a topology graph to a PNG: devices, NICs, switches and hosts in
layers, links as lines (a duplex pair drawn once, width by bandwidth).

Within a layer, nodes are grouped by server and in natural order
(``gpu2`` before ``gpu10``), so that each server's GPUs sit above its own
NICs and switches and a multi-node drawing does not cross itself."""
from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Dict, List, Tuple, Union

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import networkx as nx  # noqa: E402

from ..fileio import atomic_path  # noqa: E402
from .topology import Topology  # noqa: E402

_LAYER = {"device": 0, "nic": 1, "host": 1, "switch": 2}
_COLOUR = {"device": "#4c72b0", "nic": "#dd8452", "switch": "#55a868", "host": "#8172b3"}


def _layer(topology: Topology, node: str) -> int:
    data = topology.graph.nodes[node]
    if data["kind"] == "switch" and str(node).startswith(("leaf", "ib")):
        return 3
    if str(node).startswith("spine"):
        return 4
    return _LAYER[data["kind"]]


def natural_key(name: object) -> Tuple[Tuple[int, object], ...]:
    """Sort key reading digit runs as numbers: gpu2 < gpu10, leaf1.2 < leaf1.10."""
    return tuple((1, int(part)) if part.isdigit() else (0, part)
                 for part in re.split(r"([0-9]+)", str(name)) if part)


def layer_order(topology: Topology) -> Dict[int, List[str]]:
    """The nodes of each drawing layer, left to right: by server
    (``node_index``; network switches, which have none, after), then in
    natural name order."""
    layers: Dict[int, List[str]] = {}
    graph = topology.graph
    for node in graph:
        layers.setdefault(_layer(topology, node), []).append(node)
    for nodes in layers.values():
        nodes.sort(key=lambda v: (graph.nodes[v].get("node_index") is None,
                                  graph.nodes[v].get("node_index") or 0, natural_key(v)))
    return dict(sorted(layers.items()))


def draw_topology(topology: Topology, path: Union[str, Path]) -> None:
    """Write a PNG drawing of ``topology`` to ``path`` (atomically)."""
    g = topology.graph.to_undirected(as_view=False)
    # layers as ordered lists (a layer attribute would be grouped into sets,
    # whose order is arbitrary: gpu11, gpu3, gpu28, ...)
    pos = nx.multipartite_layout(g, subset_key=layer_order(topology), align="horizontal")
    n = g.number_of_nodes()
    size = min(40.0, max(6.0, math.sqrt(n) * 1.2))
    fig, ax = plt.subplots(figsize=(size * 1.6, size))
    widths = [0.5 + math.log10(max(d["bandwidth_Bps"], 1e9) / 1e9)
              for _, _, d in g.edges(data=True)]
    nx.draw_networkx_edges(g, pos, ax=ax, width=widths, alpha=0.4)
    for kind, colour in _COLOUR.items():
        nodes = [v for v, k in g.nodes(data="kind") if k == kind]
        nx.draw_networkx_nodes(g, pos, nodelist=nodes, node_color=colour, ax=ax,
                               node_size=300 if n < 100 else 40, label=kind)
    if n <= 120:
        nx.draw_networkx_labels(g, pos, ax=ax, font_size=7)
    ax.set_title(f"{topology.name}: {topology.num_devices} devices, "
                 f"{topology.graph.number_of_edges()} directed links")
    ax.legend(loc="upper right", scatterpoints=1)
    ax.axis("off")
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=80, bbox_inches="tight")
    plt.close(fig)
