"""The simulator's output: plain records, no formatting.

Records are NamedTuples (cheap to create by the million, easy to turn into
DataFrames); formatting (Chrome trace, plots, tables) lives in
:mod:`distsim.report`.

Op records are kept as columns (:class:`OpColumns`: one numpy array per
numeric field, the names, op types and details behind a label number) and
made into :class:`OpRecord` tuples only when ``Trace.ops`` is first read: a
large run has hundreds of thousands of records, and the summary, the usual
thing asked of a run, needs none of them as tuples, so the trace stays
cheap. The memory curve likewise (:class:`MemoryColumns`, made into
:class:`MemorySample` tuples when ``Trace.memory`` is first read).
"""
from __future__ import annotations

from itertools import repeat
from operator import itemgetter
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from ..ir.core import gc_paused

COMPUTE_STREAM = "compute"
COMM_STREAM = "comm"
#: point-to-point transfers (SendRecv): each direction of a pair of ranks
#: has a queue of its own, apart from the collectives' (see .comm_queues)
P2P_STREAM = "p2p"


class OpRecord(NamedTuple):
    """One op executed on one device stream, from ``start_s`` to ``end_s``.

    ``category`` is ``"compute"`` or ``"communication"``; ``flops`` the
    arithmetic done; ``bytes`` the memory traffic of a compute op or the
    bytes this device put on the network for a communication op (its own
    for a send/recv, gather or scatter; the team's average for the other
    kinds: see :func:`distsim.sim.collectives.bytes_sent_by`); ``detail`` free text
    (e.g. the collective algorithm).
    """

    rank: int
    stream: str
    name: str
    op_type: str
    category: str
    start_s: float
    end_s: float
    flops: float = 0.0
    bytes: float = 0.0
    detail: str = ""


class MemorySample(NamedTuple):
    """Live bytes on device ``rank`` from ``time_s`` on."""

    rank: int
    time_s: float
    live_bytes: int


class LinkRecord(NamedTuple):
    """Totals for one directed link ``src -> dst`` of the topology graph."""

    src: str
    dst: str
    bandwidth_Bps: float
    bytes_carried: float
    busy_s: float
    peak_flows: int


class LinkSample(NamedTuple):
    """Utilisation (0..1) of a directed link from ``time_s`` on."""

    src: str
    dst: str
    time_s: float
    utilisation: float


class DeviceInfo(NamedTuple):
    rank: int
    name: str
    capacity_bytes: int


Labels = Tuple[List[Any], List[Any], List[Any]]


class OpLabels:
    """Label number -> the (name, op type, detail) of op records.

    Given as three lists, or as a function that makes them, called once on
    first use: the simulator passes one that reads its Op objects, so the
    strings of a large run are read only if its records are made. A pickled
    OpLabels carries the lists, not the function."""

    __slots__ = ("_lists", "_resolve")

    def __init__(self, names: Optional[List[Any]] = None, op_types: Optional[List[Any]] = None,
                 details: Optional[List[Any]] = None,
                 resolve: Optional[Callable[[], Labels]] = None) -> None:
        if (resolve is None) == (names is None):
            raise ValueError("OpLabels: give the three lists or a resolve function")
        self._lists: Optional[Labels] = (None if names is None
                                         else (list(names), list(op_types), list(details)))
        self._resolve = resolve

    def lists(self) -> Labels:
        """``(names, op_types, details)``, indexed by label number."""
        if self._lists is None:
            self._lists = self._resolve()
            self._resolve = None
        return self._lists

    def __reduce__(self):
        return (OpLabels, self.lists())


_FIELDS = tuple(itemgetter(i) for i in range(len(OpRecord._fields)))


