"""The simulator's modules form layers (tests/test_import_layers.py holds
them free of import cycles): each imports only those below it, none
imports inside a function, and no module but network.py reaches into a
Network's private fields: the flow, analytical and fast-forward paths
share its public interface. Read from the source, so a new module is
checked too."""
from __future__ import annotations

import ast
from typing import Set

from import_graph import ROOT, import_graph

SIM = ROOT / "sim"


def _sim_graph():
    """The import graph of distsim.sim's modules (its cycles are checked
    with the other packages' in tests/test_import_layers.py)."""
    graph = import_graph()
    return graph.subgraph(n for n in graph if n.startswith("distsim.sim."))


def test_the_solo_time_sits_below_the_network_steps():
    graph = _sim_graph()
    assert "distsim.sim.solo_time" in graph
    assert not graph.has_edge("distsim.sim.network_steps", "distsim.sim.network")


def test_the_layers_under_the_simulator_import_only_downwards():
    graph = _sim_graph()
    order = ["distsim.sim.collective_algos.schedule", "distsim.sim.route_table",
             "distsim.sim.network_steps",
             "distsim.sim.network", "distsim.sim.collective_plan", "distsim.sim.solo_bounds",
             "distsim.sim.solo_time", "distsim.sim.collectives", "distsim.sim.solo"]
    for i, module in enumerate(order):
        above = set(order[i + 1:])
        imported = set(graph.successors(module))
        assert not imported & above, (module, imported & above)


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
