"""Load a Topology from a YAML file, a file in ``topologies/``, or a
builtin name such as ``dgx-a100-x16``.

The schema (see docs/topology.md) has a ``name``, a ``device`` block (see
:func:`distsim.cost.device.device_spec_from_dict`) and either

- ``builder: NAME`` with ``params`` (see :data:`builders.BUILDERS`), or
- an explicit graph: ``devices`` (a list of names, or
  ``{count, name: "gpu{i}", per_node}``), optional ``switches``, ``nics``,
  ``hosts`` (lists of names) and ``links``: each with ``src``, ``dst``,
  one of ``bandwidth_GBps`` / ``bandwidth_Gbps`` / ``bandwidth_Bps``, one of
  ``latency_us`` / ``latency_s``, ``duplex`` (default true) and optionally
  ``transport`` (``nvlink``, ``pcie``, ``network``). ``src`` and
  ``dst`` may be lists or ranges like ``gpu{0..7}``; equal-length lists pair
  up, a single name pairs with every entry of the other side.

An optional ``collectives:`` block gives what NCCL's protocols cost on
those links (:mod:`.collective_spec`). Every error is one line naming the
file and the field. Numbers may be
written ``2.0e12`` or ``1e9``: PyYAML (YAML 1.1) reads those as strings,
:func:`yaml_number` reads them as the numbers they are.
"""
from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any, Dict, List, Mapping, Tuple

import networkx as nx

from ..cost.device import device_spec_from_dict, finite_float
from ..errors import ConfigError, TopologyError
from ..paths import not_found_hint, topologies_dir
from ..yamlio import load_yaml_file, yaml_number
from .builders import BUILDERS, GB, MAX_DEVICES, MAX_NODES, US, add_duplex, check_device_count
from .collective_spec import TRANSPORTS, collective_spec_from_dict
from .topology import Topology

#: the folder of named topologies when the module was loaded; lookups read
#: :func:`distsim.paths.topologies_dir` each time, so that ``DISTSIM_DATA``
#: moves topologies as it moves models
TOPOLOGY_DIR = topologies_dir()
_CLUSTER_NAME = re.compile(r"^(?P<base>.+)-x(?P<nodes>[0-9]+)$")
_RANGE = re.compile(r"^(?P<pre>[^{}]*)\{(?P<lo>[0-9]+)\.\.(?P<hi>[0-9]+)\}(?P<post>[^{}]*)$")
_TOP_KEYS = {"name", "description", "sources", "device", "builder", "params",
             "devices", "switches", "nics", "hosts", "links", "collectives"}
_GRAPH_KEYS = ("devices", "switches", "nics", "hosts", "links")   # the explicit form's
_DEVICES_KEYS = {"count", "name", "per_node"}
_cache: Dict[Tuple[str, int, int | None], Topology] = {}


def _numbers(value: Any) -> Any:
    """:func:`yaml_number` over the values of a mapping or list (nested)."""
    if isinstance(value, Mapping):
        return {k: _numbers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_numbers(v) for v in value]
    return yaml_number(value)


def known_topologies() -> List[str]:
    """Names :func:`load_topology` accepts: files in ``topologies/`` and,
    for each file built by the ``dgx`` builder, its ``NAME-xN`` clusters."""
    folder = topologies_dir()
    names = sorted(p.stem for p in folder.glob("*.yaml")) if folder.is_dir() else []
    return names + [f"{n}-xN" for n in names if n.startswith("dgx-")]