class OpColumns:
    """Op records as columns: record ``i`` runs on device ``rank[i]``, on
    stream ``streams[stream[i]]``, in category ``categories[category[i]]``,
    from ``start_s[i]`` to ``end_s[i]``, with ``flops[i]`` and ``bytes[i]``;
    its name, op type and detail are entry ``label[i]`` of ``labels``.

    The records' order (what ``Trace.ops`` lists) is the columns' own order,
    or with ``time_ordered`` the order of (start, rank, stream, end), ties
    kept in column order; ``streams`` must then be sorted, so that stream
    codes sort as the names do. :meth:`order` gives it, :meth:`rank_order`
    the same order grouped by device (what per-device sums follow)."""

    __slots__ = ("rank", "stream", "category", "start_s", "end_s", "flops", "bytes", "label",
                 "streams", "categories", "labels", "time_ordered", "_order")

    def __init__(self, rank: np.ndarray, stream: np.ndarray, category: np.ndarray,
                 start_s: np.ndarray, end_s: np.ndarray, flops: np.ndarray, bytes: np.ndarray,
                 label: np.ndarray, streams: Sequence[str], categories: Sequence[str],
                 labels: OpLabels, time_ordered: bool = False) -> None:
        self.rank = np.asarray(rank, dtype=np.int64)
        self.stream = np.asarray(stream, dtype=np.int64)
        self.category = np.asarray(category, dtype=np.int64)
        self.start_s = np.asarray(start_s, dtype=float)
        self.end_s = np.asarray(end_s, dtype=float)
        self.flops = np.asarray(flops, dtype=float)
        self.bytes = np.asarray(bytes, dtype=float)
        self.label = np.asarray(label, dtype=np.int64)
        self.streams = tuple(streams)
        self.categories = tuple(categories)
        self.labels = labels
        self.time_ordered = time_ordered
        if time_ordered and list(self.streams) != sorted(self.streams):
            raise ValueError(f"OpColumns: time-ordered columns need sorted streams, "
                             f"got {self.streams}")
        self._order: Optional[np.ndarray] = None

    @classmethod
    def from_records(cls, records: Sequence[OpRecord]) -> "OpColumns":
        """The columns of ``records``, in their order (one pass per field)."""
        n = len(records)
        streams: Dict[Any, int] = {}
        categories: Dict[Any, int] = {}

        def codes(get, table: Dict[Any, int]) -> np.ndarray:
            return np.fromiter((table.setdefault(x, len(table)) for x in map(get, records)),
                               np.int64, n)

        f = _FIELDS
        return cls(rank=np.fromiter(map(f[0], records), np.int64, n),
                   stream=codes(f[1], streams), category=codes(f[4], categories),
                   start_s=np.fromiter(map(f[5], records), float, n),
                   end_s=np.fromiter(map(f[6], records), float, n),
                   flops=np.fromiter(map(f[7], records), float, n),
                   bytes=np.fromiter(map(f[8], records), float, n),
                   label=np.arange(n, dtype=np.int64), streams=list(streams),
                   categories=list(categories),
                   labels=OpLabels(list(map(f[2], records)), list(map(f[3], records)),
                                   list(map(f[9], records))))

    def __len__(self) -> int:
        return len(self.rank)

    def order(self) -> np.ndarray:
        """Column positions in record order (computed once)."""
        if self._order is None:
            self._order = (np.lexsort((self.end_s, self.stream, self.rank, self.start_s))
                           if self.time_ordered else np.arange(len(self), dtype=np.int64))
        return self._order

    def rank_order(self) -> np.ndarray:
        """Column positions grouped by rank (ascending), each device's
        records in record order."""
        if self.time_ordered:
            return np.lexsort((self.end_s, self.stream, self.start_s, self.rank))
        return np.argsort(self.rank, kind="stable")

    def take(self, positions: np.ndarray, rank: Optional[np.ndarray] = None) -> "OpColumns":
        """The records at ``positions`` (in that column order), with their
        ranks replaced by ``rank`` if given; same labels and order rule."""
        return OpColumns(self.rank[positions] if rank is None else rank,
                         self.stream[positions], self.category[positions],
                         self.start_s[positions], self.end_s[positions], self.flops[positions],
                         self.bytes[positions], self.label[positions], self.streams,
                         self.categories, self.labels, self.time_ordered)

    def records(self) -> List[OpRecord]:
        """The records as :class:`OpRecord` tuples (Python ints, floats and
        the labels' strings), in record order. The garbage collector is
        paused meanwhile: its passes over the new tuples (which hold no
        cycles) would take twice as long as making them."""
        with gc_paused():
            return self._records()

    def _records(self) -> List[OpRecord]:
        order = self.order()
        names, op_types, details = self.labels.lists()
        label = self.label[order].tolist()
        fields = zip(self.rank[order].tolist(),
                     map(self.streams.__getitem__, self.stream[order].tolist()),
                     map(names.__getitem__, label), map(op_types.__getitem__, label),
                     map(self.categories.__getitem__, self.category[order].tolist()),
                     self.start_s[order].tolist(), self.end_s[order].tolist(),
                     self.flops[order].tolist(), self.bytes[order].tolist(),
                     map(details.__getitem__, label))
        # OpRecord(...) checks its arguments: slow by the million
        return list(map(tuple.__new__, repeat(OpRecord), fields))


class MemoryColumns:
    """Memory samples as three arrays (``rank``, ``time_s``,
    ``live_bytes``), in sample order: what the simulator makes. A 1024-GPU
    step has about a million samples; as tuples they would cost more than
    the numpy work that finds them, and the plots read the arrays."""

    __slots__ = ("rank", "time_s", "live_bytes")

    def __init__(self, rank: Any = (), time_s: Any = (), live_bytes: Any = ()) -> None:
        self.rank = np.asarray(rank, dtype=np.int64).reshape(-1)
        self.time_s = np.asarray(time_s, dtype=float).reshape(-1)
        self.live_bytes = np.asarray(live_bytes, dtype=np.int64).reshape(-1)
        if not len(self.rank) == len(self.time_s) == len(self.live_bytes):
            raise ValueError("MemoryColumns: rank, time_s and live_bytes differ in length")

    @classmethod
    def from_samples(cls, samples: Sequence[MemorySample]) -> "MemoryColumns":
        n = len(samples)
        table = np.array(samples, dtype=object).reshape(n, 3) if n else np.zeros((0, 3))
        return cls(table[:, 0].astype(np.int64), table[:, 1].astype(float),
                   table[:, 2].astype(np.int64))

    def __len__(self) -> int:
        return len(self.rank)

    def records(self) -> List[MemorySample]:
        """The samples as :class:`MemorySample` tuples (Python ints and
        floats), in sample order, the garbage collector paused meanwhile."""
        with gc_paused():
            fields = zip(self.rank.tolist(), self.time_s.tolist(), self.live_bytes.tolist())
            # MemorySample(...) checks its arguments: slow by the million
            return list(map(tuple.__new__, repeat(MemorySample), fields))


