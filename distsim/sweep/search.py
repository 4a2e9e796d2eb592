"""``distsim search``: the fastest parallel strategy for a model on N GPUs.

1. **Enumerate** (:mod:`.search_space`) every (dp, tp, pp) with
   ``dp * tp * pp * cp == gpus`` (``cp`` searched with ``space["cp"]``,
   else fixed, default 1), crossed with the extra options of ``space``
   (e.g. ``{"zero": [0, 1], "schedule": ["1f1b", "zb-h1"], "cp_comm":
   ["allgather", "ring"]}``; by default, for GPT models, micro-batch sizes
   1, 2, 4, 8 that divide each data-parallel rank's share of the global
   batch, and for a mixture of experts every ``ep`` dividing dp and the
   experts). The global batch is the same for every point (the model's or
   ``base["global_batch"]``), so every point trains the same sequences per
   step and step time ranks them (as throughput would).
2. **Prune by memory** without estimating: a point whose weights alone
   (parameters x dtype size / (tp x pp), the routed experts' also / ep)
   exceed a GPU's memory cannot fit. The bound is a lower bound, so it
   never prunes a point that fits.
3. **Estimate** every remaining point: a GPT point with the estimator
   (:mod:`.estimate`, milliseconds each) where it models the point, and by
   a simulation in the analytical network mode (with symmetry where exact,
   and coarsening) where it does not (its NotModelledError); other models
   by that simulation. Column ``estimated_by`` says which tier
   (``estimate`` / ``simulate``). Drop the invalid and out-of-memory ones.
4. **Simulate in full** the ``keep`` fastest estimates (``network_mode``,
   default ``flow``; GPT models with symmetry reduction and coarsening,
   both exact in step time) and rank them by their simulated step time.

Progress goes to stderr as it works (``progress=True``). The result holds
both stages as sweep DataFrames, the ranking, and
:meth:`SearchResult.explain`: why the best beats the runner-up, part by part.
"""
from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional, Sequence

from ..errors import ConfigError
from ..keywords import strict_keywords
from ..report.summary import GB, MS
from .driver import sweep
from .search_space import (STRATEGY_AXES, WEIGHTS_REASON, check_space, enumerate_points,
                           expert_weights, model_config, weights_exceed, weights_lower_bound)
from .spec import SweepSpec

if TYPE_CHECKING:     # pandas is imported where a table is made (``import distsim`` stays fast)
    import pandas as pd

#: Estimates simulated in full by default.
DEFAULT_KEEP = 2
#: per model family, the options that trade time for memory (the MLP
#: family has neither; an imported graph has no layers to recompute)
_MEMORY_LEVERS = {"gpt": (("zero", "0,1,2,3"), ("recompute", "none,selective,full")),
                  "onnx": (("zero", "0,1,2,3"),)}
#: a GPT model written with explicit attention keeps seq x seq tensors
#: that a fused (FlashAttention) kernel never holds: the biggest memory
#: lever at long sequences, named when the model's attention is explicit
_ATTENTION_LEVER = ("attention", "explicit,fused")
_CHOSEN = (*STRATEGY_AXES, "model", "topology", "network_mode", "fidelity", "symmetry",
           "coarsen")