def load_topology(name_or_path: str) -> Topology:
    """A Topology from a ``.yaml`` path, a name in ``topologies/``, or
    ``BASE-xN`` (the file ``BASE.yaml`` built with ``nodes: N``).

    Loaded topologies are cached by file and modification time, so that
    repeated loads share the route cache.
    """
    text = str(name_or_path)
    path = Path(text)
    nodes: int | None = None
    if text.endswith((".yaml", ".yml")) or _is_file(path):
        if not _is_file(path):
            raise ConfigError(f"{_short(text, 200)}: topology file not found"
                              f"{not_found_hint('topologies', text, '.yaml')}")
    else:
        folder = topologies_dir()
        path = folder / f"{text}.yaml"
        match = _CLUSTER_NAME.match(text)
        if not _is_file(path) and match and _is_file(folder / f"{match['base']}.yaml"):
            digits = match["nodes"].lstrip("0") or "0"
            if len(digits) > 9:      # (and int() refuses past 4300 digits)
                raise ConfigError(f"topology '{_short(text)}': {_short(digits)} nodes is more than "
                                  f"the {MAX_DEVICES:,} devices distsim simulates")
            path, nodes = folder / f"{match['base']}.yaml", int(digits)
            if nodes < 1:
                raise ConfigError(f"topology '{text}': the node count must be at least 1")
        elif not _is_file(path):
            raise ConfigError(f"unknown topology '{_short(text)}' (known: "
                              f"{', '.join(known_topologies())}, or a path to a .yaml file)")
    key = (str(path.resolve()), path.stat().st_mtime_ns, nodes)
    if key not in _cache:
        # a cluster is named canonically (dgx-a100-x0002 is dgx-a100-x2): the
        # cache serves every spelling of it the first one loaded
        name = f"{path.stem}-x{nodes}" if nodes is not None else None
        _cache[key] = _load_file(path, nodes, name)
    return _cache[key]


def _is_file(path: Path) -> bool:
    """``path.is_file()``, False for a name the OS refuses (too long, NUL)."""
    try:
        return path.is_file()
    except (OSError, ValueError):
        return False


def _short(text: str, keep: int = 40) -> str:
    """``text``, or its start and length when longer than ``keep`` characters."""
    return text if len(text) <= keep else f"{text[:keep]}... ({len(text)} characters)"


