"""Fitting the tile/wave GEMM model (:mod:`distsim.cost.gemm`) to measured
GEMM times.

Each measured time is ``launch + max(gemm time, memory floor)``; the gemm
time scales with ``1 / (efficiency[dtype] * level[series])``: the dtypes'
ceilings at the reference series' clock, and one level per other series
(a sweep with pauses runs at a higher clock than a long run at the power
cap; a vendor's chart at yet another). For each point of a grid over the
shape parameters (``k_overhead``, and ``tile_intensity`` and
``wave_quantization`` where the data can tell them: at least
:data:`FEW_WAVE_ROWS` GEMMs of at most two waves of the largest tile) the
efficiencies and levels are the least-squares solution in log time; the
grid point with the least squared relative error wins.

Rows dominated by fixed costs are left out and reported: times under
:data:`OVERHEAD_FACTOR` launch overheads (the harness's per-call costs,
not the kernel's) and GEMMs within 1.5x of their memory floor (their time
says nothing about the arithmetic).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from ..cost.gemm import GemmModel, GemmShape, candidates, tile_intensity_of
from ..errors import ConfigError
from .measurements import GemmRow

OVERHEAD_FACTOR = 10.0
MEMORY_FACTOR = 1.5
FEW_WAVE_ROWS = 4
K_OVERHEAD_GRID = tuple(range(0, 1025, 16))
WAVE_GRID = (0.0, 0.25, 0.5, 0.75, 1.0)


@dataclass
class GemmFit:
    """The fitted figures and every row's measured and modelled time."""

    model: GemmModel
    levels: Dict[str, float]
    reference: str
    fitted_structure: bool
    rows: List[Tuple[GemmRow, float]]                   # (row, modelled seconds)
    left_out: List[Tuple[GemmRow, str]] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)

    def rms(self, rows=None) -> float:
        rows = self.rows if rows is None else rows
        errs = [math.log(t / r.seconds) for r, t in rows]
        return math.sqrt(sum(e * e for e in errs) / len(errs)) if errs else 0.0


def reference_of(rows: Sequence[GemmRow], wanted: Optional[str]) -> str:
    """The series whose clock the efficiencies are given at: ``wanted``, or
    the steadiest the measurements hold (a layer loop, GEMMs back to back,
    else the first series)."""
    names = list(dict.fromkeys(r.series for r in rows))
    if wanted is not None:
        if wanted not in names:
            raise ConfigError(f"--reference {wanted}: no such GEMM series (the measurements "
                              f"have {', '.join(names)})")
        return wanted
    for suffix in ("layer", "back-to-back"):
        for name in names:
            if name.split(":")[-1] == suffix:
                return name
    return names[0]


class _Problem:
    """The rows' candidates as flat arrays, for fast evaluation on a grid."""

    def __init__(self, rows: Sequence[GemmRow], sms: int, tiles, peak: Mapping[str, float],
                 bandwidth: float, launch: float) -> None:
        self.rows = list(rows)
        cols: Dict[str, list] = {k: [] for k in ("row", "area2", "wf", "wc", "ks", "inten",
                                                 "red", "peak_sm")}
        for i, r in enumerate(self.rows):
            for c in candidates(GemmShape(r.batch, r.m, r.n, r.k), sms, tiles):
                cols["row"].append(i)
                cols["area2"].append(2.0 * c.tm * c.tn)
                cols["wf"].append(c.waves)
                cols["wc"].append(c.full_waves)
                cols["ks"].append(c.k_slice)
                cols["inten"].append(tile_intensity_of(c.tm, c.tn, r.dtype.itemsize))
                cols["red"].append(c.reduce_bytes / bandwidth)
                cols["peak_sm"].append(peak[r.dtype.value] / sms)
        self.row = np.asarray(cols.pop("row"), dtype=int)
        self.c = {k: np.asarray(v, dtype=float) for k, v in cols.items()}
        self.starts = np.flatnonzero(np.r_[True, np.diff(self.row) != 0])
        self.measured = np.array([r.seconds for r in self.rows])
        self.floor = np.array([r.batch * (r.m * r.k + r.k * r.n + r.m * r.n) * r.dtype.itemsize
                               / bandwidth for r in self.rows])
        self.launch = launch

    def compute(self, k0: float, need: float, q: float, scale: np.ndarray) -> np.ndarray:
        """Each row's gemm time with its ceiling times level ``scale``."""
        c = self.c
        e = np.ones_like(c["inten"]) if need <= 0 else np.minimum(1.0, c["inten"] / need)
        waves = c["wf"] + q * (c["wc"] - c["wf"])
        t = waves * c["area2"] * (c["ks"] + k0) / (c["peak_sm"] * e * scale[self.row])
        return np.minimum.reduceat(t + c["red"], self.starts)

    def modelled(self, compute: np.ndarray) -> np.ndarray:
        return self.launch + np.maximum(compute, self.floor)


