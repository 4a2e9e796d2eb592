"""``distsim.sweep``: run every point of a grid and return a DataFrame.

    df = distsim.sweep({"model": "mlp", "network_mode": "analytical"},
                       grid={"dp": [1, 2, 4, 8], "hidden": [1024, 4096]},
                       constraints=["dp <= devices"], workers=2, out_dir="sweep-out")

One row per grid point (skipped and failed points included, with the
reason), sorted by point index; see :mod:`.point` for the columns. With
``out_dir`` the sweep is durable and resumable (:mod:`.store`): rerunning
the same call skips the points already in ``out_dir/results.jsonl``.
"""
from __future__ import annotations

import importlib
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, Iterable, List, Mapping, Optional, Tuple, Union


from ..errors import ConfigError
from ..fileio import refuse_file_as_folder
from ..keywords import strict_keywords
from .constraints import ConstraintLike
from .interrupt import stops_on_sigterm
from .point import SimulateFn, empty_metrics
from .progress import Progress
from .runners import DEFAULT_CONNECT_TIMEOUT_S, InProcessRunner, make_runner
from .spec import (SweepPoint, SweepSpec, check_count, check_grid_size, config_key,
                   load_spec)
from .store import JOURNAL, Journal, normalise_row, rows_to_frame, write_tables

if TYPE_CHECKING:     # pandas is imported where a table is made (``import distsim`` stays fast)
    import pandas as pd

#: Seconds between two rewrites of results.csv / .parquet during a sweep.
TABLE_INTERVAL_S = 2.0


def import_in_background(module: str) -> Optional[threading.Thread]:
    """Import ``module`` on a thread of its own while the points run
    elsewhere (the results table's pandas: about half a second that a
    sweep would otherwise spend after its last point, with a core idle);
    None where it is imported already. Started after the runner has
    started its workers: a forked worker must not inherit a thread midway
    through an import."""
    if module in sys.modules:
        return None
    thread = threading.Thread(target=_import_quietly, args=(module,),
                              name=f"distsim-import-{module}", daemon=True)
    thread.start()
    return thread


def _import_quietly(module: str) -> None:
    # a module that fails to import fails again where it is needed, with
    # that code's error (not a thread's traceback)
    try:
        importlib.import_module(module)
    except Exception:
        pass


