"""SIGTERM stops a sweep as Ctrl-C does: the coordinator, its workers and
their forkserver end within seconds, the finished points stay in the
journal and the tables are marked incomplete."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


_SCRIPT = """
import functools, sys
sys.path.insert(0, {here!r})
import sweep_fakes
from distsim.cli import main, sweep_cmd
from distsim.sweep import driver
slow = functools.partial(sweep_fakes.marked_sleep_simulate, {markers!r})
sweep_cmd.sweep = functools.partial(driver.sweep, simulate=slow)
sys.exit(main(sys.argv[1:]))
"""


def _children() -> dict:
    """ppid -> child pids, from /proc."""
    out: dict = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                stat = Path(f"/proc/{name}/stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            out.setdefault(ppid, []).append(int(name))
    return out


def _descendants(pid: int) -> list:
    children, found, todo = _children(), [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            found.append(c)
            todo.append(c)
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")
@pytest.mark.parametrize("signum, status, message", [
    (signal.SIGTERM, 143, "distsim: terminated (SIGTERM)"),
    (signal.SIGINT, 130, "distsim: interrupted"),   # to the coordinator alone, not its group
])
def test_signal_stops_the_sweep_and_its_workers(tmp_path, signum, status, message):
    """Two workers each running a point that sleeps a minute; the signal
    must end the coordinator within seconds with its workers (and their
    forkserver), keep the finished points in the journal and mark the
    tables incomplete: on SIGTERM the workers must not run on after the
    coordinator, on SIGINT to its pid alone it must not wait for the
    points."""
    markers = tmp_path / "markers"
    markers.mkdir()
    spec = tmp_path / "s.yaml"
    spec.write_text("base: {model: mlp, network_mode: analytical, layers: 2, batch: 64}\n"
                    "grid: {dp: [1, 2, 4, 8]}\n")
    out = tmp_path / "out"
    stderr = tmp_path / "stderr.txt"
    with stderr.open("w") as err_file:    # a file, not a pipe: survivors would hold a pipe open
        proc = subprocess.Popen(
            [sys.executable, "-c", _SCRIPT.format(here=str(HERE), markers=str(markers)),
             "sweep", str(spec), "--out", str(out), "--workers", "2", "--quiet"],
            stdout=subprocess.DEVNULL, stderr=err_file)
    family: list = []
    try:
        deadline = time.monotonic() + 120
        while len(list(markers.iterdir())) < 2:       # both workers busy sleeping
            assert proc.poll() is None, stderr.read_text()
            assert time.monotonic() < deadline, "the workers never started their points"
            time.sleep(0.1)
        family = _descendants(proc.pid)
        busy = {int(p.read_text()) for p in markers.iterdir()}
        assert busy <= set(family), (busy, family)
        proc.send_signal(signum)
        proc.wait(timeout=30)
        err = stderr.read_text()
        assert proc.returncode == status, err
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(message), err
        deadline = time.monotonic() + 15
        while any(_alive(p) for p in family) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [p for p in family if _alive(p)], "processes of the sweep survived it"
        journal = (out / "results.jsonl").read_text().splitlines()
        assert sorted(json.loads(line)["params"]["dp"] for line in journal) == [1, 2]
        manifest = json.loads((out / "manifest.json").read_text())
        assert manifest["complete"] is False and manifest["done"] == 2
        assert not [p.name for p in out.iterdir() if p.name.startswith(".") or "tmp" in p.name]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for p in family:                # what the test started, by pid, if it survived
            if _alive(p):
                os.kill(p, signal.SIGKILL)
