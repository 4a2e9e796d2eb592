"""Runs side by side: ``distsim compare A B [C ...]`` and :func:`compare`.

A run is a folder holding ``summary.json``, a ``summary.json`` file, a
summary dict or a :class:`~distsim.api.SimulationResult`. The first run is
the baseline: every other run's figures are given with their difference
from it (in the metric's unit and in per cent). Figures: step time,
tokens/s, MFU, exposed communication, pipeline bubble, peak memory and its
categories on the device that peaks highest, and the busiest link's mean
utilisation. :class:`Comparison` renders as a terminal table, as JSON and
as a chart (:mod:`distsim.report.compare_chart`).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Union

from distsim.errors import ConfigError
from distsim.report.summary import GB, MS

RunLike = Union[str, Path, Mapping[str, Any], Any]


@dataclass(frozen=True)
class Metric:
    """One compared figure: ``key`` (JSON), ``label`` and ``unit`` (table),
    ``get`` (summary -> value, None when the run has none) and whether
    lower values are better (None: neither)."""

    key: str
    label: str
    unit: str
    get: Callable[[Mapping[str, Any]], Optional[float]]
    lower_is_better: Optional[bool]


def _share(key: str) -> Callable[[Mapping[str, Any]], Optional[float]]:
    def get(s: Mapping[str, Any]) -> Optional[float]:
        step = s.get("step_time_s") or 0.0
        return 100.0 * s[key] / step if step > 0 and key in s else None
    return get


def _peak_category(category: str) -> Callable[[Mapping[str, Any]], Optional[float]]:
    def get(s: Mapping[str, Any]) -> Optional[float]:
        by_rank = s.get("memory_by_category") or {}
        cats = by_rank.get(str(s.get("max_peak_memory_rank")))
        return None if cats is None else cats.get(category, 0) / GB
    return get


def _optional(key: str, scale: float = 1.0) -> Callable[[Mapping[str, Any]], Optional[float]]:
    return lambda s: s[key] * scale if s.get(key) is not None else None


def _busiest(s: Mapping[str, Any]) -> Optional[float]:
    links = s.get("links") or []
    return 100.0 * links[0]["utilisation"] if links else None


def _mean_busiest(s: Mapping[str, Any]) -> Optional[float]:
    links = s.get("links") or []
    return 100.0 * sum(k["utilisation"] for k in links) / len(links) if links else None


METRICS: Sequence[Metric] = (
    Metric("step_time_ms", "step time", "ms", lambda s: s["step_time_s"] * MS, True),
    Metric("tokens_per_s", "tokens/s", "tokens/s", _optional("tokens_per_s"), False),
    Metric("mfu_pct", "MFU", "%", _optional("mfu", 100.0), False),
    Metric("compute_pct", "compute", "% of step", _share("compute_s"), None),
    Metric("exposed_communication_ms", "exposed communication", "ms",
           lambda s: s["exposed_communication_s"] * MS, True),
    Metric("exposed_communication_pct", "exposed communication", "% of step",
           _share("exposed_communication_s"), True),
    Metric("bubble_pct", "pipeline bubble", "% of step", _optional("bubble_fraction", 100.0),
           True),
    Metric("peak_memory_gb", "peak memory", "GB", lambda s: s["max_peak_memory_bytes"] / GB,
           True),
    *(Metric(f"peak_{c}_gb", f"  {c}", "GB", _peak_category(c), True)
      for c in ("weights", "gradients", "optimizer", "activations", "temporaries")),
    Metric("busiest_link_pct", "busiest link, mean use", "%", _busiest, None),
    Metric("top_links_pct", "16 busiest links, mean use", "%", _mean_busiest, None),
)


@dataclass
class Run:
    """A run's label, its summary and where it was read from."""

    label: str
    summary: Dict[str, Any]
    source: str = ""


def _read_summary(path: Path) -> Dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: cannot read the file ({e})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path}: not valid JSON (line {e.lineno}, column {e.colno}: "
                          f"{e.msg})") from None
    return _checked(data, str(path))


_REQUIRED = ("step_time_s", "exposed_communication_s", "max_peak_memory_bytes", "num_devices")


def _checked(data: Any, where: str) -> Dict[str, Any]:
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: a summary must be a JSON object")
    for key in _REQUIRED:
        value = data.get(key)
        if isinstance(value, bool) or not isinstance(value, (int, float)) \
                or not math.isfinite(value):
            raise ConfigError(f"{where}: {key}: missing or not a number (not a distsim "
                              "summary.json?)")
    return data


def load_run(run: RunLike, label: Optional[str] = None) -> Run:
    """A :class:`Run` from a folder with ``summary.json``, a summary file,
    a summary dict or a :class:`~distsim.api.SimulationResult`."""
    if hasattr(run, "summary") and callable(run.summary):
        summary = run.summary()
        config = summary.get("config") or {}
        return Run(label or str(config.get("model", "run")), _checked(summary, "result"))
    if isinstance(run, Mapping):
        config = run.get("config") or {}
        return Run(label or str(config.get("model", "run")), _checked(dict(run), "summary"))
    path = Path(run)
    if path.is_dir():
        file = path / "summary.json"
        if not file.is_file():
            raise ConfigError(f"{path}: no summary.json in this folder (a distsim simulate "
                              "--out folder, or a summary.json file)")
        return Run(label or path.name, _read_summary(file), str(file))
    name = path.parent.name if path.name == "summary.json" and path.parent.name else path.stem
    return Run(label or name, _read_summary(path), str(path))


