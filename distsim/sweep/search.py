"""``distsim search``: the fastest parallel strategy for a model on N GPUs.

1. **Enumerate** every (dp, tp, pp) with ``dp * tp * pp == gpus``, crossed
   with the extra options of ``space`` (e.g. ``{"microbatches": [8, 16],
   "zero": [0, 1]}``; by default micro-batch counts of 1, 2 and 4 times
   ``pp`` for pipelined points when the strategy has ``microbatches``).
2. **Prune by memory** without simulating: a point whose weights alone
   (parameters x dtype size / (tp x pp)) exceed a GPU's memory cannot fit.
   The bound is a lower bound, so it never prunes a point that fits.
3. **Estimate** every remaining point in the analytical network mode (no
   link contention: fast) and drop the invalid and out-of-memory ones.
4. **Simulate in full** (``network_mode``, default ``flow``) the ``keep``
   fastest estimates; rank them by their full step time.

The result holds both stages as sweep DataFrames, the ranking, and
:meth:`SearchResult.explain`: why the best beats the runner-up, part by part.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence

import pandas as pd

from ..errors import ConfigError
from ..report.summary import GB, MS
from .driver import sweep
from .params import simulate_parameters
from .spec import SweepSpec

STRATEGY_AXES = ("dp", "tp", "pp")
_DTYPE_BYTES = {"fp32": 4, "f32": 4, "float32": 4, "fp16": 2, "f16": 2, "bf16": 2,
                "float16": 2, "bfloat16": 2, "fp8": 1}


def divisors(n: int) -> List[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@dataclass
class SearchResult:
    """``estimates``: the analytical stage (every enumerated point);
    ``full``: the points simulated in full; ``ranking``: ``full``'s points
    that fit in memory, fastest first; ``pruned``: the points the memory
    bound removed, with the reason."""

    estimates: pd.DataFrame
    full: pd.DataFrame
    ranking: pd.DataFrame
    pruned: pd.DataFrame
    axes: List[str]
    gpus: int

    @property
    def best(self) -> Optional[Dict[str, Any]]:
        if self.ranking.empty:
            return None
        row = self.ranking.iloc[0]
        return {a: _plain(row[a]) for a in self.axes}

    def table(self, top: int = 5) -> str:
        lines = [f"{'rank':>4}  {'step ms':>10}  {'est. ms':>10}  {'peak GB':>8}  "
                 f"{'MFU':>6}  strategy"]
        for i, (_, r) in enumerate(self.ranking.head(top).iterrows(), 1):
            mfu = "" if pd.isna(r["mfu"]) else f"{r['mfu']:.3f}"
            lines.append(f"{i:>4}  {r['step_time_s'] * MS:10.4f}  "
                         f"{r['estimate_s'] * MS:10.4f}  "
                         f"{r['max_peak_memory_bytes'] / GB:8.2f}  {mfu:>6}  "
                         + " ".join(f"{a}={_plain(r[a])}" for a in self.axes))
        return "\n".join(lines)

    def explain(self) -> str:
        """Why the best wins: its step split, and where the runner-up loses."""
        if self.ranking.empty:
            return "no strategy fits: every point is invalid or out of memory"
        best = self.ranking.iloc[0]
        out = [f"best: {_name(best, self.axes)}: {best['step_time_s'] * MS:.4f} ms per step = "
               + _split(best)
               + f"; peak memory {best['max_peak_memory_bytes'] / GB:.2f} GB per GPU"]
        if len(self.ranking) > 1:
            second = self.ranking.iloc[1]
            gap = second["step_time_s"] - best["step_time_s"]
            parts = []
            for col, label in (("compute_s", "compute"),
                               ("exposed_communication_s", "exposed communication"),
                               ("bubble_s", "pipeline bubble"), ("other_idle_s", "other idle")):
                d = _part(second, col) - _part(best, col)
                if abs(d) > 1e-12:
                    parts.append((abs(d), f"{label} {'+' if d > 0 else '-'}{abs(d) * MS:.4f} ms"))
            parts.sort(reverse=True)
            pct = 100 * gap / best["step_time_s"] if best["step_time_s"] else 0.0
            out.append(f"runner-up: {_name(second, self.axes)} is {gap * MS:.4f} ms "
                       f"({pct:.1f} %) slower: " + (", ".join(p for _, p in parts) or "same split"))
        n_oom = int(self.estimates["oom"].fillna(False).astype(bool).sum())
        n_bad = int((self.estimates["status"] != "ok").sum())
        out.append(f"searched {len(self.estimates) + len(self.pruned)} strategies: "
                   f"{len(self.pruned)} pruned by the memory bound, {n_bad} invalid, "
                   f"{n_oom} out of memory in the estimate, {len(self.full)} simulated in full")
        return "\n".join(out)


def _plain(v: Any) -> Any:
    """A DataFrame cell as a plain option value: numpy scalars unwrapped,
    integral floats as ints, and NaN (pandas' mark for an option a point
    does not set, e.g. ``microbatches`` of an unpipelined point) as None."""
    if hasattr(v, "item"):
        v = v.item()
    if isinstance(v, float):
        if math.isnan(v):
            return None
        if v.is_integer():
            return int(v)
    return v


def _name(row: pd.Series, axes: Sequence[str]) -> str:
    return " ".join(f"{a}={_plain(row[a])}" for a in axes)


def _part(row: pd.Series, col: str) -> float:
    if col == "other_idle_s":
        return max(_part(row, "idle_s") - _part(row, "bubble_s"), 0.0)
    v = row.get(col)
    return 0.0 if v is None or pd.isna(v) else float(v)


def _split(row: pd.Series) -> str:
    return (f"compute {_part(row, 'compute_s') * MS:.4f} + exposed comm "
            f"{_part(row, 'exposed_communication_s') * MS:.4f} + bubble "
            f"{_part(row, 'bubble_s') * MS:.4f} + other idle "
            f"{_part(row, 'other_idle_s') * MS:.4f} ms")


def _weights_lower_bound(model: Any, overrides: Mapping[str, Any]) -> Optional[float]:
    """Bytes of the model's weights (parameters x dtype size), or None when
    the model family does not say its parameter count."""
    from ..models import family_of, load_model_config
    config = load_model_config(model)
    config.update({k: v for k, v in overrides.items() if k in config and v is not None})
    try:
        described = family_of(config).describe(config)
    except Exception:  # a family that cannot describe this config: no bound
        return None
    params = described.get("parameters") if isinstance(described, Mapping) else None
    size = _DTYPE_BYTES.get(str(config.get("dtype", "")).lower())
    if not isinstance(params, (int, float)) or not size:
        return None
    return float(params) * size


def search(model: Any, topology: str, gpus: Optional[int] = None, *, base: Optional[Mapping[str, Any]] = None,
           space: Optional[Mapping[str, Sequence[Any]]] = None, keep: Optional[int] = None,
           network_mode: str = "flow", workers: Optional[int] = None, scheduler: Any = None,
           progress: bool = False) -> SearchResult:
    """Find the fastest strategy of ``model`` on ``gpus`` GPUs of
    ``topology`` (see the module docstring). ``base``: other fixed options
    (``global_batch``, ``layers``, ...); ``space``: extra options to search
    over; ``keep``: how many estimates to simulate in full (default: a
    quarter of the feasible ones, at least 3)."""
    from ..topology import load_topology
    topo = load_topology(topology)
    if gpus is None:
        gpus = topo.num_devices
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1:
        raise ConfigError(f"--gpus: must be a positive integer, got {gpus!r}")
    if gpus != topo.num_devices:
        raise ConfigError(f"--gpus {gpus}: topology '{topo.name}' has {topo.num_devices} "
                          f"devices; a strategy uses all of them (pick a topology with {gpus}, "
                          "e.g. dgx-a100-xN for 8N GPUs)")
    base = dict(base or {})
    params = simulate_parameters()
    for axis in (*STRATEGY_AXES, "model", "topology", "network_mode"):
        if axis in base:
            raise ConfigError(f"search: {axis} is chosen by the search; do not fix it in base")
    space = {k: list(v) for k, v in (space or {}).items()}
    for k in space:
        if k in STRATEGY_AXES:
            raise ConfigError(f"--space {k}: dp, tp and pp are always searched")
    points: List[Dict[str, Any]] = []
    default_mb = "microbatches" in params and "microbatches" not in space \
        and "microbatches" not in base
    for tp in divisors(gpus):
        for pp in divisors(gpus // tp):
            strategy = {"dp": gpus // (tp * pp), "tp": tp, "pp": pp}
            extra = dict(space)
            if default_mb:
                extra["microbatches"] = [None] if pp == 1 else [pp, 2 * pp, 4 * pp]
            combos = [{}]
            for k, values in extra.items():
                combos = [{**c, k: v} for c in combos for v in values]
            points.extend({**strategy, **c} for c in combos)
    axes = list(dict.fromkeys([*STRATEGY_AXES, *space, *(["microbatches"] if default_mb else [])]))

    capacity = min((d.memory_bytes for d in _devices(topo)), default=None)
    weights = _weights_lower_bound(model, base)
    kept, pruned = [], []
    for p in points:
        if weights is not None and capacity and weights / (p["tp"] * p["pp"]) > capacity:
            pruned.append({**p, "reason": f"weights alone need "
                                          f"{weights / (p['tp'] * p['pp']) / GB:.1f} GB per GPU "
                                          f"> {capacity / GB:.1f} GB"})
        else:
            kept.append(p)
    fixed = {"model": model, "topology": topology, **base}
    estimates = _run(fixed, kept, axes, "analytical", workers, scheduler, progress)
    ok = estimates[(estimates["status"] == "ok")
                   & ~estimates["oom"].fillna(False).astype(bool)]
    ok = ok.sort_values(["step_time_s", "index"])
    if keep is None:
        keep = max(3, math.ceil(len(ok) / 4))
    chosen = ok.head(keep)
    chosen_points = [{a: _plain(r[a]) for a in axes} for _, r in chosen.iterrows()]
    if network_mode == "analytical":
        full = chosen.copy()
    else:
        full = _run(fixed, chosen_points, axes, network_mode, workers, scheduler, progress)
    full = full.copy()
    full["estimate_s"] = list(chosen["step_time_s"]) if len(full) == len(chosen) else math.nan
    ranking = full[(full["status"] == "ok") & ~full["oom"].fillna(False).astype(bool)]
    ranking = ranking.sort_values(["step_time_s", "index"]).reset_index(drop=True)
    return SearchResult(estimates, full, ranking, pd.DataFrame(pruned), axes, gpus)


def _devices(topo: Any) -> List[Any]:
    spec = getattr(topo, "device_spec", None)
    return [spec] if spec is not None and hasattr(spec, "memory_bytes") else []


def _run(fixed: Mapping[str, Any], points: List[Dict[str, Any]], axes: List[str], mode: str,
         workers: Optional[int], scheduler: Any, progress: bool) -> pd.DataFrame:
    """Sweep an explicit list of points: a grid over a point number, each
    number mapped to its options by a constraint-free expansion."""
    if not points:
        return _empty_frame(axes)
    frames = []
    # one grid over each group of points with the same keys (None values dropped)
    groups: Dict[tuple, List[Dict[str, Any]]] = {}
    for p in points:
        clean = {k: v for k, v in p.items() if v is not None}
        groups.setdefault(tuple(sorted(clean)), []).append(clean)
    order = {tuple(sorted((k, v) for k, v in p.items() if v is not None)): i
             for i, p in enumerate(points)}
    for keys, members in groups.items():
        spec = _ExplicitSpec.of({**fixed, "network_mode": mode}, list(keys), members)
        df = sweep(spec=spec, workers=workers, scheduler=scheduler, progress=progress)
        frames.append(df)
    df = pd.concat(frames, ignore_index=True)
    for a in axes:
        if a not in df:
            df[a] = None
    df["index"] = [order[tuple(sorted((k, _plain(r[k])) for k in axes
                                      if r[k] is not None and not pd.isna(r[k])))]
                   for _, r in df.iterrows()]
    return df.sort_values("index").reset_index(drop=True)


def _empty_frame(axes: List[str]) -> pd.DataFrame:
    from .point import METRICS
    return pd.DataFrame(columns=["index", "key", *axes, "status", "reason", *METRICS])


class _ExplicitSpec(SweepSpec):
    """A spec whose points are an explicit list rather than a product."""

    @classmethod
    def of(cls, base: Mapping[str, Any], keys: List[str],
           members: List[Dict[str, Any]]) -> "_ExplicitSpec":
        grid = {k: list(dict.fromkeys(m[k] for m in members)) for k in keys}
        allowed = {tuple(m[k] for k in keys) for m in members}
        # the product only carries the explicit members: no cap on its size
        spec = cls.create(base, grid, [lambda c: tuple(c[k] for k in keys) in allowed],
                          name="search", max_points=0)
        spec.__class__ = cls
        spec._keys = keys
        return spec

    def points(self):
        return [p for p in super().points() if p.skip_reason is None]
