"""A simulated step as a Chrome Trace Event file, for Perfetto or chrome://tracing.

Layout (the JSON Object Format of the Trace Event spec):

* one *process* per device: ``pid = rank``, named by its ``DeviceInfo``
  name (``gpu3``) and sorted by rank;
* one *thread* per stream: ``tid`` 0 is ``compute``, 1 is ``comm``, any
  other stream gets 2, 3, ... in name order (under ``comm_streams:
  per-group`` the process groups' streams, ``comm-8x1`` ..., see
  :mod:`distsim.sim.comm_queues`, and no ``comm`` thread); so tids are
  stable across runs;
  a stream whose ops overlap (``p2p``, a queue per direction of each pair
  of ranks) is spread over extra threads ``p2p (2)``, ... with the next tids (:func:`_lanes`),
  as the slices of one thread must nest;
* one complete event (``ph: "X"``) per op, ``ts``/``dur`` in microseconds,
  ``cat`` the op's category, ``args`` its op type, flops, bytes and detail;
* a flow arrow (``ph: "s"`` / ``"f"``) from the sender's slice to the
  receiver's per send/recv with both ends shown (:func:`_flows`);
* one counter event (``ph: "C"``, name ``memory``) per memory sample, args
  ``{"live_bytes": ...}``, drawn by Perfetto as a step chart per device;
* with ``include_links``, a last process ``network`` with one utilisation
  counter per directed link that has samples.

Events are emitted in a fixed sorted order and timestamps are written
with three decimals (to the nanosecond; ``dur`` is the rounded end minus
the rounded start, so ops back to back stay so), so the same trace always
serialises to the same bytes.

**Size bound.** The file is written streaming: events are formatted
straight from the simulator's records into text, a chunk at a time, into a
temporary file that is renamed at the end (:mod:`distsim.fileio`); no list
of event dicts and no whole-document string is built. ``max_trace_records``
bounds the timed records written (op slices plus memory and link counter
samples; default :data:`DEFAULT_MAX_TRACE_RECORDS`, 0 = no limit). Past it
the trace is *summarised*: it keeps every record that starts before a
cutoff time chosen so that at most ``max_trace_records`` remain (the same
time window on every device), replaces the ops after the cutoff by one
``truncated`` slice per device stream (how many ops, their flops and bytes,
from the first dropped op's start to the last one's end), marks the cutoff
with a global instant event, and says so in ``otherData.trace_truncated``.
"""
from __future__ import annotations

import contextlib
import gzip
import io
import json
import math
from dataclasses import dataclass
from json.encoder import encode_basestring_ascii as _quote
from operator import itemgetter
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Tuple

import numpy as np

from distsim.run_options import DEFAULT_MAX_TRACE_RECORDS, check_max_trace_records  # noqa: F401
from distsim.ir.comm import SEND_RECV_OP
from distsim.fileio import PathLike, atomic_path
from distsim.report.jsonsafe import json_safe
from distsim.sim.trace import (COMM_STREAM, COMPUTE_STREAM, LinkSample, MemorySample,
                                OpRecord, Trace)

US = 1e6  #: microseconds per second (Chrome trace time unit)
FIXED_TIDS: Dict[str, int] = {COMPUTE_STREAM: 0, COMM_STREAM: 1}


TRUNCATED_CATEGORY = "truncated"  #: ``cat`` of the per-stream slices that summarise dropped ops
_CHUNK = 20_000  #: events per write


def _us(seconds: float) -> float:
    """Seconds to microseconds, rounded to the nanosecond (stable text, small files)."""
    return round(seconds * US, 3)


def _span(start_s: float, end_s: float) -> str:
    """``"ts":...,"dur":...`` of a slice from ``start_s`` to ``end_s`` (s):
    both ends rounded to the nanosecond and ``dur`` their difference, so a
    slice ends exactly where the next one on its stream starts (rounding
    ``ts`` and ``dur`` apart could push the end 1 ns past it: an overlap)."""
    ts = _us(start_s)
    return f'"ts":{ts:.3f},"dur":{_us(end_s) - ts:.3f}'


def _num(x: float) -> Any:
    """A finite float, or None (strict JSON has no NaN/Infinity)."""
    x = float(x)
    return x if math.isfinite(x) else None


def _fnum(x: Any) -> str:
    """``_num(x)`` as JSON text (what ``json.dumps`` writes for it)."""
    x = float(x)
    return repr(x) if math.isfinite(x) else "null"


def _str(x: Any) -> str:
    """A JSON string literal (``json.dumps`` of a str, ASCII-escaped)."""
    if isinstance(x, str):
        return _quote(x)
    return json.dumps(json_safe(x), separators=(",", ":"), allow_nan=False)


