"""The benchmark suite behind ``distsim bench`` (figures in reports/perf/).

Each benchmark runs in its own process so that its peak resident memory is
its own; every figure that compares is a ratio measured in the same run.
Timings live here, never in the unit tests.
"""
from .suite import ALL, BENCHMARKS, OPTIONAL, run_suite

__all__ = ["ALL", "BENCHMARKS", "OPTIONAL", "run_suite"]