def _display(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def _load_file(path: Path, nodes: int | None, cluster_name: str | None) -> Topology:
    where = _display(path)
    data = load_yaml_file(where, "topology file")
    if nodes is not None and (not isinstance(data, Mapping) or data.get("builder") != "dgx"):
        raise ConfigError(f"{where}: only 'builder: dgx' files have -xN clusters")
    return topology_from_dict(data, where, nodes=nodes, name=cluster_name)


def topology_from_dict(data: Any, where: str, nodes: int | None = None,
                       name: str | None = None) -> Topology:
    """Build a Topology from parsed YAML; ``nodes`` overrides the builder's
    node count (for ``BASE-xN`` names)."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where}: a topology file must be a mapping")
    unknown = sorted(set(data) - _TOP_KEYS)
    if unknown:
        raise ConfigError(f"{where}: {unknown[0]}: unknown field (allowed: "
                          f"{', '.join(sorted(_TOP_KEYS))})")
    if "device" not in data:
        raise ConfigError(f"{where}: device: missing required field")
    if data.get("name") is not None and not isinstance(data["name"], str):
        raise ConfigError(f"{where}: name: must be text, got {data['name']!r}")
    device = data["device"]
    if isinstance(device, Mapping):     # numbers in exponent notation; the name stays text
        device = {k: v if k in ("name", "source") else _numbers(v) for k, v in device.items()}
    spec = device_spec_from_dict(device, f"{where}: device")
    topo_name = name or str(data.get("name") or Path(where).stem)
    if "builder" in data:
        builder = BUILDERS.get(data["builder"]) if isinstance(data["builder"], str) else None
        if builder is None:
            raise ConfigError(f"{where}: builder: unknown builder {data['builder']!r} "
                              f"(known: {', '.join(BUILDERS)})")
        # the builder makes the whole graph: explicit devices or links beside
        # it would be ignored, and the user's figures silently lost
        mixed = [k for k in _GRAPH_KEYS if k in data]
        if mixed:
            raise ConfigError(f"{where}: {mixed[0]}: not allowed with a builder (give either "
                              f"'builder' and 'params' or an explicit graph)")
        params = data.get("params") or {}
        if not isinstance(params, Mapping):
            raise ConfigError(f"{where}: params: must be a mapping")
        params = _numbers(dict(params))
        if nodes is not None:
            params["nodes"] = nodes
        graph = builder(params, f"{where}: params")
        meta = {"builder": data["builder"], "params": params}
    else:
        if "params" in data:
            raise ConfigError(f"{where}: params: only with a builder (builder: "
                              f"{' | '.join(BUILDERS)})")
        graph = _explicit_graph(data, where)
        meta = {}
    collectives = None
    if data.get("collectives") is not None:
        collectives = collective_spec_from_dict(_numbers(data["collectives"]),
                                                f"{where}: collectives")
    return Topology(topo_name, graph, spec, source=where, meta=meta, collectives=collectives)


def expand_names(value: Any, field: str) -> List[str]:
    """``"gpu{0..3}"`` -> ``[gpu0, gpu1, gpu2, gpu3]``; lists expand each
    entry; a plain name is a list of one."""
    items = value if isinstance(value, list) else [value]
    out: List[str] = []
    for item in items:
        if not isinstance(item, (str, int)) or isinstance(item, bool):
            raise ConfigError(f"{field}: expected a name or a list of names, got {item!r}")
        m = _RANGE.match(str(item))
        if m:
            lo, hi = int(m["lo"]), int(m["hi"])
            if hi < lo:
                raise ConfigError(f"{field}: empty range {item!r}")
            if hi - lo + 1 + len(out) > MAX_NODES:
                raise ConfigError(f"{field}: {_short(str(item))} names {hi - lo + 1:,} nodes, more "
                                  f"than the {MAX_NODES:,} a topology may have")
            out.extend(f"{m['pre']}{i}{m['post']}" for i in range(lo, hi + 1))
        else:
            out.append(str(item))
    return out


def _explicit_graph(data: Mapping[str, Any], where: str) -> nx.DiGraph:
    g = nx.DiGraph()
    devices = data.get("devices")
    if devices is None:
        raise ConfigError(f"{where}: devices: missing required field (or give a builder)")
    if isinstance(devices, Mapping):
        unknown = sorted(str(k) for k in set(devices) - _DEVICES_KEYS)
        if unknown:
            raise ConfigError(f"{where}: devices.{unknown[0]}: unknown field (allowed: "
                              f"{', '.join(sorted(_DEVICES_KEYS))})")
        count = devices.get("count")
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ConfigError(f"{where}: devices.count: must be a positive integer, got {count!r}")
        check_device_count(count, f"{where}: devices.count")
        pattern = str(devices.get("name", "gpu{i}"))
        if count > 1 and "{i}" not in pattern:
            raise ConfigError(f"{where}: devices.name: '{pattern}' has no {{i}}, so all {count} "
                              f"devices would have the same name")
        per_node = devices.get("per_node", count)
        if isinstance(per_node, bool) or not isinstance(per_node, int) or per_node < 1:
            raise ConfigError(f"{where}: devices.per_node: must be a positive integer, "
                              f"got {per_node!r}")
        names = [pattern.replace("{i}", str(i)) for i in range(count)]
    else:
        names = expand_names(devices, f"{where}: devices")
        if not names:
            raise ConfigError(f"{where}: devices: is empty (a topology needs at least one "
                              "device)")
        check_device_count(len(names), f"{where}: devices")
        per_node = len(names)
    for rank, n in enumerate(names):
        if n in g:
            raise ConfigError(f"{where}: devices: name '{n}' is used twice")
        g.add_node(n, kind="device", rank=rank, node_index=rank // per_node)
    for field, kind in (("switches", "switch"), ("nics", "nic"), ("hosts", "host")):
        for n in expand_names(data.get(field) or [], f"{where}: {field}"):
            if n in g:
                raise ConfigError(f"{where}: {field}: name '{n}' is used twice")
            g.add_node(n, kind=kind)
    links = data.get("links")
    if not isinstance(links, list) or not links:
        raise ConfigError(f"{where}: links: expected a non-empty list of links")
    if len(g) > MAX_NODES:
        raise ConfigError(f"{where}: {len(g):,} nodes, more than the {MAX_NODES:,} a topology "
                          f"may have")
    declared: Dict[Tuple[str, str], str] = {}
    for i, link in enumerate(links):
        _add_links(g, link, f"{where}: links[{i}]", declared, f"links[{i}]")
    return g


_BANDWIDTH_UNITS = {"bandwidth_GBps": GB, "bandwidth_Gbps": GB / 8, "bandwidth_Bps": 1.0}
_LATENCY_UNITS = {"latency_us": US, "latency_s": 1.0}
_LINK_KEYS = {"src", "dst", "duplex", "cost", "transport"} | set(_BANDWIDTH_UNITS) | \
    set(_LATENCY_UNITS)


def _unit_value(link: Mapping[str, Any], units: Mapping[str, float], where: str,
                positive: bool) -> float:
    given = [k for k in units if k in link]
    if len(given) != 1:
        raise ConfigError(f"{where}: give exactly one of {', '.join(units)}")
    raw = yaml_number(link[given[0]])
    if isinstance(raw, bool) or not isinstance(raw, (int, float)) or raw < 0 or \
            (positive and raw == 0):
        need = "positive" if positive else ">= 0"
        raise ConfigError(f"{where}.{given[0]}: must be {need}, got {raw!r}")
    value = finite_float(raw)
    if value is None or not math.isfinite(value * units[given[0]]):
        raise ConfigError(f"{where}.{given[0]}: must be a finite number, got {_short(str(raw))}")
    return value * units[given[0]]


def _add_links(g: nx.DiGraph, link: Any, where: str,
               declared: Dict[Tuple[str, str], str] | None = None, label: str = "") -> None:
    if not isinstance(link, Mapping):
        raise ConfigError(f"{where}: expected a mapping with src, dst, bandwidth, latency")
    unknown = sorted(set(link) - _LINK_KEYS)
    if unknown:
        raise ConfigError(f"{where}.{unknown[0]}: unknown field (allowed: "
                          f"{', '.join(sorted(_LINK_KEYS))})")
    for key in ("src", "dst"):
        if key not in link:
            raise ConfigError(f"{where}.{key}: missing required field")
    srcs = expand_names(link["src"], f"{where}.src")
    dsts = expand_names(link["dst"], f"{where}.dst")
    if len(srcs) != len(dsts) and 1 not in (len(srcs), len(dsts)):
        raise ConfigError(f"{where}: src has {len(srcs)} names and dst {len(dsts)}; "
                          f"they must be equal or one of them a single name")
    bw = _unit_value(link, _BANDWIDTH_UNITS, where, positive=True)
    lat = _unit_value(link, _LATENCY_UNITS, where, positive=False)
    duplex = link.get("duplex", True)
    if not isinstance(duplex, bool):
        raise ConfigError(f"{where}.duplex: must be true or false, got {duplex!r}")
    transport = link.get("transport")
    if transport is not None and transport not in TRANSPORTS:
        raise ConfigError(f"{where}.transport: must be one of {', '.join(TRANSPORTS)}, "
                          f"got {transport!r}")
    count = max(len(srcs), len(dsts))
    for a, b in zip(srcs * count if len(srcs) == 1 else srcs,
                    dsts * count if len(dsts) == 1 else dsts):
        for name, side in ((a, "src"), (b, "dst")):
            if name not in g:
                raise TopologyError(f"{where}.{side}: unknown node '{name}' (declare it under "
                                    f"devices, switches, nics or hosts)")
        if a == b:
            raise ConfigError(f"{where}: a link from '{a}' to itself")
        if declared is not None:
            # A link declared again with the same figures (a duplex a-b and
            # an explicit b -> a) is harmless; with other figures one of the
            # two would be silently lost.
            for edge in ((a, b), (b, a)) if duplex else ((a, b),):
                first = declared.get(edge)
                if first is not None and g.has_edge(*edge) and \
                        (g.edges[edge]["bandwidth_Bps"], g.edges[edge]["latency_s"]) != (bw, lat):
                    raise ConfigError(f"{where}: link {edge[0]} -> {edge[1]} is declared twice "
                                      f"with different bandwidth or latency (also by {first})")
                declared.setdefault(edge, label)
        if duplex:
            add_duplex(g, a, b, bw, lat, transport)
        else:
            g.add_edge(a, b, bandwidth_Bps=bw, latency_s=lat,
                       **({} if transport is None else {"transport": transport}))
        if "cost" in link:
            g.edges[a, b]["cost"] = yaml_number(link["cost"])
            if duplex:
                g.edges[b, a]["cost"] = yaml_number(link["cost"])
