"""What runs the points of a sweep: this process, local worker processes,
or a Dask cluster. Every runner calls :func:`.point.run_point` on the same
options, so the rows are the same whatever runs them; the driver sorts them
by point index.

A runner is opened before any output is written (so an unreachable
scheduler fails first), yields ``(key, row)`` pairs as points finish, and is
closed at the end.
"""
from __future__ import annotations

import importlib
import multiprocessing
import os
import re
import signal
import sys
import threading
from collections import deque
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Deque, Dict, Iterator, List, Optional, Sequence, Tuple

from ..errors import ConfigError
from .batches import Lanes, Task, batch_tasks, estimated
from .point import SimulateFn, empty_metrics, run_batch, run_point

Result = Tuple[str, Dict[str, Any]]        # (point key, row fields)

#: How long ``--scheduler tcp://...`` waits for the scheduler by default.
DEFAULT_CONNECT_TIMEOUT_S = 10.0
_ADDRESS = re.compile(r"^(tcp|tls|ws|wss|inproc|ucx)://[^\s/]+(:\d+)?/?$")


def default_workers() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def check_workers(workers: Any) -> int:
    if workers is None:
        return default_workers()
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ConfigError(f"--workers: must be a positive integer, got {workers!r}")
    return workers


#: Why no worker process starts, almost always (see :func:`_workers_start`).
WORKERS_CANNOT_START = (
    "sweep: the worker processes die as they start. Each one imports the main script "
    "again before it runs a point, so a script that runs a sweep must call it under "
    "`if __name__ == \"__main__\":` (or pass workers=1 to run in this process)")


def close_pool(pool: ProcessPoolExecutor) -> None:
    """Shut ``pool`` down and wait for its workers.

    A pool that broke (a worker died) stops its other workers and then
    waits for each of them; but a worker started by a ``submit`` that ran
    while the pool was noticing the death is not stopped and is waited for
    forever (a race in Python 3.11's ProcessPoolExecutor between ``submit``
    and the manager thread's handling of a broken pool; seen here once, a
    sweep test hanging in a full test run). So the workers of a broken pool
    still alive are killed first: submits come from this thread, so none
    can start one now."""
    if getattr(pool, "_broken", False):
        stop_workers(pool)
    pool.shutdown(wait=True, cancel_futures=True)


def stop_workers(pool: ProcessPoolExecutor) -> None:
    """Kill ``pool``'s workers still alive (SIGKILL: a point may be deep in
    native code); :func:`close_pool` then shuts the pool down without
    waiting for the points they were running."""
    for worker in list((getattr(pool, "_processes", None) or {}).values()):
        if worker.is_alive():
            worker.kill()


def _workers_start(ctx: Any) -> bool:
    """Whether a worker process of ``ctx`` starts and runs a trivial task.
    When none does, every point would be recorded as failed after its
    retries; the usual cause is a script without a ``__main__`` guard,
    which each worker imports again and which starts the sweep again in
    the middle of the worker's start-up."""
    pool = ProcessPoolExecutor(max_workers=1, mp_context=ctx)
    try:
        return pool.submit(os.getpid).result() > 0
    except BrokenProcessPool:
        return False
    finally:
        close_pool(pool)


def _died(task_key: str, detail: str) -> Dict[str, Any]:
    return {"status": "failed", "reason": f"worker process died while simulating this point "
                                          f"({detail})", **empty_metrics()}


class InProcessRunner:
    """Runs every point here, one after the other (``--workers 1``)."""

    description = "in-process"

    def __init__(self, simulate: Optional[SimulateFn] = None) -> None:
        self.simulate = simulate
        self.running = 0        # points in flight (for the progress line)

    def open(self) -> None:
        pass

    def run(self, tasks: Sequence[Task]) -> Iterator[Result]:
        for key, params in tasks:
            self.running = 1
            row = run_point(params, self.simulate)
            self.running = 0
            yield key, row

    def close(self) -> None:
        pass


#: Batches in flight per local worker: the one it runs and one queued
#: behind it, so that it starts its next batch as soon as it finishes one
#: instead of waiting for this process to hear of it and send another (a
#: few milliseconds a batch on a busy machine: a few percent of a sweep).
BATCHES_PER_WORKER = 2

#: What a worker process needs imported before it runs a point (the estimator:
#: the points of most sweeps).
_WORKER_MODULES = ("distsim.api", "distsim.sweep.point", "distsim.estimate")


def _context():
    """Worker processes fork from a server process that has imported distsim
    once (``forkserver``: no state inherited from this process, safe
    whatever threads it runs); ``spawn`` where there is no forkserver."""
    if "forkserver" in multiprocessing.get_all_start_methods():
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(list(_WORKER_MODULES))
        return ctx
    return multiprocessing.get_context("spawn")