class Trace:
    """Everything a simulation recorded.

    The op records are given either as a list (``ops``) or as columns
    (``op_columns``, what the simulator makes); each view is made from the
    other on first use and kept. Records are values: to change them, assign
    a new list to ``trace.ops`` (editing the list in place does not reach
    the columns the summary reads). The memory samples likewise: ``memory``
    or ``memory_columns``."""

    def __init__(self, devices: List[DeviceInfo], ops: Optional[List[OpRecord]] = None,
                 memory: Optional[List[MemorySample]] = None,
                 links: Optional[List[LinkRecord]] = None,
                 link_samples: Optional[List[LinkSample]] = None, step_time_s: float = 0.0,
                 meta: Optional[Dict[str, Any]] = None, *,
                 op_columns: Optional[OpColumns] = None,
                 memory_columns: Optional[MemoryColumns] = None,
                 memory_peaks: Optional[Dict[int, int]] = None) -> None:
        if ops is not None and op_columns is not None:
            raise ValueError("Trace: give ops or op_columns, not both")
        if memory is not None and memory_columns is not None:
            raise ValueError("Trace: give memory or memory_columns, not both")
        self.devices = devices
        self._ops: Optional[List[OpRecord]] = (ops if ops is not None
                                               else None if op_columns is not None else [])
        self._columns = op_columns
        self._memory: Optional[List[MemorySample]] = (
            memory if memory is not None else None if memory_columns is not None else [])
        self._memory_columns = memory_columns
        self.links = [] if links is None else links
        self.link_samples = [] if link_samples is None else link_samples
        self.step_time_s = step_time_s
        self.meta = {} if meta is None else meta
        #: each device's peak live bytes, when the simulator gave them (it
        #: always does, with or without the curve in ``memory``)
        self.memory_peaks = memory_peaks

    @property
    def ops(self) -> List[OpRecord]:
        """Every op record, as :class:`OpRecord` tuples (made on first use)."""
        if self._ops is None:
            self._ops = self._columns.records()
        return self._ops

    @ops.setter
    def ops(self, records: List[OpRecord]) -> None:
        self._ops, self._columns = records, None

    @property
    def op_columns(self) -> OpColumns:
        """The op records as columns (made from the list on first use)."""
        if self._columns is None:
            self._columns = OpColumns.from_records(self._ops)
        return self._columns

    @property
    def memory(self) -> List[MemorySample]:
        """Every memory sample, as :class:`MemorySample` tuples (made on
        first use)."""
        if self._memory is None:
            self._memory = self._memory_columns.records()
        return self._memory

    @memory.setter
    def memory(self, samples: List[MemorySample]) -> None:
        self._memory, self._memory_columns = samples, None

    @property
    def memory_columns(self) -> MemoryColumns:
        """The memory samples as columns (made from the list on first use)."""
        if self._memory_columns is None:
            self._memory_columns = MemoryColumns.from_samples(self._memory)
        return self._memory_columns

    @property
    def num_memory_samples(self) -> int:
        """How many memory samples, without making them."""
        return len(self._memory) if self._memory is not None else len(self._memory_columns)

    @property
    def num_ops(self) -> int:
        """How many op records, without making them."""
        return len(self._ops) if self._ops is not None else len(self._columns)

    def ops_on(self, rank: int) -> List[OpRecord]:
        return [r for r in self.ops if r.rank == rank]

    def peak_memory(self) -> Dict[int, int]:
        """Each device's peak live bytes: as the simulator gave them, else
        the highest memory sample (0 for a device with neither)."""
        if self.memory_peaks is not None:
            return {d.rank: int(self.memory_peaks.get(d.rank, 0)) for d in self.devices}
        peak = {d.rank: 0 for d in self.devices}
        for s in self.memory:
            if s.live_bytes > peak.get(s.rank, 0):
                peak[s.rank] = s.live_bytes
        return peak

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Trace):
            return NotImplemented
        return ((self.devices, self.ops, self.memory, self.links, self.link_samples,
                 self.step_time_s, self.meta) ==
                (other.devices, other.ops, other.memory, other.links, other.link_samples,
                 other.step_time_s, other.meta))

    __hash__ = None  # type: ignore[assignment]   (mutable, as the dataclass it replaces)

    def __repr__(self) -> str:
        return (f"Trace(devices={len(self.devices)}, ops={self.num_ops}, "
                f"memory={self.num_memory_samples}, links={len(self.links)}, "
                f"step_time_s={self.step_time_s!r})")