@dataclass
class SearchResult:
    """``estimates``: the first stage (every enumerated point not pruned);
    ``full``: the points simulated in full; ``ranking``: ``full``'s points
    that fit in memory, fastest first; ``pruned``: the points the memory
    bound removed, with the reason."""

    estimates: pd.DataFrame
    full: pd.DataFrame
    ranking: pd.DataFrame
    pruned: pd.DataFrame
    axes: List[str]
    gpus: int
    #: ``--space`` options that save memory, neither searched nor fixed
    #: (named when nothing fits for lack of memory)
    memory_options: List[str] = field(default_factory=list)

    @property
    def best(self) -> Optional[Dict[str, Any]]:
        if self.ranking.empty:
            return None
        row = self.ranking.iloc[0]
        return {a: _plain(row[a]) for a in self.axes}

    def table(self, top: int = 5) -> str:
        import pandas as pd
        lines = [f"{'rank':>4}  {'step ms':>10}  {'est. ms':>10}  {'est. by':>8}  "
                 f"{'tokens/s':>10}  {'peak GB':>8}  {'MFU':>6}  strategy"]
        for i, (_, r) in enumerate(self.ranking.head(top).iterrows(), 1):
            mfu = "" if pd.isna(r["mfu"]) else f"{r['mfu']:.3f}"
            tps = "" if pd.isna(r["tokens_per_s"]) else f"{r['tokens_per_s']:.4g}"
            lines.append(f"{i:>4}  {r['step_time_s'] * MS:10.4f}  "
                         f"{r['estimate_s'] * MS:10.4f}  {r['estimated_by']:>8}  {tps:>10}  "
                         f"{r['max_peak_memory_bytes'] / GB:8.2f}  {mfu:>6}  "
                         + _name(r, self.axes))
        return "\n".join(lines)

    def explain(self) -> str:
        """Why the best wins: its step split, and where the runner-up loses."""
        if self.ranking.empty:
            return "no strategy fits: " + self._why_none()
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
            differ = [f"{a} {_plain(second[a])} (best {_plain(best[a])})" for a in self.axes
                      if _plain(second[a]) != _plain(best[a])]
            out.append(f"runner-up: {_name(second, self.axes)} is {gap * MS:.4f} ms "
                       f"({pct:.1f} %) slower: " + (", ".join(p for _, p in parts) or "same split")
                       + ("; it differs in " + ", ".join(differ) if differ else ""))
        est = self.estimates
        n_oom = int(est["oom"].fillna(False).astype(bool).sum()) if len(est) else 0
        n_bad = int((est["status"] != "ok").sum()) if len(est) else 0
        out.append(f"searched {len(est) + len(self.pruned)} strategies: "
                   f"{len(self.pruned)} pruned by the memory bound, {n_bad} invalid, "
                   f"{n_oom} out of memory in the estimate, {len(self.full)} simulated in full")
        n_ok = len(est) - n_bad
        if self.memory_options and n_oom and 2 * n_oom >= n_ok:
            # most layouts were ruled out by memory alone: the options that
            # save it may let a faster one in
            out.append(f"{n_oom} of the {n_ok} estimated strategies did not fit in memory; "
                       "to save memory, also search " + " ".join(self.memory_options))
        return "\n".join(out)


    def _why_none(self) -> str:
        """Why no strategy is left, with the commonest reasons: "every point
        is invalid" alone does not say what to change (often a fixed
        option, e.g. a batch the model needs)."""
        frames = [f for f in (self.estimates, self.full) if len(f)]
        counts: Dict[str, int] = {}
        oom = 0
        for f in frames:
            oom += int((f["status"].eq("ok") & f["oom"].fillna(False).astype(bool)).sum())
            for reason in f.loc[f["status"] != "ok", "reason"]:
                key = str(reason)
                counts[key] = counts.get(key, 0) + 1
        pruned = len(self.pruned)
        parts = []
        if pruned:
            parts.append(f"{pruned} pruned (memory bound or batch)")
        if oom:
            parts.append(f"{oom} out of memory")
        if counts:
            top = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:3]
            parts.append(f"{sum(counts.values())} invalid or failed, e.g. "
                         + "; ".join(f"{n} x {text}" for text, n in top))
        text = ", ".join(parts) if parts else "no strategy to try"
        short_of_memory = oom or any(str(r).startswith(WEIGHTS_REASON)
                                     for r in self.pruned.get("reason", ()))
        if short_of_memory and self.memory_options:
            text += "; to save memory, also search " + " ".join(self.memory_options)
        return text


def _plain(v: Any) -> Any:
    """A DataFrame cell as a plain option value: numpy scalars unwrapped,
    integral floats as ints, and NaN (pandas' mark for an option a point
    does not set) as None."""
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
    import pandas as pd
    v = row.get(col)
    return 0.0 if v is None or pd.isna(v) else float(v)


def _split(row: pd.Series) -> str:
    return (f"compute {_part(row, 'compute_s') * MS:.4f} + exposed comm "
            f"{_part(row, 'exposed_communication_s') * MS:.4f} + bubble "
            f"{_part(row, 'bubble_s') * MS:.4f} + other idle "
            f"{_part(row, 'other_idle_s') * MS:.4f} ms")


