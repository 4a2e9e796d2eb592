"""``distsim.calibrate``: microbenchmark measurements -> a device's figures.

    cal = distsim.calibrate("h100.json", topology="dgx-h100")
    print(cal.report())                 # measured against modelled, per shape
    cal.device                          # the figures, as a topology file's device block
    cal.write("my-cluster.yaml", update=True)

The GEMM model, FlashAttention's figures, the kernel classes' bandwidths,
the CUDA cores' rate and the launch overhead are each fitted to their own
section of the measurements (:mod:`.gemm_fit`, :mod:`.attention_fit`,
:mod:`.stream_fits`); a section that is missing leaves its figures out
(an updated file keeps its own). ``topology`` (a topology name or file)
gives what the measurements do not: the peaks, the bandwidth, the SM
count, the GEMM tiles and the shape parameters the data cannot tell.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from ..cost.device import DeviceSpec
from ..cost.gemm import DEFAULT_TILES
from ..errors import ConfigError
from ..ir.types import DType
from ..keywords import strict_keywords
from .attention_fit import AttentionFit, fit_attention
from .gemm_fit import GemmFit, fit_gemm
from .measurements import AttentionRow, Measurements, read_measurements
from .stream_fits import MemoryFit, fit_memory, fit_vector


@dataclass
class Calibration:
    """What :func:`calibrate` fitted: the device figures (``device``, in
    the topology file's form), a comment per figure saying where it comes
    from (``notes``), and each fit with its rows."""

    measurements: Measurements
    device: Dict[str, Any]
    notes: Dict[str, str]
    gemm: GemmFit
    attention: Optional[AttentionFit] = None
    attention_kernels: Dict[str, AttentionFit] = field(default_factory=dict)
    memory: Optional[MemoryFit] = None
    base: Optional[str] = None
    warnings: List[str] = field(default_factory=list)

    def report(self) -> str:
        from .report import format_report
        return format_report(self)

    def to_dict(self) -> Dict[str, Any]:
        from .report import report_dict
        return report_dict(self)

    def write(self, path, update: bool = False) -> Path:
        """Write the figures: into the device block of the topology file
        ``path`` (``update``), a copy of the base topology with them, or
        the device block alone; atomically, after every check."""
        from .yaml_out import write_calibration
        return write_calibration(self, Path(path), update)


@strict_keywords
def calibrate(measurements, topology: Optional[str] = None,
              dtypes: Optional[Sequence[str]] = None,
              reference: Optional[str] = None) -> Calibration:
    """Fit a device's figures to microbenchmark measurements.

    ``measurements``: a JSON file of them (what reports/calibration/measure_gpu.py
        writes), or a list of files fitted together (each series keeps its
        own clock level).
    ``topology``: a topology name or .yaml file giving what the measurements
        lack (peaks, bandwidth, SM count, GEMM tiles, shape parameters the
        data cannot tell); the ``--topology`` flag.
    ``dtypes``: fit only the GEMMs of these dtypes (``--dtype``); a dtype
        without measurements is an error.
    ``reference``: the GEMM series whose clock the efficiencies are given at
        (``--reference``; default: a layer loop, GEMMs back to back, or the
        first series).

    Returns a :class:`Calibration`: ``.device`` (the figures),
    ``.report()``, ``.write(path, update=...)``. Bad measurements raise one
    ConfigError naming the file and the field."""
    m = read_measurements(measurements)
    base_spec = _base(topology)
    peak = {d: v for d, (v, _) in m.peak_flops.items()}
    for d, v in (base_spec.peak_flops.items() if base_spec else ()):
        peak.setdefault(d, v)
    bandwidth = m.memory_bandwidth_Bps[0] if m.memory_bandwidth_Bps else \
        (base_spec.memory_bandwidth_Bps if base_spec else None)
    if bandwidth is None:
        raise ConfigError(f"{m.files[0]}: peaks_used.memory_bandwidth_Bps: missing (or give "
                          "--topology for the device's bandwidth)")
    notes: Dict[str, str] = {}
    device: Dict[str, Any] = {}
    launch = _launch(m, base_spec, device, notes)
    memory = None
    stream_eff = base_spec.memory_efficiency if base_spec else 1.0
    if m.memory:
        memory = fit_memory(m.memory, bandwidth, launch)
        stream_eff = memory.streaming
        device["memory_efficiency"] = round(memory.streaming, 3)
        device["memory_efficiency_by_class"] = {c: round(v, 3)
                                                for c, v in sorted(memory.by_class.items())}
        notes["memory_efficiency"] = _memory_note(memory, m)
    vector = fit_vector(m.vector, peak.get("f32"))
    if vector is not None:
        device["vector_efficiency"] = round(vector, 3)
        notes["vector_efficiency"] = ("the best fp32 element-wise arithmetic rate over "
                                      f"peak_flops.f32 ({_files(m.vector)})")
    rows = _gemm_rows(m, dtypes)
    sms = _sms(m, base_spec)
    base_gemm = base_spec.gemm if base_spec else None
    tiles = base_gemm.tiles if base_gemm else DEFAULT_TILES
    gemm = fit_gemm(rows, sms=sms, tiles=tiles, peak=peak, bandwidth=bandwidth * stream_eff,
                    launch=launch, base=base_gemm, reference=reference or m.reference_series)
    device["matmul_efficiency"] = round(_flat(gemm, peak, launch), 3)
    notes["matmul_efficiency"] = (f"FLOP-weighted over the {gemm.reference} GEMMs: products "
                                  "the gemm block does not time (convolutions, other dtypes)")
    model = gemm.model
    device["gemm"] = {
        "sms": sms, "tiles": [list(t) for t in model.tiles],
        "efficiency": {d: round(e, 4) for d, e in sorted(model.efficiency.items())},
        "k_overhead": model.k_overhead, "tile_intensity": round(model.tile_intensity, 2),
        "wave_quantization": model.wave_quantization,
        "source": _gemm_source(gemm, m)}
    notes["gemm"] = _gemm_note(gemm, m, base_gemm, topology)
    attention, kernels = _fit_attention(m, device, notes, peak=peak, launch=launch, sms=sms,
                                        wave_quantization=model.wave_quantization)
    return Calibration(m, device, notes, gemm, attention, kernels, memory, topology,
                       list(gemm.notes))


def _fit_attention(m: Measurements, device: Dict[str, Any], notes: Dict[str, str], **fit):
    """The default kernel's figures from the attention rows without a
    ``kernel``, each named kernel's from its own rows (``kernels``)."""
    if not m.attention:
        return None, {}
    groups: Dict[Optional[str], List[AttentionRow]] = {}
    for r in m.attention:
        groups.setdefault(r.kernel, []).append(r)
    if None not in groups:
        raise ConfigError(f"{m.attention[0].where}: every attention row names a kernel: the "
                          "default kernel's rows (no kernel) are needed too")
    fits = {k: fit_attention(rows, **fit) for k, rows in groups.items()}
    block = _attention_figures(fits[None], groups[None])
    kernels = {str(k): f for k, f in fits.items() if k is not None}
    if kernels:
        block["kernels"] = {k: _attention_figures(f, groups[k]) for k, f in sorted(kernels.items())}
    device["attention"] = block
    series = sorted({r.series for r in m.attention})
    notes["attention"] = _series_note(series, m, "fused attention timings", m.attention)
    return fits[None], kernels


def _attention_figures(fit: AttentionFit, rows: List[AttentionRow]) -> Dict[str, Any]:
    a = fit.model
    series = sorted({r.series for r in rows})
    return {"fwd_efficiency": round(a.fwd_efficiency, 4),
            "bwd_efficiency": round(a.bwd_efficiency, 4), "key_overhead": a.key_overhead,
            "source": f"distsim calibrate: {len(rows)} attention timings of "
                      f"{', '.join(series)} (rms {100 * fit.rms():.1f} %)"}


def _base(topology: Optional[str]) -> Optional[DeviceSpec]:
    if topology is None:
        return None
    from ..topology import load_topology
    return load_topology(topology).device_spec


def _launch(m: Measurements, base: Optional[DeviceSpec], device, notes) -> float:
    if m.launch_overhead_s is not None:
        value, where = m.launch_overhead_s
        device["launch_overhead_s"] = float(f"{value:.3g}")
        notes["launch_overhead_s"] = f"per kernel, on the device's timeline ({where})"
        return device["launch_overhead_s"]
    return base.launch_overhead_s if base else 0.0


def _gemm_rows(m: Measurements, dtypes: Optional[Sequence[str]]):
    if dtypes is None:
        return m.gemm
    measured = sorted({r.dtype.value for r in m.gemm})
    wanted = [DType.parse(str(d)).value for d in dtypes]
    for d in wanted:
        if d not in measured:
            raise ConfigError(f"{', '.join(m.files)}: gemm: no measurements for dtype {d} "
                              f"(measured: {', '.join(measured)})")
    return [r for r in m.gemm if r.dtype.value in wanted]


def _sms(m: Measurements, base: Optional[DeviceSpec]) -> int:
    if m.sm_count is not None:
        return m.sm_count[0]
    if base is not None and base.gemm is not None:
        return base.gemm.sms
    raise ConfigError(f"{m.files[0]}: environment.sm_count: missing (the GPU's SM count; or "
                      "give --topology with a gemm block)")


def _flat(gemm: GemmFit, peak, launch: float) -> float:
    """The reference series' achieved fraction of peak, FLOP-weighted."""
    rows = [r for r, _ in gemm.rows if r.series == gemm.reference]
    flops = sum(2.0 * r.batch * r.m * r.n * r.k for r in rows)
    return flops / sum((r.seconds - launch) * peak[r.dtype.value] for r in rows)


def _files(rows) -> str:
    return ", ".join(dict.fromkeys(r.where.split(": ")[0] for r in rows))


#: what the series measure_gpu.py writes measure, for a file that does not say
SERIES_MEANING = {
    "sweep": "each GEMM shape timed on its own, pauses between shapes",
    "back-to-back": "GEMMs back to back, at the clock the card holds under its power cap",
    "layer": "a transformer layer's GEMMs among its element-wise ops, in a loop: the clock "
             "of a long training run",
}


def _series_note(series, m: Measurements, what: str, rows=()) -> str:
    lines = [f"{what}, by series:"]
    files = {r.series: r.where.split(": ")[0] for r in rows}
    for s in series:
        text = m.sources.get(s)
        if text is None:
            meaning = SERIES_MEANING.get(s.split(":")[-1], "measured")
            text = f"{meaning} ({files.get(s, ', '.join(m.files))})"
        lines.append(f"{s}: {text}")
    return "\n".join(lines)


def _memory_note(memory: MemoryFit, m: Measurements) -> str:
    parts = []
    for cls, eff in sorted(memory.by_class.items()):
        labels = sorted({r.label for r, _ in memory.rows if r.kernel_class == cls})
        parts.append(f"{cls} {eff:.3f} ({'; '.join(labels)})")
    src = [m.sources[s] for s in m.sources if s.split(":")[-1] == "memory"]
    return ("bytes read and written / ((time - launch) x bandwidth), median per kernel class: "
            + ", ".join(parts) + f" ({_files([r for r, _ in memory.rows])})"
            + (f". {src[0]}" if src else ""))


def _gemm_source(gemm: GemmFit, m: Measurements) -> str:
    counts: Dict[str, int] = {}
    for r, _ in gemm.rows:
        counts[r.series] = counts.get(r.series, 0) + 1
    series = ", ".join(f"{s} {n}" for s, n in counts.items())
    return (f"distsim calibrate: {len(gemm.rows)} GEMMs ({series}), rms {100 * gemm.rms():.1f} %;"
            f" efficiency at the {gemm.reference} series' clock")


def _gemm_note(gemm: GemmFit, m: Measurements, base, topology) -> str:
    lines = [_series_note(list(dict.fromkeys(r.series for r, _ in gemm.rows)), m,
                          "tile/wave GEMM model fitted to measured GEMM times",
                          [r for r, _ in gemm.rows])]
    levels = ", ".join(f"{s} {v:.3f}" for s, v in gemm.levels.items() if s != gemm.reference)
    if levels:
        lines.append(f"clock level of the other series, against {gemm.reference}: {levels}")
    lines.append("sms: " + (m.sm_count[1] if m.sm_count else f"the gemm block of {topology}"))
    lines.append("tiles: " + ("cuBLAS's tile shapes, NVIDIA Matrix Multiplication Background "
                              "User's Guide, Sec. 2.3" if gemm.model.tiles == DEFAULT_TILES
                              else f"the gemm block of {topology}"))
    if not gemm.fitted_structure:
        lines.append("tile_intensity, wave_quantization: " +
                     (f"kept from {topology}" if base else "defaults") +
                     " (too few GEMMs of at most two waves to fit them)")
    return "\n".join(lines)
