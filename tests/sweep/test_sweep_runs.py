"""Runners give the same DataFrame; a killed sweep resumes with no row lost
or duplicated; a killed worker does not lose the sweep; Dask runs it too."""
from __future__ import annotations

import functools
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

import distsim
from distsim.errors import ConfigError
from distsim.sweep.point import metrics_of
from distsim.sweep.runners import LocalProcessRunner, close_pool
from sweep_fakes import TINY

HERE = Path(__file__).resolve().parent
GRID = {"dp": [1, 2, 4, 8], "hidden": [64, 128, 256]}


@pytest.fixture(scope="module")
def reference() -> pd.DataFrame:
    return distsim.sweep(TINY, GRID, workers=1, progress=False)


def journal_keys(out: Path):
    lines = (out / "results.jsonl").read_text().splitlines()
    return [json.loads(line)["key"] for line in lines if line.strip()]


def test_local_processes_match_in_process(reference, tmp_path):
    df = distsim.sweep(TINY, GRID, workers=2, out_dir=tmp_path, progress=False)
    pd.testing.assert_frame_equal(df, reference)
    on_disk = pd.read_parquet(tmp_path / "results.parquet")
    pd.testing.assert_frame_equal(on_disk, reference, check_dtype=False)
    assert len(pd.read_csv(tmp_path / "results.csv")) == len(reference)
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["complete"] is True and manifest["done"] == manifest["total"] == 12


def test_resume_after_the_sweep_is_killed(reference, tmp_path):
    out = tmp_path / "out"
    code = ("import distsim, sweep_fakes\n"
            f"distsim.sweep(sweep_fakes.TINY, {GRID!r}, workers=2, out_dir={str(out)!r},"
            " progress=False, simulate=sweep_fakes.slow_simulate)\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get(
        "PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, start_new_session=True)
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline:
            if (out / "results.jsonl").exists() and len(journal_keys(out)) >= 3:
                break
            assert proc.poll() is None, "the sweep ended before it could be killed"
            time.sleep(0.05)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)     # the coordinator and its workers
        proc.wait()
    before = journal_keys(out)
    assert 3 <= len(before) < len(reference)
    # a torn last line, as a kill in the middle of a write leaves it
    with open(out / "results.jsonl", "a") as f:
        f.write('{"index": 99, "key": "torn')
    df = distsim.sweep(TINY, GRID, workers=2, out_dir=out, progress=False)
    pd.testing.assert_frame_equal(df, reference)
    after = journal_keys(out)
    assert len(after) == len(set(after)) == len(reference)       # none lost, none twice
    assert after[:len(before)] == before                          # done points not redone
    assert json.loads((out / "manifest.json").read_text())["complete"] is True
    # a third run has nothing left to do and returns the same table
    pd.testing.assert_frame_equal(
        distsim.sweep(TINY, GRID, workers=2, out_dir=out, progress=False), reference)
    assert journal_keys(out) == after


def test_a_killed_worker_is_retried_and_nothing_is_lost(reference, tmp_path):
    import sweep_fakes
    simulate = functools.partial(sweep_fakes.kill_worker_once, str(tmp_path / "killed-once"))
    df = distsim.sweep(TINY, GRID, workers=2, out_dir=tmp_path / "out", progress=False,
                       simulate=simulate)
    assert (tmp_path / "killed-once").exists()                    # a worker really died
    pd.testing.assert_frame_equal(df, reference)
    keys = journal_keys(tmp_path / "out")
    assert len(keys) == len(set(keys)) == len(reference)


def test_a_point_that_always_kills_its_worker_is_recorded_failed(tmp_path):
    import sweep_fakes
    df = distsim.sweep(TINY, {"dp": [1, 2, 4]}, workers=2, progress=False,
                       simulate=sweep_fakes.always_kill_dp2)
    assert list(df["status"]) == ["ok", "failed", "ok"]
    assert "worker process died" in df.loc[1, "reason"]