def _unique(labels: List[str]) -> List[str]:
    """Labels made distinct by a number where two runs share one."""
    seen: Dict[str, int] = {}
    out = []
    for label in labels:
        seen[label] = seen.get(label, 0) + 1
        out.append(label if labels.count(label) == 1 else f"{label} ({seen[label]})")
    return out


@dataclass
class Comparison:
    """Runs compared: ``values[metric key]`` is the list of each run's value
    (None: the run has none); differences are against the first run."""

    runs: List[Run]
    metrics: List[Metric]
    values: Dict[str, List[Optional[float]]] = field(default_factory=dict)

    @property
    def labels(self) -> List[str]:
        return [r.label for r in self.runs]

    def difference(self, key: str, i: int) -> Optional[float]:
        """Run ``i``'s value minus the baseline's (None if either is missing)."""
        base, value = self.values[key][0], self.values[key][i]
        return None if base is None or value is None else value - base

    def relative(self, key: str, i: int) -> Optional[float]:
        """The difference in per cent of the baseline (None when the baseline is 0)."""
        diff, base = self.difference(key, i), self.values[key][0]
        return None if diff is None or not base else 100.0 * diff / abs(base)

    def describe(self) -> Dict[str, List[str]]:
        """Per run: model, topology, strategy and the busiest link's name."""
        from distsim.report.run_page import strategy_line
        out: Dict[str, List[str]] = {"model": [], "topology": [], "strategy": [],
                                     "busiest link": [], "OOM": []}
        for run in self.runs:
            config = run.summary.get("config") or {}
            links = run.summary.get("links") or []
            out["model"].append(str(config.get("model", "")))
            out["topology"].append(str(config.get("topology", "")))
            out["strategy"].append(strategy_line(config) if config else "")
            out["busiest link"].append(f"{links[0]['src']} -> {links[0]['dst']}" if links
                                       else "")
            out["OOM"].append("yes" if run.summary.get("oom") else "no")
        return out

    def to_dict(self) -> Dict[str, Any]:
        """The comparison as JSON-ready data (what ``--json`` prints)."""
        metrics = []
        for m in self.metrics:
            metrics.append({
                "key": m.key, "label": m.label.strip(), "unit": m.unit,
                "lower_is_better": m.lower_is_better, "values": self.values[m.key],
                "difference": [self.difference(m.key, i) for i in range(1, len(self.runs))],
                "relative_pct": [self.relative(m.key, i) for i in range(1, len(self.runs))]})
        return {"runs": [{"label": r.label, "source": r.source} for r in self.runs],
                "baseline": self.runs[0].label, "describe": self.describe(), "metrics": metrics}

    def table(self) -> str:
        """The terminal table (see :func:`distsim.report.compare_table.format_comparison`)."""
        from distsim.report.compare_table import format_comparison
        return format_comparison(self)

    def figure(self):
        """The chart, a matplotlib ``Figure``."""
        from distsim.report.compare_chart import comparison_figure
        return comparison_figure(self)

    def chart(self):
        """The chart, shown inline in a notebook (:class:`~distsim.report.figures.Chart`)."""
        from distsim.report.figures import Chart
        return Chart(self.figure())

    def write_chart(self, path: Union[str, Path]) -> Path:
        """Write the chart as a PNG (atomically)."""
        from distsim.report.figures import save_png
        save_png(self.figure(), path)
        return Path(path)

    def __repr__(self) -> str:
        return self.table()

    def _repr_html_(self) -> str:
        from distsim.report.compare_table import comparison_html
        return comparison_html(self)


def compare(*runs: RunLike, labels: Optional[Sequence[str]] = None) -> Comparison:
    """Compare two or more runs (folders, summary.json files, summaries or
    results); the first is the baseline. ``labels`` name them (default: the
    folder names, or the models)."""
    if len(runs) < 2:
        raise ConfigError(f"compare: give two runs or more (got {len(runs)})")
    if labels is not None and len(labels) != len(runs):
        raise ConfigError(f"compare: {len(labels)} labels for {len(runs)} runs")
    loaded = [load_run(r, labels[i] if labels else None) for i, r in enumerate(runs)]
    for run, label in zip(loaded, _unique([r.label for r in loaded])):
        run.label = label
    values = {}
    for m in METRICS:
        row = []
        for run in loaded:
            try:
                v = m.get(run.summary)
            except (KeyError, TypeError, ValueError):
                v = None
            row.append(None if v is None else float(v))
        values[m.key] = row
    metrics = [m for m in METRICS if any(v is not None for v in values[m.key])]
    return Comparison(loaded, metrics, {m.key: values[m.key] for m in metrics})