def _design(rows: Sequence[GemmRow], reference: str, notes: List[str]):
    """The least-squares design of log(efficiency[dtype] * level[series]):
    one column per dtype and per series but each connected component's
    reference (the global one, else its largest series)."""
    dtypes = sorted({r.dtype.value for r in rows})
    series = list(dict.fromkeys(r.series for r in rows))
    parent = {("d", d): ("d", d) for d in dtypes} | {("s", s): ("s", s) for s in series}

    def find(x):
        while parent[x] != x:
            x = parent[x]
        return x
    for r in rows:
        a, b = find(("d", r.dtype.value)), find(("s", r.series))
        if a != b:
            parent[a] = b
    roots: Dict[tuple, str] = {}
    for s in sorted(series, key=lambda s: (s != reference, -sum(r.series == s for r in rows))):
        root = find(("s", s))
        if root not in roots:
            roots[root] = s
            if s != reference:
                notes.append(f"series {s} shares no dtype with the reference series {reference}: "
                             f"its dtypes' efficiencies are given at its own clock")
    fixed = set(roots.values())
    free = [s for s in series if s not in fixed]
    cols = {("d", d): i for i, d in enumerate(dtypes)}
    cols.update({("s", s): len(dtypes) + i for i, s in enumerate(free)})
    a = np.zeros((len(rows), len(cols)))
    for i, r in enumerate(rows):
        a[i, cols[("d", r.dtype.value)]] = 1.0
        if ("s", r.series) in cols:
            a[i, cols[("s", r.series)]] = 1.0
    return a, dtypes, free


