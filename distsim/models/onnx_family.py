"""The ``onnx`` model family: a model imported from an ONNX file.

    distsim simulate --model models/gpt2-tiny.onnx --input-shape input_ids=8x64
    distsim simulate --model resnet50 --train --batch 256 --dp 8 --zero 1

Config fields: ``path`` (a file, or ``onnx-backend:NAME`` for a model the
onnx package ships for its backend tests, e.g. ``light_resnet50``),
``train`` (append a loss, the backward pass and an AdamW update),
``input_shapes`` (name -> shape), ``batch``, ``seq``, ``dtype``, ``lr``,
``frozen`` (initializer name patterns that are buffers, not trained: see
:data:`~distsim.importers.onnx.DEFAULT_FROZEN`).
The training loss is the mean squared error of the first floating-point
output against a target of its shape (the cost of the loss itself is
negligible next to the model's).

The batch (``batch``, ``--global-batch`` or dim 0 of the inputs) is the
global one: the model is imported at the per-rank micro-batch ``batch /
(dp x microbatches)`` (reshapes keep their exported static shapes) and
lowered by :class:`~distsim.transforms.spmd.LowerSPMD`, as the built-in
transformers are, on one device too: gradients accumulated over the
micro-batches, averaged by all-reduce (ZeRO 2/3: reduce-scattered), AdamW
with fp32 master weights sharded as ``--zero`` says. With ``--train``,
``--tp``, ``--sp``, ``--pp``, ``--plan`` and ``--recompute`` take the
generic path (:func:`parallel_step`): tensor parallelism from the plan
(``megatron`` by default), pipeline layers from the nodes' module scopes
(``...layers.3...``: layer 3). Without ``--train`` they are refused with a
ConfigError naming the option and the model, never ignored.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Union

import numpy as np
import onnx

from ..errors import ConfigError, VerifyError
from ..importers.onnx import import_onnx, load_onnx_model
from ..ir.builder import builder_from
from ..ir.core import Function, Value
from ..ir.types import DType
from ..transforms.autodiff import Autodiff
from ..transforms.adam import AdamHyper, AdamW
from ..transforms.grad_rules import NON_DIFFERENTIABLE
from ..transforms.optimizer import SGDHyper
from ..transforms.spmd import LowerSPMD
from ..transforms.strategy import Strategy
from .registry import ModelFamily, register_family

BACKEND_PREFIX = "onnx-backend:"
DEFAULTS: Dict[str, Any] = {"path": None, "train": False, "input_shapes": {}, "batch": None,
                            "seq": None, "dtype": None, "lr": 0.01, "frozen": None}


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
                       seq=c["seq"], device=0, dtype=c["dtype"], frozen=c["frozen"])


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


def training_step(forward: Function, lr: float = 0.01,
                  hyper: Optional[AdamHyper] = None) -> Function:
    """The single-device reference step on the whole batch: loss, autodiff
    of every parameter and the same AdamW update as the lowered programs
    of :func:`build_onnx` (master weights in the parameters' dtype when it
    is f64, else f32)."""
    f = with_loss(forward)
    h = hyper or AdamHyper(lr=lr)
    return AdamW(lr=h.lr, beta1=h.beta1, beta2=h.beta2, eps=h.eps, weight_decay=h.weight_decay,
                 master_dtype=_master_dtype(f), step=h.step)(
        Autodiff(f.meta["loss"], f.meta["params"])(f))


def _master_dtype(f: Function) -> str:
    floats = [f.value_by_name(p).type.dtype for p in f.meta.get("params", ())]
    return "f64" if floats and all(dt is DType.F64 for dt in floats) else "f32"


@dataclass(frozen=True)
class BatchPlan:
    """How the global batch splits: ``batch`` samples per step (None: the
    model's own, when nothing splits it), ``microbatches`` per
    data-parallel rank, ``local`` samples per micro-batch on one rank."""

    batch: Optional[int]
    microbatches: int
    local: Optional[int]


def _declared_batch(c: Mapping[str, Any]) -> Optional[int]:
    """Dim 0 of the graph inputs as ``--input-shape`` or the file gives it
    (None: symbolic and not given); ConfigError when inputs disagree."""
    model, source, _ = load_onnx_model(resolve_path(c["path"]))
    inits = {i.name for i in model.graph.initializer}
    found: Dict[str, int] = {}
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        if vi.name in c["input_shapes"]:
            shape = c["input_shapes"][vi.name]
            if shape:
                found[vi.name] = int(shape[0])
            continue
        tt = vi.type.tensor_type
        dims = list(tt.shape.dim) if tt.HasField("shape") else []
        if dims and dims[0].HasField("dim_value") and dims[0].dim_value > 0:
            found[vi.name] = int(dims[0].dim_value)
    if len(set(found.values())) > 1:
        listing = ", ".join(f"{k}: {v}" for k, v in found.items())
        raise ConfigError(f"{source}: the graph inputs disagree on the batch size (dim 0: "
                          f"{listing}); give --batch")
    return next(iter(found.values()), None)


def plan_batches(c: Mapping[str, Any], strategy: Strategy, where: str) -> BatchPlan:
    """The global batch (``--global-batch``, else ``--batch`` or the config's
    ``batch``, else dim 0 of the inputs), split over ``dp`` ranks and
    ``--microbatches`` (or ``--micro-batch`` samples per micro-batch).

    ``--batch`` against ``--global-batch`` is not checked here: that is the
    one shared :func:`~distsim.models.registry.check_batch_options`, which
    :func:`distsim.api.build_program`, the CLI and the sweep's estimator run
    on the options before any family builds, so an ONNX model and a GPT get
    the same line for them. Here ``c["batch"]`` cannot be told apart from
    the model file's ``batch`` field, which ``--global-batch`` overrides as
    it overrides a GPT file's ``global_batch`` (refusing the pair here named
    a ``--batch`` the user never gave). Each message names where the batch
    came from: the flag, or dim 0 of the inputs."""
    dp = strategy.dp or 1
    if strategy.global_batch is not None:
        batch, source = strategy.global_batch, "--global-batch"
    else:
        batch, source = c["batch"], "--batch"
    m, mb = strategy.microbatches, strategy.micro_batch
    if dp * (m or 1) == 1 and mb is None:
        return BatchPlan(batch, 1, batch)
    subject = f"{source} {batch}"
    if batch is None:
        batch = _declared_batch(c)
        subject = f"batch {batch} (dim 0 of the inputs)"
    if batch is None:
        raise ConfigError(f"{where}: the batch dimension is symbolic; give --batch (or "
                          "--input-shape) to split it over data-parallel ranks and micro-batches")
    if mb is not None:
        if m is None:
            if batch % (dp * mb):
                raise ConfigError(f"{subject} is not a multiple of dp x micro-batch = "
                                  f"{dp} x {mb}")
            m = batch // (dp * mb)
        elif batch != dp * m * mb:
            raise ConfigError(f"{subject} differs from dp x microbatches x micro-batch = "
                              f"{dp} x {m} x {mb} = {dp * m * mb} (give two of global batch, "
                              "microbatches and micro-batch)")
    m = m or 1
    if batch % (dp * m):
        raise ConfigError(f"{subject} is not divisible by dp x microbatches = {dp} x {m}"
                          if m > 1 else f"{subject} is not divisible by --dp {dp}")
    return BatchPlan(batch, m, batch // (dp * m))


def model_parallel(strategy: Strategy) -> bool:
    """Whether the strategy takes the generic path (a plan's tensor
    parallelism, pipeline stages, recomputation of layers)."""
    return (strategy.tp > 1 or strategy.pp > 1 or strategy.plan is not None
            or strategy.recompute != "none")


def check_strategy(strategy: Strategy, train: bool, where: str) -> None:
    """Refuse, naming the option and the model, every strategy field that
    an imported model cannot honour (none is ignored silently)."""
    if model_parallel(strategy) and not train:
        flags = [f for f, on in ((f"--tp {strategy.tp}", strategy.tp > 1),
                                 (f"--pp {strategy.pp}", strategy.pp > 1),
                                 (f"--plan {strategy.plan}", strategy.plan is not None),
                                 (f"--recompute {strategy.recompute}",
                                  strategy.recompute != "none")) if on]
        raise ConfigError(f"{', '.join(flags)}: the imported ONNX model {where} is forward-only "
                          "here; add --train (tensor and pipeline parallelism, plans and "
                          "recomputation apply to its training step)")
    if not train:
        for flag, given in ((f"--zero {strategy.zero}", strategy.zero != 0),
                            (f"--bucket-mb {strategy.bucket_mb}", strategy.bucket_mb is not None)):
            if given:
                raise ConfigError(f"{flag}: the imported ONNX model {where} is forward-only "
                                  "(no gradients or optimizer state); add --train")


def build_onnx(config: Mapping[str, Any], strategy: Strategy,
               hyper: Optional[Union[AdamHyper, SGDHyper]] = None) -> Function:
    """Import at the per-replica micro-batch (``batch / (dp x
    microbatches)``), then the training step lowered by
    :class:`~distsim.transforms.spmd.LowerSPMD` under ``strategy``: ZeRO,
    micro-batches (gradient accumulation), the schedule, DDP buckets,
    --symmetry and --coarsen as for the built-in transformers, the
    strategy's optimizer (AdamW or SGD; ``hyper``, default ``lr`` from the
    config) on any number of devices.
    Without ``train``: forward replicas (micro-batches run one after the
    other). Options that cannot apply are a ConfigError."""
    c = _check(config)
    where = f"'{config.get('name', 'onnx')}'"
    strategy = strategy if strategy.dp is not None else replace(strategy, dp=1)
    check_strategy(strategy, bool(c["train"]), where)
    plan = plan_batches(c, strategy, where)
    local = dict(config)
    if plan.local != plan.batch:
        local["batch"] = plan.local
        local["input_shapes"] = {k: (plan.local,) + tuple(v[1:]) if len(v) else tuple(v)
                                 for k, v in c["input_shapes"].items()}
    try:
        step = import_forward(local)
    except VerifyError as e:
        if plan.local == plan.batch:
            raise
        raise VerifyError(f"{e} (imported at the micro-batch of {plan.local} per data-parallel "
                          f"rank; global batch {plan.batch})") from None
    if hyper is None:
        hyper = (SGDHyper(lr=float(c["lr"])) if strategy.optimizer == "sgd"
                 else AdamHyper(lr=float(c["lr"])))
    model = {"name": config.get("name", "onnx"), "layers": 1, "batch": plan.batch,
             "micro_batch": plan.local}
    if c["train"] and model_parallel(strategy):
        program = parallel_step(with_loss(step), strategy, plan.microbatches, hyper, model)
        program.meta["constants"] = dict(step.meta.get("constants", {}))
        return program
    if c["train"]:
        step = with_loss(step)
        step = Autodiff(step.meta["loss"], step.meta["params"])(step)
    elif strategy.num_devices == 1 and plan.microbatches == 1:
        return step
    step.meta["model"] = model
    program = _lower(step, strategy, plan.microbatches, hyper)
    program.meta["model"] = dict(step.meta["model"])
    # the data of the constants, by the name in meta["io"][input]["name"]
    program.meta["constants"] = dict(step.meta.get("constants", {}))
    return program


def _lower(step: Function, strategy: Strategy, microbatches: int,
           hyper: Union[AdamHyper, SGDHyper]) -> Function:
    """The per-replica, per-micro-batch ``step`` on every data-parallel
    rank: gradients accumulated over the micro-batches, averaged by
    all-reduce (or reduce-scattered under ZeRO 2/3) and AdamW, or, without
    gradients, forward replicas. The lowering knows parameters and data;
    constants travel as data and get their role back afterwards."""
    roles = dict(step.meta["roles"])
    step.meta.setdefault("loss", step.outputs[0].name)
    step.meta.setdefault("grads", {})
    if not step.meta["grads"]:  # forward only: every input is per-replica data
        step.meta["params"] = []
    trainable = set(step.meta["params"])
    step.meta["roles"] = {k: ("param" if k in trainable else "data") for k in roles}
    program = LowerSPMD(strategy, microbatches, hyper, _master_dtype(step),
                        representatives=strategy.symmetry, coarsen=strategy.coarsen)(step)
    for name, info in program.meta["io"].items():
        original = roles.get(info.get("name", ""))
        if info.get("role") == "data" and original in ("param", "const"):
            program.meta["roles"][name] = original
    step.meta["roles"] = roles
    return program


def parallel_step(forward: Function, strategy: Strategy, microbatches: int,
                  hyper: Union[AdamHyper, SGDHyper], model: Dict[str, Any]) -> Function:
    """The forward-and-loss step under a plan's tensor parallelism and
    pipeline stages read off the nodes' scopes (``layers.3``: layer 3), by
    the generic path (:func:`~distsim.transforms.parallelize.parallelize`).
    Constants travel as data, as in :func:`_lower`."""
    # the generic path loads the sharding layer: only when it is taken
    from ..transforms.parallelize import parallelize, resolve_plan
    from ..transforms.pipeline_layers import layers_from_scopes
    name = str(model["name"])
    plan = resolve_plan(strategy.plan, forward)
    layers = layers_from_scopes(forward)
    if layers is None and (strategy.pp > 1 or strategy.recompute != "none") and not plan.cuts:
        raise ConfigError(f"--pp {strategy.pp}, --recompute {strategy.recompute}: the imported "
                          f"ONNX model '{name}' names no layers in its nodes' scopes (such as "
                          "layers.3); give a plan with cuts (--plan FILE)")
    forward.meta["model"] = dict(model, layers=layers or 1)
    roles = dict(forward.meta["roles"])
    trainable = set(forward.meta["params"])
    forward.meta["roles"] = {k: ("param" if k in trainable else "data") for k in roles}
    program = parallelize(forward, strategy, microbatches, hyper, _master_dtype(forward), plan,
                          name)
    for io_name, info in program.meta["io"].items():
        original = roles.get(info.get("name", ""))
        if info.get("role") == "data" and original in ("param", "const"):
            program.meta["roles"][io_name] = original
    program.meta["model"] = dict(forward.meta["model"])
    return program


def describe_onnx(config: Mapping[str, Any]) -> Dict[str, Any]:
    f = import_forward(config)
    params = sum(int(np.prod(f.value_by_name(p).type.shape)) for p in f.meta["params"])
    return {"parameters": params, "ops": len(f.ops), "path": str(resolve_path(config["path"])),
            "outputs": {v.name: list(v.type.shape) for v in f.outputs}}


def config_for_file(path: str, name: Optional[str] = None) -> Dict[str, Any]:
    return {"family": "onnx", "name": name or Path(path).stem, "path": path}


ONNX_FAMILY = register_family(ModelFamily("onnx", build_onnx, dict(DEFAULTS), describe_onnx,
                                          check=_check))
