"""Run a measurement in a forked child process and get its figures back.

A benchmark (and each growth point) runs in a fresh process so that its
peak resident memory is its own and its timing does not inherit the heap
of whatever ran before it.
"""
from __future__ import annotations

import multiprocessing as mp
from typing import Any, Callable, Dict

import numpy as np

from ..pages import small_pages


def in_fresh_process(fn: Callable[..., Dict[str, Any]], *args: Any) -> Dict[str, Any]:
    """``fn(*args)`` in a forked child; the dict it returns, or
    ``{"_error": text}`` when it raised or died without answering (killed,
    e.g. out of memory)."""
    ctx = mp.get_context("fork")
    receive, send = ctx.Pipe(duplex=False)

    def child() -> None:
        try:
            out = fn(*args)
        except Exception as e:  # pragma: no cover - reported in the parent
            out = {"_error": f"{type(e).__name__}: {e}"}
        send.send(out)

    proc = ctx.Process(target=child)
    proc.start()
    send.close()                # so that a dead child reads as EOF here
    try:
        out = receive.recv()
    except EOFError:
        out = None
    proc.join()
    receive.close()
    if out is None:
        out = {"_error": f"benchmark process ended with exit code {proc.exitcode}"}
    return out


def _touch(nbytes: int) -> Dict[str, Any]:
    with small_pages():                     # 4 kB pages, as the measurements get
        buffer = np.ones(max(int(nbytes), 0) // 8)
    return {"touched_bytes": int(buffer.nbytes)}


def ready_free_memory(nbytes: int) -> int:
    """Touch ``nbytes`` of memory in a short-lived child process and free
    them, just before a measurement starts in a fresh process.

    Why: a VM that hands freed memory back to its host (virtio-balloon
    free page reporting, as on the development machine) makes a process
    pay the host for every page beyond those freed in the last seconds:
    about 7 us per 4 kB page against under 1 us for a page still backed
    (measured there, in system time). Measurements run one after another
    then pay unevenly: one that needs more memory than the run before it
    freed pays for the difference, so the order of the runs, not their
    work, decides part of their times. Freed just before each, enough
    backed pages are ready for every run alike. Where memory stays backed
    this costs a fraction of a second and changes nothing. Returns the
    bytes touched (0 if the child could not: the measurement that follows
    then finds the machine as it is)."""
    return int(in_fresh_process(_touch, nbytes).get("touched_bytes", 0))
