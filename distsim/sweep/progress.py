"""Progress of a sweep: a one-line bar on a terminal (done / total, rate,
ETA), plain lines elsewhere (CI logs): one every 10 % or 30 s, and at the end."""
from __future__ import annotations

import sys
import time
from typing import Optional, TextIO


def _duration(seconds: float) -> str:
    if seconds != seconds or seconds == float("inf"):
        return "?"
    s = int(round(seconds))
    h, rem = divmod(s, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


class Progress:
    """``update(done)`` after each finished point; ``close()`` at the end.
    ``already`` points (resumed from a journal, or skipped by a constraint)
    count towards ``done`` but not towards the rate."""

    WIDTH = 28

    def __init__(self, total: int, already: int = 0, stream: Optional[TextIO] = None,
                 enabled: bool = True, label: str = "sweep", tty: Optional[bool] = None,
                 resumed: int = 0) -> None:
        self.total = total
        self.already = already
        self.done = already
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled
        self.label = label
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)()) if tty is None else tty
        self.start = time.monotonic()
        self._last_line = self.start
        self._last_decile = -1
        self._last_draw = 0.0
        if enabled and resumed:
            self._print(f"{label}: resuming, {resumed}/{total} already done")

    def _print(self, text: str) -> None:
        try:
            self.stream.write(text + "\n")
            self.stream.flush()
        except (OSError, ValueError):
            self.enabled = False

    def text(self) -> str:
        elapsed = max(time.monotonic() - self.start, 1e-9)
        fresh = self.done - self.already
        rate = fresh / elapsed
        left = self.total - self.done
        eta = left / rate if rate > 0 else float("inf")
        pct = 100.0 * self.done / self.total if self.total else 100.0
        return (f"{self.done}/{self.total} ({pct:.0f}%)  {rate:.2f} configs/s  "
                f"ETA {_duration(eta) if left else '0:00'}")

    def update(self, done: int) -> None:
        self.done = done
        if not self.enabled:
            return
        now = time.monotonic()
        if self.tty:
            if now - self._last_draw < 0.1 and done < self.total:
                return
            self._last_draw = now
            filled = int(self.WIDTH * done / self.total) if self.total else self.WIDTH
            bar = "#" * filled + "." * (self.WIDTH - filled)
            try:
                self.stream.write(f"\r{self.label} [{bar}] {self.text()}\x1b[K")
                self.stream.flush()
            except (OSError, ValueError):
                self.enabled = False
            return
        decile = int(10 * done / self.total) if self.total else 10
        if decile > self._last_decile or now - self._last_line >= 30 or done == self.total:
            self._last_decile = decile
            self._last_line = now
            self._print(f"{self.label}: {self.text()}")

    def close(self) -> None:
        if self.enabled and self.tty:
            try:
                self.stream.write("\n")
                self.stream.flush()
            except (OSError, ValueError):
                pass
        self.enabled = False
