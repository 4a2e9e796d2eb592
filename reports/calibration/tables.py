"""The fit tables of README.md: each measured GEMM and attention timing
beside the calibrated model's time, per device.

    PYTHONPATH=. python reports/calibration/tables.py > /tmp/tables.md
"""
from __future__ import annotations

import math
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent))

import distsim  # noqa: E402

#: device: (measurements, topology, the flat model it replaces: efficiency
#: of the peak and launch overhead)
DEVICES = {
    "H100 (dgx-h100)": ([HERE / "h100.json", HERE / "h100-public.json"], "dgx-h100",
                        (0.71, 4e-6)),
    "A100 (dgx-a100)": ([HERE / "a100-public.json"], "dgx-a100", (0.7, 5e-6)),
}


def rms(errs) -> float:
    return math.sqrt(sum(e * e for e in errs) / len(errs)) if errs else 0.0


def gemm_table(cal, flat) -> list:
    """Per series: rms and largest error; per GEMM (but the large public
    tables): measured, modelled, and the flat model's error."""
    out = ["| series | M x N x K | dtype | measured us | model us | error | flat model error |",
           "|---|---|---|---|---|---|---|"]
    peak = cal.measurements.peak_flops
    by_series = {}
    for r, t in cal.gemm.rows:
        by_series.setdefault(r.series, []).append((r, t))
    summary = []
    for series, rows in by_series.items():
        errs = [t / r.seconds - 1 for r, t in rows]
        flat_errs = [_flat(r, peak, flat) / r.seconds - 1 for r, _ in rows]
        summary.append(f"| {series} | {len(rows)} | {100 * rms(errs):.1f} % | "
                       f"{100 * max(errs, key=abs):+.1f} % | {cal.gemm.levels[series]:.3f} | "
                       f"{100 * rms(flat_errs):.1f} % |")
        if series.endswith("xla"):
            continue
        merged = {}
        for r, t in rows:            # the sweep's two passes: their mean
            merged.setdefault((r.batch, r.m, r.n, r.k, r.dtype.value), []).append((r.seconds, t))
        for (b, m, n, k, d), pairs in merged.items():
            meas = sum(p[0] for p in pairs) / len(pairs)
            model = pairs[0][1]
            old = flat[1] + 2.0 * b * m * n * k / (peak[d][0] * flat[0])
            shape = f"{m} x {n} x {k}" + (f" (x{b})" if b > 1 else "")
            out.append(f"| {series} | {shape} | {d} | {meas * 1e6:.1f} | {model * 1e6:.1f} | "
                       f"{100 * (model / meas - 1):+.1f} % | {100 * (old / meas - 1):+.1f} % |")
    head = ["| series | GEMMs | rms error | largest error | clock level | flat model rms |",
            "|---|---|---|---|---|---|"]
    return head + summary + [""] + out


def _flat(r, peak, flat) -> float:
    return flat[1] + 2.0 * r.batch * r.m * r.n * r.k / (peak[r.dtype.value][0] * flat[0])


def attention_table(cal) -> list:
    out = ["| series | pass | causal | seq | measured ms | model ms | error |",
           "|---|---|---|---|---|---|---|"]
    for r, t in cal.attention.rows:
        out.append(f"| {r.series} | {r.direction} | {'yes' if r.causal else 'no'} | {r.seq_q} | "
                   f"{r.seconds * 1e3:.2f} | {t * 1e3:.2f} | {100 * (t / r.seconds - 1):+.1f} % |")
    return out


def main() -> int:
    for name, (files, topology, flat) in DEVICES.items():
        cal = distsim.calibrate(files, topology=topology)
        g = cal.gemm.model
        print(f"### {name}\n")
        print(f"GEMM: ceiling {', '.join(f'{d} {e:.4f}' for d, e in g.efficiency.items())} at "
              f"the `{cal.gemm.reference}` clock; k_overhead {g.k_overhead:g}, tile_intensity "
              f"{g.tile_intensity:.4g}, wave_quantization {g.wave_quantization:g}; "
              f"{len(cal.gemm.rows)} GEMMs, rms {100 * cal.gemm.rms():.1f} % "
              f"({len(cal.gemm.left_out)} left out)\n")
        print("\n".join(gemm_table(cal, flat)))
        if cal.attention is not None:
            a = cal.attention.model
            print(f"\nAttention: fwd {a.fwd_efficiency:.4f}, bwd {a.bwd_efficiency:.4f}, "
                  f"key_overhead {a.key_overhead:g}, rms {100 * cal.attention.rms():.1f} %\n")
            print("\n".join(attention_table(cal)))
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
