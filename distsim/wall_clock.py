"""A wall-clock bound on a whole run (``--max-wall-s``, ``max_wall_s=``):
building and verifying the program as well as simulating it.

The simulator checks its own bound every 256 events and names the blocked
ops when it stops; building a program has no such loop, so a run's phases
are bounded from outside: in the main thread (on a system with
``SIGALRM``) a timer interrupts a phase that passes the deadline, wherever
it is. Elsewhere (a thread, a system without the signal, a timer that is
already the caller's) the bound is checked between phases, and the
simulation's event loop still bounds itself.
"""
from __future__ import annotations

import contextlib
import signal
import sys
import threading
import time
from typing import Iterator, Optional

from .errors import SimulationError


#: Seconds after which the timer fires again when its first exception was
#: dropped (raised inside a finalizer).
_RETRY_S = 0.01


class _Expired(BaseException):
    """Raised by the timer inside a phase: a BaseException, so that no
    ``except Exception`` on the way turns it into another error."""


def _can_interrupt() -> bool:
    """Whether a timer may interrupt the current thread: the main thread,
    SIGALRM available, and neither the signal nor the timer in use."""
    if not hasattr(signal, "setitimer"):
        return False
    if threading.current_thread() is not threading.main_thread():
        return False
    if signal.getsignal(signal.SIGALRM) not in (signal.SIG_DFL, signal.SIG_IGN, None):
        return False
    return signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


class WallClock:
    """The deadline of one run: ``seconds`` from now (None: no bound).
    Used as ``with WallClock(s) as clock:`` around the run, each phase in
    ``with clock.phase(...)``; the outer block turns a timer that fired
    just as a phase ended into the same error."""

    def __init__(self, seconds: Optional[float]) -> None:
        self.seconds = seconds
        self.start = time.monotonic()
        self._phase = "running"

    def __enter__(self) -> "WallClock":
        return self

    def __exit__(self, kind, error, tb) -> None:
        if kind is not None and issubclass(kind, _Expired):
            raise self._error(self._phase) from None

    def remaining(self) -> Optional[float]:
        """Seconds left (None: no bound), at least a millisecond."""
        if self.seconds is None:
            return None
        return max(1e-3, self.start + self.seconds - time.monotonic())

    def _error(self, phase: str) -> SimulationError:
        spent = time.monotonic() - self.start
        return SimulationError(f"stopped while {phase}: the run took {spent:.3g} s of "
                               f"wall-clock time, past --max-wall-s {self.seconds:g}")

    @contextlib.contextmanager
    def phase(self, phase: str, grace_s: float = 0.0) -> Iterator[None]:
        """Bound the block (``phase``: what it does, for the message) by
        the deadline plus ``grace_s``: a :class:`SimulationError` when it
        runs past it."""
        if self.seconds is None:
            yield
            return
        self._phase = phase
        left = self.start + self.seconds + grace_s - time.monotonic()
        if left <= 0:
            raise self._error(phase)
        if not _can_interrupt():
            yield
            if time.monotonic() > self.start + self.seconds + grace_s:
                raise self._error(phase)
            return
        state = {"armed": True}

        def expire(signum, frame):
            if state["armed"]:
                # again shortly, in case this one lands in a finalizer (a __del__, a
                # weakref callback), where Python reports and drops the exception
                signal.setitimer(signal.ITIMER_REAL, _RETRY_S)
                raise _Expired()

        previous = signal.signal(signal.SIGALRM, expire)
        hook = sys.unraisablehook
        sys.unraisablehook = _quiet_about_expiry(hook)
        try:
            try:
                signal.setitimer(signal.ITIMER_REAL, left)
                yield
            finally:
                state["armed"] = False
                signal.setitimer(signal.ITIMER_REAL, 0)
                signal.signal(signal.SIGALRM, previous)
                sys.unraisablehook = hook
        except _Expired:
            raise self._error(phase) from None


def _quiet_about_expiry(hook):
    """``sys.unraisablehook`` that drops the timer's exception when it lands
    in a finalizer (the timer fires again; stderr stays one line)."""
    def quiet(unraisable) -> None:
        if not isinstance(unraisable.exc_value, _Expired):
            hook(unraisable)
    return quiet
