"""Progress of a sweep: a one-line bar on a terminal (done / total, rate,
ETA, points running), plain lines elsewhere (CI logs): one every 10 %, and
a heartbeat every :data:`HEARTBEAT_S` while points run, so that a slow
sweep is never silent for minutes; at the end a last line.

The bar also refreshes on a timer (:data:`REDRAW_S`), so its ETA and
elapsed time move while a long point runs. :meth:`Progress.tick` does both;
:meth:`Progress.start_ticker` calls it from a daemon thread. The clock is a
parameter, so tests drive it by hand.
"""
from __future__ import annotations

import sys
import threading
import time
from typing import Callable, Optional, TextIO

#: Seconds between heartbeat lines in plain (CI) mode while points run.
HEARTBEAT_S = 30.0
#: Seconds between redraws of the terminal bar when nothing finishes.
REDRAW_S = 1.0
#: How often the ticker thread wakes up.
TICK_S = 0.5


def _duration(seconds: float) -> str:
    if seconds != seconds or seconds == float("inf"):
        return "?"
    s = int(round(seconds))
    h, rem = divmod(s, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


class Progress:
    """``update(done)`` after each finished point; ``tick()`` on a timer
    (or :meth:`start_ticker`); ``close()`` at the end. ``already`` points
    (resumed from a journal, or skipped by a constraint) count towards
    ``done`` but not towards the rate. ``running``: a callable giving the
    number of points in flight (shown as ``running N``). ``clock``: the
    time source (``time.monotonic``)."""

    WIDTH = 28

    def __init__(self, total: int, already: int = 0, stream: Optional[TextIO] = None,
                 enabled: bool = True, label: str = "sweep", tty: Optional[bool] = None,
                 resumed: int = 0, running: Optional[Callable[[], int]] = None,
                 clock: Callable[[], float] = time.monotonic,
                 heartbeat_s: float = HEARTBEAT_S) -> None:
        self.total = total
        self.already = already
        self.done = already
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled
        self.label = label
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)()) if tty is None else tty
        self.running = running
        self.clock = clock
        self.heartbeat_s = heartbeat_s
        self.start = clock()
        self._last_line = self.start
        self._last_decile = -1
        self._last_draw = float("-inf")
        self._lock = threading.RLock()
        self._stop: Optional[threading.Event] = None
        self._thread: Optional[threading.Thread] = None
        if enabled and resumed:
            self._print(f"{label}: resuming, {resumed}/{total} already done")

    def _print(self, text: str) -> None:
        try:
            self.stream.write(text + "\n")
            self.stream.flush()
        except (OSError, ValueError):
            self.enabled = False

    def _running(self) -> Optional[int]:
        if self.running is None:
            return None
        try:
            return int(self.running())
        except Exception:  # a runner that cannot say: leave it out
            return None

    def text(self) -> str:
        now = self.clock()
        elapsed = max(now - self.start, 1e-9)
        fresh = self.done - self.already
        rate = fresh / elapsed
        left = self.total - self.done
        eta = left / rate if rate > 0 else float("inf")
        pct = 100.0 * self.done / self.total if self.total else 100.0
        out = (f"{self.done}/{self.total} ({pct:.0f}%)  {rate:.2f} configs/s  "
               f"ETA {_duration(eta) if left else '0:00'}")
        running = self._running()
        if running is not None and left:
            out += f"  running {running}"
        return out + f"  elapsed {_duration(elapsed)}"

    def _draw(self, now: float) -> None:
        self._last_draw = now
        filled = int(self.WIDTH * self.done / self.total) if self.total else self.WIDTH
        bar = "#" * filled + "." * (self.WIDTH - filled)
        try:
            self.stream.write(f"\r{self.label} [{bar}] {self.text()}\x1b[K")
            self.stream.flush()
        except (OSError, ValueError):
            self.enabled = False

    def update(self, done: int) -> None:
        with self._lock:
            self.done = done
            if not self.enabled:
                return
            now = self.clock()
            if self.tty:
                if now - self._last_draw >= 0.1 or done >= self.total:
                    self._draw(now)
                return
            decile = int(10 * done / self.total) if self.total else 10
            if decile > self._last_decile or now - self._last_line >= self.heartbeat_s \
                    or done == self.total:
                self._last_decile = decile
                self._last_line = now
                self._print(f"{self.label}: {self.text()}")

    def tick(self) -> None:
        """Called on a timer: redraw the bar (terminal) or, when nothing
        was printed for :data:`HEARTBEAT_S`, print a heartbeat line."""
        with self._lock:
            if not self.enabled or self.done >= self.total:
                return
            now = self.clock()
            if self.tty:
                if now - self._last_draw >= REDRAW_S:
                    self._draw(now)
            elif now - self._last_line >= self.heartbeat_s:
                self._last_line = now
                self._print(f"{self.label}: {self.text()}  (working)")

    def start_ticker(self, interval_s: float = TICK_S) -> None:
        """Call :meth:`tick` every ``interval_s`` from a daemon thread until
        :meth:`close`."""
        if not self.enabled or self._thread is not None:
            return
        stop = self._stop = threading.Event()

        def loop() -> None:
            while not stop.wait(interval_s):
                self.tick()

        self._thread = threading.Thread(target=loop, name="distsim-progress", daemon=True)
        self._thread.start()

    def close(self) -> None:
        if self._stop is not None:
            self._stop.set()
            if self._thread is not None:
                self._thread.join(timeout=2 * TICK_S + 1)
        with self._lock:
            if self.enabled and self.tty:
                try:
                    self.stream.write("\n")
                    self.stream.flush()
                except (OSError, ValueError):
                    pass
            self.enabled = False
