"""DeviceSpec: what the cost model needs to know about one accelerator.

Figures come from topology files (see ``topologies/*.yaml``), which cite
their public sources. Achieved rates are peak times an efficiency, kept as
named fields so that calibration changes one number.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Mapping

from ..errors import ConfigError
from ..ir.types import DType


@dataclass(frozen=True)
class DeviceSpec:
    """One accelerator's compute and memory figures.

    ``peak_flops`` maps a dtype name (``f16``, ``bf16``, ``f32``, ...) to
    dense peak FLOP/s; ``matmul_efficiency`` and ``memory_efficiency`` are
    the achieved fractions of peak for large GEMMs and for streaming memory
    traffic; ``launch_overhead_s`` is added once per kernel.
    """

    name: str
    peak_flops: Mapping[str, float]
    memory_bandwidth_Bps: float
    memory_bytes: int
    launch_overhead_s: float = 0.0
    matmul_efficiency: float = 1.0
    vector_efficiency: float = 1.0
    memory_efficiency: float = 1.0

    def peak_flops_for(self, dtype: DType) -> float:
        """Peak FLOP/s for ``dtype``; bf16 falls back to f16 and integer
        types to f32 when the spec does not list them."""
        for key in (dtype.value, {"bf16": "f16", "f16": "bf16"}.get(dtype.value), "f32"):
            if key and key in self.peak_flops:
                return float(self.peak_flops[key])
        raise ConfigError(f"device '{self.name}' has no peak_flops entry for {dtype.value}")


_FIELDS = {
    "name": str, "memory_bandwidth_Bps": float, "memory_bytes": float,
    "launch_overhead_s": float, "matmul_efficiency": float, "vector_efficiency": float,
    "memory_efficiency": float,
}


def device_spec_from_dict(data: Any, where: str) -> DeviceSpec:
    """Build a DeviceSpec from a YAML mapping; errors name ``where`` and the
    field (e.g. ``topologies/x.yaml: device.memory_bytes``)."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where}: must be a mapping of device fields")
    unknown = set(data) - set(_FIELDS) - {"peak_flops", "source"}
    if unknown:
        raise ConfigError(f"{where}.{sorted(unknown)[0]}: unknown field "
                          f"(allowed: peak_flops, {', '.join(_FIELDS)}, source)")
    values: Dict[str, Any] = {}
    for key, kind in _FIELDS.items():
        if key not in data:
            if key in ("name", "memory_bandwidth_Bps", "memory_bytes"):
                raise ConfigError(f"{where}.{key}: missing required field")
            continue
        raw = data[key]
        if kind is float:
            if isinstance(raw, bool) or not isinstance(raw, (int, float)):
                raise ConfigError(f"{where}.{key}: expected a number, got {raw!r}")
            if raw < 0 or (raw == 0 and key in ("memory_bandwidth_Bps", "memory_bytes")):
                raise ConfigError(f"{where}.{key}: must be positive, got {raw!r}")
            if key.endswith("efficiency") and not 0 < raw <= 1:
                raise ConfigError(f"{where}.{key}: must be in (0, 1], got {raw!r}")
            values[key] = float(raw)
        else:
            values[key] = str(raw)
    flops = data.get("peak_flops")
    if not isinstance(flops, Mapping) or not flops:
        raise ConfigError(f"{where}.peak_flops: expected a mapping of dtype to FLOP/s")
    peak: Dict[str, float] = {}
    for k, v in flops.items():
        try:
            dtype = DType.parse(str(k))
        except ConfigError:
            raise ConfigError(f"{where}.peak_flops.{k}: unknown dtype") from None
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0:
            raise ConfigError(f"{where}.peak_flops.{k}: must be a positive number, got {v!r}")
        peak[dtype.value] = float(v)
    values["memory_bytes"] = int(values["memory_bytes"])
    return DeviceSpec(peak_flops=peak, **values)
