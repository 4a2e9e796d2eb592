"""Reading a device's calibrated blocks from a topology file: ``gemm``
(:class:`~distsim.cost.gemm.GemmModel`), ``attention``
(:class:`~distsim.cost.attention_time.AttentionModel`) and
``memory_efficiency_by_class`` (:mod:`~distsim.cost.kernel_classes`).
Every error is one line naming the file and the field."""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, Dict, Mapping, Tuple

from ..errors import ConfigError
from ..ir.types import DType
from .attention_time import DEFAULT_BLOCK_Q, AttentionModel
from .gemm import DEFAULT_TILES, GemmModel
from .kernel_classes import KERNEL_CLASSES

#: the largest SM count, tile side, overhead and intensity a file may give
#: (beyond any GPU: keeps every derived time finite)
MAX_SMS = 100_000
MAX_TILE = 4096
MAX_OVERHEAD = 1e6


def _number(where: str, key: str, raw: Any, low: float, high: float, *,
            open_low: bool = False, integer: bool = False) -> float:
    """``raw`` as a number in [low, high] ((low, high] when ``open_low``),
    else one ConfigError naming ``where.key``."""
    if isinstance(raw, bool) or not isinstance(raw, (int, float)) or \
            (integer and not (isinstance(raw, int) or float(raw).is_integer())):
        kind = "an integer" if integer else "a number"
        raise ConfigError(f"{where}.{key}: expected {kind}, got {raw!r}")
    value = float(raw)
    if not math.isfinite(value) or value < low or value > high or (open_low and value == low):
        span = f"({low:g}, {high:g}]" if open_low else f"[{low:g}, {high:g}]"
        raise ConfigError(f"{where}.{key}: must be in {span}, got {raw!r}")
    return value


def _mapping(where: str, raw: Any, allowed) -> Mapping[str, Any]:
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where}: expected a mapping, got {raw!r}")
    unknown = sorted(str(k) for k in set(raw) - set(allowed))
    if unknown:
        raise ConfigError(f"{where}.{unknown[0]}: unknown field (allowed: {', '.join(allowed)})")
    return raw


def _source(where: str, raw: Any) -> str:
    if raw is None:
        return ""
    if not isinstance(raw, str):
        raise ConfigError(f"{where}.source: must be text, got {raw!r}")
    return raw


def efficiencies_by_dtype(where: str, raw: Any) -> Dict[str, float]:
    """``{dtype: efficiency in (0, 1]}``, at least one."""
    if not isinstance(raw, Mapping) or not raw:
        raise ConfigError(f"{where}: expected a mapping of dtype to a fraction of peak, got "
                          f"{raw!r}")
    out: Dict[str, float] = {}
    for name, value in raw.items():
        try:
            dtype = DType.parse(str(name))
        except ConfigError:
            raise ConfigError(f"{where}.{name}: unknown dtype") from None
        out[dtype.value] = _number(where, str(name), value, 0.0, 1.0, open_low=True)
    return out


GEMM_FIELDS = ("sms", "efficiency", "tiles", "k_overhead", "tile_intensity",
               "wave_quantization", "source")


def gemm_model_from_dict(raw: Any, where: str) -> GemmModel:
    """The ``gemm`` block (``where`` names it, e.g. ``x.yaml: device.gemm``)."""
    data = _mapping(where, raw, GEMM_FIELDS)
    for key in ("sms", "efficiency"):
        if key not in data:
            raise ConfigError(f"{where}.{key}: missing required field")
    sms = int(_number(where, "sms", data["sms"], 1, MAX_SMS, integer=True))
    tiles = _tiles(where, data.get("tiles", DEFAULT_TILES))
    return GemmModel(
        sms=sms, tiles=tiles, efficiency=efficiencies_by_dtype(f"{where}.efficiency",
                                                               data["efficiency"]),
        k_overhead=_number(where, "k_overhead", data.get("k_overhead", 0), 0, MAX_OVERHEAD),
        tile_intensity=_number(where, "tile_intensity", data.get("tile_intensity", 0), 0,
                               MAX_OVERHEAD),
        wave_quantization=_number(where, "wave_quantization",
                                  data.get("wave_quantization", 1), 0, 1),
        source=_source(where, data.get("source")))


def _tiles(where: str, raw: Any) -> Tuple[Tuple[int, int], ...]:
    if not isinstance(raw, (list, tuple)) or not raw:
        raise ConfigError(f"{where}.tiles: expected a list of [rows, columns] tile shapes, "
                          f"got {raw!r}")
    out = []
    for i, tile in enumerate(raw):
        if not isinstance(tile, (list, tuple)) or len(tile) != 2:
            raise ConfigError(f"{where}.tiles[{i}]: expected [rows, columns], got {tile!r}")
        out.append(tuple(int(_number(f"{where}.tiles[{i}]", side, v, 1, MAX_TILE, integer=True))
                         for side, v in zip(("rows", "columns"), tile)))
    return tuple(out)


KERNEL_FIELDS = ("fwd_efficiency", "bwd_efficiency", "key_overhead", "block_q", "source")
ATTENTION_FIELDS = KERNEL_FIELDS + ("kernels",)


def attention_model_from_dict(raw: Any, where: str) -> AttentionModel:
    """The ``attention`` block (``where`` names it): the default kernel's
    figures and, under ``kernels``, other kernels' by name."""
    data = _mapping(where, raw, ATTENTION_FIELDS)
    kernels = data.get("kernels", {})
    if not isinstance(kernels, Mapping):
        raise ConfigError(f"{where}.kernels: expected a mapping of kernel name -> figures, "
                          f"got {kernels!r}")
    return replace(_kernel_model(data, where), kernels=tuple(
        (str(name), _kernel_model(_mapping(f"{where}.kernels.{name}", sub, KERNEL_FIELDS),
                                  f"{where}.kernels.{name}"))
        for name, sub in kernels.items()))


def _kernel_model(data: Mapping[str, Any], where: str) -> AttentionModel:
    for key in ("fwd_efficiency", "bwd_efficiency"):
        if key not in data:
            raise ConfigError(f"{where}.{key}: missing required field")
    return AttentionModel(
        fwd_efficiency=_number(where, "fwd_efficiency", data["fwd_efficiency"], 0, 1,
                               open_low=True),
        bwd_efficiency=_number(where, "bwd_efficiency", data["bwd_efficiency"], 0, 1,
                               open_low=True),
        key_overhead=_number(where, "key_overhead", data.get("key_overhead", 0), 0,
                             MAX_OVERHEAD),
        block_q=int(_number(where, "block_q", data.get("block_q", DEFAULT_BLOCK_Q), 1, MAX_TILE,
                            integer=True)),
        source=_source(where, data.get("source")))


def efficiency_by_class(raw: Any, where: str) -> Dict[str, float]:
    """``memory_efficiency_by_class``: kernel class -> a fraction of the
    memory bandwidth in (0, 1]."""
    data = _mapping(where, raw, KERNEL_CLASSES)
    return {str(k): _number(where, str(k), v, 0, 1, open_low=True) for k, v in data.items()}
