"""Output safety: a write interrupted half-way (an exception, Ctrl-C, a
killed process) leaves no file under the final name and no temporary file
behind; a file that existed before keeps its old content; the CLI on error
leaves no output folder."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from distsim.cli import main
from distsim.fileio import atomic_path, write_json_atomic, write_text_atomic


class Boom(Exception):
    pass


def _half_then(exc):
    def write(tmp: Path):
        with open(tmp, "w") as f:
            f.write('{"step_time_s": 1.0, "devi')   # half a JSON document
            f.flush()
            raise exc
    return write


@pytest.mark.parametrize("exc", [Boom("disk on fire"), KeyboardInterrupt(), SystemExit(3)],
                         ids=["exception", "keyboard-interrupt", "system-exit"])
def test_interrupted_write_leaves_no_file(tmp_path, exc):
    target = tmp_path / "summary.json"
    with pytest.raises(type(exc)):
        with atomic_path(target) as tmp:
            _half_then(exc)(tmp)
    assert not target.exists()
    assert os.listdir(tmp_path) == []


def test_interrupted_overwrite_keeps_the_old_file(tmp_path):
    target = tmp_path / "trace.json"
    write_json_atomic(target, {"old": True})
    before = target.read_bytes()
    with pytest.raises(KeyboardInterrupt):
        with atomic_path(target) as tmp:
            _half_then(KeyboardInterrupt())(tmp)
    assert target.read_bytes() == before
    assert os.listdir(tmp_path) == ["trace.json"]


def test_failing_serialisation_leaves_no_file(tmp_path):
    target = tmp_path / "summary.json"
    with pytest.raises(TypeError):
        write_json_atomic(target, {"bad": object()})
    assert os.listdir(tmp_path) == []


def test_completed_write_has_usual_permissions(tmp_path):
    target = tmp_path / "a.txt"
    write_text_atomic(target, "hello\n")
    mask = os.umask(0)
    os.umask(mask)
    assert target.stat().st_mode & 0o777 == 0o666 & ~mask


def test_report_writer_interrupted_mid_trace_leaves_no_trace(tmp_path, monkeypatch):
    """Ctrl-C while trace.json is being streamed (some chunks already in
    the temporary file): summary.json (written first) is complete,
    trace.json does not exist, no temporary file."""
    import importlib

    import distsim
    chrome_trace = importlib.import_module("distsim.report.chrome_trace")  # the module

    result = distsim.simulate(layers=1, hidden=64, batch=64, dp=2, network_mode="analytical")
    real_events = chrome_trace._events
    written = []

    def events_then_interrupt(*a, **k):
        for i, event in enumerate(real_events(*a, **k)):
            if i == 10:
                raise KeyboardInterrupt
            written.append(event)
            yield event

    monkeypatch.setattr(chrome_trace, "_CHUNK", 3)   # several chunks reach the file first
    monkeypatch.setattr(chrome_trace, "_events", events_then_interrupt)
    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        result.write_outputs(out, plots=False)
    assert len(written) == 10
    # write_outputs made the folder, so it removes it again (no partial set
    # of outputs); a folder left behind must hold no partial file either
    names = sorted(os.listdir(out)) if out.exists() else []
    assert "trace.json" not in names
    assert all(not n.startswith(".") for n in names), names
    if "summary.json" in names:
        json.loads((out / "summary.json").read_text())


def test_killed_process_leaves_no_partial_file(tmp_path):
    """SIGKILL in the middle of a large atomic write: whatever is left, the
    final name is absent or complete (never truncated)."""
    target = tmp_path / "big.json"
    script = (
        "import sys, time\n"
        "from distsim.fileio import atomic_path\n"
        "with atomic_path(sys.argv[1]) as tmp:\n"
        "    f = open(tmp, 'w')\n"
        "    f.write('[' + '1,' * 100000)\n"
        "    f.flush()\n"
        "    print('writing', flush=True)\n"
        "    time.sleep(60)\n"
        "    f.write('1]')\n"
        "    f.close()\n")
    proc = subprocess.Popen([sys.executable, "-c", script, str(target)], stdout=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout.readline().strip() == "writing"
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert not target.exists()


def test_ctrl_c_in_the_cli_exits_130_without_output(tmp_path, capsys, monkeypatch):
    import distsim.cli.simulate_cmd as simulate_cmd

    def interrupted(*a, **k):
        raise KeyboardInterrupt
    monkeypatch.setattr(simulate_cmd, "simulate", interrupted)
    out = tmp_path / "out"
    code = main(["simulate", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 130
    assert err.strip() == "distsim: interrupted"
    assert not out.exists()


@pytest.mark.parametrize("args", [
    ["simulate", "--dp", "3"],
    ["simulate", "--model", "nope"],
    ["simulate", "--topology", "dgx-a100-x0"],
    ["sweep", "/nonexistent/spec.yaml"],
])
def test_cli_error_leaves_no_output_folder(tmp_path, capsys, monkeypatch, args):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out"
    code = main([*args, "--out", str(out)])
    assert code == 2
    assert not out.exists()
    assert os.listdir(tmp_path) == []


def test_default_output_folder_is_not_created_on_error(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    proc = subprocess.run([sys.executable, "-m", "distsim", "simulate", "--dp", "0"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert os.listdir(tmp_path) == []