def stream_tids(trace: Trace) -> Dict[str, int]:
    """``stream -> tid``: compute 0, comm 1, other streams 2.. in name order."""
    columns = trace.op_columns   # the streams used, read without making the records
    used = {columns.streams[code] for code in np.unique(columns.stream).tolist()}
    extra = sorted(used - set(FIXED_TIDS))
    tids = dict(FIXED_TIDS)
    tids.update({s: len(FIXED_TIDS) + i for i, s in enumerate(extra)})
    return tids


@dataclass(frozen=True)
class TracePlan:
    """What trace.json will hold: ``records`` timed records in the trace,
    ``written`` of them in the file; ``cutoff_s`` is None when nothing is
    dropped, else records at or after it are summarised."""

    records: int
    written: int
    max_records: int
    cutoff_s: Optional[float]

    @property
    def truncated(self) -> bool:
        return self.cutoff_s is not None

    def to_dict(self) -> Dict[str, Any]:
        """The ``trace_file`` block of summary.json."""
        return {"truncated": self.truncated, "records": self.records,
                "records_written": self.written, "max_trace_records": self.max_records,
                "cutoff_s": self.cutoff_s}


# each sample's time, by position in its tuple (C-level getters: the
# trace of a 1024-GPU step has millions of records, most of them link samples)
_SAMPLE_TIME = itemgetter(MemorySample._fields.index("time_s"))
_LINK_TIME = itemgetter(LinkSample._fields.index("time_s"))
_SAMPLE_ORDER = itemgetter(0, 1)         # (rank, time_s)
_LINK_ORDER = itemgetter(0, 1, 2)        # (src, dst, time_s)


def _times(trace: Trace, include_links: bool) -> "np.ndarray":
    """Every timed record's start time (ops, memory and link samples)."""
    parts = [trace.op_columns.start_s, trace.memory_columns.time_s]
    if include_links:
        parts.append(np.fromiter(map(_LINK_TIME, trace.link_samples), float,
                                 len(trace.link_samples)))
    return np.concatenate(parts)


def plan_trace(trace: Trace, max_trace_records: Optional[int] = None,
               include_links: bool = True) -> TracePlan:
    """Decide what trace.json keeps under ``max_trace_records`` (None: the
    default, 0: no limit): everything, or the records before a cutoff time."""
    limit = check_max_trace_records(max_trace_records)
    links = len(trace.link_samples) if include_links else 0
    total = trace.num_ops + trace.num_memory_samples + links
    if limit == 0 or total <= limit:
        return TracePlan(total, total, limit, None)
    times = _times(trace, include_links)
    cutoff = float(np.partition(times, limit)[limit])  # the (limit+1)-th earliest start
    kept = int(np.count_nonzero(times < cutoff))        # <= limit (ties at the cutoff go)
    return TracePlan(total, kept, limit, cutoff)


def rank_ranges(ranks: List[int]) -> str:
    """``[0, 1, 2, 3, 8, 9]`` -> ``"gpu0-3, gpu8-9"``: consecutive runs."""
    runs: List[List[int]] = []
    for r in sorted(ranks):
        if runs and r == runs[-1][1] + 1:
            runs[-1][1] = r
        else:
            runs.append([r, r])
    return ", ".join(f"gpu{a}" if a == b else f"gpu{a}-{b}" for a, b in runs)


def _metadata(pid: int, name: str, sort_index: int, threads: List[Tuple[int, str]],
              stands_for: Optional[List[int]] = None) -> List[str]:
    """The metadata events of one device: its process name and order, a
    ``process_labels`` event naming the devices it stands for when the
    program was reduced by ``--symmetry``, and its threads."""
    events = [
        f'{{"ph":"M","pid":{pid},"tid":0,"name":"process_name","args":{{"name":{_str(name)}}}}}',
        f'{{"ph":"M","pid":{pid},"tid":0,"name":"process_sort_index",'
        f'"args":{{"sort_index":{sort_index}}}}}',
    ]
    if stands_for:
        label = f"stands for {len(stands_for)} devices: {rank_ranges(stands_for)}"
        events.append(f'{{"ph":"M","pid":{pid},"tid":0,"name":"process_labels",'
                      f'"args":{{"labels":{_str(label)}}}}}')
    for tid, tname in threads:
        events.append(f'{{"ph":"M","pid":{pid},"tid":{tid},"name":"thread_name",'
                      f'"args":{{"name":{_str(tname)}}}}}')
        events.append(f'{{"ph":"M","pid":{pid},"tid":{tid},"name":"thread_sort_index",'
                      f'"args":{{"sort_index":{tid}}}}}')
    return events


