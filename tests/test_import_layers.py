"""The package's modules import in one direction: no module of
``distsim.transforms``, ``distsim.sim`` or ``distsim.estimate`` imports
itself back through another (counting imports made only for type
annotations, and imports inside functions)."""
from __future__ import annotations

import networkx as nx
import pytest

from import_graph import ROOT, import_graph


@pytest.mark.parametrize("package", ["distsim.transforms", "distsim.sim", "distsim.estimate"])
def test_no_import_cycles(package):
    graph = import_graph()
    inside = graph.subgraph(n for n in graph if n == package or n.startswith(package + "."))
    # a package's __init__ importing its own modules is how it exports them
    packages = {n for n in graph if (ROOT.parent / n.replace(".", "/") / "__init__.py").exists()}
    edges = [(a, b) for a, b in inside.edges if not (a in packages and b.startswith(a + "."))]
    cycles = list(nx.simple_cycles(nx.DiGraph(edges)))
    assert cycles == [], f"import cycles in {package}: {cycles[:5]}"


def test_the_fast_tier_and_the_simulator_import_no_higher_layer():
    graph = import_graph()
    higher = ("distsim.sweep", "distsim.cli", "distsim.api", "distsim.report", "distsim.bench")
    for package in ("distsim.sim", "distsim.estimate", "distsim.transforms"):
        for a, b in graph.edges:
            if a.startswith(package) and b.startswith(higher):
                pytest.fail(f"{a} imports {b}, a higher layer")
