"""A simulated step as a Chrome Trace Event file, for Perfetto or chrome://tracing.

Layout (the JSON Object Format of the Trace Event spec):

* one *process* per device: ``pid = rank``, named by its ``DeviceInfo``
  name (``gpu3``) and sorted by rank;
* one *thread* per stream: ``tid`` 0 is ``compute``, 1 is ``comm``, any
  other stream gets 2, 3, ... in name order; so tids are stable across runs;
* one complete event (``ph: "X"``) per op, ``ts``/``dur`` in microseconds,
  ``cat`` the op's category, ``args`` its op type, flops, bytes and detail;
* one counter event (``ph: "C"``, name ``memory``) per memory sample, args
  ``{"live_bytes": ...}``, drawn by Perfetto as a step chart per device;
* with ``include_links``, a last process ``network`` with one utilisation
  counter per directed link that has samples.

Events are emitted in a fixed sorted order and timestamps are rounded to
the nanosecond, so the same trace always serialises to the same bytes.
"""
from __future__ import annotations

import contextlib
import gc
import gzip
import json
import math
from typing import Any, Dict, Iterator, List, Tuple

from distsim.fileio import PathLike, atomic_path
from distsim.report.jsonsafe import json_safe
from distsim.sim.trace import COMM_STREAM, COMPUTE_STREAM, Trace

US = 1e6  #: microseconds per second (Chrome trace time unit)
FIXED_TIDS: Dict[str, int] = {COMPUTE_STREAM: 0, COMM_STREAM: 1}


def _us(seconds: float) -> float:
    """Seconds to microseconds, rounded to the nanosecond (stable text, small files)."""
    return round(seconds * US, 3)


def _num(x: float) -> Any:
    """A finite float, or None (strict JSON has no NaN/Infinity)."""
    x = float(x)
    return x if math.isfinite(x) else None


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while building millions of small
    dicts (none of them cyclic): it halves the build time. Restored after."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def stream_tids(trace: Trace) -> Dict[str, int]:
    """``stream -> tid``: compute 0, comm 1, other streams 2.. in name order."""
    extra = sorted({op.stream for op in trace.ops} - set(FIXED_TIDS))
    tids = dict(FIXED_TIDS)
    tids.update({s: len(FIXED_TIDS) + i for i, s in enumerate(extra)})
    return tids


def _metadata(pid: int, name: str, sort_index: int, threads: List[Tuple[int, str]]) -> List[Dict[str, Any]]:
    events: List[Dict[str, Any]] = [
        {"ph": "M", "pid": pid, "tid": 0, "name": "process_name", "args": {"name": name}},
        {"ph": "M", "pid": pid, "tid": 0, "name": "process_sort_index", "args": {"sort_index": sort_index}},
    ]
    for tid, tname in threads:
        events.append({"ph": "M", "pid": pid, "tid": tid, "name": "thread_name", "args": {"name": tname}})
        events.append({"ph": "M", "pid": pid, "tid": tid, "name": "thread_sort_index",
                       "args": {"sort_index": tid}})
    return events


def chrome_trace(trace: Trace, include_links: bool = True) -> Dict[str, Any]:
    """The Chrome Trace Event document of ``trace`` (a JSON-ready dict)."""
    with _gc_paused():
        return _build(trace, include_links)


def _build(trace: Trace, include_links: bool) -> Dict[str, Any]:
    tids = stream_tids(trace)
    names = {d.rank: d.name for d in trace.devices}
    ranks = sorted(set(names) | {op.rank for op in trace.ops} | {s.rank for s in trace.memory})
    streams_of: Dict[int, set] = {r: {COMPUTE_STREAM, COMM_STREAM} for r in ranks}
    for op in trace.ops:
        streams_of[op.rank].add(op.stream)

    events: List[Dict[str, Any]] = []
    for rank in ranks:
        threads = sorted((tids[s], s) for s in streams_of[rank])
        events += _metadata(rank, names.get(rank, f"gpu{rank}"), rank, threads)

    ops = sorted(trace.ops, key=lambda o: (o.rank, tids[o.stream], o.start_s, -o.end_s, o.name))
    for op in ops:
        events.append({
            "ph": "X", "pid": op.rank, "tid": tids[op.stream], "name": op.name, "cat": op.category,
            "ts": _us(op.start_s), "dur": _us(op.end_s - op.start_s),
            "args": {"op_type": op.op_type, "flops": _num(op.flops), "bytes": _num(op.bytes),
                     "detail": op.detail},
        })
    for s in sorted(trace.memory, key=lambda s: (s.rank, s.time_s)):
        events.append({"ph": "C", "pid": s.rank, "tid": 0, "name": "memory", "ts": _us(s.time_s),
                       "args": {"live_bytes": int(s.live_bytes)}})

    if include_links and trace.link_samples:
        pid = (ranks[-1] + 1) if ranks else 0
        events += _metadata(pid, "network", pid, [])
        for s in sorted(trace.link_samples, key=lambda s: (s.src, s.dst, s.time_s)):
            events.append({"ph": "C", "pid": pid, "tid": 0, "name": f"link {s.src}->{s.dst}",
                           "ts": _us(s.time_s), "args": {"utilisation": _num(s.utilisation)}})

    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"step_time_s": _num(trace.step_time_s), "meta": json_safe(dict(trace.meta))},
    }


def chrome_trace_json(trace: Trace, include_links: bool = True) -> str:
    """The trace document as compact, deterministic JSON text."""
    doc = chrome_trace(trace, include_links)  # dicts built in a fixed key order
    with _gc_paused():
        return json.dumps(doc, separators=(",", ":"), allow_nan=False) + "\n"


def write_chrome_trace(trace: Trace, path: PathLike, include_links: bool = True) -> None:
    """Write the trace to ``path`` atomically; gzip-compressed when it ends in ``.gz``
    (Perfetto opens ``trace.json.gz`` directly)."""
    data = chrome_trace_json(trace, include_links).encode("utf-8")
    with atomic_path(path) as tmp:
        if str(path).endswith(".gz"):
            with open(tmp, "wb") as raw, gzip.GzipFile(filename="", fileobj=raw, mode="wb", mtime=0) as gz:
                gz.write(data)
        else:
            tmp.write_bytes(data)
