"""The simulator's modules form layers: no import cycle inside distsim/sim
(counting every import, also those for type checking only), no import
inside a function, and no module but network.py reaches into a Network's
private fields: the flow, analytical and fast-forward paths share its
public interface. Read from the source, so a new module is checked too."""
from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, Set

import distsim

ROOT = Path(distsim.__file__).parent
SIM = ROOT / "sim"


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> Set[str]:
    """Every distsim module ``path`` imports (``from . import x`` counts
    the package and its module x)."""
    tree = ast.parse(path.read_text())
    package = _module(path) if path.name == "__init__.py" else _module(path).rsplit(".", 1)[0]
    out: Set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            out.add(target)
            out.update(f"{target}.{alias.name}" for alias in node.names)
    return {name for name in out if name.startswith("distsim.")}


def _sim_graph() -> Dict[str, Set[str]]:
    paths = sorted(SIM.rglob("*.py"))
    modules = {_module(p) for p in paths}
    return {_module(p): _imports(p) & modules - {_module(p)} for p in paths}


def test_the_import_graph_of_distsim_sim_has_no_cycle():
    graph = _sim_graph()
    assert "distsim.sim.solo_time" in graph and graph["distsim.sim.network_steps"] \
        .isdisjoint({"distsim.sim.network"})
    state: Dict[str, int] = {}

    def visit(node, path):
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                raise AssertionError("import cycle: " + " -> ".join(path + [nxt]))
            if nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])


def test_the_layers_under_the_simulator_import_only_downwards():
    graph = _sim_graph()
    order = ["distsim.sim.collective_algos.schedule", "distsim.sim.route_table",
             "distsim.sim.network_steps",
             "distsim.sim.network", "distsim.sim.collective_plan", "distsim.sim.solo_bounds",
             "distsim.sim.solo_time", "distsim.sim.collectives", "distsim.sim.solo"]
    for i, module in enumerate(order):
        above = set(order[i + 1:])
        assert not graph[module] & above, (module, graph[module] & above)


def test_no_import_inside_a_function_in_distsim_sim():
    for path in sorted(SIM.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                inner = [n for n in ast.walk(node) if isinstance(n, (ast.Import, ast.ImportFrom))]
                assert not inner, f"{path.name}: import inside {node.name}()"


def _network_private_names() -> Set[str]:
    tree = ast.parse((SIM / "network.py").read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Network")
    names = set()
    for node in ast.walk(cls):
        if isinstance(node, ast.FunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                and node.value.id == "self":
            names.add(node.attr)
    return {n for n in names if n.startswith("_") and not n.startswith("__")}


def test_no_module_but_network_py_touches_a_networks_private_fields():
    private = _network_private_names()
    assert {"_stats", "_capacity", "_reserved", "_fill"} <= private
    touched = []
    for path in sorted(ROOT.rglob("*.py")):
        if path == SIM / "network.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in private and not (
                    isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                touched.append(f"{path.relative_to(ROOT)}:{node.lineno} .{node.attr}")
    assert not touched, touched
