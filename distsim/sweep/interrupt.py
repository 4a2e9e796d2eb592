"""SIGTERM stops a sweep as Ctrl-C does.

By default SIGTERM ends the coordinator at once: no ``finally`` runs, so
its worker processes (and their forkserver) are left running, orphaned,
until they finish on their own. While :func:`sigterm_as_interrupt` is
active, SIGTERM raises :class:`Terminated` (a ``KeyboardInterrupt``) in the
main thread instead: the runners stop their workers, the journal is
closed and the tables are written with ``complete: false``, exactly as for
Ctrl-C, and ``distsim sweep`` exits with status 143 (128 + SIGTERM).
"""
from __future__ import annotations

import functools
import signal
import threading
from contextlib import contextmanager
from typing import Any, Callable, Iterator, TypeVar

__all__ = ["EXIT_TERMINATED", "Terminated", "sigterm_as_interrupt", "stops_on_sigterm"]

#: The exit status of a command stopped by SIGTERM (128 + 15, as the shell reports it).
EXIT_TERMINATED = 128 + signal.SIGTERM

F = TypeVar("F", bound=Callable[..., Any])


class Terminated(KeyboardInterrupt):
    """SIGTERM received while :func:`sigterm_as_interrupt` was active."""


def _raise_terminated(signum: int, frame: Any) -> None:
    # one interrupt: a second SIGTERM must not break the cleanup the first started
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise Terminated("terminated (SIGTERM)")


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Within the block, SIGTERM raises :class:`Terminated` in the main
    thread. Does nothing off the main thread (signal handlers live there)
    or when SIGTERM already has a handler (the caller's, or an outer
    block's); the previous handler is restored on the way out."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGTERM)
    if previous is not signal.SIG_DFL:
        yield
        return
    signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def stops_on_sigterm(fn: F) -> F:
    """``fn`` run within :func:`sigterm_as_interrupt`."""
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with sigterm_as_interrupt():
            return fn(*args, **kwargs)
    return wrapper  # type: ignore[return-value]
