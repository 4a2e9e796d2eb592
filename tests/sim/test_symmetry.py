"""Symmetry reduction is exact where its assumptions hold: the reduced
simulation gives the same step time (within 0.1%) and the same per-device
memory as the full one."""
import pytest

from distsim.ir import DType, FunctionBuilder, TensorType
from distsim.models import MLPConfig, mlp_training_step
from distsim.report import summarize
from distsim.sim.simulator import SimulationOptions, simulate_function
from distsim.sim.symmetry import symmetry_classes
from distsim.topology import load_topology
from distsim.transforms.data_parallel import DataParallel


def both(program, topo):
    full = simulate_function(program, topo, options=SimulationOptions(symmetry=False))
    reduced = simulate_function(program, topo, options=SimulationOptions(symmetry=True))
    return full, reduced


def assert_same(full, reduced):
    assert reduced.step_time_s == pytest.approx(full.step_time_s, rel=1e-3)
    assert reduced.peak_memory() == full.peak_memory()
    fs, rs = summarize(full), summarize(reduced)
    for a, b in zip(fs["devices"], rs["devices"]):
        assert b["compute_s"] == pytest.approx(a["compute_s"], rel=1e-3)
        assert b["communication_s"] == pytest.approx(a["communication_s"], rel=1e-3)


@pytest.mark.parametrize("topology,dp", [("dgx-a100", 8), ("dgx-a100-x2", 16),
                                         ("dgx-a100-x8", 64)])
def test_data_parallel_mlp_reduced_equals_full(topology, dp):
    topo = load_topology(topology)
    program = DataParallel(dp)(mlp_training_step(MLPConfig(layers=3, hidden=512, batch=dp * 16)))
    full, reduced = both(program, topo)
    assert reduced.meta["simulated_devices"] == 1
    assert_same(full, reduced)


def test_dp_replicas_form_one_class():
    program = DataParallel(4)(mlp_training_step(MLPConfig(layers=2, hidden=8, batch=8)))
    assert symmetry_classes(program) == {0: 0, 1: 0, 2: 0, 3: 0}


def chain_pipeline(stages: int):
    """Stage s computes then sends to stage s+1: every stage waits on a
    different neighbour, so no two stages may share a class."""
    b = FunctionBuilder("pipe")
    x = b.input("x", TensorType((512, 512), DType.F16, 0))
    w = [b.input(f"w{s}", TensorType((512, 512), DType.F16, s)) for s in range(stages)]
    for s in range(stages):
        x = b.op("matmul", [x, w[s]])
        if s + 1 < stages:
            x = b.op("comm.sendrecv", [x], {"ranks": (s, s + 1)})
    return b.finish([x])


def test_pipeline_stages_stay_apart_and_times_match():
    program = chain_pipeline(4)
    rep = symmetry_classes(program)
    assert sorted(set(rep.values())) == [0, 1, 2, 3]
    full, reduced = both(program, load_topology("dgx-a100"))
    assert_same(full, reduced)


def test_two_replicated_pipelines_reduce_to_one():
    """DP 2 x PP 2: ranks (0,1) one pipeline, (2,3) the other; gradients of
    each stage all-reduced across the two pipelines."""
    b = FunctionBuilder("dp_pp")
    outs = []
    acts = []
    for pipe in range(2):
        x = b.input(f"x{pipe}", TensorType((256, 256), DType.F16, 2 * pipe))
        w0 = b.input(f"w0_{pipe}", TensorType((256, 256), DType.F16, 2 * pipe))
        w1 = b.input(f"w1_{pipe}", TensorType((256, 256), DType.F16, 2 * pipe + 1))
        h = b.op("matmul", [x, w0])
        h = b.op("comm.sendrecv", [h], {"ranks": (2 * pipe, 2 * pipe + 1)})
        acts.append((b.op("matmul", [h, w1]), h))
    g1 = [b.op("matmul", [a, h], {"trans_a": True}) for a, h in acts]
    outs += list(b.op("comm.allreduce", g1, {"ranks": (1, 3)}))
    program = b.finish(outs)
    rep = symmetry_classes(program)
    assert rep == {0: 0, 1: 1, 2: 0, 3: 1}
    full, reduced = both(program, load_topology("dgx-a100"))
    assert_same(full, reduced)