class _Log:
    """Search progress on stderr (one line per stage, and the sweeps' own)."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.start = time.monotonic()

    def __call__(self, text: str) -> None:
        if self.enabled:
            try:
                sys.stderr.write(f"search [{time.monotonic() - self.start:6.1f} s] {text}\n")
                sys.stderr.flush()
            except (OSError, ValueError):
                self.enabled = False


@strict_keywords
def search(model: Any, topology: str, gpus: Optional[int] = None, *,
           base: Optional[Mapping[str, Any]] = None,
           space: Optional[Mapping[str, Sequence[Any]]] = None, keep: Optional[int] = None,
           network_mode: str = "flow", workers: Optional[int] = None, scheduler: Any = None,
           progress: bool = False) -> SearchResult:
    """Find the fastest strategy of ``model`` on ``gpus`` GPUs of
    ``topology`` (see the module docstring). ``base``: other fixed options
    (``global_batch``, ``layers``, ...); ``space``: extra options to search
    over; ``keep``: how many estimates to simulate in full (default
    :data:`DEFAULT_KEEP`); ``network_mode``: the network model of those
    full simulations (``flow`` or ``analytical``); ``workers`` /
    ``scheduler``: what runs the points (estimates of GPT models run in
    local processes, each keeping its per-layer profiles); ``progress``:
    print each stage and the sweeps' progress on stderr."""
    import pandas as pd
    from ..topology import load_topology
    log = _Log(progress)
    topo = load_topology(topology)
    if gpus is None:
        gpus = topo.num_devices
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1:
        raise ConfigError(f"--gpus: must be a positive integer, got {gpus!r}")
    if gpus != topo.num_devices:
        raise ConfigError(f"--gpus {gpus}: topology '{topo.name}' has {topo.num_devices} "
                          f"devices; a strategy uses all of them (pick a topology with {gpus}, "
                          "e.g. dgx-a100-xN for 8N GPUs)")
    if keep is not None and (isinstance(keep, bool) or not isinstance(keep, int) or keep < 1):
        raise ConfigError(f"--keep: must be a positive integer, got {keep!r}")
    base = dict(base or {})
    for axis in _CHOSEN:
        if axis in base:
            raise ConfigError(f"search: {axis} is chosen by the search; do not fix it in base")
    space = {k: list(v) for k, v in (space or {}).items()}
    for k, values in space.items():
        _check_space_values(k, values)
        if k in _CHOSEN:
            raise ConfigError(f"--space {k}: dp, tp and pp are always searched"
                              if k in STRATEGY_AXES else
                              f"--space {k}: chosen by the search, not searchable")
    config = model_config(model, base)
    is_gpt = config.get("family") == "gpt"
    check_space(space, base, config, gpus)
    points, pruned, axes = enumerate_points(gpus, space, base, config)

    capacity = topo.device_spec.memory_bytes if getattr(topo, "device_spec", None) else None
    weights = weights_lower_bound(model, base)
    experts = expert_weights(config)
    kept = []
    for p in points:
        reason = weights_exceed(weights, experts, capacity, p, base)
        if reason:
            pruned.append({**p, "reason": reason})
        else:
            kept.append(p)
    fixed = {"model": model, "topology": topology, **base}
    log(f"{len(kept) + len(pruned)} strategies for {gpus} GPUs ({len(pruned)} pruned: "
        "the memory bound, or dp not dividing the batch)")
    estimates = _first_stage(fixed, kept, axes, is_gpt, log, workers=workers,
                             scheduler=scheduler, progress=progress)
    ok = estimates[(estimates["status"] == "ok")
                   & ~estimates["oom"].fillna(False).astype(bool)] if len(estimates) else estimates
    if len(ok):
        ok = ok.sort_values(["step_time_s", "index"])
    keep = DEFAULT_KEEP if keep is None else keep
    chosen = ok.head(keep)
    chosen_points = [{a: _plain(r[a]) for a in axes} for _, r in chosen.iterrows()]
    reduced = {"coarsen": True} if is_gpt else {}
    if is_gpt:
        chosen_points = [{**p, "symmetry": _symmetric({**fixed, **p})} for p in chosen_points]
    log(f"{len(ok)} of {len(kept)} fit in memory; simulating the {len(chosen_points)} fastest "
        f"in full ({network_mode} network"
        + (_reduction_note(chosen_points) if is_gpt else "") + ")")
    # a point the first stage simulated analytically (with the same
    # reductions) is not simulated again in that mode
    again = [network_mode != "analytical" or tier == "estimate"
             for tier in chosen["estimated_by"]]
    full = _run({**fixed, "network_mode": network_mode, **reduced},
                [p for p, a in zip(chosen_points, again) if a], axes,
                "search: full simulations", workers=workers, scheduler=scheduler,
                progress=progress)
    copied = chosen.iloc[[i for i, a in enumerate(again) if not a]]
    full = pd.concat([f for f in (full, copied) if len(f)] or [full], ignore_index=True)
    # each full row with its first-stage tier and figure, numbered by its
    # estimate's rank (the tie-break of equal step times)
    first = {_key(r, axes): (i, r["estimated_by"], r["step_time_s"])
             for i, (_, r) in enumerate(chosen.iterrows())}
    rows = [first[_key(r, axes)] for _, r in full.iterrows()]
    full["index"] = [i for i, _, _ in rows]
    full["estimated_by"] = [tier for _, tier, _ in rows]
    full["estimate_s"] = [est for _, _, est in rows]
    ranking = full[(full["status"] == "ok") & ~full["oom"].fillna(False).astype(bool)] \
        if len(full) else full
    ranking = ranking.sort_values(["step_time_s", "index"]).reset_index(drop=True)
    log("done")
    levers = _MEMORY_LEVERS.get(str(config.get("family")), ())
    if config.get("family") == "gpt":
        from ..models.gpt import GPTConfig
        if config.get("attention", GPTConfig.attention) == "explicit":
            levers = (*levers, _ATTENTION_LEVER)
    memory_options = [f"--space {k}={v}" for k, v in levers if k not in space and k not in base]
    return SearchResult(estimates, full, ranking, pd.DataFrame(pruned), axes, gpus,
                        memory_options)


