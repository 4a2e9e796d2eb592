"""Where the time and the memory of one simulated step went, as plain data.

:func:`summarize` reduces a :class:`~distsim.sim.trace.Trace` to a
JSON-ready dict (what ``summary.json`` holds, field by field documented in
``docs/outputs.md``); :func:`format_summary_table` renders it for a terminal
and :func:`summary_dataframe` for pandas. All three are pure functions of
their input, so the same trace always gives the same text.

Time accounting per device (all in seconds, over ``[0, step_time_s]``):

* ``compute_s``: length of the union of the device's compute-category ops;
* ``communication_s``: length of the union of its communication ops;
* ``exposed_communication_s``: communication time during which no compute
  op of that device runs (what overlap failed to hide);
* ``idle_s``: ``step_time_s`` minus the union of all its ops.

So ``compute_s + exposed_communication_s + idle_s == step_time_s``.
The figures are computed from the trace's op columns
(:class:`~distsim.sim.trace.OpColumns`), grouped by device with one sort,
without making a record tuple per op; each device's sums run over its ops
in the trace's record order, so the floats are those of a loop over
``trace.ops``.
Top-level ``compute_s`` / ``communication_s`` / ``exposed_communication_s``
/ ``idle_s`` are **means over devices** (every device runs the same step,
so the mean is the fleet-wide share of the step; the worst device is
reported beside it as ``max_exposed_communication_s`` / ``min_idle_s``).
"""
from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any, Dict, List, Sequence, Tuple

import numpy as np

from distsim.fileio import PathLike, write_text_atomic
from distsim.intervals import union_length_of
from distsim.report.jsonsafe import json_safe
from distsim.sim.trace import OpColumns, Trace

if TYPE_CHECKING:     # pandas is imported by summary_dataframe (``import distsim`` stays fast)
    import pandas as pd

COMPUTE = "compute"
COMMUNICATION = "communication"

GB = 1e9  #: bytes per GB in tables and plots (decimal, like vendor datasheets)
MS = 1e3  #: milliseconds per second

#: Per-device fields, in the order of the DataFrame columns.
DEVICE_FIELDS: Tuple[str, ...] = (
    "rank", "name", "peak_memory_bytes", "capacity_bytes", "oom",
    "compute_s", "communication_s", "exposed_communication_s", "idle_s",
    "flops", "communication_bytes", "num_ops",
)


def step_time_of(trace: Trace) -> float:
    """The step time: ``trace.step_time_s``, or the last op end when that is unset (0)."""
    if trace.step_time_s > 0:
        return float(trace.step_time_s)
    return max((op.end_s for op in trace.ops), default=0.0)


def _device_summary(rank: int, name: str, capacity: int, columns: OpColumns,
                    kinds: Tuple[np.ndarray, np.ndarray], positions: np.ndarray, peak: int,
                    step_time_s: float) -> Dict[str, Any]:
    """The figures of one device, whose records are ``columns`` at
    ``positions`` (in record order); ``kinds``: which records of
    ``columns`` are compute, which communication."""
    n = len(positions)
    starts = columns.start_s[positions]
    ends = columns.end_s[positions]
    is_compute = kinds[0][positions]
    is_comm = kinds[1][positions]
    compute_s = union_length_of(starts[is_compute], ends[is_compute])
    # communication not hidden behind compute: |comm u compute| - |compute|
    both = is_compute | is_comm
    exposed = union_length_of(starts[both], ends[both]) - compute_s
    busy = union_length_of(starts, ends)
    flops = columns.flops[positions]
    sent = columns.bytes[positions]
    return {
        "rank": rank,
        "name": name,
        "peak_memory_bytes": int(peak),
        "capacity_bytes": int(capacity),
        "oom": bool(peak > capacity),
        "compute_s": float(compute_s),
        "communication_s": float(union_length_of(starts[is_comm], ends[is_comm])),
        "exposed_communication_s": float(max(0.0, exposed)),
        "idle_s": float(max(0.0, step_time_s - busy)),
        "flops": float(flops.sum()),
        "communication_bytes": float(sent[is_comm].sum()),
        "num_ops": n,
    }


