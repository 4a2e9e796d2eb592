"""ZeRO-3 in the estimator's block-level tasks: a block's compute waits for
the gather of each parameter where it first reads it, not for all of the
block's gathers at its start (see :mod:`.estimate_timeline`).

LowerSPMD issues a block's gathers (and the next ``prefetch`` blocks')
back to back on the communication stream when it enters the block, in the
order the block first reads the parameters; each read goes through a
reshape of the gathered value (``{param}_use_m{mb}``), the only op that
waits for the gather. So the compute before the block's first read runs
under the gathers, and the compute between two reads waits for no gather
past the first of them (:attr:`.estimate_profile.Block.f_gates`). A
block's compute that holds the communication stream (tensor-parallel
collectives) waits for every gather anyway: the stream takes them in
order.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, List, Optional, Tuple

from ..ir.comm import CollectiveType

if TYPE_CHECKING:     # pragma: no cover - for the annotations only
    from .estimate_timeline import Builder

#: A block's first compute piece cut at its reads of gathered parameters:
#: (time, busy time or None, how long before the end of the block's gathers
#: the parameter read there is gathered, or None: waits for none)
Chain = List[Tuple[float, Optional[float], Optional[float]]]


def gather_time(b: "Builder", kind: str, block: str) -> float:
    """ZeRO-3: the all-gathers of the parameters a block reads first in a
    forward / backward task (one item: they run back to back)."""
    t = b.memo.gathers.get((kind, block))
    if t is None:
        t = sum(gather_times(b, kind, block))
        b.memo.gathers[(kind, block)] = t
    return t


def gather_times(b: "Builder", kind: str, block: str) -> List[float]:
    """Each of :func:`gather_time`'s all-gathers, in the order issued."""
    blk = b.prof.blocks[block]
    out = []
    for owner, i in (blk.f_gather if kind == "F" else blk.b_gather):
        p = b.prof.params[owner][i]
        out.append(b.dp_time(CollectiveType.ALL_GATHER, p.numel * p.dtype.itemsize))
    return out


def chain(b: "Builder", kind: str, block: str, piece: Tuple[float, Optional[float], bool]
          ) -> Optional[Chain]:
    """The first compute piece of a block's task cut at its reads of
    gathered parameters (:data:`Chain`), or None where it waits for all of
    them (it holds the communication stream, or the block reads none)."""
    time_s, busy_s, holds = piece
    blk = b.prof.blocks[block]
    gates = blk.f_gates if kind == "F" else blk.b_gates
    if holds or not gates:
        return None
    times = gather_times(b, kind, block)
    total = sum(times)
    ends: List[float] = []
    done = 0.0
    for t in times:
        done += t
        ends.append(total - done)
    out: Chain = []
    at, wait = 0.0, None
    for before, j in gates:
        cut = min(before, time_s)
        if cut > at:
            out.append((cut - at, _part(busy_s, cut - at, time_s), wait))
            at = cut
        wait = ends[j]
    out.append((time_s - at, _part(busy_s, time_s - at, time_s), wait))
    return out


def _part(busy_s: Optional[float], length: float, time_s: float) -> Optional[float]:
    return None if busy_s is None or time_s <= 0.0 else busy_s * length / time_s


def emit_chain(b: "Builder", stage: int, pieces: Chain, gathered: float, ready: float
               ) -> float:
    """Emit a :data:`Chain` on ``stage``: each piece from ``ready`` and the
    gather it waits for (``gathered``: the end of the block's gathers);
    returns the last end."""
    compute = b.tl.compute
    end = ready
    for time_s, busy_s, before in pieces:
        at = ready if before is None else max(ready, gathered - before)
        end = compute(stage, time_s, at, busy_s)
    return end

