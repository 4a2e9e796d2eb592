"""The estimator's timeline: work items on the streams of pipeline stages.

Each pipeline stage is represented by one rank with the simulator's two
streams, compute and communication. An :class:`Item` is a piece of work in
program order on one or more streams: a run of compute (one stream), a
collective (the communication streams of every stage in its team: a
pipeline send/receive is on two), or a forward/backward task with
tensor-parallel collectives inside (both streams of its stage: its
collectives hold the communication stream while it runs). An item starts
when every stream it is on has finished the items before it and the items
it depends on have ended -- the simulator's rule (a stream takes its ops in
program order; a collective starts when every member has reached it) with
no network contention, as in the analytical mode. So :func:`run` needs no
event queue: it settles items in dependency order.
"""
from __future__ import annotations

from collections import deque
from typing import Dict, List, Optional, Sequence, Tuple

from ..errors import SimulationError
from ..report.intervals import merged_overlap

COMPUTE, COMM = 0, 1


class Item:
    """One unit of work. ``streams``: stream ids (``2 * stage + COMPUTE``
    or ``+ COMM``); ``busy_s``: the part of ``time_s`` its compute stream
    computes (the rest waits on tensor-parallel collectives); ``flops``:
    FLOPs it executes per rank."""

    __slots__ = ("streams", "time_s", "deps", "busy_s", "flops", "start", "end", "label")

    def __init__(self, streams: Tuple[int, ...], time_s: float, deps: Sequence["Item"] = (),
                 busy_s: Optional[float] = None, flops: float = 0.0, label: str = "") -> None:
        self.streams = streams
        self.time_s = float(time_s)
        self.deps = tuple(d for d in deps if d is not None)
        self.busy_s = self.time_s if busy_s is None else float(busy_s)
        self.flops = flops
        self.start: Optional[float] = None
        self.end: Optional[float] = None
        self.label = label


class Timeline:
    """Streams of items in program order (two per stage)."""

    def __init__(self, stages: int) -> None:
        self.stages = stages
        self.streams: List[List[Item]] = [[] for _ in range(2 * stages)]

    @staticmethod
    def stream(stage: int, kind: int) -> int:
        return 2 * stage + kind

    def add(self, item: Item) -> Item:
        for s in item.streams:
            self.streams[s].append(item)
        return item

    def compute(self, stage: int, time_s: float, deps: Sequence[Optional[Item]] = (),
                busy_s: Optional[float] = None, flops: float = 0.0, label: str = "",
                holds_comm: bool = False) -> Item:
        streams = (2 * stage, 2 * stage + 1) if holds_comm else (2 * stage,)
        return self.add(Item(streams, time_s, deps, busy_s, flops, label))

    def comm(self, stages: Sequence[int], time_s: float, deps: Sequence[Optional[Item]] = (),
             label: str = "") -> Item:
        streams = tuple(2 * s + 1 for s in dict.fromkeys(stages))
        return self.add(Item(streams, time_s, deps, 0.0, 0.0, label))

    def run(self) -> float:
        """Give every item its start and end; returns the last end."""
        streams = self.streams
        heads = [0] * len(streams)
        free = [0.0] * len(streams)
        waiting: Dict[int, List[int]] = {}
        todo = deque(range(len(streams)))
        queued = set(todo)
        while todo:
            s = todo.popleft()
            queued.discard(s)
            items = streams[s]
            while heads[s] < len(items):
                it = items[heads[s]]
                ready = True
                for t in it.streams:
                    if t != s and (heads[t] >= len(streams[t]) or streams[t][heads[t]] is not it):
                        ready = False   # the other stream schedules it when it gets there
                        break
                if ready:
                    for d in it.deps:
                        if d.end is None:
                            waiting.setdefault(id(d), []).append(s)
                            ready = False
                            break
                if not ready:
                    break
                start = 0.0
                for t in it.streams:
                    if free[t] > start:
                        start = free[t]
                for d in it.deps:
                    if d.end > start:
                        start = d.end
                it.start = start
                it.end = start + it.time_s
                for t in it.streams:
                    free[t] = it.end
                    heads[t] += 1
                    if t != s and t not in queued:
                        todo.append(t)
                        queued.add(t)
                for w in waiting.pop(id(it), ()):
                    if w not in queued:
                        todo.append(w)
                        queued.add(w)
        stuck = [s for s in range(len(streams)) if heads[s] < len(streams[s])]
        if stuck:
            s = stuck[0]
            raise SimulationError(f"estimate: the timeline deadlocks at stage {s // 2} "
                                  f"({'comm' if s % 2 else 'compute'} stream, item "
                                  f"{streams[s][heads[s]].label!r})")
        return max((it.end for items in streams for it in items), default=0.0)

    # -- accounting ----------------------------------------------------------
    def stage_breakdown(self, stage: int, step_s: float) -> Dict[str, float]:
        """Per rank of ``stage``, as the simulator's summary counts it:
        compute (the busy part of its compute items), communication (its
        communication-only items and the tensor-parallel waits inside
        compute items), exposed communication (communication while nothing
        computes), idle (the rest of the step). Items on one stream are
        disjoint and in time order, so this is a linear sweep."""
        compute: List[Tuple[float, float]] = []
        waits = 0.0
        flops = 0.0
        comm_id = 2 * stage + 1
        for it in self.streams[2 * stage]:
            compute.append((it.start, it.start + it.busy_s))
            if comm_id in it.streams:           # waits on its tensor-parallel collectives
                waits += it.time_s - it.busy_s
            flops += it.flops
        comm = [(it.start, it.end) for it in self.streams[2 * stage + 1]
                if 2 * stage not in it.streams]
        busy = sum(e - s for s, e in compute)
        comm_s = sum(e - s for s, e in comm)
        hidden = merged_overlap(compute, comm)
        exposed = waits + comm_s - hidden
        return {"compute_s": busy, "communication_s": comm_s + waits,
                "exposed_communication_s": exposed,
                "idle_s": max(0.0, step_s - busy - exposed), "flops": flops}


