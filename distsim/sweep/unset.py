"""What an option a sweep point leaves unset stands for, as the spec's
constraints see it: the value the run will use.

* a model field (``hidden``, ``layers``, ``heads``, ...): the model's own
  (``batch`` of a GPT is its ``global_batch``); None for a field the
  model does not have (``heads`` of an MLP);
* ``dp``: the devices that ``tp x pp`` leave; ``global_batch``,
  ``micro_batch`` and ``microbatches`` of a GPT: the sizes the step runs
  with (the model's, or what the point's others imply); ``global_batch``
  of another model: its ``batch``; ``virtual_stages``: 2 with the
  interleaved schedule, else 1;
* any other option: its default (``tp`` 1, ``zero`` 0, ``schedule``
  ``1f1b``, ...); None where the run has no single number (``bucket_mb``
  unset: one all-reduce per gradient), or where the point's options do
  not fit together (the point will be ``invalid``).

And ``devices``, the number of devices of the point's topology.
"""
from __future__ import annotations

from typing import Any, Dict, Mapping

from .. import api
from ..errors import DistsimError
from ..models import load_model_config
from ..topology import load_topology
from ..transforms.strategy import Strategy


#: The model overrides that shape a GPT's batches (``batch``: its global batch).
_GPT_SHAPE = ("batch", "layers", "hidden", "seq", "heads", "kv_heads", "ffn", "vocab")


class Resolver:
    """The values of points' options, with the model configs and device
    counts each read once."""

    def __init__(self, defaults: Mapping[str, Any]) -> None:
        self.defaults = dict(defaults)
        self._models: Dict[Any, Dict[str, Any]] = {}
        self._devices: Dict[Any, int] = {}

    def values(self, point: Mapping[str, Any]) -> Dict[str, Any]:
        """Every option of ``point`` (see the module docstring), and ``devices``."""
        env = {**self.defaults, **point}
        env["devices"] = devices = self._device_count(env.get("topology") or api.DEFAULT_TOPOLOGY)
        config = self._model(env.get("model") or api.DEFAULT_MODEL)
        gpt = config.get("family") == "gpt"
        for name in api.MODEL_FIELDS:
            if point.get(name) is None:
                env[name] = config.get("global_batch" if gpt and name == "batch" else name)
        given = {k: v for k, v in point.items() if k in api.STRATEGY_OPTIONS and v is not None}
        try:
            strategy = Strategy.from_mapping(given).resolved(devices)
        except DistsimError:
            return env
        env["dp"] = strategy.dp
        if point.get("virtual_stages") is None:
            env["virtual_stages"] = strategy.chunks
        if gpt:
            env.update(self._gpt_batches(config, point, strategy))
        elif env.get("global_batch") is None:
            env["global_batch"] = env.get("batch")     # the batch is the global batch
        return env

    def _gpt_batches(self, config: Mapping[str, Any], point: Mapping[str, Any],
                     strategy: Strategy) -> Dict[str, Any]:
        from ..models.gpt_family import gpt_config, resolve_batch
        fields = dict(config)
        for name in _GPT_SHAPE:
            if point.get(name) is not None:
                fields["global_batch" if name == "batch" else name] = point[name]
        try:
            c, microbatches = resolve_batch(gpt_config(fields), strategy)
        except (DistsimError, TypeError, ValueError):
            return {}
        return {"global_batch": c.global_batch, "micro_batch": c.micro_batch,
                "microbatches": microbatches, "batch": c.global_batch}

    def _model(self, model: Any) -> Dict[str, Any]:
        key = model if isinstance(model, str) else None
        if key is None:
            return load_model_config(model)
        if key not in self._models:
            self._models[key] = load_model_config(model)
        return self._models[key]

    def _device_count(self, topology: Any) -> int:
        key = topology if isinstance(topology, str) else id(topology)
        if key not in self._devices:
            self._devices[key] = load_topology(topology).num_devices
        return self._devices[key]
