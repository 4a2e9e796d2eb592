"""Growth measured in counted work, not in seconds: how many machine
instructions one simulation executes, and how many of its memory reads miss
a cache of fixed size, counted by Valgrind's cachegrind (optional: a
benchmark, never a test dependency).

Why: wall times on a shared machine move by 20-40 % from run to run, and the
growth benchmark fits an exponent over four points, so one slow run moves k
by a tenth. An instruction count does not depend on the machine's load: it
says whether the *work* grows linearly in the simulated ops. The simulated
cache misses (a 32 MiB, 16-way last-level cache and a 32 KiB first level,
the figures of the machine the report runs on, fixed so that every machine
counts the same) say how much of the remaining growth is the memory
hierarchy: the same work over a larger heap misses more.

Each point runs ``python -m distsim.bench.counted point GPUS TP PP LAYERS
MICROBATCHES`` under cachegrind; a *baseline* run does the same imports and
stops before simulating, and is subtracted, so a point's count is that of
``distsim.simulate(...)`` alone. Both leave by ``os._exit`` (the
interpreter's teardown, a garbage collection over the whole heap, is not
counted) and run with ``PYTHONHASHSEED=0``.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Dict, List, Optional, Sequence

from ..api import simulate
from .cases import (GROWTH_POINTS, GROWTH_POINTS_QUICK, _gpt3_options, fitted_exponent,
                    simulated_ops)

#: the simulated caches (size, associativity, line): this machine's L1d and L3
D1_CACHE = (32 * 1024, 8, 64)
LL_CACHE = (32 * 1024 * 1024, 16, 64)


class CountingUnavailable(RuntimeError):
    """Valgrind is not installed, or a counted run failed."""


def parse_cachegrind(text: str) -> Dict[str, int]:
    """The whole-program totals of a cachegrind output file, by event name
    (``Ir`` instructions, ``D1mr``/``DLmr`` first- and last-level read
    misses, ...): its ``events:`` line names them, its ``summary:`` line
    holds the totals in that order."""
    events: Optional[List[str]] = None
    totals: Optional[List[int]] = None
    for line in text.splitlines():
        if line.startswith("events:"):
            events = line.split()[1:]
        elif line.startswith("summary:"):
            totals = [int(x) for x in line.split()[1:]]
    if events is None or totals is None or len(events) != len(totals):
        raise CountingUnavailable("cachegrind output without an events and a summary line")
    return dict(zip(events, totals))


def _cachegrind_args(out: str) -> List[str]:
    def cache(spec):
        return ",".join(str(x) for x in spec)
    return ["valgrind", "--tool=cachegrind", "--cache-sim=yes", f"--D1={cache(D1_CACHE)}",
            f"--LL={cache(LL_CACHE)}", f"--I1={cache(D1_CACHE)}",
            f"--cachegrind-out-file={out}"]


def count(child_args: Sequence[str], timeout_s: float = 3600) -> Dict[str, int]:
    """Run ``python -m distsim.bench.counted CHILD_ARGS`` under cachegrind
    and return its event totals, and the simulated ops the child printed
    (``simulated_ops``; a point's only)."""
    if shutil.which("valgrind") is None:
        raise CountingUnavailable("valgrind is not installed (apt install valgrind)")
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "cachegrind.out")
        env = dict(os.environ, PYTHONHASHSEED="0")
        proc = subprocess.run(_cachegrind_args(out) + [sys.executable, "-m", __name__,
                                                       *map(str, child_args)],
                              capture_output=True, text=True, env=env, timeout=timeout_s)
        if proc.returncode != 0 or not os.path.exists(out):
            tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            raise CountingUnavailable(f"counted run {' '.join(map(str, child_args))} "
                                      f"failed (exit {proc.returncode}): {tail}")
        with open(out, encoding="utf-8") as fh:
            totals: Dict[str, int] = parse_cachegrind(fh.read())
    printed = proc.stdout.split()
    if printed:
        totals["simulated_ops"] = int(printed[-1])
    return totals


def _misses(counts: Dict[str, int], level: str = "L") -> int:
    """Misses at the last level (``L``) or the first (``1``), reads and writes."""
    return counts.get(f"D{level}mr", 0) + counts.get(f"D{level}mw", 0)


def growth_counts(quick: bool, workers: int = 2,
                  counter: Callable[[Sequence[Any]], Dict[str, int]] = count
                  ) -> Dict[str, Any]:
    """The growth points of benchmark 5 (``quick``: its reduced ones),
    counted: instructions and simulated last-level cache misses of
    ``distsim.simulate`` at each, less the baseline's, and the exponents
    of each against the simulated ops (linear: 1). ``counter`` runs one
    counted child (tests pass a fake)."""
    specs = GROWTH_POINTS_QUICK if quick else GROWTH_POINTS
    microbatches = 32 if quick else 192
    jobs: List[Sequence[Any]] = [("baseline",)] + [("point", *s, microbatches) for s in specs]
    # the longest (most layers) first, so that the workers finish together
    order = sorted(range(len(jobs)), key=lambda i: -(jobs[i][4] if i else 0))
    finished = []

    def run(i: int) -> Dict[str, int]:
        result = counter(jobs[i])
        finished.append(i)      # a counted run takes minutes: say when each ends
        print(f"  counted {' '.join(map(str, jobs[i]))} ({len(finished)}/{len(jobs)})",
              file=sys.stderr, flush=True)
        return result
    with ThreadPoolExecutor(max_workers=workers) as pool:
        done = dict(zip(order, pool.map(run, order)))
    base, counted = done[0], [done[i] for i in range(1, len(jobs))]
    points = []
    for spec, c in zip(specs, counted):
        points.append({"gpus": spec[0], "layers": spec[3], "ops": c["simulated_ops"],
                       "instructions": c["Ir"] - base["Ir"],
                       "ll_misses": _misses(c) - _misses(base),
                       "d1_misses": _misses(c, "1") - _misses(base, "1")})
    ops = [p["ops"] for p in points]

    def slope(key: str) -> float:
        return fitted_exponent(ops, [p[key] for p in points])
    return {"growth_exponent_instructions": slope("instructions"),
            "growth_exponent_ll_misses": slope("ll_misses"),
            "growth_exponent_d1_misses": slope("d1_misses"),
            "growth_instructions_per_op": [p["instructions"] / p["ops"] for p in points],
            "growth_ll_misses_per_op": [p["ll_misses"] / p["ops"] for p in points],
            "growth_count_points": points,
            "growth_count_caches": {"D1": D1_CACHE, "LL": LL_CACHE}}


def _child(argv: Sequence[str]) -> None:   # pragma: no cover - runs under valgrind
    """The counted process: imports (this module's), then (for a point) one
    simulation; it prints the simulated ops and leaves without the
    interpreter's teardown."""
    if argv[0] == "point":
        gpus, tp, pp, layers, microbatches = map(int, argv[1:6])
        result = simulate(**_gpt3_options(gpus, tp, pp, layers, microbatches))
        sys.stdout.write(f"{simulated_ops(result.program)}\n")
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":   # pragma: no cover
    _child(sys.argv[1:])
