"""Fixtures shared across the test folders."""
import pytest


@pytest.fixture(scope="session")
def small_program():
    """``small_program(case)`` -> (program, topology) for the small programs
    that the record and summary tests simulate: ``mlp`` (data parallel 8),
    ``gpt`` (GPT-2, 2 layers, tp 2 x pp 2 x dp 2) and ``zero3`` (GPT-2,
    1 layer, tp 2 x dp 4, ZeRO-3)."""
    from distsim.api import build_program
    from distsim.bench.cases import _mlp_dp
    from distsim.topology import load_topology

    def build(case):
        if case == "mlp":
            return _mlp_dp(8, 3), load_topology("dgx-a100")
        if case == "gpt":
            program, _, topo = build_program("gpt2", "dgx-a100", layers=2, seq=32, tp=2, pp=2,
                                             dp=2, microbatches=4)
        else:
            program, _, topo = build_program("gpt2", "dgx-a100", layers=1, seq=32, tp=2, dp=4,
                                             zero=3)
        return program, topo
    return build
