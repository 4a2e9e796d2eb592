"""The simulator's liveness bounds and its report of blocked ops.

A run that cannot finish stops with a :class:`SimulationError` listing
every blocked op per device: at once when no event is left (a deadlock),
or when a bound of :class:`~.simulator.SimulationOptions` is passed
(``stall_events``, ``max_events``, ``max_wall_s``).
"""
from __future__ import annotations

import time
from typing import Callable, Dict, Optional, Tuple

import simpy

from ..errors import SimulationError

#: what a blocked op waits for when it is a launch token (blocking
#: launches, stream order, a p2p that waits: :mod:`.launch_queue`), in
#: place of an input value
PREVIOUS_LAUNCH = "previous launch"


def run_events(env: simpy.Environment, options, progress: Callable[[], int],
               report: Callable[[Optional[str]], str]) -> None:
    """``env.run()`` under the liveness bounds of ``options``;
    ``progress()`` counts the blocks and collectives finished so far,
    ``report(reason)`` is the blocked-ops report (:func:`blocked_report`)."""
    stall, most, wall = options.stall_events, options.max_events, options.max_wall_s
    for name, bound in (("stall_events", stall), ("max_events", most),
                        ("max_wall_s", wall)):
        if bound is not None and (isinstance(bound, bool) or
                                  not isinstance(bound, (int, float)) or bound < 0):
            raise SimulationError(f"SimulationOptions.{name}: must be a non-negative "
                                  f"number or None, got {bound!r}")
    step = env.step
    deadline = None if wall is None else time.monotonic() + wall
    n = 0
    progress_at, seen = 0, progress()  # event count at the last progress
    try:
        while True:
            step()
            n += 1
            if stall is not None:
                done = progress()
                if done != seen:
                    seen, progress_at = done, n
                elif n - progress_at >= stall:
                    raise SimulationError(report(
                        f"no progress for {stall} events (stall_events)"))
            if most is not None and n >= most:
                raise SimulationError(report(
                    f"event budget of {most} events spent (max_events)"))
            if deadline is not None and n & 255 == 1 and time.monotonic() > deadline:
                raise SimulationError(report(
                    f"wall-clock budget of {wall:g} s spent (max_wall_s)"))
    except simpy.core.EmptySchedule:
        pass


def blocked_report(blocked: Dict[Tuple[int, str], tuple], reached: float,
                   reason: Optional[str] = None) -> str:
    """One line: every blocked stream's op and what it waits for
    (``blocked``: (rank, stream) -> (op, value or :data:`PREVIOUS_LAUNCH`
    or None, collective)), and the latest time reached."""
    parts = []
    for (rank, stream), (op, value, coll) in sorted(blocked.items(), key=lambda item: item[0]):
        if value is PREVIOUS_LAUNCH:
            why = ("waiting for the launch before it to finish (launch: blocking, "
                   "comm_order: stream, or p2p: synchronous or separate)")
        elif value is not None:
            why = f"waiting for input %{value.name}"
        else:
            missing = [r for r in coll.members if r not in coll.arrivals]
            why = (f"waiting for ranks {missing} to reach it" if missing
                   else "in flight (every member has reached it)")
        parts.append(f"device {rank} {stream}: %{op.name} ({op.op_type}) {why}")
    head = "deadlock" if reason is None else f"stopped ({reason})"
    return (f"{head} at t={reached:.6g} s: {len(blocked)} stream(s) blocked: "
            + "; ".join(parts))
