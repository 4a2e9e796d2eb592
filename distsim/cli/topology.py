"""``distsim topology [NAME]``: describe a topology (devices, links,
bisection bandwidth), optionally draw it; without NAME, list the known
topologies."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..errors import ConfigError
from ..topology import known_topologies, load_topology
from .stdout import printed_or_removed

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
             "  nodes by kind: "
             + ", ".join(f"{k} {v}" for k, v in sorted(info['node_kinds'].items())),
             f"  directed links: {info['num_links']}"]
    for c in info["link_classes"]:
        lines.append(f"    {c['count']:>6} x {c['from']:>6} -> {c['to']:<6} "
                     f"{c['bandwidth_Bps'] / 1e9:8.1f} GB/s  {c['latency_s'] * 1e6:6.2f} us")
    if "bisection_bandwidth_Bps" in info:
        lines.append(f"  bisection bandwidth (ranks 0..{info['num_devices'] // 2 - 1} vs the rest, "
                     f"one way): {info['bisection_bandwidth_Bps'] / 1e9:.1f} GB/s")
    return "\n".join(lines)


def check_draw_path(path: str) -> None:
    """Refuse a ``--draw`` target that cannot be a PNG file before any work:
    an empty name, an existing folder (whose error would otherwise name
    the hidden temporary file the drawing is written to first), a name
    that does not end in ``.png`` (PNG bytes in a ``.txt``), or a folder
    that does not exist (made unasked, a typo leaves a tree of folders)."""
    if not path.strip():
        raise ConfigError(f"--draw: must name a .png file, got {path!r}")
    target = Path(path)
    if target.is_dir():
        raise ConfigError(f"--draw {path}: is a directory, expected a .png file name")
    if target.suffix.lower() != ".png":
        raise ConfigError(f"--draw {path}: the drawing is a PNG image; name a .png file")
    folder = target.parent
    if not folder.is_dir():
        what = "is not a folder" if folder.exists() else "does not exist"
        raise ConfigError(f"--draw {path}: the folder {folder} {what}")


def run(args: argparse.Namespace) -> int:
    if args.name is None:
        if args.draw is not None:
            raise ConfigError(f"--draw {args.draw}: give the topology NAME to draw")
        names = known_topologies()
        print(json.dumps(names) if args.json else "\n".join(names))
        return 0
    if args.draw is not None:
        check_draw_path(args.draw)
    topo = load_topology(args.name)
    info = topo.describe(bisection=topo.graph.number_of_nodes() <= _BISECTION_LIMIT)
    drawn = []
    if args.draw:
        from ..topology.draw import draw_topology   # matplotlib: only when drawing
        try:
            draw_topology(topo, args.draw)
        except OSError as e:    # the rename onto it failed: name --draw, not the temp file
            raise ConfigError(f"--draw {args.draw}: cannot write ({e.strerror or e})") from None
        drawn.append(Path(args.draw))
    with printed_or_removed(drawn, Path(args.draw or "."), None):
        print(json.dumps(info, indent=2) if args.json else describe_text(info))
        if args.draw:   # with --json, stdout stays one JSON document
            print(f"wrote {args.draw}", file=sys.stderr if args.json else sys.stdout)
    return 0
