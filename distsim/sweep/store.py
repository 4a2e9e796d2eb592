"""Where a sweep keeps its results in ``--out DIR``, durably.

* ``results.jsonl``: the journal. One JSON line per finished point,
  appended by the coordinating process only, flushed and fsynced before the
  next point is counted as done. A killed run leaves at most a torn last
  line, which the next run cuts off. Resuming reads it and skips every point
  whose key (a hash of its options) is already there; a key seen twice
  counts once.
* ``results.csv`` and ``results.parquet``: the table, rewritten atomically
  (temporary file + rename) as rows arrive and at the end, sorted by point
  index; never a truncated file.
* ``manifest.json``: ``{"name", "total", "done", "complete", ...}``,
  rewritten with the tables; ``complete`` is true only when every point of
  the spec has a row.
"""
from __future__ import annotations

import json
import math
import os
from collections import abc
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, Iterable, List, Mapping, Optional


from ..errors import ConfigError
from ..fileio import atomic_path, write_json_atomic
from .point import METRICS, RESOLVED

if TYPE_CHECKING:     # pandas is imported where a table is made (``import distsim`` stays fast)
    import pandas as pd

JOURNAL = "results.jsonl"
CSV = "results.csv"
PARQUET = "results.parquet"
MANIFEST = "manifest.json"
ROW_HEAD = ("index", "key")
ROW_TAIL = ("status", "reason", *METRICS, *RESOLVED)


class Journal:
    """Append-only JSONL journal of finished points, keyed by point key."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.rows: Dict[str, Dict[str, Any]] = {}
        self._load()
        self._fd: Optional[int] = None

    def _load(self) -> None:
        if not self.path.exists():
            return
        data = self.path.read_bytes()
        end = data.rfind(b"\n") + 1
        if end < len(data):  # a torn last line from a killed run: cut it off
            with open(self.path, "r+b") as f:
                f.truncate(end)
                f.flush()
                os.fsync(f.fileno())
            data = data[:end]
        for n, line in enumerate(data.decode("utf-8", errors="replace").splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                raise ConfigError(f"{self.path}:{n}: not a sweep journal line; remove the "
                                  "file or choose another --out") from None
            if not isinstance(row, dict) or "key" not in row:
                raise ConfigError(f"{self.path}:{n}: not a sweep journal line; remove the "
                                  "file or choose another --out")
            self.rows.setdefault(row["key"], row)

    def append(self, row: Mapping[str, Any]) -> None:
        self.extend([row])

    def extend(self, rows: Iterable[Mapping[str, Any]]) -> None:
        """Append ``rows`` (those not in the journal yet) with one write and
        one fsync: a grid whose constraints skip 100,000 points would
        otherwise wait for 100,000 fsyncs (minutes on a slow disk) before
        its first point runs."""
        lines: List[bytes] = []
        fresh: Dict[str, Dict[str, Any]] = {}
        for row in rows:
            if row["key"] in self.rows or row["key"] in fresh:
                continue
            text = json.dumps(_json_safe(row), sort_keys=False)
            fresh[row["key"]] = json.loads(text)
            lines.append((text + "\n").encode("utf-8"))
        if not lines:
            return
        if self._fd is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        view = memoryview(b"".join(lines))
        while view:
            n = os.write(self._fd, view)
            view = view[n:]
        os.fsync(self._fd)
        self.rows.update(fresh)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _json_safe(value: Any) -> Any:
    # (collections.abc's Mapping: typing's costs several times more per
    # check, and a row has dozens of values)
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, abc.Mapping):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def normalise_row(row: Mapping[str, Any]) -> Dict[str, Any]:
    """A row as it reads back from the journal (JSON round trip), so that a
    fresh run and a resumed one build the same DataFrame."""
    return json.loads(json.dumps(_json_safe(dict(row))))


def rows_to_frame(rows: Iterable[Mapping[str, Any]], param_names: List[str]) -> pd.DataFrame:
    """The results table: index, key, the options (always with
    ``fidelity``), status, reason, metrics, the resolved batch layout;
    sorted by point index. Numeric metrics are floats (NaN when absent),
    ``oom`` a nullable boolean, the resolved sizes nullable integers."""
    import pandas as pd
    names = [n for n in param_names if n != "fidelity"] + ["fidelity"]
    records = []
    for row in sorted(rows, key=lambda r: r["index"]):
        rec: Dict[str, Any] = {"index": row["index"], "key": row["key"]}
        params = row.get("params", {})
        for name in names:
            v = params.get(name)
            rec[name] = json.dumps(v, sort_keys=True) if isinstance(v, (dict, list)) else v
        rec["fidelity"] = params.get("fidelity") or row.get("fidelity") or "simulate"
        rec["status"] = row.get("status")
        rec["reason"] = row.get("reason")
        for m in (*METRICS, *RESOLVED):
            rec[m] = row.get(m)
        records.append(rec)
    columns = [*ROW_HEAD, *names, *ROW_TAIL]
    df = pd.DataFrame.from_records(records, columns=columns)
    df["index"] = df["index"].astype("int64")
    for m in METRICS:
        if m == "oom":
            df[m] = df[m].astype("boolean")
        else:
            df[m] = pd.to_numeric(df[m], errors="coerce").astype("float64")
    for m in RESOLVED:
        df[m] = pd.to_numeric(df[m], errors="coerce").astype("Int64")
    df["fidelity"] = df["fidelity"].astype("object")
    df["reason"] = df["reason"].astype("object")
    return df.reset_index(drop=True)


def write_tables(df: pd.DataFrame, out_dir: Path, manifest: Mapping[str, Any]) -> Dict[str, Path]:
    """Write results.csv, results.parquet (when pyarrow is installed) and
    manifest.json atomically."""
    out = Path(out_dir)
    paths = {"csv": out / CSV, "manifest": out / MANIFEST}
    with atomic_path(paths["csv"]) as tmp:
        df.to_csv(tmp, index=False)
    info = dict(manifest)
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        info["parquet"] = "skipped: pyarrow is not installed (pip install pyarrow)"
    else:
        paths["parquet"] = out / PARQUET
        with atomic_path(paths["parquet"]) as tmp:
            _parquet_frame(df).to_parquet(tmp, index=False)
    write_json_atomic(paths["manifest"], info)
    return paths


def _parquet_frame(df: pd.DataFrame) -> pd.DataFrame:
    """Parquet wants one type per column: option columns that mix types
    (e.g. ``dp`` null and int, or names and numbers) are stored as text."""
    out = df.copy()
    for col in out.columns:
        if out[col].dtype == object and col != "reason":
            values = [v for v in out[col] if v is not None and not
                      (isinstance(v, float) and math.isnan(v))]
            kinds = {type(v) for v in values}
            # an integer past 64 bits (a spec may list one: the point is then
            # invalid) has no parquet type either
            wide = any(isinstance(v, int) and not _INT64[0] <= v <= _INT64[1] for v in values)
            if len(kinds) > 1 or wide:
                out[col] = out[col].map(lambda v: None if v is None else str(v))
    return out


_INT64 = (-(2 ** 63), 2 ** 63 - 1)
