"""The ``mlp`` model family: MLP training step, data-parallel."""
from __future__ import annotations

from typing import Any, Dict, Mapping

from ..errors import ConfigError
from ..ir.core import Function
from ..transforms.data_parallel import DataParallel
from ..transforms.strategy import Strategy
from .mlp import MLPConfig, mlp_training_step
from .registry import ModelFamily, register_family


def _config(config: Mapping[str, Any]) -> MLPConfig:
    fields = {k: v for k, v in config.items() if k not in ("family", "name")}
    return MLPConfig.from_dict(fields, where=str(config.get("name", "mlp")))


def build_mlp(config: Mapping[str, Any], strategy: Strategy) -> Function:
    if strategy.tp != 1 or strategy.pp != 1:
        raise ConfigError("model 'mlp' supports data parallelism only (--tp 1 --pp 1)")
    step = mlp_training_step(_config(config), device=0)
    return DataParallel(strategy.dp or 1)(step)


def describe_mlp(config: Mapping[str, Any]) -> Dict[str, Any]:
    c = _config(config)
    params = c.layers * (c.hidden * c.hidden + (c.hidden if c.bias else 0))
    return {"parameters": params, "layers": c.layers, "hidden": c.hidden, "batch": c.batch,
            "dtype": c.dtype}


MLP_FAMILY = register_family(ModelFamily("mlp", build_mlp, MLPConfig().to_dict(), describe_mlp))
