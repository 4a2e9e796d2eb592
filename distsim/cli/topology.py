"""``distsim topology [NAME]``: describe a topology (devices, links,
bisection bandwidth), optionally draw it; without NAME, list the known
topologies."""
from __future__ import annotations

import argparse
import json
import sys

from ..topology import known_topologies, load_topology

_BISECTION_LIMIT = 4096     # nodes; max-flow on bigger graphs takes a while


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "topology", help="describe a topology (devices, links, bisection bandwidth)",
        description="Describe a topology: devices, servers, link classes and bisection "
                    "bandwidth. Without NAME, list the known topologies.")
    p.add_argument("name", nargs="?", metavar="NAME",
                   help="topology name (see topologies/, or dgx-a100-xN) or .yaml path")
    p.add_argument("--draw", metavar="PNG", help="also draw the graph to this PNG file")
    p.add_argument("--json", action="store_true", help="print the description as JSON")
    p.set_defaults(func=run)


def describe_text(info: dict) -> str:
    lines = [f"topology {info['name']} ({info['source']})",
             f"  devices: {info['num_devices']} x {info['device']} "
             f"({info['num_nodes']} node(s), {info['devices_per_node']} per node)",
             "  nodes by kind: " + ", ".join(f"{k} {v}" for k, v in sorted(info['node_kinds'].items())),
             f"  directed links: {info['num_links']}"]
    for c in info["link_classes"]:
        lines.append(f"    {c['count']:>6} x {c['from']:>6} -> {c['to']:<6} "
                     f"{c['bandwidth_Bps'] / 1e9:8.1f} GB/s  {c['latency_s'] * 1e6:6.2f} us")
    if "bisection_bandwidth_Bps" in info:
        lines.append(f"  bisection bandwidth (ranks 0..{info['num_devices'] // 2 - 1} vs the rest, "
                     f"one way): {info['bisection_bandwidth_Bps'] / 1e9:.1f} GB/s")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    if args.name is None:
        names = known_topologies()
        print(json.dumps(names) if args.json else "\n".join(names))
        return 0
    topo = load_topology(args.name)
    info = topo.describe(bisection=topo.graph.number_of_nodes() <= _BISECTION_LIMIT)
    if args.draw:
        from ..topology.draw import draw_topology   # matplotlib: only when drawing
        draw_topology(topo, args.draw)
    print(json.dumps(info, indent=2) if args.json else describe_text(info))
    if args.draw:   # with --json, stdout stays one JSON document
        print(f"wrote {args.draw}", file=sys.stderr if args.json else sys.stdout)
    return 0
