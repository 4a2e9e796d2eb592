"""Run the benchmarks, each in a fresh process, and collect one JSON-ready
dict of figures (``distsim bench --json``)."""
from __future__ import annotations

import multiprocessing as mp
import platform
import time
from typing import Any, Callable, Dict, Iterable, Optional

from ..errors import ConfigError
from .cases import BENCHMARKS, peak_rss_bytes
from .counted import growth_counts
from .fresh import in_fresh_process

#: Benchmarks run only when asked for by name (``--only``): growth in
#: counted instructions and cache misses needs Valgrind and takes about a
#: quarter of an hour.
OPTIONAL = {"growth_counts": growth_counts}
#: every benchmark, by name
ALL = {**BENCHMARKS, **OPTIONAL}

# The key each benchmark's peak resident memory is reported under.
RSS_KEYS = {"gpt3": "gpt3_1024_peak_rss_bytes", "engine": "engine_peak_rss_bytes",
            "allreduce": "allreduce_peak_rss_bytes", "growth": "growth_peak_rss_bytes"}


def _measured(name: str, quick: bool) -> Dict[str, Any]:
    figures = ALL[name](quick)
    figures["_rss"] = peak_rss_bytes()
    return figures


def run_one(name: str, quick: bool) -> Dict[str, Any]:
    """One benchmark in its own process (its peak RSS is its own)."""
    figures = in_fresh_process(_measured, name, quick)
    if "_error" in figures:
        figures = {f"{name}_note": figures.pop("_error")}
    rss = figures.pop("_rss", None)
    if name in RSS_KEYS and rss is not None and figures.get(RSS_KEYS[name], 0) is not None:
        figures[RSS_KEYS[name]] = rss
    return figures


def run_suite(names: Optional[Iterable[str]] = None, quick: bool = False,
              progress: Optional[Callable[[str], None]] = None) -> Dict[str, Any]:
    """The benchmarks ``names`` (default: all but the :data:`OPTIONAL`
    ones); returns the merged figures plus the machine they ran on."""
    out: Dict[str, Any] = {"quick": quick, "machine": {
        "python": platform.python_version(), "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(), "cpus": mp.cpu_count()}}
    for name in names or BENCHMARKS:
        if name not in ALL:
            raise ConfigError(f"no benchmark named {name!r} (one of {', '.join(sorted(ALL))})")
        if progress:
            progress(name)
        start = time.perf_counter()
        figures = run_one(name, quick)
        figures[f"{name}_benchmark_wall_s"] = time.perf_counter() - start
        out.update(figures)
    return out
