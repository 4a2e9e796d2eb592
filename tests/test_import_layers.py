"""The package's modules import in one direction: no module of
``distsim.transforms``, ``distsim.sim`` or ``distsim.estimate`` imports
itself back through another (counting imports made only for type
annotations, and imports inside functions)."""
from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parents[1] / "distsim"


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, name: str) -> set:
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if node.module:
                found.add(target)
            for alias in node.names:          # `from . import x` imports module x
                found.add(f"{target}.{alias.name}")
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def import_graph() -> nx.DiGraph:
    modules = {_module_name(p): p for p in ROOT.rglob("*.py")}
    graph = nx.DiGraph()
    for name, path in modules.items():
        graph.add_node(name)
        for target in _imports(path, name):
            if target in modules and target != name:
                graph.add_edge(name, target)
    return graph


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
