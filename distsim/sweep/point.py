"""Run one sweep point: simulate, and reduce the result to one flat row.

:func:`run_point` is what every runner (in-process, local processes, Dask)
calls, so a row does not depend on what ran it. It never raises for a bad
configuration: the row says what happened in ``status``:

* ``ok``: simulated; the metric columns are filled;
* ``skipped``: a constraint of the spec excluded it (``reason`` says which);
* ``invalid``: the simulator refused the combination (degrees that do not
  fit the devices, a strategy the model does not support, ...; ``reason``
  is its message);
* ``failed``: the simulation raised (``reason`` is the error text).

Metrics a summary does not have (yet) are NaN, never a crash.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Dict, Mapping, Optional

from ..errors import ConfigError, DistsimError, PassPreconditionError

#: The metric columns of a sweep row, in order.
METRICS = ("step_time_s", "samples_per_s", "tokens_per_s", "mfu", "max_peak_memory_bytes",
           "memory_capacity_bytes", "oom", "bubble_fraction", "bubble_s", "compute_s",
           "communication_s", "exposed_communication_s", "idle_s", "num_devices",
           "total_flops")
#: Errors that mean "this combination is not valid" rather than "it broke".
INVALID_ERRORS = (ConfigError, PassPreconditionError)

SimulateFn = Callable[..., Any]


def empty_metrics() -> Dict[str, Any]:
    return {m: None for m in METRICS}


def run_point(params: Mapping[str, Any], simulate: Optional[SimulateFn] = None) -> Dict[str, Any]:
    """Simulate one configuration; return ``{status, reason, <metrics>}``."""
    if simulate is None:
        from ..api import simulate as default_simulate
        simulate = default_simulate
    row: Dict[str, Any] = {"status": "ok", "reason": None, **empty_metrics()}
    try:
        result = simulate(**dict(params))
        summary = result.summary()
        row.update(metrics_of(summary, getattr(result, "config", None) or {}))
    except INVALID_ERRORS as e:
        row.update(status="invalid", reason=_one_line(str(e)))
    except DistsimError as e:
        row.update(status="failed", reason=_one_line(f"{type(e).__name__}: {e}"))
    except Exception as e:  # a bug somewhere below: record it, keep sweeping
        row.update(status="failed", reason=_one_line(f"{type(e).__name__}: {e}"))
    return row


def _one_line(text: str) -> str:
    return " ".join(text.split())[:2000]


def _number(value: Any) -> Optional[float]:
    if isinstance(value, bool) or value is None:
        return None
    try:
        f = float(value)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def metrics_of(summary: Mapping[str, Any], config: Mapping[str, Any]) -> Dict[str, Any]:
    """The metric columns of a row from a ``SimulationResult.summary()``."""
    out = empty_metrics()
    for name in METRICS:
        if name == "oom":
            continue
        out[name] = _number(summary.get(name))
    oom = summary.get("oom")
    out["oom"] = bool(oom) if oom is not None else None
    step = out["step_time_s"]
    if out["samples_per_s"] is None and step:
        batch = _number(config.get("global_batch")) or _number(config.get("batch"))
        if batch:
            out["samples_per_s"] = batch / step
    if out["bubble_s"] is None and out["bubble_fraction"] is not None and step is not None:
        out["bubble_s"] = out["bubble_fraction"] * step
    devices = summary.get("devices") or []
    caps = [d.get("capacity_bytes") for d in devices if isinstance(d, Mapping)]
    caps = [c for c in (_number(c) for c in caps) if c]
    if out["memory_capacity_bytes"] is None and caps:
        out["memory_capacity_bytes"] = min(caps)
    return out
