"""The simulator's output: plain records, no formatting.

Records are NamedTuples (cheap to create by the million, easy to turn into
DataFrames); formatting (Chrome trace, plots, tables) lives in
:mod:`distsim.report`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, NamedTuple

COMPUTE_STREAM = "compute"
COMM_STREAM = "comm"


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


@dataclass
class Trace:
    """Everything a simulation recorded."""

    devices: List[DeviceInfo]
    ops: List[OpRecord] = field(default_factory=list)
    memory: List[MemorySample] = field(default_factory=list)
    links: List[LinkRecord] = field(default_factory=list)
    link_samples: List[LinkSample] = field(default_factory=list)
    step_time_s: float = 0.0
    meta: Dict[str, Any] = field(default_factory=dict)

    def ops_on(self, rank: int) -> List[OpRecord]:
        return [r for r in self.ops if r.rank == rank]

    def peak_memory(self) -> Dict[int, int]:
        peak = {d.rank: 0 for d in self.devices}
        for s in self.memory:
            if s.live_bytes > peak.get(s.rank, 0):
                peak[s.rank] = s.live_bytes
        return peak
