"""Command-line options shared by several subcommands (model, strategy,
topology), so that ``simulate``, ``print`` and later ``sweep`` agree."""
from __future__ import annotations

import argparse
from typing import Any, Dict

from ..api import DEFAULT_MODEL, DEFAULT_TOPOLOGY
from ..errors import ConfigError


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


def add_onnx_options(p: argparse.ArgumentParser) -> None:
    """Options of models imported from ONNX files (``--model FILE.onnx``)."""
    g = p.add_argument_group("imported models (--model FILE.onnx)")
    g.add_argument("--train", action="store_true", default=None,
                   help="append a loss, the backward pass and an SGD update to the forward graph")
    g.add_argument("--input-shape", action="append", metavar="NAME=AxB", dest="input_shape",
                   help="shape of a graph input, e.g. input_ids=8x1024 (repeatable)")
    g.add_argument("--seq", type=int, help="sequence length of symbolic sequence dims")


def input_shapes_option(items) -> Dict[str, str]:
    """``["ids=2x64"]`` -> ``{"ids": "2x64"}`` (shapes are parsed by the model family)."""
    out = {}
    for item in items or ():
        name, sep, shape = item.rpartition("=")
        if not sep or not name:
            raise ConfigError(f"--input-shape: expected NAME=AxB, got '{item}'")
        out[name] = shape
    return out


def program_options(args: argparse.Namespace) -> Dict[str, Any]:
    """The keyword arguments of :func:`distsim.api.build_program` from args."""
    out = {"model": args.model, "topology": args.topology}
    if getattr(args, "input_shape", None):
        out["input_shapes"] = input_shapes_option(args.input_shape)
    for key in ("layers", "hidden", "batch", "dtype", "dp", "tp", "pp", "train", "seq"):
        value = getattr(args, key, None)
        if value is not None:
            out[key] = value
    return out