_RANK, _STREAM, _START, _END = (itemgetter(OpRecord._fields.index(f))
                                for f in ("rank", "stream", "start_s", "end_s"))


def _lanes(ops: List[OpRecord], tids: Dict[str, int]
           ) -> Tuple[List[int], Dict[int, List[Tuple[int, str]]]]:
    """The thread each of ``ops`` (sorted by rank, stream tid, start) is
    shown on, and each rank's extra threads ``(tid, name)``.

    The Trace Event format needs the slices of one thread to nest; a stream
    whose ops overlap (``p2p``: a queue per direction of each pair of
    ranks, several on one device) would draw wrongly. Each op goes on the first *lane* of its
    stream that is free at its start (the ends compared as written, to the
    nanosecond): lane 0 is the stream's own thread, lane k > 0 a thread
    named ``<stream> (k+1)`` with the next tid after every stream's. An op
    of no duration (``pack``) overlaps nothing: it stays on lane 0, drawn
    inside whatever runs there at that instant. Found with numpy; only the
    streams with an overlap are walked op by op."""
    n = len(ops)
    tid = np.fromiter(map(tids.__getitem__, map(_STREAM, ops)), np.int64, n)
    rank = np.fromiter(map(_RANK, ops), np.int64, n)
    start = np.round(np.fromiter(map(_START, ops), float, n) * US, 3)
    end = np.round(np.fromiter(map(_END, ops), float, n) * US, 3)
    # the timed ops of a stream, in start order, overlap iff one starts
    # before the one before it ends
    timed = np.flatnonzero(end != start)
    r, t = rank[timed], tid[timed]
    clash = (r[1:] == r[:-1]) & (t[1:] == t[:-1]) & (start[timed[1:]] < end[timed[:-1]])
    extra: Dict[int, List[Tuple[int, str]]] = {}
    if not clash.any():
        return tid.tolist(), extra
    width = int(tid.max()) + 1
    key = rank * width + tid
    walked = np.flatnonzero(np.isin(key, np.unique(key[timed[1:][clash]])))
    streams = {v: k for k, v in tids.items()}
    first_free = next_tid = max(tids.values()) + 1
    group = ends = lane_tids = None
    for i, k, s, e in zip(walked.tolist(), key[walked].tolist(), start[walked].tolist(),
                          end[walked].tolist()):
        if k != group:
            if group is None or k // width != group // width:
                next_tid = first_free
            group, ends, lane_tids = k, [], [k % width]
        for lane, free_at in enumerate(ends):
            if free_at <= s or e == s:
                break
        else:
            lane = len(ends)
            ends.append(e)
            if lane:
                lane_tids.append(next_tid)
                extra.setdefault(k // width, []).append(
                    (next_tid, f"{streams[k % width]} ({lane + 1})"))
                next_tid += 1
        ends[lane] = max(ends[lane], e)
        tid[i] = lane_tids[lane]
    return tid.tolist(), extra


