"""Command-line options shared by several subcommands (model, strategy,
topology), so that ``simulate``, ``print`` and later ``sweep`` agree."""
from __future__ import annotations

import argparse
from typing import Any, Dict

from ..api import DEFAULT_MODEL, DEFAULT_TOPOLOGY


def add_model_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model")
    g.add_argument("--model", default=DEFAULT_MODEL,
                   help="model name (see models/) or path to a model .yaml (default: %(default)s)")
    g.add_argument("--layers", type=int, help="number of layers (overrides the model file)")
    g.add_argument("--hidden", type=int, help="hidden size (overrides the model file)")
    g.add_argument("--batch", type=int, help="global batch size (overrides the model file)")
    g.add_argument("--dtype", choices=["fp16", "bf16", "fp32", "f16", "f32"],
                   help="compute dtype (overrides the model file)")


def add_strategy_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("parallel strategy")
    g.add_argument("--dp", type=int,
                   help="data-parallel degree (default: every device of the topology)")
    g.add_argument("--tp", type=int, default=1, help="tensor-parallel degree (default: 1)")
    g.add_argument("--pp", type=int, default=1, help="pipeline-parallel degree (default: 1)")


def add_topology_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--topology", default=DEFAULT_TOPOLOGY,
                   help="topology name (see topologies/, or dgx-a100-xN) or path to a .yaml "
                        "(default: %(default)s)")


def program_options(args: argparse.Namespace) -> Dict[str, Any]:
    """The keyword arguments of :func:`distsim.api.build_program` from args."""
    out = {"model": args.model, "topology": args.topology}
    for key in ("layers", "hidden", "batch", "dtype", "dp", "tp", "pp"):
        value = getattr(args, key, None)
        if value is not None:
            out[key] = value
    return out
