"""A simulation of a program of 10 million ops (here through the
reductions, which are exact in step time: one representative device per
pipeline stage and coarsened compute runs) completes without exceeding
4 GB of memory. GPT-3 175B on 1024 A100s (TP 8, PP 16, DP 8, 1F1B, 24
micro-batches): about 100k ops simulated that stand for 13 million. Run
in a fresh process so that its peak resident memory is its own."""
from __future__ import annotations

import json
import subprocess
import sys

GB = 1 << 30

CHILD = r"""
import json, resource
import distsim
from distsim.sim.symmetry import represented_ops
result = distsim.simulate(model="gpt3-175b", topology="dgx-a100-x128", tp=8, pp=16, dp=8,
                          schedule="1f1b", micro_batch=1, global_batch=192, symmetry=True,
                          coarsen=True, network_mode="flow")
summary = result.summary()
print(json.dumps({"ops": len(result.program.ops), "represents": represented_ops(result.program),
                  "step_time_s": result.step_time_s, "devices": summary["num_devices"],
                  "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))
"""


def test_a_ten_million_op_program_simulates_within_4_gb():
    done = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["represents"] >= 10_000_000
    assert out["devices"] == 1024
    assert out["step_time_s"] > 0
    assert out["peak_rss_bytes"] < 4 * GB


def test_represented_ops_of_a_reduced_program_count_the_full_program():
    """The count above is honest: on programs small enough to build in full,
    the reduced and coarsened program stands for exactly the full one's ops
    (a collective once per member)."""
    from distsim.api import build_program
    from distsim.bench.cases import simulated_ops
    from distsim.sim.symmetry import represented_ops

    for strategy in (dict(dp=2, tp=2, pp=2, microbatches=4),
                     dict(dp=2, pp=4, microbatches=8, zero=1, global_batch=16)):
        full, _, _ = build_program("tiny", "dgx-a100", **strategy)
        reduced, _, _ = build_program("tiny", "dgx-a100", symmetry=True, coarsen=True, **strategy)
        assert len(reduced.ops) < len(full.ops)
        assert represented_ops(reduced) == represented_ops(full) == simulated_ops(full)