def _first_stage(fixed: Mapping[str, Any], points: List[Dict[str, Any]], axes: List[str],
                 is_gpt: bool, log: _Log, workers: Optional[int], scheduler: Any,
                 progress: bool) -> pd.DataFrame:
    """Every point estimated: a GPT point by the estimator where it models
    the point, and by an analytical simulation where it does not (its
    NotModelledError: a ``skipped`` row) or for a model of another family.
    Column ``estimated_by`` says which (``estimate`` / ``simulate``)."""
    import pandas as pd
    simulated = list(range(len(points)))
    frames = []
    if is_gpt:
        log(f"estimating {len(points)} with the estimator (where it does not model a point: "
            "an analytical simulation)")
        est = _run({**fixed, "fidelity": "estimate"}, points, axes, "search: estimates",
                   workers=workers, scheduler=None, progress=progress)
        unmodelled = est["status"] == "skipped"
        simulated = [int(i) for i in est.loc[unmodelled, "index"]]
        frames.append(est[~unmodelled])
        if simulated:
            reasons = est.loc[unmodelled, "reason"].astype(str).value_counts()
            log(f"the estimator does not model {len(simulated)} of {len(points)} (e.g. "
                f"{reasons.index[0]}); simulating them analytically")
    else:
        log(f"estimating {len(points)} with analytical simulations")
    if simulated:
        chosen = [points[i] for i in simulated]
        if is_gpt:      # reduced as the full simulations are (exact in step time)
            chosen = [{**p, "symmetry": _symmetric({**fixed, **p})} for p in chosen]
        sim = _run({**fixed, "network_mode": "analytical", **({"coarsen": True} if is_gpt else {})},
                   chosen, axes, "search: analytical estimates", workers=workers,
                   scheduler=scheduler, progress=progress)
        sim["index"] = [simulated[int(i)] for i in sim["index"]]
        frames.append(sim)
    frames = [f for f in frames if len(f)]
    df = pd.concat(frames, ignore_index=True) if frames else _empty_frame(axes)
    df["estimated_by"] = df["fidelity"]
    by = df["estimated_by"].value_counts()
    log(f"estimated {len(df)}: {int(by.get('estimate', 0))} by the estimator, "
        f"{int(by.get('simulate', 0))} by analytical simulation")
    return df.sort_values("index").reset_index(drop=True)