def _events(trace: Trace, include_links: bool, plan: TracePlan) -> Iterator[str]:
    """Every event of the document as compact JSON text, in the fixed order."""
    tids = stream_tids(trace)
    names = {d.rank: d.name for d in trace.devices}
    ranks = sorted(set(names) | {op.rank for op in trace.ops}
                   | set(trace.memory_columns.rank.tolist()))
    ops = sorted(trace.ops, key=lambda o: (o.rank, tids[o.stream], o.start_s, -o.end_s, o.name))
    shown_tids, extra_threads = _lanes(ops, tids)
    # every device shows its compute and comm threads, but no empty comm
    # thread where collectives run on a stream per group (comm-8x1, ...)
    per_group = any(s.startswith(COMM_STREAM + "-") for s in tids)
    always = {COMPUTE_STREAM} if per_group else {COMPUTE_STREAM, COMM_STREAM}
    streams_of: Dict[int, set] = {r: set(always) for r in ranks}
    for op in trace.ops:
        streams_of[op.rank].add(op.stream)
    stands_for = trace.meta.get("represented_ranks") or {}
    for rank in ranks:
        threads = sorted((tids[s], s) for s in streams_of[rank]) + extra_threads.get(rank, [])
        yield from _metadata(rank, names.get(rank, f"gpu{rank}"), rank, threads,
                             stands_for.get(rank))

    cutoff = plan.cutoff_s
    # (rank, tid) -> [ops dropped, first start, last end, flops, bytes]
    dropped: Dict[Tuple[int, int], List[float]] = {}
    quoted: Dict[Any, str] = {}   # category / op type / detail -> JSON text (few distinct)
    numbers: Dict[Any, str] = {}  # flops / bytes -> JSON text (repeat across layers)
    shown = zip(ops, shown_tids)
    if extra_threads:   # events by (pid, tid, ts) also where a stream has extra lanes
        shown = sorted(shown, key=lambda o: (o[0][0], o[1], o[0][5], -o[0][6], o[0][2]))
    for (rank, stream, name, op_type, category, start, end, flops, nbytes, detail), tid in shown:
        if cutoff is not None and start >= cutoff:
            d = dropped.get((rank, tid))
            if d is None:
                dropped[(rank, tid)] = [1, start, end, _num(flops) or 0.0, _num(nbytes) or 0.0]
            else:
                d[0] += 1
                d[2] = max(d[2], end)
                d[3] += _num(flops) or 0.0
                d[4] += _num(nbytes) or 0.0
            continue
        cat = quoted.get(category)
        if cat is None:
            cat = quoted[category] = _str(category)
        typ = quoted.get(op_type)
        if typ is None:
            typ = quoted[op_type] = _str(op_type)
        det = quoted.get(detail)
        if det is None:
            det = quoted[detail] = _str(detail)
        fl = numbers.get(flops)
        if fl is None:
            fl = numbers[flops] = _fnum(flops)
        nb = numbers.get(nbytes)
        if nb is None:
            nb = numbers[nbytes] = _fnum(nbytes)
        if "+" in op_type:
            # a fused kernel (its op type names its parts, scale+mask+softmax;
            # no single op type has a '+'): the slice is named so
            name = op_type
        yield (f'{{"ph":"X","pid":{rank},"tid":{tid},'
               f'"name":{_quote(name) if name.__class__ is str else _str(name)},"cat":{cat},'
               f'{_span(start, end)},'
               f'"args":{{"op_type":{typ},"flops":{fl},"bytes":{nb},"detail":{det}}}}}')
    for (rank, tid), (n, first, last, flops, nbytes) in sorted(dropped.items()):
        yield (f'{{"ph":"X","pid":{rank},"tid":{tid},'
               f'"name":"{int(n)} ops not shown (trace truncated)","cat":"{TRUNCATED_CATEGORY}",'
               f'{_span(first, last)},'
               f'"args":{{"ops":{int(n)},"flops":{_fnum(flops)},"bytes":{_fnum(nbytes)}}}}}')

    yield from _flows(ops, shown_tids, cutoff)

    for rank, time_s, live in sorted(_before(trace.memory, _SAMPLE_TIME, cutoff),
                                     key=_SAMPLE_ORDER):
        yield (f'{{"ph":"C","pid":{rank},"tid":0,"name":"memory","ts":{time_s * US:.3f},'
               f'"args":{{"live_bytes":{int(live)}}}}}')

    pid = (ranks[-1] + 1) if ranks else 0
    if include_links and trace.link_samples:
        yield from _metadata(pid, "network", pid, [])
        link_names: Dict[Tuple[str, str], str] = {}
        for src, dst, time_s, util in sorted(_before(trace.link_samples, _LINK_TIME, cutoff),
                                             key=_LINK_ORDER):
            name = link_names.get((src, dst))
            if name is None:
                name = link_names[(src, dst)] = _str(f"link {src}->{dst}")
            yield (f'{{"ph":"C","pid":{pid},"tid":0,"name":{name},'
                   f'"ts":{time_s * US:.3f},"args":{{"utilisation":{_fnum(util)}}}}}')
    if plan.truncated:
        yield (f'{{"ph":"i","s":"g","pid":0,"tid":0,"name":{_str(_note(plan))},'
               f'"cat":"{TRUNCATED_CATEGORY}","ts":{cutoff * US:.3f},'
               f'"args":{_other_json(plan.to_dict())}}}')


