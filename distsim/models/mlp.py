"""The MLP training step: the model of the end-to-end path.

``layers`` fully connected layers of ``hidden`` units (ReLU between them,
none after the last), a mean-squared-error loss against a target, the
backward pass by autodiff and an SGD update. Inputs are the batch ``x``
(``batch x hidden``), the target and the parameters; outputs the loss and
the updated parameters.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any, Mapping

from ..errors import ConfigError
from ..ir.builder import FunctionBuilder
from ..ir.core import Function
from ..ir.types import DType, TensorType, parse_float_dtype
from ..transforms.autodiff import Autodiff
from ..transforms.optimizer import SGD


@dataclass(frozen=True)
class MLPConfig:
    """Size of the MLP step. Defaults are the embedded default of
    ``distsim simulate`` (and ``models/mlp.yaml``)."""

    layers: int = 8
    hidden: int = 4096
    batch: int = 2048
    dtype: str = "f16"
    bias: bool = True
    lr: float = 0.01

    def __post_init__(self) -> None:
        for name in ("layers", "hidden", "batch"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"mlp.{name}: must be a positive integer, got {value!r}")
        parse_float_dtype("mlp.dtype", self.dtype)
        if not isinstance(self.bias, bool):
            raise ConfigError(f"mlp.bias: must be true or false, got {self.bias!r}")
        # finite: an infinite rate is no step, and not JSON in the summary's config
        if isinstance(self.lr, bool) or not isinstance(self.lr, (int, float)) \
                or not 0 < self.lr < math.inf:
            raise ConfigError(f"mlp.lr: must be a positive number, got {self.lr!r}")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str = "mlp") -> "MLPConfig":
        allowed = {f.name for f in fields(cls)}
        for key in data:
            if key not in allowed:
                raise ConfigError(f"{where}: unknown field '{key}' (allowed: "
                                  f"{', '.join(sorted(allowed))})")
        return cls(**dict(data))

    def to_dict(self) -> dict:
        return asdict(self)


def mlp_forward(config: MLPConfig, device: int | None = 0, layer_meta: bool = False) -> Function:
    """Forward pass and loss; ``meta["roles"]`` marks data and parameters.
    With ``layer_meta`` each op of layer ``i`` has ``meta["layer"] = i``
    (the loss none: it follows the last layer), as pipeline stages need."""
    dtype = DType.parse(config.dtype)
    b = FunctionBuilder("mlp_step")
    x = b.input("x", TensorType((config.batch, config.hidden), dtype, device))
    target = b.input("target", TensorType((config.batch, config.hidden), dtype, device))
    roles = {"x": "data", "target": "data"}
    params = []
    h = x
    for i in range(config.layers):
        meta = {"layer": i} if layer_meta else None
        w = b.input(f"w{i}", TensorType((config.hidden, config.hidden), dtype, device))
        roles[w.name] = "param"
        params.append(w.name)
        h = b.op("matmul", [h, w], name=f"h{i}", meta=meta)
        if config.bias:
            bias = b.input(f"b{i}", TensorType((config.hidden,), dtype, device))
            roles[bias.name] = "param"
            params.append(bias.name)
            h = b.op("add", [h, bias], name=f"h{i}", meta=meta)
        if i < config.layers - 1:
            h = b.op("relu", [h], name=f"a{i}", meta=meta)
    loss = b.op("mse_loss", [h, target], name="loss")
    f = b.finish([loss])
    f.meta["roles"] = roles
    f.meta["params"] = params
    f.meta["loss"] = loss.name
    f.meta["batch_inputs"] = ["x", "target"]
    f.meta["model"] = {"name": "mlp", **config.to_dict()}
    return f


def mlp_training_step(config: MLPConfig, device: int | None = 0) -> Function:
    """Forward, backward (autodiff) and SGD update on one device."""
    forward = mlp_forward(config, device)
    step = Autodiff(forward.meta["loss"], forward.meta["params"])(forward)
    return SGD(config.lr)(step)