def test_points_that_kill_every_worker_are_failed_rows_not_a_start_error(tmp_path):
    """The workers start (a trivial task runs): the deaths are the points'."""
    import sweep_fakes
    df = distsim.sweep(TINY, {"dp": [1, 2]}, workers=2, progress=False,
                       simulate=sweep_fakes.always_kill)
    assert list(df["status"]) == ["failed", "failed"]


UNGUARDED = """
import threading, time
import distsim
if THREAD:          # forking is unsafe with another thread: workers come from a forkserver
    threading.Thread(target=time.sleep, args=(600,), daemon=True).start()
df = distsim.sweep({"model": "mlp", "network_mode": "analytical", "layers": 2, "batch": 64},
                   {"dp": [1, 2]}, workers=2, progress=False)
print("ROWS", list(df["status"]))
"""


def _run_script(path: Path, body: str, thread: bool) -> subprocess.CompletedProcess:
    path.write_text(f"THREAD = {thread}\n" + body)
    return subprocess.run([sys.executable, str(path)], capture_output=True, text=True,
                          timeout=300, cwd=path.parent)


def test_a_script_without_a_main_guard_gets_one_clear_error(tmp_path):
    """Workers that start from a forkserver (here: the script runs a second
    thread, so it is not forked) each import the script again and start the
    sweep again in their start-up, so no worker ever runs a point: the
    sweep says so and how to fix it, instead of recording every point as
    failed."""
    done = _run_script(tmp_path / "unguarded.py", UNGUARDED, thread=True)
    assert done.returncode != 0
    assert "ROWS" not in done.stdout
    last = done.stderr.strip().splitlines()
    error = [line for line in last if line.startswith("distsim.errors.ConfigError")]
    assert error and 'if __name__ == "__main__":' in error[-1]
    guarded = "if __name__ == '__main__':\n" + "".join(
        "    " + line + "\n" for line in UNGUARDED.strip().splitlines())
    done = _run_script(tmp_path / "guarded.py", guarded, thread=True)
    assert done.returncode == 0 and "ROWS ['ok', 'ok']" in done.stdout, done.stderr[-2000:]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="workers fork only on Linux")
def test_a_single_threaded_script_forks_its_workers_guard_or_not(tmp_path):
    """With no other thread, the first pool's workers are forks of the
    script (nothing imported again), so even an unguarded script runs."""
    done = _run_script(tmp_path / "unguarded.py", UNGUARDED, thread=False)
    assert done.returncode == 0 and "ROWS ['ok', 'ok']" in done.stdout, done.stderr[-2000:]


def test_the_first_pool_forks_and_later_pools_use_the_forkserver():
    """open() starts the first pools (one worker each) by fork where safe
    (Linux, this thread alone); run() uses them once; pools after them come
    from the runner's own (forkserver) context."""
    import threading
    runner = LocalProcessRunner(2)
    alone = threading.active_count() == 1
    runner.open()
    try:
        if not sys.platform.startswith("linux") or not alone:
            assert runner._started is None
            return
        first = runner._pools(2)
        assert len(first) == 2
        assert all(p._mp_context.get_start_method() == "fork" for p in first)
        assert all(p._max_workers == 1 for p in first)
        for pool in first:
            close_pool(pool)
        second = runner._pools(2)
        assert all(p._mp_context.get_start_method() == runner._ctx.get_start_method()
                   for p in second)
        for pool in second:
            close_pool(pool)
    finally:
        runner.close()


