"""`distsim bench` runs and reports its figures (values are not asserted:
timings belong to the benchmark report, not to unit tests)."""
import json

from distsim.bench.cases import simulated_ops
from distsim.cli import main
from distsim.models import MLPConfig, mlp_training_step
from distsim.transforms.data_parallel import DataParallel


def test_bench_json_has_the_tracked_keys(tmp_path, capsys):
    out = tmp_path / "bench.json"
    assert main(["bench", "--quick", "--only", "allreduce", "--json", "--out", str(out)]) == 0
    figures = json.loads(capsys.readouterr().out)
    assert figures == json.loads(out.read_text())
    assert figures["allreduce_1024_wall_s"] > 0
    # over 16 DGX A100s the rings (one per NIC, as NCCL's channels) beat the
    # hierarchical algorithm's three phases one after another
    assert figures["allreduce_ring_simulated_s"] < figures["allreduce_hierarchical_simulated_s"]
    assert figures["machine"]["cpus"] >= 1


def test_simulated_ops_counts_collectives_per_member():
    step = mlp_training_step(MLPConfig(layers=2, hidden=8, batch=8))
    dp = DataParallel(4)(step)
    comms = len(step.meta["grads"])
    assert simulated_ops(dp) == 4 * len(step.ops) + 4 * comms


def test_bench_rejects_bad_out(capsys):
    assert main(["bench", "--only", "allreduce", "--out", "x.txt"]) == 2


def test_a_measurement_in_a_fresh_process_reports_errors_and_deaths():
    import os
    from distsim.bench.fresh import in_fresh_process

    assert in_fresh_process(lambda n: {"pid": os.getpid(), "n": n}, 3)["n"] == 3
    assert in_fresh_process(lambda: {"pid": os.getpid()})["pid"] != os.getpid()
    assert in_fresh_process(lambda: 1 / 0) == {"_error": "ZeroDivisionError: division by zero"}
    assert in_fresh_process(lambda: os._exit(3)) == {
        "_error": "benchmark process ended with exit code 3"}


def test_growth_fits_wall_against_ops_and_values(monkeypatch):
    """Two points, the second with twice the ops and 2.1x the values;
    three rounds each. Median walls 1.1 and 2.2: wall ~ ops^1, wall ~
    values^(ln 2 / ln 2.1), values ~ ops^(ln 2.1 / ln 2). Best rounds 1.0
    and 2.1: wall ~ ops^(ln 2.1 / ln 2). And k of each round alone; memory
    readied before every point, and each point's median system time."""
    import math

    import pytest

    from distsim.bench import cases

    made = {(64, 8, 8, 24): (100_000, 400_000, [1.3, 1.0, 1.1]),
            (128, 8, 16, 48): (200_000, 840_000, [2.1, 2.5, 2.2])}
    calls = iter(range(10))
    events = []

    def fake(fn, gpus, tp, pp, layers, microbatches):
        ops, values, walls = made[(gpus, tp, pp, layers)]
        at = next(calls) // 2
        events.append(("point", gpus))
        return {"gpus": gpus, "layers": layers, "ops": ops, "values": values,
                "wall_s": walls[at], "sys_s": [0.3, 0.1, 0.2][at] * ops / 100_000}
    monkeypatch.setattr(cases, "GROWTH_POINTS", list(made))
    monkeypatch.setattr(cases, "GROWTH_REPEATS", 3)
    monkeypatch.setattr(cases, "in_fresh_process", fake)
    monkeypatch.setattr(cases, "ready_free_memory", lambda n: events.append(("ready", n)))
    out = cases.growth(quick=False)
    ready = ("ready", cases.GROWTH_READY_BYTES[False])
    assert events == [ready, ("point", 64), ready, ("point", 128)] * 3
    assert [p["sys_s"] for p in out["growth_points"]] == pytest.approx([0.2, 0.4])
    assert [p["wall_s"] for p in out["growth_points"]] == [1.1, 2.2]
    assert [p["wall_best_s"] for p in out["growth_points"]] == [1.0, 2.1]
    ln2, ln21 = math.log(2), math.log(2.1)
    assert out["growth_exponent"] == pytest.approx(1.0)
    assert out["growth_exponent_best"] == pytest.approx(ln21 / ln2)
    assert out["growth_exponent_values"] == pytest.approx(ln2 / ln21)
    assert out["growth_exponent_values_alone"] == pytest.approx(ln21 / ln2)
    # round by round: walls 1.3 then 2.1, 1.0 then 2.5, 1.1 then 2.2
    each = [math.log(2.1 / 1.3) / ln2, math.log(2.5) / ln2, math.log(2.2 / 1.1) / ln2]
    assert out["growth_exponent_rounds"] == pytest.approx(each)
    assert (out["growth_exponent_round_min"], out["growth_exponent_round_max"]) == \
        pytest.approx((min(each), max(each)))