def _is(codes: np.ndarray, names: Sequence[Any], name: str) -> np.ndarray:
    """Which of ``codes`` (indices into ``names``) stand for ``name``."""
    return np.isin(codes, [c for c, x in enumerate(names) if x == name])


def _by_device(columns: OpColumns, ranks: Sequence[int]) -> Dict[int, np.ndarray]:
    """Each of ``ranks`` -> the positions of its records in ``columns``, in
    record order (one sort for all devices)."""
    order = columns.rank_order()
    sorted_ranks = columns.rank[order]
    wanted = np.asarray(ranks, dtype=np.int64)
    lo = np.searchsorted(sorted_ranks, wanted, side="left").tolist()
    hi = np.searchsorted(sorted_ranks, wanted, side="right").tolist()
    return {r: order[a:b] for r, a, b in zip(ranks, lo, hi)}


def _mean(devices: List[Dict[str, Any]], key: str) -> float:
    """Mean over the devices, each weighted by how many it represents."""
    total = sum(d.get("represents", 1) for d in devices)
    return sum(d[key] * d.get("represents", 1) for d in devices) / total if total else 0.0


def _oom_ranks(devices: List[Dict[str, Any]], represented: Dict[Any, Any]) -> List[int]:
    """Every rank over its capacity: in a reduced program a simulated device
    that runs out of memory stands for the devices it represents
    (``represented``: rank -> ranks; JSON may have made the keys strings)."""
    stands_for = {int(r): ranks for r, ranks in represented.items()}
    return sorted({int(m) for d in devices if d["oom"]
                   for m in stands_for.get(d["rank"], [d["rank"]])})


def summarize(trace: Trace) -> Dict[str, Any]:
    """A JSON-ready summary of ``trace`` (see the module docstring and docs/outputs.md)."""
    step = step_time_of(trace)
    peaks = trace.peak_memory()
    columns = trace.op_columns
    kinds = (_is(columns.category, columns.categories, COMPUTE),
             _is(columns.category, columns.categories, COMMUNICATION))
    by_rank = _by_device(columns, [d.rank for d in trace.devices])
    devices = [
        _device_summary(d.rank, d.name, d.capacity_bytes, columns, kinds, by_rank[d.rank],
                        peaks.get(d.rank, 0), step)
        for d in sorted(trace.devices, key=lambda d: d.rank)
    ]
    # A reduced program simulates one device per class (trace.meta["represents"]).
    represents = {int(r): int(n) for r, n in (trace.meta.get("represents") or {}).items()}
    if represents:
        for d in devices:
            d["represents"] = represents.get(d["rank"], 1)
    peak_dev = max(devices, key=lambda d: (d["peak_memory_bytes"], -d["rank"]), default=None)
    return {
        "step_time_s": step,
        "num_devices": sum(d.get("represents", 1) for d in devices),
        "compute_s": _mean(devices, "compute_s"),
        "communication_s": _mean(devices, "communication_s"),
        "exposed_communication_s": _mean(devices, "exposed_communication_s"),
        "idle_s": _mean(devices, "idle_s"),
        "max_exposed_communication_s": max((d["exposed_communication_s"] for d in devices),
                                           default=0.0),
        "min_idle_s": min((d["idle_s"] for d in devices), default=0.0),
        "max_peak_memory_bytes": peak_dev["peak_memory_bytes"] if peak_dev else 0,
        "max_peak_memory_rank": peak_dev["rank"] if peak_dev else None,
        "oom": any(d["oom"] for d in devices),
        "oom_ranks": _oom_ranks(devices, trace.meta.get("represented_ranks") or {}),
        # each simulated device stands for d["represents"] (1 without reduction)
        "total_flops": float(sum(d["flops"] * d.get("represents", 1) for d in devices)),
        "devices": devices,
        "links": link_summary(trace),
        "meta": json_safe(dict(trace.meta)),
    }


