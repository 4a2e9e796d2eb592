"""Run a measurement in a forked child process and get its figures back.

A benchmark (and each growth point) runs in a fresh process so that its
peak resident memory is its own and its timing does not inherit the heap
of whatever ran before it.
"""
from __future__ import annotations

import multiprocessing as mp
from typing import Any, Callable, Dict


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
