"""The ``onnx`` model family: a model imported from an ONNX file.

    distsim simulate --model models/gpt2-tiny.onnx --input-shape input_ids=8x64
    distsim simulate --model resnet50 --train --batch 256 --dp 8

Config fields: ``path`` (a file, or ``onnx-backend:NAME`` for a model the
onnx package ships for its backend tests, e.g. ``light_resnet50``),
``train`` (append a loss, the backward pass and an SGD update),
``input_shapes`` (name -> shape), ``batch``, ``seq``, ``dtype``, ``lr``.
The training loss is the mean squared error of the first floating-point
output against a target of its shape (the cost of the loss itself is
negligible next to the model's). With ``--dp N`` the model is imported at
the per-replica batch ``batch / N`` (reshapes keep their exported static
shapes) and lowered to N replicas; the gradients are averaged by
all-reduce and the update is AdamW, as for the built-in transformers (SGD
on a single device).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Dict, Mapping, Optional

import numpy as np
import onnx

from ..errors import ConfigError
from ..importers.onnx import import_onnx
from ..ir.builder import builder_from
from ..ir.core import Function, Value
from ..transforms.autodiff import Autodiff
from ..transforms.adam import AdamHyper
from ..transforms.grad_rules import NON_DIFFERENTIABLE
from ..transforms.optimizer import SGD
from ..transforms.spmd import LowerSPMD
from ..transforms.strategy import Strategy
from .registry import ModelFamily, register_family

BACKEND_PREFIX = "onnx-backend:"
DEFAULTS: Dict[str, Any] = {"path": None, "train": False, "input_shapes": {}, "batch": None,
                            "seq": None, "dtype": None, "lr": 0.01}


def backend_model_path(name: str) -> Path:
    """A model of onnx's backend test data (``light_resnet50``, ...)."""
    folder = Path(os.path.dirname(onnx.__file__)) / "backend" / "test" / "data" / "light"
    path = folder / (name if name.endswith(".onnx") else f"{name}.onnx")
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in folder.glob("*.onnx"))) or "none"
        raise ConfigError(f"{BACKEND_PREFIX}{name}: not in the onnx package (known: {known})")
    return path


def resolve_path(path: Any) -> Path:
    if not path:
        raise ConfigError("onnx model: 'path' is required")
    text = str(path)
    if text.startswith(BACKEND_PREFIX):
        return backend_model_path(text[len(BACKEND_PREFIX):])
    return Path(text)


def parse_shape(text: str) -> tuple:
    """``"2x1024"`` -> (2, 1024)."""
    try:
        dims = tuple(int(d) for d in str(text).lower().split("x"))
    except ValueError:
        raise ConfigError(f"--input-shape: bad shape '{text}' (expected e.g. 2x1024)") from None
    if not dims or min(dims) < 1:
        raise ConfigError(f"--input-shape: bad shape '{text}' (dims must be positive)")
    return dims


def _check(config: Mapping[str, Any]) -> Dict[str, Any]:
    where = str(config.get("name", "onnx"))
    out = dict(DEFAULTS)
    for key, value in config.items():
        if key in ("family", "name"):
            continue
        if key not in DEFAULTS:
            raise ConfigError(f"{where}: unknown field '{key}' (allowed: "
                              f"{', '.join(sorted(DEFAULTS))})")
        out[key] = value
    shapes = out["input_shapes"] or {}
    if not isinstance(shapes, Mapping):
        raise ConfigError(f"{where}: input_shapes must map input names to shapes")
    out["input_shapes"] = {k: parse_shape(v) if isinstance(v, str) else tuple(v)
                           for k, v in shapes.items()}
    return out


def import_forward(config: Mapping[str, Any]) -> Function:
    c = _check(config)
    return import_onnx(resolve_path(c["path"]), input_shapes=c["input_shapes"], batch=c["batch"],
                       seq=c["seq"], device=0, dtype=c["dtype"])


def _trainable(f: Function, out: Value) -> list:
    """Parameters the output depends on through differentiable ops."""
    needed = {out}
    for op in reversed(f.ops):
        if op.op_type not in NON_DIFFERENTIABLE and any(v in needed for v in op.outputs):
            needed.update(op.inputs)
    return [p for p in f.meta["params"] if f.value_by_name(p) in needed]


