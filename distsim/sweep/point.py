"""Run one sweep point: simulate (or estimate), and reduce the result to
one flat row.

:func:`run_point` is what every runner (in-process, local processes, Dask)
calls, so a row does not depend on what ran it. The option ``fidelity``
chooses how: ``simulate`` (the default: build the program and simulate it)
or ``estimate`` (:func:`distsim.estimate.estimate`, milliseconds, GPT
models only). Every row records the batch layout the step ran with
(:data:`RESOLVED`: data-parallel degree, global batch, micro-batch size and
count), so rows compare at equal work. It never raises for a bad
configuration: the row says what happened in ``status``:

* ``ok``: simulated; the metric columns are filled;
* ``skipped``: a constraint of the spec excluded it, or the estimator does
  not model it (``fidelity: estimate``; ``reason`` says which);
* ``invalid``: the simulator refused the combination (degrees that do not
  fit the devices, a strategy the model does not support, ...; ``reason``
  is its message);
* ``failed``: the simulation raised (``reason`` is the error text).

Metrics a summary does not have (yet) are NaN, never a crash.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

from ..errors import ConfigError, DistsimError, NotModelledError, PassPreconditionError

#: The metric columns of a sweep row, in order.
METRICS = ("step_time_s", "samples_per_s", "tokens_per_s", "mfu", "max_peak_memory_bytes",
           "memory_capacity_bytes", "oom", "bubble_fraction", "bubble_s", "compute_s",
           "communication_s", "exposed_communication_s", "idle_s", "num_devices",
           "total_flops")
#: The batch layout a point ran with, as resolved (the options may leave it
#: to defaults): data-parallel degree, sequences (samples) per step, per
#: micro-batch, and micro-batches per step.
RESOLVED = ("resolved_dp", "resolved_global_batch", "resolved_micro_batch",
            "resolved_microbatches")
#: How a row was produced.
FIDELITIES = ("simulate", "estimate")
#: Errors that mean "this combination is not valid" rather than "it broke".
INVALID_ERRORS = (ConfigError, PassPreconditionError)

SimulateFn = Callable[..., Any]


def empty_metrics() -> Dict[str, Any]:
    return {**{m: None for m in METRICS}, **{r: None for r in RESOLVED}}


def run_point(params: Mapping[str, Any], simulate: Optional[SimulateFn] = None) -> Dict[str, Any]:
    """Simulate (or estimate, with ``fidelity: estimate``) one configuration;
    return ``{status, reason, fidelity, <metrics>, <resolved batch>}``.
    ``simulate`` replaces :func:`distsim.simulate` for simulated points."""
    options = dict(params)
    fidelity = options.pop("fidelity", None) or "simulate"
    row: Dict[str, Any] = {"status": "ok", "reason": None, "fidelity": fidelity,
                           **empty_metrics()}
    try:
        if fidelity == "estimate":
            from ..estimate import estimate
            row.update(estimated_row(estimate(options)))
        elif fidelity == "simulate":
            if simulate is None:
                from ..api import simulate as default_simulate
                simulate = default_simulate
            result = simulate(**options)
            summary = result.summary()
            config = getattr(result, "config", None) or {}
            row.update(metrics_of(summary, config))
            row.update(resolved_of(config))
        else:
            raise ConfigError(f"fidelity: must be one of {', '.join(FIDELITIES)}, "
                              f"got {fidelity!r}")
    except NotModelledError as e:   # valid, but the estimator does not model it
        row.update(status="skipped", reason=_one_line(str(e)))
    except INVALID_ERRORS as e:
        row.update(status="invalid", reason=_one_line(str(e)))
    except DistsimError as e:
        row.update(status="failed", reason=_one_line(f"{type(e).__name__}: {e}"))
    except Exception as e:  # a bug somewhere below: record it, keep sweeping
        row.update(status="failed", reason=_one_line(f"{type(e).__name__}: {e}"))
    return row


def run_batch(batch: Sequence[Mapping[str, Any]], simulate: Optional[SimulateFn] = None
              ) -> List[Dict[str, Any]]:
    """:func:`run_point` on each of ``batch``, in one worker (see
    :mod:`.batches`)."""
    return [run_point(params, simulate) for params in batch]


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


def _int(value: Any) -> Optional[int]:
    f = _number(value)
    return int(f) if f is not None and f == int(f) else None


def resolved_of(config: Mapping[str, Any]) -> Dict[str, Any]:
    """The resolved batch columns from a run's config (the GPT family
    resolves global batch, micro-batch and count; a data-parallel model's
    ``batch`` is its global batch, one micro-batch per step)."""
    dp = _int(config.get("dp")) or 1
    gb = _int(config.get("global_batch")) or _int(config.get("batch"))
    m = _int(config.get("microbatches"))
    mb = _int(config.get("micro_batch"))
    if m is None and mb is None and gb is not None and gb % dp == 0:
        m, mb = 1, gb // dp
    return {"resolved_dp": dp, "resolved_global_batch": gb, "resolved_micro_batch": mb,
            "resolved_microbatches": m}


def estimated_row(values: Mapping[str, Any]) -> Dict[str, Any]:
    """A row's metric and resolved columns from :func:`estimate`'s dict."""
    out = {m: None for m in METRICS}
    for m in METRICS:
        out[m] = bool(values[m]) if m == "oom" else _number(values.get(m))
    out.update(resolved_of(values))
    return out
