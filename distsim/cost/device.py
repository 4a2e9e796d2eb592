"""DeviceSpec: what the cost model needs to know about one accelerator.

Figures come from topology files (see ``topologies/*.yaml``), which cite
their public sources. Achieved rates are peak times an efficiency, kept as
named fields so that calibration changes one number.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Dict, Mapping, Optional, Tuple

from ..errors import ConfigError
from ..ir.registry import is_registered
from ..ir.types import DType
from .attention_time import AttentionModel
from .device_blocks import attention_model_from_dict, efficiency_by_class, gemm_model_from_dict
from .gemm import GemmModel
from .kernel_classes import kernel_class


#: On a device without an ``attention`` block (measured FlashAttention
#: figures, :class:`~distsim.cost.attention_time.AttentionModel`), the fused
#: attention kernels (``fused_attention`` and its backward) run on the
#: tensor cores like a GEMM but reach less of the peak: their FLOPs are
#: timed at ``matmul_efficiency`` times this share. Source: FlashAttention-2
#: (Dao 2023, "FlashAttention-2: Faster Attention with Better Parallelism
#: and Work Partitioning", arXiv:2307.08691, abstract and Sec. 4.1): on A100
#: it reaches 50-73 % of the 312 TFLOP/s bf16 peak, the forward pass at the
#: top of that range, the backward pass lower (its 5 matmuls have more
#: dependencies), while optimised GEMMs reach 80-90 % (Sec. 1). So the
#: forward runs at about 0.85 of a GEMM's efficiency and the backward at
#: about 0.75. A measured kernel time
#: (``CostModel(profile={"fused_attention": ...})``) overrides them.
ATTENTION_VS_MATMUL: Dict[str, float] = {"fused_attention": 0.85,
                                         "fused_attention_grad": 0.75}


@dataclass(frozen=True)
class DeviceSpec:
    """One accelerator's compute and memory figures.

    ``peak_flops`` maps a dtype name (``f16``, ``bf16``, ``f32``, ...) to
    dense peak FLOP/s; ``matmul_efficiency`` and ``memory_efficiency`` are
    the achieved fractions of peak for large GEMMs and for streaming memory
    traffic; ``launch_overhead_s`` is added once per kernel (a cost on the
    device's timeline). ``host_launch_s``, when above 0, is the host's time
    to issue one kernel: the host queues kernels ahead of the device, one
    every ``host_launch_s``, and a kernel starts no earlier than it was
    issued (the simulator's launch queue; 0, the default, issues every
    kernel at once).
    ``memory_efficiency_by_class`` gives a kernel class its own figure
    (:mod:`~distsim.cost.kernel_classes`: copies, element-wise kernels,
    norms, softmax, reductions) and ``memory_efficiency_by_op`` one op
    type, both in place of ``memory_efficiency``. ``gemm`` (the tile/wave
    GEMM model) and ``attention`` (FlashAttention's figures), when given,
    time matrix products and fused attention in place of the flat
    efficiencies: a device opts in per file.
    """

    name: str
    peak_flops: Mapping[str, float]
    memory_bandwidth_Bps: float
    memory_bytes: int
    launch_overhead_s: float = 0.0
    host_launch_s: float = 0.0
    matmul_efficiency: float = 1.0
    vector_efficiency: float = 1.0
    memory_efficiency: float = 1.0
    memory_efficiency_by_op: Mapping[str, float] = field(default_factory=dict)
    memory_efficiency_by_class: Mapping[str, float] = field(default_factory=dict)
    gemm: Optional[GemmModel] = None
    attention: Optional[AttentionModel] = None

    def compute_efficiency_of(self, op_type: str, matmul: bool = False) -> float:
        """The fraction of peak FLOP/s that ``op_type``'s kernel reaches:
        ``matmul_efficiency`` for matrix products (``matmul``), a share of
        it for the fused attention kernels (:data:`ATTENTION_VS_MATMUL`),
        ``vector_efficiency`` for everything else."""
        if matmul:
            return self.matmul_efficiency
        share = ATTENTION_VS_MATMUL.get(op_type)
        if share is not None:
            return self.matmul_efficiency * share
        return self.vector_efficiency

    def memory_efficiency_of(self, op_type: str) -> float:
        """The fraction of memory bandwidth that ``op_type``'s kernel reaches:
        its own figure, its kernel class's, or ``memory_efficiency``."""
        eff = self.memory_efficiency_by_op.get(op_type)
        if eff is None:
            by_class = self.memory_efficiency_by_class
            eff = by_class.get(kernel_class(op_type)) if by_class else None
        return self.memory_efficiency if eff is None else eff

    def peak_flops_for(self, dtype: DType) -> float:
        """Peak FLOP/s for ``dtype``; bf16 falls back to f16 and integer
        types to f32 when the spec does not list them."""
        for key in (dtype.value, {"bf16": "f16", "f16": "bf16"}.get(dtype.value), "f32"):
            if key and key in self.peak_flops:
                return float(self.peak_flops[key])
        raise ConfigError(f"device '{self.name}' has no peak_flops entry for {dtype.value}")


#: the device fields besides the figures of :data:`_FIELDS`
_BLOCKS = ("memory_efficiency_by_op", "memory_efficiency_by_class", "gemm", "attention",
           "source")

_FIELDS = {
    "name": str, "memory_bandwidth_Bps": float, "memory_bytes": float,
    "launch_overhead_s": float, "host_launch_s": float, "matmul_efficiency": float,
    "vector_efficiency": float, "memory_efficiency": float,
}

#: The closed range each figure must lie in (a lower bound of 0 for an
#: efficiency means "above 0": efficiencies are in (0, 1]). Besides
#: rejecting NaN and infinity, the bounds keep every derived time finite: an
#: op's time is flops / peak or bytes / bandwidth (at least 1 FLOP/s and
#: 1 B/s, so even 1e20 FLOP take a finite time), and a launch overhead
#: summed over ten million ops stays finite (at most 1 s per kernel, itself
#: absurd: real launches take microseconds). Capacities stay below 2^63
#: bytes so that numpy (memory curves, plots) holds them exactly.
FIGURE_RANGES: Dict[str, Tuple[float, float]] = {
    "peak_flops": (1.0, math.inf),
    "memory_bandwidth_Bps": (1.0, math.inf),
    "memory_bytes": (1.0, 1e18),
    "launch_overhead_s": (0.0, 1.0),
    "host_launch_s": (0.0, 1.0),
    "matmul_efficiency": (0.0, 1.0),
    "vector_efficiency": (0.0, 1.0),
    "memory_efficiency": (0.0, 1.0),
    "memory_efficiency_by_op": (0.0, 1.0),
}


def finite_float(raw: Any) -> float | None:
    """``raw`` as a finite float, or None when it is not a number (a bool,
    text, None), NaN, infinite, or an int too large for a float."""
    if isinstance(raw, bool) or not isinstance(raw, (int, float)):
        return None
    try:
        value = float(raw)
    except OverflowError:
        return None
    return value if math.isfinite(value) else None


def check_figure(where: str, key: str, raw: Any) -> float:
    """``raw`` as a float if it is a finite number in ``key``'s range of
    :data:`FIGURE_RANGES` (``key`` ``peak_flops.f16`` uses ``peak_flops``'s);
    otherwise one ConfigError naming ``where.key`` and the value."""
    low, high = FIGURE_RANGES[key.split(".")[0]]
    if isinstance(raw, bool) or not isinstance(raw, (int, float)):
        raise ConfigError(f"{where}.{key}: expected a number, got {raw!r}")
    value = finite_float(raw)
    if value is None:
        raise ConfigError(f"{where}.{key}: must be a finite number, got {_show(raw)}")
    if "efficiency" in key.split(".")[0]:
        if not 0 < value <= 1:
            raise ConfigError(f"{where}.{key}: must be in (0, 1], got {raw!r}")
    elif value < 0 or (value == 0 and low > 0):
        raise ConfigError(f"{where}.{key}: must be {'positive' if low > 0 else '>= 0'}, "
                          f"got {raw!r}")
    elif not low <= value <= high:
        need = f"at least {low:g}" if high == math.inf else f"between {low:g} and {high:g}"
        raise ConfigError(f"{where}.{key}: must be {need}, got {raw!r}")
    return value


def _show(raw: Any) -> str:
    """``repr(raw)``, or a short description of an int of hundreds of digits."""
    if isinstance(raw, int) and raw.bit_length() > 1000:
        return f"an integer of about {int(raw.bit_length() * math.log10(2)) + 1} digits"
    return repr(raw)


def device_spec_from_dict(data: Any, where: str) -> DeviceSpec:
    """Build a DeviceSpec from a YAML mapping; errors name ``where`` and the
    field (e.g. ``topologies/x.yaml: device.memory_bytes``). Every figure
    must be a finite number in its range (:data:`FIGURE_RANGES`)."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where}: must be a mapping of device fields")
    unknown = set(data) - set(_FIELDS) - set(_BLOCKS) - {"peak_flops"}
    if unknown:
        raise ConfigError(f"{where}.{sorted(unknown)[0]}: unknown field "
                          f"(allowed: peak_flops, {', '.join(_FIELDS)}, {', '.join(_BLOCKS)})")
    values: Dict[str, Any] = {}
    for key, kind in _FIELDS.items():
        if key not in data:
            if key in ("name", "memory_bandwidth_Bps", "memory_bytes"):
                raise ConfigError(f"{where}.{key}: missing required field")
            continue
        raw = data[key]
        if kind is str and (isinstance(raw, bool) or not isinstance(raw, (str, int, float))):
            raise ConfigError(f"{where}.{key}: must be a name, got a {type(raw).__name__}")
        values[key] = check_figure(where, key, raw) if kind is float else str(raw)
    flops = data.get("peak_flops")
    if not isinstance(flops, Mapping) or not flops:
        raise ConfigError(f"{where}.peak_flops: expected a mapping of dtype to FLOP/s")
    peak: Dict[str, float] = {}
    for k, v in flops.items():
        try:
            dtype = DType.parse(str(k))
        except ConfigError:
            raise ConfigError(f"{where}.peak_flops.{k}: unknown dtype") from None
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ConfigError(f"{where}.peak_flops.{k}: must be a positive number, got {v!r}")
        peak[dtype.value] = check_figure(where, f"peak_flops.{k}", v)
    values["memory_bytes"] = int(values["memory_bytes"])
    by_op = _efficiency_by_op(data.get("memory_efficiency_by_op", {}), where)
    blocks: Dict[str, Any] = {}
    for key, parse in (("memory_efficiency_by_class", efficiency_by_class),
                       ("gemm", gemm_model_from_dict), ("attention", attention_model_from_dict)):
        if data.get(key) is not None:
            blocks[key] = parse(data[key], f"{where}.{key}")
    return DeviceSpec(peak_flops=peak, memory_efficiency_by_op=by_op, **blocks, **values)


def _efficiency_by_op(raw: Any, where: str) -> Dict[str, float]:
    """``memory_efficiency_by_op``: op type -> a fraction in (0, 1]; an op
    type the IR does not know is an error (a misspelt name would otherwise
    be ignored)."""
    key = "memory_efficiency_by_op"
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where}.{key}: expected a mapping of op type to a fraction of "
                          f"memory bandwidth, got {raw!r}")
    out: Dict[str, float] = {}
    for op_type, value in raw.items():
        if not isinstance(op_type, str) or not is_registered(op_type):
            raise ConfigError(f"{where}.{key}.{op_type}: unknown op type")
        out[op_type] = check_figure(where, f"{key}.{op_type}", value)
    return out


def check_compute_dtype(spec: DeviceSpec, dtype: Any, model_name: Any, where: str) -> None:
    """The device must give a peak for the model's compute ``dtype``: the
    cost model would otherwise time the model's matmuls at another dtype's
    peak (f16's for bf16, f32's for either), a silently wrong step time.
    ``where`` names the topology file. None (an ONNX model in its file's
    types) is not checked here; a dtype the cost model finds no peak for at
    all stops it."""
    if dtype is None:
        return
    try:
        name = DType.parse(str(dtype)).value
    except ConfigError:     # the family reports a bad dtype in its own words
        return
    if name not in spec.peak_flops:
        raise ConfigError(f"{where}: device.peak_flops: no entry for {name}, the compute dtype "
                          f"of model '{model_name}' (it lists "
                          f"{', '.join(sorted(spec.peak_flops))}); add {name}: FLOP/s, or run "
                          "the model in one of those (--dtype)")