def _symmetric(options: Mapping[str, Any]) -> bool:
    """Whether a simulation of these GPT options may use ``symmetry``
    (exact): not when its ZeRO shards differ between ranks. The estimator's
    check (:func:`~.estimate.symmetry_applies`) where it resolves the
    point; otherwise only without sharded ZeRO state (ZeRO 0, or one
    data-parallel rank, context-parallel ranks counted with them)."""
    from ..estimate import symmetry_applies
    try:
        return symmetry_applies(options)
    except ConfigError:   # not modelled by the estimator (or invalid: refused anyway)
        ranks = (options.get("dp") or 1) * (options.get("cp") or 1)
        return not options.get("zero") or ranks == 1


def _key(row: pd.Series, axes: Sequence[str]) -> tuple:
    return tuple(_plain(row[a]) for a in axes)


def _reduction_note(points: List[Dict[str, Any]]) -> str:
    """How the full simulations of GPT points are reduced, for the log:
    coarsening always, symmetry where the point allows it."""
    reduced = sum(1 for p in points if p.get("symmetry"))
    if reduced == len(points):
        return ", symmetry and coarsening"
    if reduced == 0:
        return ", coarsening; no symmetry: the ZeRO shards differ between ranks"
    return (f", coarsening; symmetry for {reduced} of {len(points)} (the others' ZeRO shards "
            "differ between ranks)")


def _check_space_values(name: str, values: List[Any]) -> None:
    """A searched option needs values, each once: a repeated value would
    count (and, in the log, estimate) its strategies twice while the sweep
    runs them once."""
    if not values:
        raise ConfigError(f"--space {name}: no values")
    from .params import check_value, simulate_parameters
    params = simulate_parameters()
    seen: List[Any] = []
    for v in values:
        check_value(params, name, v, f"--space {name}")
        if any(v == s and type(v) is type(s) for s in seen):
            raise ConfigError(f"--space {name}: value {v!r} is listed twice")
        seen.append(v)


def _run(fixed: Mapping[str, Any], points: List[Dict[str, Any]], axes: List[str], name: str,
         workers: Optional[int], scheduler: Any, progress: bool) -> pd.DataFrame:
    """Sweep an explicit list of points (one spec per set of option names)."""
    import pandas as pd
    if not points:
        return _empty_frame(axes)
    frames = []
    groups: Dict[tuple, List[Dict[str, Any]]] = {}
    for p in points:
        clean = {k: v for k, v in p.items() if v is not None}
        groups.setdefault(tuple(sorted(clean)), []).append(clean)
    order = {tuple(sorted((k, v) for k, v in p.items() if v is not None and k in axes)): i
             for i, p in enumerate(points)}
    for keys, members in groups.items():
        spec = _ExplicitSpec.of(fixed, list(keys), members, name)
        frames.append(sweep(spec=spec, workers=workers, scheduler=scheduler,
                            progress=progress))
    df = pd.concat(frames, ignore_index=True)
    # options a point carries beyond the axes (symmetry) are not columns
    df = df.drop(columns=[c for c in ("symmetry",) if c in df and c not in axes])
    for a in axes:
        if a not in df:
            df[a] = None
    df["index"] = [order[tuple(sorted((k, _plain(r[k])) for k in axes
                                      if r[k] is not None and not pd.isna(r[k])))]
                   for _, r in df.iterrows()]
    return df.sort_values("index").reset_index(drop=True)


def _empty_frame(axes: List[str]) -> pd.DataFrame:
    import pandas as pd

    from .point import METRICS, RESOLVED
    return pd.DataFrame(columns=["index", "key", *axes, "fidelity", "status", "reason",
                                 *METRICS, *RESOLVED])


class _ExplicitSpec(SweepSpec):
    """A spec whose points are an explicit list rather than a product."""

    @classmethod
    def of(cls, base: Mapping[str, Any], keys: List[str], members: List[Dict[str, Any]],
           name: str = "search") -> "_ExplicitSpec":
        grid = {k: list(dict.fromkeys(m[k] for m in members)) for k in keys}
        allowed = {tuple(m[k] for k in keys) for m in members}
        # the product only carries the explicit members: no cap on its size
        spec = cls.create(base, grid, [lambda c: tuple(c[k] for k in keys) in allowed],
                          name=name, max_points=0)
        spec.__class__ = cls
        return spec

    def points(self):
        return [p for p in super().points() if p.skip_reason is None]
