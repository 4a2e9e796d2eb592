"""A calibration's fits, as text tables and as JSON: each measurement
beside the model's time for it."""
from __future__ import annotations

from typing import Any, Dict, List

from .measurements import AttentionRow, GemmRow


def _shape(r: GemmRow) -> str:
    return f"{r.m} x {r.n} x {r.k}" + (f" (x{r.batch})" if r.batch > 1 else "")


def _attention_shape(r: AttentionRow) -> str:
    return (f"{r.direction} b{r.batch} h{r.heads} s{r.seq_q} d{r.head_dim}"
            + (" causal" if r.causal else ""))


def _table(header: List[str], rows: List[List[str]]) -> List[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return out


def _err(model: float, measured: float) -> str:
    return f"{100 * (model / measured - 1):+.1f} %"


def format_report(cal) -> str:
    g, model = cal.gemm, cal.gemm.model
    lines = [f"calibrated from {', '.join(cal.measurements.files)}"
             + (f" (base: {cal.base})" if cal.base else ""), ""]
    lines.append(f"GEMM model: {model.sms} SMs, tiles "
                 f"{' '.join(f'{a}x{b}' for a, b in model.tiles)}, k_overhead "
                 f"{model.k_overhead:g}, tile_intensity {model.tile_intensity:.3g}, "
                 f"wave_quantization {model.wave_quantization:g}")
    lines.append(f"  efficiency at the {g.reference} clock: "
                 + ", ".join(f"{d} {e:.3f}" for d, e in sorted(model.efficiency.items())))
    others = {s: v for s, v in g.levels.items() if s != g.reference}
    if others:
        lines.append("  clock level of the other series: "
                     + ", ".join(f"{s} {v:.3f}" for s, v in others.items()))
    lines.append(f"  {len(g.rows)} GEMMs fitted, rms error {100 * g.rms():.1f} %"
                 + (f"; {len(g.left_out)} left out (fixed costs dominate)" if g.left_out else ""))
    lines.append("")
    lines += _table(["series", "M x N x K", "dtype", "measured us", "model us", "error"],
                    [[r.series, _shape(r), r.dtype.value, f"{r.seconds * 1e6:.1f}",
                      f"{t * 1e6:.1f}", _err(t, r.seconds)] for r, t in g.rows])
    fits = ([("Attention", cal.attention)] if cal.attention is not None else []) + \
        [(f"Attention, kernel {k}", f) for k, f in cal.attention_kernels.items()]
    for title, fit in fits:
        a = fit.model
        lines += ["", f"{title}: fwd_efficiency {a.fwd_efficiency:.3f}, bwd_efficiency "
                      f"{a.bwd_efficiency:.3f}, key_overhead {a.key_overhead:g}, rms error "
                      f"{100 * fit.rms():.1f} %", ""]
        lines += _table(["series", "shape", "measured us", "model us", "error"],
                        [[r.series, _attention_shape(r), f"{r.seconds * 1e6:.1f}",
                          f"{t * 1e6:.1f}", _err(t, r.seconds)] for r, t in fit.rows])
    if cal.memory is not None:
        lines += ["", f"Memory: streaming efficiency {cal.memory.streaming:.3f}; by class "
                      + ", ".join(f"{c} {v:.3f}" for c, v in sorted(cal.memory.by_class.items())),
                  ""]
        lines += _table(["kernel", "class", "dtype", "MB", "measured us", "efficiency"],
                        [[r.label, r.kernel_class, r.dtype, f"{r.bytes / 1e6:.0f}",
                          f"{r.seconds * 1e6:.1f}", f"{e:.3f}"] for r, e in cal.memory.rows])
    rest = {k: v for k, v in cal.device.items()
            if k in ("launch_overhead_s", "vector_efficiency", "matmul_efficiency")}
    if rest:
        lines += ["", "Other figures: " + ", ".join(f"{k} {v:g}" for k, v in rest.items())]
    if cal.warnings:
        lines += ["", *[f"note: {w}" for w in cal.warnings]]
    return "\n".join(lines)


def report_dict(cal) -> Dict[str, Any]:
    g = cal.gemm
    out: Dict[str, Any] = {
        "measurements": cal.measurements.files, "base": cal.base, "device": cal.device,
        "gemm": {"reference": g.reference, "levels": g.levels, "rms": g.rms(),
                 "rows": [{"series": r.series, "batch": r.batch, "M": r.m, "N": r.n, "K": r.k,
                           "dtype": r.dtype.value, "measured_s": r.seconds, "model_s": t}
                          for r, t in g.rows],
                 "left_out": [{"where": r.where, "why": why} for r, why in g.left_out]},
        "notes": cal.warnings,
    }
    if cal.attention is not None:
        out["attention"] = _attention_dict(cal.attention)
        if cal.attention_kernels:
            out["attention"]["kernels"] = {k: _attention_dict(f)
                                           for k, f in cal.attention_kernels.items()}
    if cal.memory is not None:
        out["memory"] = [{"kernel": r.label, "class": r.kernel_class, "efficiency": e}
                         for r, e in cal.memory.rows]
    return out


def _attention_dict(fit) -> Dict[str, Any]:
    return {"rms": fit.rms(),
            "rows": [{"series": r.series, "shape": _attention_shape(r), "measured_s": r.seconds,
                      "model_s": t} for r, t in fit.rows]}
