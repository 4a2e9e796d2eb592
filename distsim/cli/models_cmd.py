"""``distsim models``: list the named model configs with their sizes."""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Dict, List, Optional

from ..errors import DistsimError
from ..models import available_models, family_of, load_model_config


def add_parser(sub) -> None:
    p = sub.add_parser("models", help="list the model configs (models/*.yaml) and their sizes",
                       description="List every named model (models/*.yaml and built-in "
                                   "families) with its family and parameter count, or the "
                                   "models given (names, .yaml files, Hugging Face "
                                   "config.json files or their folders).")
    p.add_argument("models", nargs="*", metavar="MODEL",
                   help="models to describe (default: every named model)")
    p.add_argument("--json", action="store_true", help="print the list as JSON")
    p.set_defaults(func=run)


def model_rows(names: Optional[List[str]] = None) -> List[Dict[str, Any]]:
    """One row per model (``names``, default every named model): name,
    family and what the family describes."""
    rows = []
    for name in names or available_models():
        config = load_model_config(name)
        try:
            info = family_of(config).describe(config)
        except DistsimError as e:  # e.g. an ONNX file that needs input shapes
            info = {"note": str(e)}
        rows.append({"name": config.get("name", name) if names else name,
                     "family": config["family"], **info})
    return rows


def _count(n: Any) -> str:
    if not isinstance(n, (int, float)):
        return "-"
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f}{unit}"
    return str(int(n))


def _experts(row: Dict[str, Any]) -> str:
    """``top_k/experts`` routed (``+shared``) of a MoE model, else ``-``."""
    if not row.get("experts"):
        return "-"
    shared = f"+{row['shared_experts']}" if row.get("shared_experts") else ""
    return f"{row['top_k']}/{row['experts']}{shared}"


def run(args: argparse.Namespace) -> int:
    rows = model_rows(args.models)
    if args.json:
        json.dump(rows, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    header = ("model", "family", "parameters", "published", "active", "experts", "layers",
              "hidden", "heads", "seq", "attention")
    table = [header]
    for r in rows:
        table.append((r["name"], r["family"], _count(r.get("parameters")),
                      _count(r.get("published_parameters")), _count(r.get("active_parameters")),
                      _experts(r), str(r.get("layers", "-")),
                      str(r.get("hidden", "-")), str(r.get("heads", "-")), str(r.get("seq", "-")),
                      str(r.get("attention", "-"))))
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    left = (0, 1, len(header) - 1)     # names left-aligned, numbers right-aligned
    for row in table:
        print("  ".join(cell.ljust(w) if i in left else cell.rjust(w)
                        for i, (cell, w) in enumerate(zip(row, widths))).rstrip())
    return 0