def test_missing_summary_fields_are_nan_not_errors():
    metrics = metrics_of({"step_time_s": 2.0, "oom": False, "devices": []}, {"batch": 8})
    assert metrics["samples_per_s"] == 4.0
    assert metrics["tokens_per_s"] is None and metrics["mfu"] is None
    metrics = metrics_of({"step_time_s": 2.0, "bubble_fraction": 0.25, "tokens_per_s": 7},
                         {})
    assert metrics["bubble_s"] == 0.5 and metrics["tokens_per_s"] == 7.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_scheduler_fails_fast_and_writes_nothing(tmp_path):
    pytest.importorskip("distributed")
    out = tmp_path / "out"
    start = time.monotonic()
    with pytest.raises(ConfigError, match="cannot reach the Dask scheduler within 1 s"):
        distsim.sweep(TINY, GRID, scheduler=f"tcp://127.0.0.1:{_free_port()}", out_dir=out,
                      progress=False, connect_timeout_s=1)
    assert time.monotonic() - start < 30
    assert not out.exists()
    with pytest.raises(ConfigError, match="expected tcp://HOST:PORT or local-dask"):
        distsim.sweep(TINY, GRID, scheduler="localhost:8786", out_dir=out, progress=False)
    assert not out.exists()


def test_dask_local_cluster_gives_the_same_frame(reference, tmp_path):
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                                  protocol="tcp", dashboard_address=None) as cluster:
        df = distsim.sweep(TINY, GRID, scheduler=cluster.scheduler_address,
                           out_dir=tmp_path, progress=False)
    pd.testing.assert_frame_equal(df, reference)
    assert json.loads((tmp_path / "manifest.json").read_text())["runner"].startswith("dask")


class _Worker:
    def __init__(self, alive):
        self.alive, self.killed = alive, False

    def is_alive(self):
        return self.alive

    def kill(self):
        self.alive, self.killed = False, True


class _Pool:
    """Stands for a ProcessPoolExecutor: its workers and whether it broke."""

    def __init__(self, broken, workers):
        self._broken = broken
        self._processes = dict(enumerate(workers))
        self.alive_at_shutdown = None

    def shutdown(self, wait, cancel_futures):
        assert wait and cancel_futures
        self.alive_at_shutdown = [w.alive for w in self._processes.values()]


def test_a_broken_pool_is_waited_for_only_once_its_workers_are_dead():
    """A worker started by a submit racing with the pool's breakdown is not
    stopped by the pool, which then waits for it forever: close_pool kills
    the broken pool's live workers before waiting; a healthy pool's workers
    are left to stop by themselves."""
    from distsim.sweep.runners import close_pool
    stray, dead = _Worker(alive=True), _Worker(alive=False)
    broken = _Pool("a child process terminated abruptly", [dead, stray])
    close_pool(broken)
    assert stray.killed and not dead.killed
    assert broken.alive_at_shutdown == [False, False]
    working = _Worker(alive=True)
    healthy = _Pool(False, [working])
    close_pool(healthy)
    assert not working.killed and healthy.alive_at_shutdown == [True]


def test_pandas_is_imported_while_the_points_run_and_no_thread_is_left():
    """A sweep on worker processes imports the table's pandas on a thread of
    its own while they run (after they started: a fork must not copy a
    thread midway through an import); the thread is joined by the end."""
    code = ("import sys, threading, distsim\n"
            "assert 'pandas' not in sys.modules\n"
            "if __name__ == '__main__':\n"
            "    df = distsim.sweep({'model': 'mlp', 'network_mode': 'analytical', 'layers': 2,"
            " 'batch': 64}, {'dp': [1, 2]}, workers=2, progress=False)\n"
            "    names = [t.name for t in threading.enumerate()]\n"
            "    print('ROWS', list(df['status']), 'THREADS', names)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "ROWS ['ok', 'ok'] THREADS ['MainThread']" in done.stdout


def test_the_background_import_is_skipped_for_a_module_already_imported():
    from distsim.sweep.driver import import_in_background
    assert import_in_background("json") is None
    thread = import_in_background("distsim_no_such_module_xyz")
    assert thread is not None
    thread.join(timeout=60)      # failed quietly: the table's own import says why
    assert not thread.is_alive()
