"""Verify a large program on the second core while the first simulates it.

Building, verifying and simulating a 1024-GPU training step each cost a few
seconds of single-threaded Python; verification is independent of the
simulation, so on a machine with more than one core :func:`verified_beside`
runs :func:`~distsim.ir.verifier.verify` in a forked child process while
the body of the ``with`` block (the simulation) runs in this one. The
program is shared copy-on-write; nothing is pickled but the verdict.

The result is the same as verifying first:

* the child reports only "valid" or "not"; a program it rejects, or a
  child that dies without a verdict, is verified again here, in this
  process, so the error raised is exactly the verifier's (its class,
  message and traceback), raised when the block ends;
* that error takes precedence over any error the body raised (a
  malformed program may also trip the simulator; the verifier's message
  is the one that names the problem);
* an interrupted body (Ctrl-C, ``SystemExit``) stops the child and verifies
  nothing.

Small programs, machines without ``os.fork`` or with one core, and
processes running other threads (forking those is unsafe) verify first,
in this process, as before.
"""
from __future__ import annotations

import os
import signal
import threading
from contextlib import contextmanager
from typing import Iterable, Iterator, Optional

from .core import Function
from .verifier import verify

#: Programs with fewer ops verify first, in this process: a fork costs
#: milliseconds, verification of a small program less.
MIN_OPS_TO_FORK = 50_000

_VALID, _INVALID = b"valid", b"invalid"


def can_fork() -> bool:
    """Whether a verifier child may be forked here: ``os.fork`` exists,
    there is a second core to run it on, and this process runs no other
    thread (a fork copies only the calling thread, with any lock another
    one held)."""
    return (hasattr(os, "fork") and (os.cpu_count() or 1) > 1
            and threading.active_count() == 1)


def _child(function: Function, known_devices: Optional[list], write_fd: int) -> None:
    """In the child: verify, write the verdict, leave without cleanup (no
    atexit handlers, no flushing the parent's buffers a second time)."""
    status = 1
    try:
        try:
            verify(function, known_devices=known_devices)
            verdict = _VALID
        except Exception:
            verdict = _INVALID
        with os.fdopen(write_fd, "wb") as out:
            out.write(verdict)
        status = 0
    finally:
        os._exit(status)


def _child_found_valid(pid: int, read_fd: int) -> bool:
    """Whether the child reported the program valid (and exited cleanly)."""
    with os.fdopen(read_fd, "rb") as pipe:
        verdict = pipe.read()
    _, status = os.waitpid(pid, 0)
    return verdict == _VALID and os.waitstatus_to_exitcode(status) == 0


def _abandon(pid: int, read_fd: int) -> None:
    """Stop the child and reap it (an interrupted run verifies nothing)."""
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    os.close(read_fd)
    os.waitpid(pid, 0)


@contextmanager
def verified_beside(function: Function, known_devices: Optional[Iterable[int]] = None,
                    min_ops: Optional[int] = None) -> Iterator[None]:
    """Run the ``with`` block while ``function`` is verified in a child
    process (see the module docstring); on leaving, raise what
    :func:`verify` would have raised. Verifies first, here, when the
    program has fewer than ``min_ops`` ops (None: :data:`MIN_OPS_TO_FORK`)
    or :func:`can_fork` says no."""
    devices = None if known_devices is None else list(known_devices)
    limit = MIN_OPS_TO_FORK if min_ops is None else min_ops
    if len(function.ops) < limit or not can_fork():
        verify(function, known_devices=devices)
        yield
        return
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:                       # pragma: no cover - runs in the child
        os.close(read_fd)
        _child(function, devices, write_fd)
    os.close(write_fd)

    def settle() -> None:
        if not _child_found_valid(pid, read_fd):
            verify(function, known_devices=devices)     # raises the verifier's own error

    try:
        yield
    except Exception:
        settle()                       # the verifier's error names the cause
        raise
    except BaseException:              # Ctrl-C, exit: stop the child, verify nothing
        _abandon(pid, read_fd)
        raise
    settle()
