"""Reading microbenchmark measurements (the JSON that
``reports/calibration/measure_gpu.py`` writes, or ``measure_h100.py``'s
earlier form) into checked records. Every problem is one ConfigError
naming the file and the field (``h100.json: gemm[3].median_s: ...``).

Sections, each optional except ``gemm``:

- ``gemm``: rows ``{M, N, K, batch (1), dtype, median_s, label, series
  ("sweep"), source}``: one GEMM shape timed back to back;
- ``gemm_cycles``: ``{gemms_only | layer: {ops: [...]}}``, GEMMs timed at
  the steady clock of a long run (series ``back-to-back`` and ``layer``);
  an op gives ``M, N, K`` or the ``label`` of a ``gemm`` row (``layer``
  ops: ``tp8 {label}, {tokens} tok``); ops without ``flops`` are not GEMMs;
- ``memory``: rows ``{op, dtype, bytes, median_s, kernel_class}`` (the
  class, else from the op's first word: copy, add/scale/gelu, layernorm,
  softmax);
- ``vector``: rows ``{dtype, flops, median_s}`` (compute-bound element-wise);
- ``launch``: ``{overhead_s}``, or ``fit_eager_device_bound.intercept_s``;
- ``attention``: rows ``{direction (fwd, bwd or fwd+bwd), batch, heads,
  seq_q, seq_k, head_dim, causal, dtype, median_s, kernel}`` (``kernel``:
  the implementation timed, e.g. ``cudnn``; none is the device's default);
- ``environment`` (``sm_count``, ``gpu``), ``peaks_used``
  (``peak_flops``, ``memory_bandwidth_Bps``), ``reference_series`` and
  ``sources`` (series -> citation) describe the rest.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Tuple

from ..cost.kernel_classes import KERNEL_CLASSES
from ..errors import ConfigError
from ..fileio import load_json_file
from ..ir.types import DType

#: the largest dimension, time and byte count a measurement may give
MAX_DIM = 2 ** 31
MAX_SECONDS = 1e4
#: legacy memory rows: the op name's first word -> kernel class
_LEGACY_CLASS = {"copy": "copy", "add": "elementwise", "scale": "elementwise",
                 "gelu": "elementwise", "mul": "elementwise", "layernorm": "norm",
                 "rmsnorm": "norm", "softmax": "softmax"}
DIRECTIONS = ("fwd", "bwd", "fwd+bwd")


@dataclass(frozen=True)
class GemmRow:
    batch: int
    m: int
    n: int
    k: int
    dtype: DType
    seconds: float
    series: str
    label: str
    where: str


@dataclass(frozen=True)
class MemoryRow:
    kernel_class: str
    dtype: str
    bytes: float
    seconds: float
    label: str
    where: str


@dataclass(frozen=True)
class VectorRow:
    dtype: DType
    flops: float
    seconds: float
    where: str


@dataclass(frozen=True)
class AttentionRow:
    direction: str
    batch: int
    heads: int
    seq_q: int
    seq_k: int
    head_dim: int
    causal: bool
    dtype: DType
    seconds: float
    series: str
    where: str
    kernel: Optional[str] = None


@dataclass
class Measurements:
    """Everything read from one or more measurement files."""

    files: List[str] = field(default_factory=list)
    gemm: List[GemmRow] = field(default_factory=list)
    memory: List[MemoryRow] = field(default_factory=list)
    vector: List[VectorRow] = field(default_factory=list)
    attention: List[AttentionRow] = field(default_factory=list)
    launch_overhead_s: Optional[Tuple[float, str]] = None
    sm_count: Optional[Tuple[int, str]] = None
    peak_flops: Dict[str, Tuple[float, str]] = field(default_factory=dict)
    memory_bandwidth_Bps: Optional[Tuple[float, str]] = None
    reference_series: Optional[str] = None
    sources: Dict[str, str] = field(default_factory=dict)
    gpu: str = ""
    memory_bytes: Optional[int] = None


def read_measurements(paths) -> Measurements:
    """The measurements of ``paths`` (one path or several), in order; a
    series name is prefixed with its file's stem when several files are
    read (``h100:sweep``), so that each file keeps its own clock level."""
    paths = [paths] if isinstance(paths, (str, Path)) else list(paths)
    if not paths:
        raise ConfigError("calibrate: give at least one measurement file")
    out = Measurements()
    for path in paths:
        _read_file(Path(path), out, prefix=f"{Path(path).stem}:" if len(paths) > 1 else "")
    if not out.gemm:
        raise ConfigError(f"{', '.join(out.files)}: gemm: no GEMM measurements (the section "
                          "the GEMM model is fitted to)")
    return out


def _read_file(path: Path, out: Measurements, prefix: str) -> None:
    name = str(path)
    data = load_json_file(path)
    if not isinstance(data, Mapping):
        raise ConfigError(f"{name}: expected a JSON object of measurement sections")
    out.files.append(name)
    sections = _Reader(name, data, prefix)
    out.gemm += sections.gemm()
    out.memory += sections.memory()
    out.vector += sections.vector()
    out.attention += sections.attention()
    if out.launch_overhead_s is None:
        out.launch_overhead_s = sections.launch()
    env = data.get("environment")
    if out.sm_count is None and isinstance(env, Mapping) and env.get("sm_count") is not None:
        out.sm_count = (int(sections.number("environment", "sm_count", env["sm_count"], 1, 1e5,
                                            integer=True)), f"{name}: environment.sm_count")
    if isinstance(env, Mapping) and isinstance(env.get("gpu"), str) and not out.gpu:
        out.gpu = env["gpu"]
    if isinstance(env, Mapping) and env.get("total_memory_bytes") is not None and \
            out.memory_bytes is None:
        out.memory_bytes = int(sections.number("environment", "total_memory_bytes",
                                               env["total_memory_bytes"], 1, 1e18))
    sections.peaks(out)
    ref = data.get("reference_series")
    if ref is not None and out.reference_series is None:
        if not isinstance(ref, str):
            raise ConfigError(f"{name}: reference_series: expected a series name, got {ref!r}")
        out.reference_series = prefix + ref
    for series, text in (data.get("sources") or {}).items():
        out.sources[prefix + str(series)] = str(text)


class _Reader:
    """Checked access to one file's sections."""

    def __init__(self, name: str, data: Mapping[str, Any], prefix: str) -> None:
        self.name, self.data, self.prefix = name, data, prefix

    def number(self, where: str, key: str, raw: Any, low: float, high: float, *,
               positive: bool = False, integer: bool = False) -> float:
        at = f"{self.name}: {where}.{key}"
        if raw is None:
            raise ConfigError(f"{at}: missing")
        if isinstance(raw, bool) or not isinstance(raw, (int, float)) or \
                (integer and not float(raw).is_integer()):
            raise ConfigError(f"{at}: expected {'an integer' if integer else 'a number'}, "
                              f"got {raw!r}")
        value = float(raw)
        if not math.isfinite(value) or value < low or value > high or (positive and value <= 0):
            what = "a positive time in seconds" if key.endswith("_s") else \
                f"{'positive and ' if positive else ''}between {low:g} and {high:g}"
            raise ConfigError(f"{at}: must be {what}, got {raw!r}")
        return value

    def rows(self, key: str) -> List[Tuple[str, Mapping[str, Any]]]:
        rows = self.data.get(key)
        if rows is None or (isinstance(rows, Mapping) and "error" in rows):
            return []                      # not measured, or the section failed
        if not isinstance(rows, list):
            raise ConfigError(f"{self.name}: {key}: expected a list of measurements")
        out = []
        for i, row in enumerate(rows):
            if not isinstance(row, Mapping):
                raise ConfigError(f"{self.name}: {key}[{i}]: expected an object, got {row!r}")
            if "error" in row and "median_s" not in row:
                continue                   # the script recorded a failed measurement
            out.append((f"{key}[{i}]", row))
        return out

    def dtype(self, where: str, raw: Any) -> DType:
        if raw is None:
            raise ConfigError(f"{self.name}: {where}.dtype: missing")
        try:
            return DType.parse(str(raw))
        except ConfigError:
            raise ConfigError(f"{self.name}: {where}.dtype: unknown dtype {raw!r}") from None

    def seconds(self, where: str, row: Mapping[str, Any]) -> float:
        return self.number(where, "median_s", row.get("median_s"), 0, MAX_SECONDS, positive=True)

    def dim(self, where: str, row: Mapping[str, Any], key: str, default=None) -> int:
        raw = row.get(key, default)
        return int(self.number(where, key, raw, 1, MAX_DIM, integer=True))

    def gemm(self) -> List[GemmRow]:
        out, by_label = [], {}
        for where, row in self.rows("gemm"):
            r = self._gemm_row(where, row, self.prefix + str(row.get("series", "sweep")))
            out.append(r)
            by_label.setdefault(r.label, r)
        cycles = self.data.get("gemm_cycles")
        if isinstance(cycles, Mapping):
            for kind, series in (("gemms_only", "back-to-back"), ("layer", "layer")):
                block = cycles.get(kind)
                if isinstance(block, Mapping) and isinstance(block.get("ops"), list):
                    out += self._cycle(f"gemm_cycles.{kind}", block, self.prefix + series,
                                       by_label)
        return out

    def _gemm_row(self, where: str, row: Mapping[str, Any], series: str) -> GemmRow:
        return GemmRow(self.dim(where, row, "batch", 1), self.dim(where, row, "M"),
                       self.dim(where, row, "N"), self.dim(where, row, "K"),
                       self.dtype(where, row.get("dtype")), self.seconds(where, row), series,
                       str(row.get("label", "")), f"{self.name}: {where}")

    def _cycle(self, key: str, block: Mapping[str, Any], series: str,
               by_label: Mapping[str, GemmRow]) -> List[GemmRow]:
        out = []
        tokens = block.get("tokens")
        for i, op in enumerate(block["ops"]):
            where = f"{key}.ops[{i}]"
            if not isinstance(op, Mapping) or op.get("flops") is None:
                continue                   # an element-wise op of the loop
            if all(op.get(d) is not None for d in ("M", "N", "K")):
                out.append(self._gemm_row(where, {"dtype": "bf16", **op}, series))
                continue
            label = str(op.get("label", ""))
            match = by_label.get(label) or by_label.get(f"tp8 {label}, {tokens} tok")
            if match is None:
                raise ConfigError(f"{self.name}: {where}: give M, N, K (the label {label!r} "
                                  "names no gemm row)")
            dtype = self.dtype(where, op.get("dtype", match.dtype.value))
            out.append(GemmRow(match.batch, match.m, match.n, match.k, dtype,
                               self.seconds(where, op), series, label,
                               f"{self.name}: {where}"))
        return out

    def memory(self) -> List[MemoryRow]:
        out = []
        for where, row in self.rows("memory"):
            label = str(row.get("op", ""))
            cls = row.get("kernel_class") or _LEGACY_CLASS.get(label.split(" ")[0].lower())
            if cls not in KERNEL_CLASSES:
                raise ConfigError(f"{self.name}: {where}.kernel_class: expected one of "
                                  f"{', '.join(KERNEL_CLASSES)}, got {cls!r} (op {label!r})")
            out.append(MemoryRow(cls, str(row.get("dtype", "")),
                                 self.number(where, "bytes", row.get("bytes"), 1, 1e18),
                                 self.seconds(where, row), label, f"{self.name}: {where}"))
        return out

    def vector(self) -> List[VectorRow]:
        return [VectorRow(self.dtype(where, row.get("dtype")),
                          self.number(where, "flops", row.get("flops"), 1, 1e21),
                          self.seconds(where, row), f"{self.name}: {where}")
                for where, row in self.rows("vector")]

    def attention(self) -> List[AttentionRow]:
        out = []
        for where, row in self.rows("attention"):
            direction = row.get("direction")
            if direction not in DIRECTIONS:
                raise ConfigError(f"{self.name}: {where}.direction: expected one of "
                                  f"{', '.join(DIRECTIONS)}, got {direction!r}")
            causal = row.get("causal", False)
            if not isinstance(causal, bool):
                raise ConfigError(f"{self.name}: {where}.causal: expected true or false, "
                                  f"got {causal!r}")
            kernel = row.get("kernel")
            if kernel is not None and (not isinstance(kernel, str) or not kernel):
                raise ConfigError(f"{self.name}: {where}.kernel: expected a kernel's name, "
                                  f"got {kernel!r}")
            seq_q = self.dim(where, row, "seq_q")
            out.append(AttentionRow(direction, self.dim(where, row, "batch"),
                                    self.dim(where, row, "heads"), seq_q,
                                    self.dim(where, row, "seq_k", seq_q),
                                    self.dim(where, row, "head_dim"), causal,
                                    self.dtype(where, row.get("dtype")), self.seconds(where, row),
                                    self.prefix + str(row.get("series", "attention")),
                                    f"{self.name}: {where}", kernel))
        return out

    def launch(self) -> Optional[Tuple[float, str]]:
        block = self.data.get("launch")
        if not isinstance(block, Mapping):
            return None
        if "overhead_s" in block:
            return (self.number("launch", "overhead_s", block["overhead_s"], 0, 1e-3),
                    f"{self.name}: launch.overhead_s")
        fit = block.get("fit_eager_device_bound")
        if isinstance(fit, Mapping) and "intercept_s" in fit:
            return (self.number("launch.fit_eager_device_bound", "intercept_s",
                                fit["intercept_s"], 0, 1e-3),
                    f"{self.name}: launch.fit_eager_device_bound.intercept_s")
        return None

    def peaks(self, out: Measurements) -> None:
        peaks = self.data.get("peaks_used")
        if not isinstance(peaks, Mapping):
            return
        for dtype, value in (peaks.get("peak_flops") or {}).items():
            key = self.dtype(f"peaks_used.peak_flops.{dtype}", dtype).value
            out.peak_flops.setdefault(key, (self.number("peaks_used.peak_flops", str(dtype),
                                                        value, 1, math.inf, positive=True),
                                            f"{self.name}: peaks_used.peak_flops.{dtype}"))
        if peaks.get("memory_bandwidth_Bps") is not None and out.memory_bandwidth_Bps is None:
            out.memory_bandwidth_Bps = (
                self.number("peaks_used", "memory_bandwidth_Bps", peaks["memory_bandwidth_Bps"],
                            1, math.inf, positive=True),
                f"{self.name}: peaks_used.memory_bandwidth_Bps")
