"""The individual benchmarks. Each returns a dict of figures; sizes shrink
with ``quick`` so that the whole quick suite runs in under a minute."""
from __future__ import annotations

import resource
import time
from typing import Any, Dict, List

import numpy as np
import simpy

from ..api import simulate
from ..ir.comm import CollectiveType, is_communication
from ..ir.core import Function
from ..models import MLPConfig, mlp_training_step
from ..sim.collectives import run_collective
from ..sim.network import Network
from ..sweep import sweep
from ..sim.simulator import SimulationOptions, simulate_function
from ..sim.symmetry import represented_ops
from .fresh import in_fresh_process, ready_free_memory
from ..topology import load_topology
from ..transforms.data_parallel import DataParallel


def simulated_ops(program: Function) -> int:
    """Ops as the simulated devices execute them: a collective counts once
    per member (in a reduced program, once per member present)."""
    return sum(len(op.attrs.get("present") or op.attrs["ranks"]) if is_communication(op)
               else 1 for op in program.ops)


def bare_simpy_rate(events: int, processes: int = 16) -> float:
    """Timeouts per second that bare SimPy processes achieve here and now."""
    def proc(env: simpy.Environment, n: int):
        for _ in range(n):
            yield env.timeout(1e-6)

    env = simpy.Environment()
    for _ in range(processes):
        env.process(proc(env, events // processes))
    start = time.perf_counter()
    env.run()
    return (events // processes) * processes / (time.perf_counter() - start)


def _mlp_dp(dp: int, layers: int, hidden: int = 256) -> Function:
    return DataParallel(dp)(mlp_training_step(MLPConfig(layers=layers, hidden=hidden,
                                                        batch=dp * 16)))


def engine_efficiency(quick: bool) -> Dict[str, Any]:
    """Simulated ops per second on a large data-parallel program, every
    device simulated (no symmetry reduction, so every op counted is one the
    engine schedules; a collective counts once per member), over the rate
    at which bare SimPy processes yield timeouts in the same process. The
    wall time is all of :func:`simulate_function`: indexing the program,
    the event loop, the per-op times, records and memory curves."""
    layers = 100 if quick else 400
    topo = load_topology("dgx-a100-x8")
    program = _mlp_dp(64, layers)
    n = simulated_ops(program)
    start = time.perf_counter()
    simulate_function(program, topo, options=SimulationOptions(record_memory=False))
    wall = time.perf_counter() - start
    rate = n / wall
    bare = bare_simpy_rate(min(n, 2_000_000))
    return {"engine_efficiency": rate / bare, "engine_ops": n, "engine_wall_s": wall,
            "engine_ops_per_s": rate, "bare_simpy_events_per_s": bare,
            "engine_program": f"mlp {layers} layers, data-parallel 64 on dgx-a100-x8, "
                              "every device simulated"}


def allreduce_1024(quick: bool) -> Dict[str, Any]:
    """A 1 GB all-reduce over every GPU of dgx-a100-x128 (1024), flow model,
    ring and hierarchical; the figure is the slower wall time."""
    nodes = 16 if quick else 128
    topo = load_topology(f"dgx-a100-x{nodes}")
    ranks = tuple(range(topo.num_devices))
    out: Dict[str, Any] = {"allreduce_gpus": len(ranks)}
    walls = []
    for algo in ("ring", "hierarchical"):
        env = simpy.Environment()
        net = Network(env, topo, mode="flow")
        start = time.perf_counter()
        env.process(run_collective(env, net, CollectiveType.ALL_REDUCE, ranks, 1e9,
                                   algorithm=algo))
        env.run()
        wall = time.perf_counter() - start
        walls.append(wall)
        out[f"allreduce_{algo}_wall_s"] = wall
        out[f"allreduce_{algo}_simulated_s"] = env.now
    out["allreduce_1024_wall_s"] = max(walls)
    return out


# (GPUs, tp, pp, layers) of the growth benchmark: benchmark 2 at 64, 256
# and 1024 GPUs, and at twice the layers; 192 micro-batches per pipeline
# throughout (global batch 192 x dp), so the work per replica is the same.
GROWTH_POINTS = [(64, 8, 8, 96), (256, 8, 16, 96), (1024, 8, 16, 96), (1024, 8, 16, 192)]
GROWTH_POINTS_QUICK = [(64, 8, 8, 24), (128, 8, 16, 48), (128, 8, 16, 96)]
#: rounds over the growth points; each point's figure is the median round
GROWTH_REPEATS = 5
#: memory touched and freed before each growth point (see
#: :func:`~distsim.bench.fresh.ready_free_memory`): more than the largest
#: point's peak (about 1.2 GB at 192 layers, 0.2 GB for the quick points)
GROWTH_READY_BYTES = {False: 1_500_000_000, True: 400_000_000}


def fitted_exponent(x: Any, y: Any) -> float:
    """k of ``y ~ x^k``: the slope of the least-squares line through the
    points' logarithms."""
    return float(np.polyfit(np.log(x), np.log(y), 1)[0])


def _gpt3_options(gpus: int, tp: int, pp: int, layers: int, microbatches: int) -> Dict[str, Any]:
    dp = gpus // (tp * pp)
    return dict(model="gpt3-175b", topology=f"dgx-a100-x{gpus // 8}", tp=tp, pp=pp,
                layers=layers, schedule="1f1b", micro_batch=1,
                global_batch=microbatches * dp, symmetry=True, coarsen=True,
                network_mode="flow")


def _growth_point(gpus: int, tp: int, pp: int, layers: int, microbatches: int
                  ) -> Dict[str, Any]:
    """One growth point, timed (run in a fresh process: see :func:`growth`),
    with the CPU time it took in the kernel (``sys_s``: mostly page faults)
    and the process's peak resident memory."""
    before = resource.getrusage(resource.RUSAGE_SELF)
    start = time.perf_counter()
    result = simulate(**_gpt3_options(gpus, tp, pp, layers, microbatches))
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_SELF)
    program = result.program
    return {"gpus": gpus, "layers": layers, "ops": simulated_ops(program),
            "values": len(program.inputs) + sum(len(op.outputs) for op in program.ops),
            "represented_ops": represented_ops(program),
            "step_time_s": result.step_time_s, "wall_s": wall,
            "sys_s": after.ru_stime - before.ru_stime, "peak_rss_bytes": peak_rss_bytes()}


def growth(quick: bool) -> Dict[str, Any]:
    """Wall time of benchmark 2 (GPT-3 175B, 1F1B, symmetry and coarsening,
    flow network) at 64, 256 and 1024 GPUs and at twice the layers, against
    the ops the engine simulates (collectives once per member present): the
    fitted exponent of wall ~ ops^k; linear or better means k <= 1. Each
    point runs in a fresh process, as benchmark 2 does (one after another
    in one process, a run inherits the previous runs' heap and is slower
    for it), and its wall time is the median of ``GROWTH_REPEATS`` rounds
    over all the points (one when quick): on a shared machine one run can
    be 20-40 % slower than the next, and the fit has only a few points.
    Before each point :data:`GROWTH_READY_BYTES` of memory are touched and
    freed (:func:`~distsim.bench.fresh.ready_free_memory`): on a VM that
    gives freed memory back to its host, a point that needs more memory
    than the point before it freed pays the host for the difference, so
    the order of the points bends the fit (GPT-3 at rising sizes, one after
    another: the largest paid twice the others' system time per op; these
    points in four alternating runs: k 1.11 and 1.12 without, 1.08 and
    1.09 with).

    The median, not the best round: this machine's speed drifts over
    seconds, so a short run's times spread wider than a long run's (5.7-6.8
    s at 96 layers, 11.8-12.5 s at 192, five runs each), and the best of a
    few short runs lies further below their typical time than the best of
    the long ones; fitted to the best rounds, k reads higher than the work
    grows. The fit to the best rounds is kept beside it
    (``growth_exponent_best``).

    Beside it, two diagnostics: the exponent against the program's values
    (``growth_exponent_values``: most of the work is per value, its name,
    number, type and lifetime), and that of values against ops
    (``growth_exponent_values_alone``: above 1 when the larger programs
    have more values per op, which a wall time linear in values carries
    into ``growth_exponent``); and k fitted to each round alone
    (``growth_exponent_rounds``, lowest and highest), how far the noise of
    one round moves it."""
    specs = GROWTH_POINTS_QUICK if quick else GROWTH_POINTS
    microbatches = 32 if quick else 192
    points: List[Dict[str, Any]] = []
    for round_ in range(1 if quick else GROWTH_REPEATS):
        for i, spec in enumerate(specs):
            ready_free_memory(GROWTH_READY_BYTES[quick])
            point = in_fresh_process(_growth_point, *spec, microbatches)
            if "_error" in point:
                raise RuntimeError(f"growth point {spec}: {point['_error']}")
            if round_ == 0:
                point["walls_s"], point["sys_s_rounds"] = [], []
                points.append(point)
            points[i]["walls_s"].append(point["wall_s"])
            points[i]["sys_s_rounds"].append(point["sys_s"])
    for p in points:
        p["wall_s"] = float(np.median(p["walls_s"]))
        p["wall_best_s"] = min(p["walls_s"])
        p["sys_s"] = float(np.median(p.pop("sys_s_rounds")))   # of the same rounds
    ops, values, wall, best = ([p[key] for p in points]
                               for key in ("ops", "values", "wall_s", "wall_best_s"))
    # the noise: k fitted to each round's walls alone
    rounds = [fitted_exponent(ops, [p["walls_s"][i] for p in points])
              for i in range(len(points[0]["walls_s"]))]
    return {"growth_exponent": fitted_exponent(ops, wall),
            "growth_exponent_best": fitted_exponent(ops, best),
            "growth_exponent_values": fitted_exponent(values, wall),
            "growth_exponent_values_alone": fitted_exponent(ops, values),
            "growth_exponent_rounds": rounds, "growth_exponent_round_min": min(rounds),
            "growth_exponent_round_max": max(rounds), "growth_points": points}


def gpt3_1024(quick: bool) -> Dict[str, Any]:
    """GPT-3 175B on 1024 A100s (dgx-a100-x128; TP 8, PP 16, DP 8, 1F1B,
    micro-batch 1, global batch 1536), flow network, with symmetry reduction
    and coarsening (both exact in step time, see the tests). Quick: 128 GPUs
    (DP 1) and a global batch of 32. The wall time includes building and
    verifying the program."""
    options = (_gpt3_options(128, 8, 16, 96, 32) if quick else
               _gpt3_options(1024, 8, 16, 96, 192))
    start = time.perf_counter()
    result = simulate(**options)
    summary = result.summary()
    return {"gpt3_1024_wall_s": time.perf_counter() - start,
            "gpt3_gpus": summary["num_devices"], "gpt3_global_batch": options["global_batch"],
            "gpt3_ops": len(result.program.ops),
            # the ops of the full program the reduced, coarsened one stands for
            "gpt3_represented_ops": represented_ops(result.program),
            "gpt3_step_time_s": result.step_time_s,
            "gpt3_mfu": summary.get("mfu"), "gpt3_bubble_fraction": summary.get("bubble_fraction")}


# The GPT-3 175B strategy space on 1024 A100s (benchmark 4): every
# tensor x pipeline degree, micro-batch size, ZeRO stage and recomputation,
# data parallelism filling the GPUs; points that are invalid (tp not
# dividing the heads, more stages than layers, ...) are skipped.
SWEEP_GRID = {"tp": [1, 2, 4, 8], "pp": [1, 2, 4, 8, 16, 32], "micro_batch": [1, 2, 4],
              "zero": [0, 1, 2, 3], "recompute": ["none", "selective", "full"]}
SWEEP_GRID_QUICK = {"tp": [4, 8], "pp": [8, 16], "micro_batch": [1, 2], "zero": [0, 1]}


#: Rounds of benchmark 4 (one when quick); its figures are the median
#: round's (see :func:`sweep_rate`).
SWEEP_REPEATS = 3


def sweep_rate(quick: bool) -> Dict[str, Any]:
    """Configurations per second of a sweep of the GPT-3 175B strategy
    space on 1024 A100s (dgx-a100-x128), analytical network, on 2 worker
    processes: estimated (``fidelity: estimate``, the sweep's fast tier,
    within a few percent of the simulator) and, on a sample of points,
    simulated in full (symmetry and coarsening). Only the points evaluated
    count (not those skipped as invalid). Beside the rate, the bare SimPy
    event rate of this process (:func:`bare_simpy_rate`, after each round)
    and the sweep's rate per million of those events per second
    (``sweep_configs_per_bare_mevent``): the rate with this machine's
    Python speed divided out, to compare runs on different machines.

    The estimated sweep runs :data:`SWEEP_REPEATS` times (once when quick),
    each round a fresh sweep with fresh workers (nothing a round computes
    reaches the next: the workers' caches die with them), and the figures
    are the median round's (the median of the per-round ratios for
    ``sweep_configs_per_bare_mevent``), every round's rate listed
    (``sweep_configs_per_s_rounds``): on this shared machine one round can
    take half as long again as the next (12.8 s and 18.7 s, two rounds in
    a row), and the median, unlike the best, is not moved by one lucky
    round."""
    base = {"model": "gpt3-175b", "topology": "dgx-a100-x128", "network_mode": "analytical"}
    grid = SWEEP_GRID_QUICK if quick else SWEEP_GRID
    # the results table's pandas, imported once a process (a sweep imports
    # it on a thread while its workers run: half a second of CPU taken from
    # them): here before the first round, so that every round is alike
    import pandas  # noqa: F401
    rounds = []           # (configs per second, wall, bare SimPy rate) of each round
    for _ in range(1 if quick else SWEEP_REPEATS):
        start = time.perf_counter()
        df = sweep(dict(base, fidelity="estimate"), grid, workers=2, progress=False)
        wall = time.perf_counter() - start
        evaluated = int((df["status"] == "ok").sum())
        # this machine's speed beside it: a rate here is only comparable with
        # another machine's run over the bare SimPy rate of each
        bare = bare_simpy_rate(200_000 if quick else 400_000)
        rounds.append((evaluated / wall, wall, bare))
    median = sorted(rounds)[len(rounds) // 2]
    per_bare = sorted(rate / (bare / 1e6) for rate, _, bare in rounds)[len(rounds) // 2]
    sample = {"tp": [8], "pp": [16], "micro_batch": [1, 2]}
    start = time.perf_counter()
    full = sweep(dict(base, symmetry=True, coarsen=True), sample, workers=2, progress=False)
    full_wall = time.perf_counter() - start
    return {"sweep_configs_per_s": median[0], "sweep_configs": evaluated,
            "sweep_configs_per_s_rounds": [rate for rate, _, _ in rounds],
            "sweep_bare_simpy_events_per_s": median[2],
            "sweep_configs_per_bare_mevent": per_bare,
            "sweep_points": len(df), "sweep_wall_s": median[1],
            "sweep_simulated_configs_per_s": len(full) / full_wall,
            "sweep_simulated_configs": len(full),
            "sweep_space": "gpt3-175b on dgx-a100-x128 (1024 GPUs), analytical network: "
                           + " x ".join(f"{k} {v}" for k, v in grid.items())}


BENCHMARKS = {
    "engine": engine_efficiency,
    "allreduce": allreduce_1024,
    "gpt3": gpt3_1024,
    "sweep": sweep_rate,
    "growth": growth,
}


def peak_rss_bytes() -> int:
    """This process's peak resident memory (Linux reports KiB)."""
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024