#: how many links summary.json lists (and links.png draws)
TOP_LINKS = 16


def ranked_links(links: Sequence[Any]) -> List[Any]:
    """Link records busiest first: by busy time, then bytes carried, then name."""
    return sorted(links, key=lambda k: (-k.busy_s, -k.bytes_carried, k.src, k.dst))


def link_summary(trace: Trace, top: int = TOP_LINKS) -> List[Dict[str, Any]]:
    """The ``top`` busiest directed links: bytes carried, busy time, peak
    concurrent flows, and utilisation = bytes / (bandwidth x step time)."""
    step = step_time_of(trace)
    ranked = ranked_links(trace.links)
    return [{"src": k.src, "dst": k.dst, "bandwidth_Bps": k.bandwidth_Bps,
             "bytes_carried": k.bytes_carried, "busy_s": k.busy_s, "peak_flows": k.peak_flows,
             "utilisation": k.bytes_carried / (k.bandwidth_Bps * step) if step > 0 else 0.0}
            for k in ranked[:top]]


def summary_dataframe(summary: Dict[str, Any]) -> pd.DataFrame:
    """One row per device (columns :data:`DEVICE_FIELDS`), indexed by rank.

    The scalar top-level fields (step time, means, ...) are kept in
    ``df.attrs`` so that nothing of the summary is lost.
    """
    import pandas as pd
    df = pd.DataFrame([{k: d.get(k) for k in DEVICE_FIELDS} for d in summary["devices"]],
                      columns=list(DEVICE_FIELDS))
    df = df.set_index("rank", drop=False)
    df.index.name = None
    df.attrs.update({k: v for k, v in summary.items() if k not in ("devices", "meta")})
    return df


def _pct(part: float, whole: float) -> str:
    return f"{100.0 * part / whole:.1f}%" if whole > 0 else "-"


def _row_cells(d: Dict[str, Any], step: float) -> Tuple[str, ...]:
    return (
        f"{d['peak_memory_bytes'] / GB:.2f}",
        f"{d['capacity_bytes'] / GB:.2f}",
        f"{d['compute_s'] * MS:.3f}", _pct(d["compute_s"], step),
        f"{d['communication_s'] * MS:.3f}", _pct(d["communication_s"], step),
        f"{d['exposed_communication_s'] * MS:.3f}", _pct(d["exposed_communication_s"], step),
        f"{d['idle_s'] * MS:.3f}", _pct(d["idle_s"], step),
        "OOM" if d["oom"] else "",
    )


def rank_ranges(ranks: Sequence[int]) -> str:
    """``[0, 1, 2, 3, 8]`` -> ``"0-3,8"``: a short text for a set of ranks."""
    parts: List[str] = []
    start = prev = None
    for r in sorted(ranks):
        if prev is not None and r == prev + 1:
            prev = r
            continue
        if start is not None:
            parts.append(str(start) if start == prev else f"{start}-{prev}")
        start = prev = r
    if start is not None:
        parts.append(str(start) if start == prev else f"{start}-{prev}")
    return ",".join(parts)


_NAME_RE = re.compile(r"^(.*?)(\d+)$")


def group_label(names: Sequence[str], ranks: Sequence[int]) -> str:
    """A label for consecutive devices: ``gpu0-7`` when the names are
    ``<prefix><rank>``, else ``first..last``; a single device keeps its name."""
    if len(names) == 1:
        return names[0]
    matches = [_NAME_RE.match(n) for n in names]
    if all(matches) and len({m.group(1) for m in matches}) == 1 \
            and [int(m.group(2)) for m in matches] == list(ranks):
        return f"{matches[0].group(1)}{ranks[0]}-{ranks[-1]}"
    return f"{names[0]}..{names[-1]}"


