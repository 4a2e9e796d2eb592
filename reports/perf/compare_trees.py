"""Two checkouts of distsim timed against each other, interleaved.

    python reports/perf/compare_trees.py TREE_A PYTHON_A TREE_B PYTHON_B [--rounds N]
        [--only grid|gpt3|bench] [--bench NAME ...]

Each round runs, for A and then B (B first every second round, so that neither
side always goes first), each measurement in a fresh process of that
tree's Python with the tree first on ``PYTHONPATH``:

- ``grid``: the sweep benchmark's GPT-3 175B grid on 1024 GPUs
  (``distsim.bench.cases.SWEEP_GRID``, estimated, analytical network) in
  one process (``workers=1``): its CPU seconds, and the points evaluated;
- ``gpt3``: the GPT-3 benchmark's step (``distsim.bench.cases.gpt3_1024``):
  its wall and CPU seconds;
- ``bench`` (only when named): ``distsim bench --json`` of the benchmarks
  ``--bench`` names (default: engine, allreduce, gpt3, sweep; growth takes
  minutes more), its table's figures.

CPU seconds are the figures that compare on a machine shared with other
work (wall seconds there include other processes' turns). This machine's
speed also drifts by 20-40 % within an hour, so only pairs run side by side
compare; the script prints each round's pair, each side's median, the
median of the per-round ratios B / A and whether B is no worse than A by
that median (a time: B / A <= 1; a rate or efficiency: >= 1).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

#: The child's code: one measurement, its figures as one JSON line on stdout.
CHILD = r"""
import json, sys, time
what = sys.argv[1]
if what == "grid":
    import pandas  # noqa: F401  (the results table's; not timed)
    from distsim.bench.cases import SWEEP_GRID
    from distsim.sweep import sweep
    base = {"model": "gpt3-175b", "topology": "dgx-a100-x128", "network_mode": "analytical",
            "fidelity": "estimate"}
    cpu, wall = time.process_time(), time.perf_counter()
    df = sweep(base, SWEEP_GRID, workers=1, progress=False)
    out = {"grid_cpu_s": time.process_time() - cpu, "grid_wall_s": time.perf_counter() - wall,
           "grid_points_ok": int((df["status"] == "ok").sum())}
elif what == "gpt3":
    from distsim.bench.cases import gpt3_1024
    cpu = time.process_time()
    r = gpt3_1024(False)
    out = {"gpt3_cpu_s": time.process_time() - cpu, "gpt3_wall_s": r["gpt3_1024_wall_s"],
           "gpt3_step_time_s": r["gpt3_step_time_s"]}
else:
    import subprocess
    names = [a for n in sys.argv[2:] for a in ("--only", n)]
    done = subprocess.run([sys.executable, "-m", "distsim", "bench", "--json", *names],
                          check=True, capture_output=True, text=True)
    out = json.loads(done.stdout)
print(json.dumps(out))
"""

#: The figures compared per measurement, each with the better direction.
FIGURES = {
    "grid": (("grid_cpu_s", "lower"), ("grid_wall_s", "lower")),
    "gpt3": (("gpt3_cpu_s", "lower"), ("gpt3_wall_s", "lower")),
    "bench": (("engine_efficiency", "higher"), ("gpt3_1024_wall_s", "lower"),
              ("gpt3_1024_peak_rss_bytes", "lower"), ("allreduce_1024_wall_s", "lower"),
              ("sweep_configs_per_s", "higher"), ("sweep_configs_per_bare_mevent", "higher"),
              ("growth_exponent", "lower")),
}
#: What ``bench`` runs unless ``--bench`` says.
BENCH = ("engine", "allreduce", "gpt3", "sweep")


def measure(tree: str, python: str, what: str, bench=BENCH) -> dict:
    env = dict(os.environ, PYTHONPATH=tree)
    done = subprocess.run([python, "-c", CHILD, what, *bench], cwd=tree, env=env, check=True,
                          capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("tree_a")
    ap.add_argument("python_a")
    ap.add_argument("tree_b")
    ap.add_argument("python_b")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--only", action="append", choices=sorted(FIGURES),
                    help="a measurement (repeatable; default: grid and gpt3)")
    ap.add_argument("--bench", nargs="+", default=list(BENCH),
                    help="the benchmarks of the bench measurement")
    args = ap.parse_args(argv)
    sides = {"A": (args.tree_a, args.python_a), "B": (args.tree_b, args.python_b)}
    whats = args.only or ["gpt3", "grid"]
    runs = {(s, w): [] for s in sides for w in whats}
    for r in range(args.rounds):
        order = "AB" if r % 2 == 0 else "BA"
        for what in whats:
            for side in order:
                runs[side, what].append(measure(*sides[side], what, args.bench))
            a, b = runs["A", what][-1], runs["B", what][-1]
            keys = [k for k, _ in FIGURES[what] if k in a]
            print(f"round {r + 1} {what}: A {_show(a, keys)}  B {_show(b, keys)}", flush=True)
    print(f"A = {args.tree_a}\nB = {args.tree_b}")
    for what in whats:
        for key, better in FIGURES[what]:
            a = [x[key] for x in runs["A", what] if x.get(key) is not None]
            b = [x[key] for x in runs["B", what] if x.get(key) is not None]
            if not a or len(a) != len(b):
                continue
            ratio = statistics.median(y / x for x, y in zip(a, b))
            ok = ratio <= 1 if better == "lower" else ratio >= 1
            print(f"{key} ({better} is better): A median {statistics.median(a):.4g} "
                  f"({_list(a)})  B median {statistics.median(b):.4g} ({_list(b)})  "
                  f"B/A per round, median {ratio:.3f}: B {'no worse' if ok else 'WORSE'}")
    return 0


def _list(xs) -> str:
    return ", ".join(f"{x:.4g}" for x in xs)


def _show(figures: dict, keys) -> str:
    return json.dumps({k: figures[k] for k in keys})


if __name__ == "__main__":
    sys.exit(main())