def test_ready_free_memory_touches_the_bytes_asked_for_in_a_child():
    """The bytes are touched in a child process (this one's peak resident
    memory, which benchmarks report, does not grow by them)."""
    from distsim.bench.fresh import ready_free_memory
    from distsim.bench.cases import peak_rss_bytes

    before = peak_rss_bytes()
    assert ready_free_memory(64 << 20) == 64 << 20
    assert peak_rss_bytes() - before < 32 << 20
    assert ready_free_memory(0) == 0


def test_sweep_rate_is_given_with_the_machine_speed_divided_out(monkeypatch):
    """The sweep's rate over this process's bare SimPy rate (per million
    events per second): three points evaluated of four, one of them
    invalid, bare SimPy at 2 million events per second."""
    import pandas as pd
    import pytest

    from distsim.bench import cases

    def fake_sweep(base, grid, workers, progress):
        return pd.DataFrame({"status": ["ok", "ok", "error", "ok"]})
    monkeypatch.setattr(cases, "sweep", fake_sweep)
    monkeypatch.setattr(cases, "bare_simpy_rate", lambda events: 2e6)
    out = cases.sweep_rate(quick=True)
    assert out["sweep_configs"] == 3
    assert out["sweep_bare_simpy_events_per_s"] == 2e6
    assert out["sweep_configs_per_bare_mevent"] == pytest.approx(out["sweep_configs_per_s"] / 2)


def test_sweep_rate_reports_the_median_round(monkeypatch):
    """Three rounds of 2, 1 and 3 seconds for three evaluated points (1.5,
    3 and 1 configs/s; bare SimPy at 4, 1 and 2 million events/s, so
    0.375, 3 and 0.5 configs per Mevent/s): the figures are the first
    round's (the median rate, neither the best, the last nor the middle
    one run), the per-Mevent figure the median ratio (the third round's),
    each round's rate listed in order."""
    import pandas as pd
    import pytest

    from distsim.bench import cases

    class Clock:                       # scripted perf_counter: round starts and ends
        def __init__(self, ticks):
            self.ticks = list(ticks)

        def perf_counter(self):
            return self.ticks.pop(0)

    monkeypatch.setattr(cases, "time", Clock([0.0, 2.0, 10.0, 11.0, 20.0, 23.0, 30.0, 31.0]))
    monkeypatch.setattr(cases, "sweep",
                        lambda base, grid, workers, progress:
                        pd.DataFrame({"status": ["ok", "ok", "invalid", "ok"]}))
    bares = iter([4e6, 1e6, 2e6])
    monkeypatch.setattr(cases, "bare_simpy_rate", lambda events: next(bares))
    out = cases.sweep_rate(quick=False)
    assert out["sweep_configs_per_s_rounds"] == pytest.approx([1.5, 3.0, 1.0])
    assert out["sweep_configs_per_s"] == pytest.approx(1.5)
    assert out["sweep_wall_s"] == pytest.approx(2.0)
    assert out["sweep_bare_simpy_events_per_s"] == 4e6
    assert out["sweep_configs_per_bare_mevent"] == pytest.approx(0.5)
    assert out["sweep_configs"] == 3
