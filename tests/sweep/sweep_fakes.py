"""Simulate functions for the sweep tests: importable by name in spawned
worker processes (tests/sweep is on their sys.path)."""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import distsim

#: Tiny MLP points: each simulates in a few milliseconds.
TINY = {"model": "mlp", "network_mode": "analytical", "layers": 2, "batch": 64}


def slow_simulate(**options):
    """distsim.simulate, a little slower, so that a test can kill a sweep mid-way."""
    time.sleep(0.25)
    return distsim.simulate(**options)


def kill_worker_once(marker: str, **options):
    """Kill the calling process (SIGKILL, like the OOM killer) the first time
    it sees dp == 4; the file ``marker`` records that (bind it with
    functools.partial)."""
    marker = Path(marker)
    if options.get("dp") == 4 and not marker.exists():
        marker.write_text("killed")
        os.kill(os.getpid(), signal.SIGKILL)
    return distsim.simulate(**options)


def always_kill_dp2(**options):
    if options.get("dp") == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    return distsim.simulate(**options)


def always_kill(**options):
    """Every point kills its worker: the workers themselves start fine."""
    os.kill(os.getpid(), signal.SIGKILL)


def marked_sleep_simulate(marker_dir: str, **options):
    """Points with dp <= 2 simulate at once; the others leave a file in
    ``marker_dir`` (the worker's pid: it is busy now) and sleep a minute,
    so that a test can stop the sweep while workers are running points
    (bind ``marker_dir`` with functools.partial)."""
    if (options.get("dp") or 1) > 2:
        Path(marker_dir, f"busy-{os.getpid()}").write_text(str(os.getpid()))
        time.sleep(60)
    return distsim.simulate(**options)