def _fork_context():
    """``fork`` where forking this process now is safe: on Linux, with no
    thread but this one (a child forked while another thread holds a lock
    would find it held forever); else None. A forked worker starts at once
    with everything this process has imported, where a forkserver first
    starts an interpreter and imports distsim again (about a second, most
    of a small sweep)."""
    if (not sys.platform.startswith("linux") or threading.active_count() != 1
            or "fork" not in multiprocessing.get_all_start_methods()):
        return None
    for name in _WORKER_MODULES:        # imported once here, not in each worker
        importlib.import_module(name)
    return multiprocessing.get_context("fork")


def _worker_signals() -> None:
    """A forked worker's signals as a forkserver's worker has them: SIGTERM
    ends it (this process's handler, which raises
    :class:`~.interrupt.Terminated`, is inherited by a fork)."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


class LocalProcessRunner:
    """Runs points in ``workers`` local processes, in batches
    (:func:`.batches.batch_tasks`: estimated points that share a per-layer
    profile together, other points one by one), each process a pool of its
    own that runs one lane of batches (:class:`.batches.Lanes`): a process
    keeps to one part of the grid, so what it computes once (profiles, the
    collectives' times of its data-parallel teams) serves the points after
    it; a shared pool would hand each batch to whichever process is free,
    and every process would time every team's collectives. At most
    :data:`BATCHES_PER_WORKER` batches per process are in flight (one it
    runs, one queued behind it). If a worker dies (killed, out of memory, a
    crash in native code), its pool is restarted and the points that were
    in flight there are retried one at a time in a pool of their own; a
    point that kills its worker again is recorded as failed. No finished
    point is lost or run twice. If a worker dies before any point has
    finished and not even a trivial task can run in a fresh worker, the
    sweep stops with a :class:`ConfigError` (:data:`WORKERS_CANNOT_START`)
    instead.

    :meth:`open` starts the first pools' workers by forking this process
    where that is safe (:func:`_fork_context`: before the progress line's
    thread starts); every other pool (after a worker died, a retried point,
    a run without :meth:`open`) forks from a forkserver."""

    def __init__(self, workers: int, simulate: Optional[SimulateFn] = None) -> None:
        self.workers = workers
        self.simulate = simulate
        self.description = f"{workers} local processes"
        self._ctx = _context()
        self._started: Optional[List[ProcessPoolExecutor]] = None   # opened, not yet run
        self.running = 0

    def open(self) -> None:
        ctx = _fork_context()
        if ctx is not None and self._started is None:
            self._started = []
            for _ in range(self.workers):
                pool = ProcessPoolExecutor(max_workers=1, mp_context=ctx,
                                           initializer=_worker_signals)
                pool.submit(os.getpid)   # a fork pool starts its worker at its first task
                self._started.append(pool)

    def _pools(self, n: int) -> List[ProcessPoolExecutor]:
        """``n`` one-process pools: the ones :meth:`open` started (once, when
        ``n`` is their number), else new ones from the forkserver."""
        if self._started is not None and n == self.workers:
            pools, self._started = self._started, None
            return pools
        return [self._pool() for _ in range(n)]

    def _pool(self) -> ProcessPoolExecutor:
        return ProcessPoolExecutor(max_workers=1, mp_context=self._ctx)

    def run(self, tasks: Sequence[Task]) -> Iterator[Result]:
        queue = Lanes(batch_tasks(tasks), self.workers)
        suspects: List[Task] = []
        finished_any = False
        pools = self._pools(min(self.workers, sum(len(lane) for lane in queue.lanes)))
        # (lane, batch) of each batch in flight
        inflight: Dict[Future, Tuple[int, List[Task]]] = {}
        # each lane's batches in flight, in the order they were sent: the
        # first is the one running (for the progress line)
        sent: Dict[int, Deque[Future]] = {lane: deque() for lane in range(len(pools))}

        def fill(lane: int) -> bool:
            """Send ``lane``'s worker its next batch if it may take one now:
            when idle, or behind estimated batches when the next is one too
            (a long simulated point must not hold a batch that an idle
            worker could run)."""
            if not queue or len(sent[lane]) >= BATCHES_PER_WORKER:
                return False
            if sent[lane] and not (estimated(queue.peek(lane)) and
                                   all(estimated(inflight[f][1]) for f in sent[lane])):
                return False
            batch = queue.take(lane)
            try:
                fut = pools[lane].submit(run_batch, [t[1] for t in batch], self.simulate)
            except BrokenProcessPool:   # its worker died since the last wait
                queue.put_back(lane, batch)
                restart(lane)
                return True
            inflight[fut] = (lane, batch)
            sent[lane].append(fut)
            return True

        def restart(lane: int) -> None:
            """Lane ``lane``'s worker died: its batches in flight become
            suspects and the lane gets a fresh pool."""
            nonlocal finished_any
            while sent[lane]:
                suspects.extend(inflight.pop(sent[lane].popleft())[1])
            close_pool(pools[lane])
            if not finished_any and not _workers_start(self._ctx):
                raise ConfigError(WORKERS_CANNOT_START)
            finished_any = True       # workers do start: check once
            pools[lane] = self._pool()

        try:
            while queue or inflight:
                while any([fill(lane) for lane in range(len(pools))]):
                    pass                      # lanes in turn, one batch each a round
                if not inflight:
                    continue
                self.running = sum(len(inflight[q[0]][1]) for q in sent.values() if q)
                done, _ = wait(list(inflight), return_when=FIRST_COMPLETED)
                broken = set()
                for fut in sorted(done, key=lambda f: inflight[f][1][0][0]):
                    lane, batch = inflight[fut]
                    try:
                        rows = fut.result()
                    except BrokenProcessPool:
                        broken.add(lane)
                        continue
                    del inflight[fut]
                    sent[lane].remove(fut)
                    finished_any = True
                    yield from ((task[0], row) for task, row in zip(batch, rows))
                for lane in sorted(broken):
                    restart(lane)
        except BaseException:
            # interrupted (Ctrl-C, SIGTERM) or closed early: the points in
            # flight are not waited for (not journalled: a rerun runs them)
            for pool in pools:
                stop_workers(pool)
            raise
        finally:
            for pool in pools:
                close_pool(pool)
        self.running = 0
        for task in suspects:
            self.running = 1
            row = self._isolated(task)
            self.running = 0
            yield task[0], row

    def _isolated(self, task: Task) -> Dict[str, Any]:
        pool = self._pool()
        try:
            return pool.submit(run_point, task[1], self.simulate).result()
        except BrokenProcessPool as e:
            return _died(task[0], str(e) or "the process pool broke")
        except BaseException:
            stop_workers(pool)        # interrupted: do not wait for the point
            raise
        finally:
            close_pool(pool)

    def close(self) -> None:
        if self._started is not None:          # opened but never run
            pools, self._started = self._started, None
            for pool in pools:
                close_pool(pool)


class DaskRunner:
    """Runs points as tasks on a Dask distributed cluster, in batches as
    local workers do (:meth:`run`): ``scheduler`` is a
    scheduler address (``tcp://HOST:PORT``; reached within ``timeout_s`` or
    a :class:`ConfigError`), ``"local-dask"`` (a LocalCluster of
    ``workers`` processes started here and stopped at the end) or a
    ``distributed.Client``."""

    def __init__(self, scheduler: Any, workers: Optional[int] = None,
                 simulate: Optional[SimulateFn] = None,
                 timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S) -> None:
        self.scheduler = scheduler
        self.workers = workers
        self.simulate = simulate
        self.timeout_s = timeout_s
        self.client = None
        self.cluster = None
        self._own_client = False
        self.running = 0
        self.submitted = 0      # Dask tasks submitted (a batch of points each)
        name = scheduler if isinstance(scheduler, str) else type(scheduler).__name__
        self.description = f"dask ({name})"
        if isinstance(scheduler, str) and scheduler != "local-dask" \
                and not _ADDRESS.match(scheduler):
            raise ConfigError(f"--scheduler: expected tcp://HOST:PORT or local-dask, "
                              f"got {scheduler!r}")

    def open(self) -> None:
        try:
            import distributed
        except ImportError:
            raise ConfigError("--scheduler needs the Dask distributed package: "
                              "pip install 'distsim[dask]' (or: pip install distributed)") from None
        if not isinstance(self.scheduler, str):
            self.client = self.scheduler
            return
        if self.scheduler == "local-dask":
            try:
                self.cluster = distributed.LocalCluster(
                    n_workers=self.workers or default_workers(), threads_per_worker=1,
                    processes=True, dashboard_address=None)
                self.client = distributed.Client(self.cluster, timeout=self.timeout_s)
            except Exception as e:
                self.close()
                raise ConfigError(f"--scheduler local-dask: cannot start a local Dask cluster "
                                  f"({_one_line(e)})") from None
        else:
            self.client = connect_client(distributed, self.scheduler, self.timeout_s)
        self._own_client = True

    def run(self, tasks: Sequence[Task]) -> Iterator[Result]:
        """Each batch of :func:`.batches.batch_tasks` is one Dask task (estimated
        points that share a per-layer profile build it once, as in local
        workers); a batch whose task fails (a worker lost, a lost
        connection) has its points run again one task each, and a point
        whose own task fails is recorded as failed."""
        from distributed import as_completed
        if not tasks:
            return
        futures: Dict[Any, List[Task]] = {}

        def submit(batch: List[Task]) -> Any:
            name = f"distsim-{'batch' if len(batch) > 1 else 'point'}-{batch[0][0]}"
            fut = self.client.submit(run_batch, [t[1] for t in batch], self.simulate,
                                     key=f"{name}-{len(batch)}", pure=False)
            futures[fut] = batch
            self.submitted += 1
            return fut

        pending = as_completed([submit(b) for b in batch_tasks(tasks)], loop=self.client.loop)
        self.running = len(tasks)     # submitted and not finished
        try:
            for fut in pending:
                batch = futures.pop(fut)
                error: Optional[Exception] = None
                try:
                    rows = fut.result()
                except Exception as e:  # KilledWorker, a lost connection, ...
                    error = e
                fut.release()
                if error is not None:
                    if len(batch) > 1:
                        for task in batch:
                            pending.add(submit([task]))
                        continue
                    rows = [_died(batch[0][0], f"{type(error).__name__}: {error}")]
                for task, row in zip(batch, rows):
                    self.running -= 1
                    yield task[0], row
        finally:
            for fut in futures:
                fut.release()

    def close(self) -> None:
        if self._own_client and self.client is not None:
            self.client.close()
        if self.cluster is not None:
            self.cluster.close()
        self.client = None
        self.cluster = None


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split())[:200]
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


#: Extra seconds given to a connection attempt past its own timeout.
CONNECT_GRACE_S = 2.0


def connect_client(distributed: Any, address: str, timeout_s: float,
                   grace_s: float = CONNECT_GRACE_S) -> Any:
    """A ``distributed.Client`` on ``address`` within ``timeout_s`` (plus a
    small grace), whatever answers there: the attempt runs in a daemon
    thread that is given up on at the deadline (a server that accepts and
    then says nothing, or not Dask's protocol, can hold the client's own
    handshake far past its timeout), and any failure (a refused
    connection, a garbled reply that makes the protocol allocate
    nonsense, ...) is a :class:`ConfigError` naming the address. A client
    that connects after the deadline is closed."""
    state: Dict[str, Any] = {}
    lock = threading.Lock()

    def attempt() -> None:
        try:
            client = distributed.Client(address, timeout=timeout_s, set_as_default=False)
        except BaseException as e:  # noqa: BLE001 - reported to the caller, whatever it is
            with lock:
                state["error"] = e
            return
        with lock:
            if state.get("abandoned"):
                late = client
            else:
                state["client"] = client
                late = None
        if late is not None:
            try:
                late.close()
            except Exception:  # pragma: no cover - best effort on a late connection
                pass

    thread = threading.Thread(target=attempt, name=f"distsim-connect-{address}", daemon=True)
    thread.start()
    thread.join(timeout_s + grace_s)
    with lock:
        if "client" in state:
            return state["client"]
        state["abandoned"] = True
        error = state.get("error")
    if error is None:
        raise ConfigError(f"--scheduler {address}: no Dask scheduler answered within "
                          f"{timeout_s:g} s (is it a Dask scheduler's address?)")
    raise ConfigError(f"--scheduler {address}: cannot reach the Dask scheduler within "
                      f"{timeout_s:g} s ({_one_line(error)})")


#: The longest ``--connect-timeout`` (a day; longer ones overflow the clocks).
MAX_CONNECT_TIMEOUT_S = 86400.0


def check_connect_timeout(value: Any) -> float:
    """``--connect-timeout`` as a positive, finite number of seconds (a NaN
    or infinite one would reach ``Thread.join`` and fail there, not here)."""
    # NaN and infinity fail the range too
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not 0 < value <= MAX_CONNECT_TIMEOUT_S:
        raise ConfigError(f"--connect-timeout: must be a number of seconds in "
                          f"(0, {MAX_CONNECT_TIMEOUT_S:g}], got {value!r}")
    return float(value)


def make_runner(workers: Any = None, scheduler: Any = None,
                simulate: Optional[SimulateFn] = None,
                connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
                tasks: Optional[int] = None):
    """The runner for ``--workers``/``--scheduler`` (not opened yet)."""
    check_connect_timeout(connect_timeout_s)
    if scheduler is not None:
        n = check_workers(workers) if workers is not None else None
        return DaskRunner(scheduler, n, simulate, connect_timeout_s)
    n = check_workers(workers)
    if tasks is not None:
        n = max(1, min(n, tasks))
    return InProcessRunner(simulate) if n == 1 else LocalProcessRunner(n, simulate)
