"""The ``mlp`` model family: the MLP training step under any strategy.

Plain data parallelism (``--dp`` alone) is :class:`DataParallel` of the
one-device step (one all-reduce per gradient, SGD). Any other strategy --
tensor and sequence parallelism from a plan (``--plan``, default
``megatron``: column/row pairs of consecutive layers), pipeline stages
over the layers, micro-batches, ZeRO, buckets, recomputation -- goes
through the generic path (:func:`~distsim.transforms.parallelize.parallelize`):
SGD with master weights in the model's dtype widened to at least f32.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Dict, List, Mapping, Tuple

from ..errors import ConfigError
from ..ir.core import Function
from ..ir.types import DType
from ..transforms.data_parallel import DataParallel
from ..transforms.optimizer import SGDHyper
from ..transforms.strategy import Strategy
from .mlp import MLPConfig, mlp_forward, mlp_training_step
from .registry import ModelFamily, register_family

#: the strategy fields only the generic path applies
GENERIC_OPTIONS = ("zero", "recompute", "microbatches", "schedule", "virtual_stages",
                   "bucket_mb", "global_batch", "micro_batch", "partition", "prefetch",
                   "zero3_unit", "plan", "fusion", "ep")


def _config(config: Mapping[str, Any]) -> MLPConfig:
    fields = {k: v for k, v in config.items() if k not in ("family", "name")}
    return MLPConfig.from_dict(fields, where=str(config.get("name", "mlp")))


def generic_options(strategy: Strategy) -> List[str]:
    """The strategy options set away from their defaults that plain data
    parallelism does not apply (they take the generic path)."""
    default = Strategy()
    return [f"--{name.replace('_', '-')} {getattr(strategy, name)}" for name in GENERIC_OPTIONS
            if getattr(strategy, name) != getattr(default, name)
            and not (name == "fusion" and strategy.fusion == "none")]   # the MLP's default


def is_plain_data_parallel(strategy: Strategy) -> bool:
    return strategy.tp == 1 and strategy.pp == 1 and not generic_options(strategy)


def split_batch(batch: int, strategy: Strategy) -> Tuple[int, int]:
    """(micro-batches per data-parallel rank, samples per micro-batch) of the
    global ``batch``: ``--microbatches`` and/or ``--micro-batch`` (default
    one micro-batch); ConfigError when they do not fit."""
    dp = strategy.dp or 1
    m, mb = strategy.microbatches, strategy.micro_batch
    if m is not None and mb is not None:
        if dp * m * mb != batch:
            raise ConfigError(f"--batch {batch} differs from dp x microbatches x micro-batch = "
                              f"{dp} x {m} x {mb} = {dp * m * mb} (give two of them)")
        return m, mb
    if mb is not None:
        if batch % (dp * mb):
            raise ConfigError(f"--batch {batch} is not a multiple of dp x micro-batch = "
                              f"{dp} x {mb}")
        return batch // (dp * mb), mb
    m = m or 1
    if batch % (dp * m):
        raise ConfigError(f"--batch {batch} is not a multiple of dp x microbatches = "
                          f"{dp} x {m}")
    return m, batch // (dp * m)


def master_dtype(c: MLPConfig) -> str:
    """The dtype of the master weights: the model's, at least f32."""
    return "f64" if DType.parse(c.dtype) is DType.F64 else "f32"


def build_mlp(config: Mapping[str, Any], strategy: Strategy) -> Function:
    c = _config(config)
    if is_plain_data_parallel(strategy):
        step = mlp_training_step(c, device=0)
        return DataParallel(strategy.dp or 1)(step)
    # the generic path loads the sharding layer: only when it is taken
    from ..transforms.parallelize import parallelize, resolve_plan
    strategy = strategy if strategy.dp is not None else replace(strategy, dp=1)
    batch = strategy.global_batch or c.batch
    m, mb = split_batch(batch, strategy)
    name = str(config.get("name", "mlp"))
    forward = mlp_forward(replace(c, batch=mb), device=0, layer_meta=True)
    plan = resolve_plan(strategy.plan, forward)
    program = parallelize(forward, strategy, m, SGDHyper(lr=c.lr), master_dtype(c), plan, name)
    program.meta["model"] = {"name": name, **replace(c, batch=batch).to_dict(),
                             "micro_batch": mb, "parameters": parameter_count(c)}
    return program


def parameter_count(c: MLPConfig) -> int:
    return c.layers * (c.hidden * c.hidden + (c.hidden if c.bias else 0))


def describe_mlp(config: Mapping[str, Any]) -> Dict[str, Any]:
    c = _config(config)
    return {"parameters": parameter_count(c), "layers": c.layers, "hidden": c.hidden,
            "batch": c.batch, "dtype": c.dtype}


MLP_FAMILY = register_family(ModelFamily("mlp", build_mlp, MLPConfig().to_dict(), describe_mlp,
                                         check=_config))