def with_loss(forward: Function) -> Function:
    """The forward function with an MSE loss of its first floating-point
    output against a new ``target`` input; ``meta["params"]`` keeps the
    parameters the loss depends on."""
    outs = [v for v in forward.outputs if v.type.dtype.is_float]
    if not outs:
        raise ConfigError(f"{forward.name}: --train needs a floating-point model output")
    b, mapping = builder_from(forward)
    y = mapping[outs[0]]
    target = b.input("target", y.type)
    loss = b.op("mse_loss", [y, target], name="loss")
    f = b.finish([loss])
    f.meta["roles"] = dict(forward.meta["roles"], target="data")
    f.meta["batch_inputs"] = list(forward.meta["batch_inputs"]) + ["target"]
    f.meta["loss"] = loss.name
    f.meta["params"] = _trainable(f, y)
    if not f.meta["params"]:
        raise ConfigError(f"{forward.name}: --train: the output depends on no parameter")
    return f


def training_step(forward: Function, lr: float = 0.01) -> Function:
    """One device's step: loss, autodiff of every parameter, SGD update."""
    f = with_loss(forward)
    return SGD(lr)(Autodiff(f.meta["loss"], f.meta["params"])(f))


def _replicate(step: Function, strategy: Strategy, lr: float) -> Function:
    """The per-replica ``step`` (already at the local batch) on every
    data-parallel rank: gradients averaged by all-reduce and AdamW (as for
    the built-in transformers), or, without gradients, forward replicas.
    The lowering knows parameters and data; constants travel as data and
    get their role back afterwards."""
    roles = dict(step.meta["roles"])
    step.meta.setdefault("loss", step.outputs[0].name)
    step.meta.setdefault("grads", {})
    if not step.meta["grads"]:  # forward only: every input is per-replica data
        step.meta["params"] = []
    trainable = set(step.meta["params"])
    step.meta["roles"] = {k: ("param" if k in trainable else "data") for k in roles}
    program = LowerSPMD(strategy, 1, AdamHyper(lr=lr))(step)
    for name, info in program.meta["io"].items():
        original = roles.get(info.get("name", ""))
        if info.get("role") == "data" and original in ("param", "const"):
            program.meta["roles"][name] = original
    step.meta["roles"] = roles
    return program


def build_onnx(config: Mapping[str, Any], strategy: Strategy) -> Function:
    """Import at the per-replica batch (``batch / dp``), then the training
    step and its data-parallel lowering."""
    if strategy.tp != 1 or strategy.pp != 1:
        raise ConfigError("imported ONNX models support data parallelism only (--tp 1 --pp 1)")
    c = _check(config)
    dp = strategy.dp or 1
    local = dict(config)
    if c["batch"] is not None:
        if c["batch"] % dp:
            raise ConfigError(f"--batch {c['batch']} is not divisible by --dp {dp}")
        local["batch"] = c["batch"] // dp
    program = import_forward(local)
    if c["train"]:
        program = with_loss(program)
        program = Autodiff(program.meta["loss"], program.meta["params"])(program)
        if dp == 1:
            return SGD(float(c["lr"]))(program)
    elif dp == 1:
        return program
    program.meta["model"] = {"name": config.get("name", "onnx"), "layers": 1}
    return _replicate(program, Strategy(dp=dp), float(c["lr"]))


def describe_onnx(config: Mapping[str, Any]) -> Dict[str, Any]:
    f = import_forward(config)
    params = sum(int(np.prod(f.value_by_name(p).type.shape)) for p in f.meta["params"])
    return {"parameters": params, "ops": len(f.ops), "path": str(resolve_path(config["path"])),
            "outputs": {v.name: list(v.type.shape) for v in f.outputs}}


def config_for_file(path: str, name: Optional[str] = None) -> Dict[str, Any]:
    return {"family": "onnx", "name": name or Path(path).stem, "path": path}


ONNX_FAMILY = register_family(ModelFamily("onnx", build_onnx, dict(DEFAULTS), describe_onnx))