@strict_keywords
@stops_on_sigterm
def sweep(base_config: Optional[Mapping[str, Any]] = None,
          grid: Optional[Mapping[str, Any]] = None,
          constraints: Optional[Iterable[ConstraintLike]] = None,
          workers: Optional[int] = None, scheduler: Any = None,
          out_dir: Union[str, Path, None] = None, progress: Union[bool, str] = True, *,
          spec: Union[SweepSpec, str, Path, None] = None, simulate: Optional[SimulateFn] = None,
          connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
          max_points: Optional[int] = None, check: Optional[int] = None) -> pd.DataFrame:
    """Simulate every point of ``grid`` over ``base_config``.

    ``base_config`` and ``grid`` keys are ``distsim simulate`` option names
    (``model``, ``topology``, ``network_mode``, ``dp``, ``tp``, ``layers``,
    ...); grid values are lists. ``constraints``: expression strings (e.g.
    ``"dp * tp * pp == devices"``) or callables ``f(config) -> bool``;
    points that fail one are kept as ``skipped`` rows. ``workers``: local
    processes (default: every core; 1 runs in this process). ``scheduler``:
    ``"tcp://HOST:PORT"``, ``"local-dask"`` or a ``distributed.Client``.
    ``out_dir``: keep a journal and results.csv/.parquet there and resume
    from it. ``progress``: a progress bar / lines on stderr (False: quiet).
    ``simulate``: the function to call (default :func:`distsim.simulate`;
    it must be picklable for process and Dask runners).
    ``connect_timeout_s``: how long to wait for a Dask scheduler (seconds).

    ``spec``: instead of ``base_config``, ``grid`` and ``constraints``, a
    :class:`SweepSpec`, a path to a YAML spec, or the name of an example
    in ``reports/sweeps/`` (``"mlp-scaling"``), as ``distsim sweep SPEC`` takes.

    ``max_points``: the most points the grid may expand to (None:
    :data:`~distsim.sweep.spec.DEFAULT_MAX_POINTS`, 100,000; 0: no limit).

    ``check``: after the grid, simulate in full the ``check`` best points
    estimated with ``fidelity: estimate`` that fit in memory (extra rows,
    ``fidelity`` simulate, numbered after the grid; see :func:`check_points`).

    The whole spec is checked, and a scheduler reached, before any work
    starts or any file is written; errors are :class:`ConfigError`.

    SIGTERM (when nothing else handles it) stops the sweep as Ctrl-C does:
    :class:`~.interrupt.Terminated`, a ``KeyboardInterrupt``, once the
    workers are stopped and the journal and tables are written.
    """
    if spec is None:
        if grid is None:
            raise ConfigError("sweep: grid: missing (option -> list of values)")
        spec = SweepSpec.create(base_config, grid, constraints, max_points=max_points)
    elif base_config is not None or grid is not None or constraints is not None:
        raise ConfigError("sweep: give either spec= or base_config/grid/constraints")
    elif isinstance(spec, (str, Path)):      # a YAML file, or an example's name
        spec = load_spec(spec, max_points=max_points)
    elif not isinstance(spec, SweepSpec):
        raise ConfigError(f"sweep: spec: must be a SweepSpec, a path to a YAML spec or the "
                          f"name of an example, got {type(spec).__name__}")
    elif max_points is not None:
        check_grid_size([len(v) for v in spec.grid.values()], max_points, spec.source)
    if check is not None:
        spec.check = check_count(check, spec.base, spec.grid, spec.source)
    points = spec.points()
    if out_dir is not None and not isinstance(out_dir, (str, Path)):
        raise ConfigError(f"--out: must be a path, got {out_dir!r}")
    out = refuse_file_as_folder(out_dir) if out_dir is not None else None
    journal = Journal(out / JOURNAL) if out is not None else None
    done: Dict[str, Dict[str, Any]] = {}
    if journal is not None:
        for p in points:
            if p.key in journal.rows:
                done[p.key] = {**journal.rows[p.key], "index": p.index,
                               "params": normalise_row(p.params)}
    todo = [p for p in points if p.key not in done and p.skip_reason is None]
    runner = make_runner(workers, scheduler, simulate, connect_timeout_s, tasks=len(todo))
    param_names = list(dict.fromkeys([*spec.base, *spec.grid]))
    by_key = {p.key: p for p in points}

    runner_open = bool(todo)
    loader = None
    if todo:
        runner.open()      # reach the scheduler before writing anything
        if not isinstance(runner, InProcessRunner):
            loader = import_in_background("pandas")
    if out is not None:
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as e:     # a file on the path, no permission, a read-only disk
            runner.close()
            raise ConfigError(f"--out {out}: cannot create the folder "
                              f"({e.strerror or e})") from None
    resumed = len(done)
    bar = None

    def record(key: str, fields: Mapping[str, Any]) -> None:
        record_many([(key, fields)])

    def record_many(items: List[Tuple[str, Mapping[str, Any]]]) -> None:
        rows = []
        for key, fields in items:
            p = by_key[key]
            rows.append(normalise_row({"index": p.index, "key": key, "params": p.params,
                                       **fields}))
        if journal is not None:
            journal.extend(rows)
        for row in rows:
            done[row["key"]] = row

    def tables(complete: bool) -> None:
        if out is None:
            return
        df = rows_to_frame(done.values(), param_names)
        counts = df["status"].value_counts().to_dict() if len(df) else {}
        write_tables(df, out, {"name": spec.name, "total": len(points) + len(checks),
                               "done": len(done), "complete": complete,
                               "status_counts": counts, "runner": runner.description,
                               "journal": JOURNAL, "checked": len(checks)})

    checks: List[SweepPoint] = []
    try:
        record_many([(p.key, {"status": "skipped", "reason": p.skip_reason,
                              **empty_metrics()})
                     for p in points if p.key not in done and p.skip_reason is not None])
        bar = Progress(len(points), len(done), enabled=bool(progress), label=spec.name,
                       resumed=resumed, running=lambda: getattr(runner, "running", 0))
        last = time.monotonic()
        if todo:
            bar.start_ticker()      # heartbeat lines / a live bar while points run
            for key, fields in runner.run([(p.key, p.params) for p in todo]):
                record(key, fields)
                bar.update(len(done))
                if out is not None and time.monotonic() - last >= TABLE_INTERVAL_S:
                    tables(complete=False)
                    last = time.monotonic()
        if spec.check:
            bar.close()
            checks = check_points(spec, points, rows_to_frame(done.values(), param_names))
            for p in checks:
                by_key[p.key] = p
                if journal is not None and p.key in journal.rows:
                    done[p.key] = {**journal.rows[p.key], "index": p.index,
                                   "params": normalise_row(p.params)}
            check_todo = [p for p in checks if p.key not in done]
            if check_todo and scheduler is None:     # local processes sized for the checks
                runner.close()
                runner = make_runner(workers, None, simulate, connect_timeout_s,
                                     tasks=len(check_todo))
                runner.open()
            elif check_todo and not runner_open:
                runner.open()
            finished = len(checks) - len(check_todo)
            bar = Progress(len(checks), finished, enabled=bool(progress),
                           label=f"{spec.name}: check",
                           running=lambda: getattr(runner, "running", 0))
            bar.start_ticker()
            for key, fields in runner.run([(p.key, p.params) for p in check_todo]):
                record(key, fields)
                finished += 1
                bar.update(finished)
                tables(complete=False)
    finally:
        if bar is not None:
            bar.close()
        runner.close()
        if loader is not None:
            loader.join()
        if journal is not None:
            journal.close()
        tables(complete=len(done) == len(points) + len(checks))
    return rows_to_frame(done.values(), param_names)


def check_points(spec: SweepSpec, points: List[SweepPoint], df: pd.DataFrame
                 ) -> List[SweepPoint]:
    """The ``spec.check`` best estimated points that fit in memory (by the
    charts' objective: step time at a common batch, else throughput), as
    points to simulate in full: their options with ``fidelity: simulate``
    (GPT models also ``symmetry`` and ``coarsen``, exact in step time and
    much faster; symmetry only where :func:`~.estimate.symmetry_applies`),
    numbered after the grid."""
    from ..models import load_model_config
    from ..report.sweep_charts import ranked
    from ..estimate import symmetry_applies
    estimated = df[df["fidelity"] == "estimate"]
    best = ranked(estimated)
    best = best[~best["oom"].fillna(False).astype(bool)].head(spec.check)
    by_index = {p.index: p for p in points}
    out: List[SweepPoint] = []
    for i, (_, row) in enumerate(best.iterrows()):
        params = dict(by_index[int(row["index"])].params, fidelity="simulate")
        model = params.get("model")
        if model is not None and load_model_config(model).get("family") == "gpt":
            # symmetry unless the ZeRO shards differ between ranks (the
            # simulator refuses that reduced program)
            params.update(symmetry=symmetry_applies(params), coarsen=True)
        out.append(SweepPoint(len(points) + i, params, config_key(params)))
    return out
