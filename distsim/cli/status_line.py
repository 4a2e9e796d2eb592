"""A status line on the terminal for the phases of a long command.

``distsim simulate`` of a 1024-GPU step spends tens of seconds building,
simulating and writing its files; on a terminal the user sees which phase
is running and for how long, on one line of stderr rewritten in place and
cleared at the end, so the command's real output (the summary table)
follows as before. Elsewhere (a pipe, a CI log) it writes nothing.
"""
from __future__ import annotations

import sys
import time
from typing import Callable, Optional, TextIO

_CLEAR = "\r\033[K"   # carriage return, erase to the end of the line


class StatusLine:
    """Call it with each phase's message; :meth:`close` clears the line.
    Active only when ``stream`` is a terminal (``enabled`` overrides)."""

    def __init__(self, stream: Optional[TextIO] = None, enabled: Optional[bool] = None,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.stream = stream if stream is not None else sys.stderr
        if enabled is None:
            isatty = getattr(self.stream, "isatty", None)
            enabled = bool(isatty and isatty())
        self.enabled = enabled
        self.clock = clock
        self.started = clock()
        self.shown = False

    def __call__(self, message: str) -> None:
        if not self.enabled:
            return
        elapsed = self.clock() - self.started
        self.stream.write(f"{_CLEAR}distsim: {message} ... ({elapsed:.1f} s)")
        self.stream.flush()
        self.shown = True

    def close(self) -> None:
        if self.shown:
            self.stream.write(_CLEAR)
            self.stream.flush()
            self.shown = False

    def __enter__(self) -> "StatusLine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
