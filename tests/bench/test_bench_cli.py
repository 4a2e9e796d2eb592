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
    assert figures["allreduce_ring_simulated_s"] > figures["allreduce_hierarchical_simulated_s"]
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
