"""The ``mlp`` model family: MLP training step, data-parallel."""
from __future__ import annotations

from typing import Any, Dict, List, Mapping

from ..errors import ConfigError
from ..ir.core import Function
from ..transforms.data_parallel import DataParallel
from ..transforms.strategy import Strategy
from .mlp import MLPConfig, mlp_training_step
from .registry import ModelFamily, register_family


def _config(config: Mapping[str, Any]) -> MLPConfig:
    fields = {k: v for k, v in config.items() if k not in ("family", "name")}
    return MLPConfig.from_dict(fields, where=str(config.get("name", "mlp")))


def unsupported_options(strategy: Strategy) -> List[str]:
    """The strategy options set away from their defaults that the MLP step
    does not apply (it is plain data parallelism with an SGD update and one
    all-reduce per gradient). Refused rather than ignored: a run that says
    ``zero: 3`` or ``bucket_mb: 0`` in its config but simulated neither
    would be a silently wrong number. ``--optimizer`` is not checked here
    (its default cannot be told from an explicit ``adamw``):
    :func:`distsim.api.build_program` compares an explicit one with the
    optimizer the built step uses."""
    default = Strategy()
    flags = []
    for name in ("zero", "recompute", "microbatches", "schedule", "virtual_stages",
                 "bucket_mb", "global_batch", "micro_batch", "partition", "prefetch",
                 "zero3_unit"):
        value = getattr(strategy, name)
        if value != getattr(default, name):
            flags.append(f"--{name.replace('_', '-')} {value}")
    return flags


def build_mlp(config: Mapping[str, Any], strategy: Strategy) -> Function:
    if strategy.tp != 1 or strategy.pp != 1:
        raise ConfigError("model 'mlp' supports data parallelism only (--tp 1 --pp 1)")
    flags = unsupported_options(strategy)
    if flags:
        raise ConfigError(f"{', '.join(flags)}: not supported by model 'mlp' (plain data "
                          "parallelism, one all-reduce per gradient, SGD; the batch is --batch)")
    step = mlp_training_step(_config(config), device=0)
    return DataParallel(strategy.dp or 1)(step)


def describe_mlp(config: Mapping[str, Any]) -> Dict[str, Any]:
    c = _config(config)
    params = c.layers * (c.hidden * c.hidden + (c.hidden if c.bias else 0))
    return {"parameters": params, "layers": c.layers, "hidden": c.hidden, "batch": c.batch,
            "dtype": c.dtype}


MLP_FAMILY = register_family(ModelFamily("mlp", build_mlp, MLPConfig().to_dict(), describe_mlp,
                                         check=_config))