def device_groups(summary: Dict[str, Any]) -> List[Tuple[str, List[int], Dict[str, Any]]]:
    """Consecutive ranks whose table cells are all equal, as ``(label,
    ranks, first device's entry)``: the rows of the summary table."""
    step = summary["step_time_s"]
    groups: List[Tuple[List[str], List[int], Tuple[str, ...], Dict[str, Any]]] = []
    for d in summary["devices"]:
        cells = _row_cells(d, step)
        if groups and groups[-1][2] == cells and groups[-1][1][-1] == d["rank"] - 1:
            groups[-1][0].append(d["name"])
            groups[-1][1].append(d["rank"])
        else:
            groups.append(([d["name"]], [d["rank"]], cells, d))
    return [(group_label(names, ranks), ranks, d) for names, ranks, _, d in groups]


_HEADER = ("device", "peak GB", "cap GB", "compute ms", "%", "comm ms", "%",
           "exposed ms", "%", "idle ms", "%", "")


def format_summary_table(summary: Dict[str, Any], max_rows: int = 64) -> str:
    """A plain-text table of ``summary``.

    Consecutive ranks whose displayed cells are all equal share one row
    labelled ``gpu0-7``; past ``max_rows`` rows the middle is elided.
    """
    step = summary["step_time_s"]
    rows = [(label,) + _row_cells(d, step) for label, _, d in device_groups(summary)]
    elided = 0
    if len(rows) > max_rows:
        head = max_rows // 2
        elided = len(rows) - max_rows
        gap = ("...",) + ("",) * (len(_HEADER) - 1)
        rows = rows[:head] + [gap] + rows[len(rows) - (max_rows - head):]
    table = [_HEADER] + rows
    widths = [max(len(r[i]) for r in table) for i in range(len(_HEADER))]

    def fmt(r: Tuple[str, ...]) -> str:
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                         for i, (c, w) in enumerate(zip(r, widths))).rstrip()

    lines = [
        f"step time: {step * MS:.3f} ms   devices: {summary['num_devices']}   "
        f"max peak memory: {summary['max_peak_memory_bytes'] / GB:.2f} GB"
        + ("   OOM on ranks " + rank_ranges(summary["oom_ranks"]) if summary["oom"] else ""),
        f"mean per device: compute {summary['compute_s'] * MS:.3f} ms "
        f"({_pct(summary['compute_s'], step)}), "
        f"communication {summary['communication_s'] * MS:.3f} ms "
        f"({_pct(summary['communication_s'], step)}), "
        f"exposed {summary['exposed_communication_s'] * MS:.3f} ms "
        f"({_pct(summary['exposed_communication_s'], step)}), "
        f"idle {summary['idle_s'] * MS:.3f} ms ({_pct(summary['idle_s'], step)})",
        "",
        fmt(table[0]),
        fmt(tuple("-" * w for w in widths)),
    ]
    lines += [fmt(r) for r in table[1:]]
    if elided:
        lines.append(f"({elided} rows elided)")
    return "\n".join(lines)


def summary_json(summary: Dict[str, Any]) -> str:
    """The text of ``summary.json`` (and of ``distsim simulate --json``):
    strict JSON in the summary's own field order, a non-finite number (a
    NaN that reached the run's config) written as ``null`` and any other
    value that JSON has no type for as its text, so that writing a summary
    never fails after the simulation has run."""
    return json.dumps(json_safe(summary, sort_keys=False), indent=2, allow_nan=False) + "\n"


def write_summary(trace_or_summary: "Trace | Dict[str, Any]", path: PathLike) -> Dict[str, Any]:
    """Write ``summary.json`` atomically (strict JSON, no NaN: see
    :func:`summary_json`) and return the summary.

    Accepts a trace (summarised first) or an already built summary dict.
    """
    summary = trace_or_summary if isinstance(trace_or_summary, dict) else \
        summarize(trace_or_summary)
    write_text_atomic(path, summary_json(summary))
    return summary