def fit_gemm(rows: Sequence[GemmRow], *, sms: int, tiles, peak: Mapping[str, float],
             bandwidth: float, launch: float, base: Optional[GemmModel] = None,
             reference: Optional[str] = None, source: str = "") -> GemmFit:
    """Fit ``efficiency`` per dtype and the shape parameters (module
    docstring); ``base`` gives the shape parameters the data cannot tell."""
    notes: List[str] = []
    for r in rows:
        peak_d = peak.get(r.dtype.value)
        if peak_d is None:
            raise ConfigError(f"{r.where}: no peak_flops for {r.dtype.value} (give "
                              "peaks_used.peak_flops in the measurements, or --topology)")
        rate = 2.0 * r.batch * r.m * r.n * r.k / r.seconds
        if rate > peak_d:
            raise ConfigError(f"{r.where}: {rate:.3g} FLOP/s is above peak_flops.{r.dtype.value} "
                              f"({peak_d:.3g}): the time or the peak is wrong")
    ref = reference_of(rows, reference)
    kept, left_out = _keep(rows, sms, tiles, bandwidth, launch)
    if not kept:
        raise ConfigError("gemm: every GEMM is dominated by fixed costs (under "
                          f"{OVERHEAD_FACTOR:g} launch overheads or at its memory floor): "
                          "measure larger shapes")
    if ref not in {r.series for r in kept}:
        raise ConfigError(f"gemm: the reference series {ref} has no GEMM long enough to fit "
                          "(see the rows left out)")
    problem = _Problem(kept, sms, tiles, peak, bandwidth, launch)
    a, dtypes, free = _design(kept, ref, notes)
    largest = max(tile_intensity_of(tm, tn, min(r.dtype.itemsize for r in kept))
                  for tm, tn in tiles)
    few = sum(1 for r in kept if _waves(r, sms, tiles) <= 2)
    structure = few >= FEW_WAVE_ROWS
    base = base or GemmModel(sms=sms, efficiency={"bf16": 1.0})
    needs = [0.0] + [largest * i / 8 for i in range(1, 9)] if structure else [base.tile_intensity]
    waves = WAVE_GRID if structure else (base.wave_quantization,)
    if not structure:
        notes.append(f"tile_intensity and wave_quantization kept at {base.tile_intensity:g} and "
                     f"{base.wave_quantization:g}: only {few} GEMM(s) of at most two waves")
    best = None
    log_meas = np.log(np.maximum(problem.measured - launch, 1e-12))
    for k0 in K_OVERHEAD_GRID:
        for need in needs:
            for q in waves:
                x, sse = _solve(problem, a, log_meas, k0, need, q)
                # no series may run its largest tile above the peak
                if np.max(a @ x) <= 1e-9 and (best is None or sse < best[0] - 1e-12):
                    best = (sse, k0, need, q, x)
    if best is None:
        raise ConfigError("gemm: every fit puts some series above peak_flops: check the times "
                          "and the peaks of the measurements")
    _, k0, need, q, x = best
    eff = {d: float(math.exp(x[i])) for i, d in enumerate(dtypes)}
    levels = {s: 1.0 for s in {r.series for r in kept}}
    levels.update({s: float(math.exp(x[len(dtypes) + i])) for i, s in enumerate(free)})
    model = GemmModel(sms=sms, tiles=tuple(tiles), efficiency=eff, k_overhead=float(k0),
                      tile_intensity=float(need), wave_quantization=float(q), source=source)
    scale = np.array([eff[r.dtype.value] * levels[r.series] for r in kept])
    modelled = problem.modelled(problem.compute(k0, need, q, scale))
    return GemmFit(model, levels, ref, structure, list(zip(kept, modelled.tolist())),
                   left_out, notes)


def _solve(problem: _Problem, a: np.ndarray, log_meas: np.ndarray, k0: float, need: float,
           q: float):
    """Efficiencies and levels for one grid point (two passes: the split-K
    term does not scale with the ceiling), and the squared error."""
    scale = np.ones(len(problem.rows))
    for _ in range(2):
        unit = problem.compute(k0, need, q, scale) * scale      # time at scale 1 (approx.)
        x = np.linalg.lstsq(a, np.log(unit) - log_meas, rcond=None)[0]
        scale = np.exp(a @ x)
    resid = np.log(problem.modelled(problem.compute(k0, need, q, scale)) / problem.measured)
    return x, float(resid @ resid)


def _waves(r: GemmRow, sms: int, tiles) -> float:
    tm, tn = tiles[0]
    return r.batch * -(-r.m // tm) * -(-r.n // tn) / sms


def _keep(rows, sms, tiles, bandwidth, launch):
    kept, left = [], []
    for r in rows:
        floor = r.batch * (r.m * r.k + r.k * r.n + r.m * r.n) * r.dtype.itemsize / bandwidth
        if launch > 0 and r.seconds < OVERHEAD_FACTOR * launch:
            left.append((r, f"under {OVERHEAD_FACTOR:g} launch overheads"))
        elif r.seconds - launch < MEMORY_FACTOR * floor:
            left.append((r, "within 1.5x of its memory floor"))
        else:
            kept.append(r)
    return kept, left