def _flows(ops: List[OpRecord], tids: List[int], cutoff: Optional[float]) -> Iterator[str]:
    """A flow arrow (``ph`` ``s`` on the sender's slice, ``f`` on the
    receiver's) per send/recv whose two ends are shown: the pipeline's
    hand-offs from stage to stage, drawn by Perfetto between the devices.
    The two records of a send/recv share its name; the sender's carries the
    bytes sent, the receiver's none. Skipped: a send/recv with one end in
    the trace (the other device not simulated, or past a truncation) or of
    no bytes (no direction to draw). In sender order (rank, thread, start)."""
    ends: Dict[str, List[Tuple[int, int, float, float]]] = {}
    for op, tid in zip(ops, tids):
        if op.op_type == SEND_RECV_OP and (cutoff is None or op.start_s < cutoff):
            ends.setdefault(op.name, []).append((op.rank, tid, op.start_s, op.bytes))
    pairs = []
    for name, pair in ends.items():
        if len(pair) == 2:
            senders = [e for e in pair if e[3] > 0]
            if len(senders) == 1:
                src = senders[0]
                dst = pair[1] if pair[0] is src else pair[0]
                pairs.append((src[:3], dst[:3], name))
    for i, ((srank, stid, sstart), (drank, dtid, dstart), name) in enumerate(sorted(pairs)):
        label = _quote(name)
        yield (f'{{"ph":"s","id":{i},"pid":{srank},"tid":{stid},"name":{label},"cat":"p2p",'
               f'"ts":{_us(sstart):.3f}}}')
        yield (f'{{"ph":"f","bp":"e","id":{i},"pid":{drank},"tid":{dtid},"name":{label},'
               f'"cat":"p2p","ts":{_us(dstart):.3f}}}')


def _before(records: List[Any], time_of: Callable[[Any], float],
            cutoff: Optional[float]) -> List[Any]:
    """The records that start before ``cutoff`` (all of them when None),
    filtered before sorting: past the cutoff there may be millions."""
    if cutoff is None:
        return records
    return [r for r in records if time_of(r) < cutoff]


def _note(plan: TracePlan) -> str:
    return (f"trace truncated: {plan.written} of {plan.records} records shown, those before "
            f"{_us(plan.cutoff_s or 0.0)} us (max_trace_records {plan.max_records})")


def _other_json(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"), allow_nan=False)


def _chunks(trace: Trace, include_links: bool, plan: TracePlan) -> Iterator[str]:
    """The document's text in pieces of about :data:`_CHUNK` events."""
    yield '{"traceEvents":['
    batch: List[str] = []
    first = True
    for event in _events(trace, include_links, plan):
        batch.append(event)
        if len(batch) >= _CHUNK:
            yield ("" if first else ",") + ",".join(batch)
            first = False
            batch = []
    if batch:
        yield ("" if first else ",") + ",".join(batch)
    other: Dict[str, Any] = {"step_time_s": _num(trace.step_time_s),
                             "meta": json_safe(dict(trace.meta))}
    if plan.truncated:
        other["trace_truncated"] = plan.to_dict()
    yield '],"displayTimeUnit":"ms","otherData":' + _other_json(other) + "}\n"


def chrome_trace_chunks(trace: Trace, include_links: bool = True,
                        max_trace_records: Optional[int] = 0) -> Iterator[str]:
    """The trace document as compact JSON text, in pieces (0: no limit)."""
    return _chunks(trace, include_links, plan_trace(trace, max_trace_records, include_links))


def chrome_trace_json(trace: Trace, include_links: bool = True,
                      max_trace_records: Optional[int] = 0) -> str:
    """The trace document as compact, deterministic JSON text (0: no limit)."""
    return "".join(chrome_trace_chunks(trace, include_links, max_trace_records))


def chrome_trace(trace: Trace, include_links: bool = True,
                 max_trace_records: Optional[int] = 0) -> Dict[str, Any]:
    """The Chrome Trace Event document of ``trace`` (a JSON-ready dict; 0: no limit)."""
    return json.loads(chrome_trace_json(trace, include_links, max_trace_records))


def write_chrome_trace(trace: Trace, path: PathLike, include_links: bool = True,
                       max_trace_records: Optional[int] = None,
                       plan: Optional[TracePlan] = None) -> TracePlan:
    """Write the trace to ``path`` atomically and streaming, summarised past
    ``max_trace_records`` (None: :data:`DEFAULT_MAX_TRACE_RECORDS`, 0: no
    limit); gzip-compressed when it ends in ``.gz`` (Perfetto opens
    ``trace.json.gz`` directly). Returns what was written."""
    if plan is None:
        plan = plan_trace(trace, max_trace_records, include_links)
    chunks = _chunks(trace, include_links, plan)
    with atomic_path(path) as tmp:
        with contextlib.ExitStack() as stack:
            raw = stack.enter_context(open(tmp, "wb"))
            if str(path).endswith(".gz"):
                sink: io.BufferedIOBase = stack.enter_context(
                    gzip.GzipFile(filename="", fileobj=raw, mode="wb", mtime=0))
            else:
                sink = raw
            for chunk in chunks:
                sink.write(chunk.encode("ascii"))
    return plan


def iter_event_texts(trace: Trace, include_links: bool = True) -> Iterable[str]:
    """Each event's JSON text, untruncated (for tests and tools)."""
    return _events(trace, include_links, plan_trace(trace, 0, include_links))
