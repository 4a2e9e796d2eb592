"""distsim's import graph, read from the source (every import: at module
level, inside functions and for type checking only), for the tests that
hold the package's layers (tests/test_import_layers.py,
tests/sim/test_sim_layers.py). Read from the source, so a new module is
checked too."""
from __future__ import annotations

import ast
from pathlib import Path
from typing import Set

import networkx as nx

import distsim

ROOT = Path(distsim.__file__).parent


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def module_imports(path: Path) -> Set[str]:
    """Every module ``path`` imports (``from . import x`` counts the
    package and its module x)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found: Set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.add(target)
            found.update(f"{target}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def import_graph() -> nx.DiGraph:
    """Module -> the distsim modules it imports (itself left out)."""
    modules = {module_name(p): p for p in ROOT.rglob("*.py")}
    graph = nx.DiGraph()
    for name, path in modules.items():
        graph.add_node(name)
        for target in module_imports(path):
            if target in modules and target != name:
                graph.add_edge(name, target)
    return graph
