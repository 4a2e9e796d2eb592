"""DataParallel's ``roles`` / ``grads`` / ``updates`` tables name only values
of the program it writes.

They used to keep the template's own names next to the replicas'. Most
template names name nothing in the new program (copies are ``v_r{rank}``),
but a template name of that form (``h_r0``) is also the name of a copy of
another value (``h`` on rank 0), and the stale entry then labelled that copy:
the simulator counted one replica's activation as weights or as a gradient
and reported different memory for identical replicas.
"""
from __future__ import annotations

import pytest

from distsim.ir import DType, FunctionBuilder, TensorType, verify
from distsim.models import MLPConfig, mlp_training_step
from distsim.sim.simulator import simulate_function
from distsim.topology import load_topology
from distsim.transforms.data_parallel import DataParallel

T = DType.F32


def _role_collision():
    """Input ``h`` has no role (an activation); a parameter is named
    ``h_r0``, the name of ``h``'s copy on rank 0."""
    b = FunctionBuilder("f")
    x = b.input("x", TensorType((8, 4), T, device=0))
    h = b.input("h", TensorType((8, 4), T, device=0))
    w = b.input("h_r0", TensorType((4, 4), T, device=0))
    y = b.op("matmul", [x, w], name="y")
    f = b.finish([b.op("add", [y, h], name="z")])
    f.meta.update(roles={"x": "data", "h_r0": "param"}, batch_inputs=["x", "h"],
                  params=["h_r0"], grads={})
    return f


def _grad_collision():
    """The gradient of ``w`` is named ``a_r0``, the name of the copy of the
    activation ``a`` on rank 0."""
    b = FunctionBuilder("f")
    x = b.input("x", TensorType((8, 4), T, device=0))
    w = b.input("w", TensorType((4, 4), T, device=0))
    a = b.op("matmul", [x, w], name="a")
    g = b.op("matmul", [b.op("transpose", [x], {"perm": [1, 0]}, name="xt"), a], name="a_r0")
    f = b.finish([a, g])
    f.meta.update(roles={"x": "data", "w": "param"}, batch_inputs=["x"], params=["w"],
                  grads={"w": "a_r0"})
    return f


@pytest.mark.parametrize("make", [_role_collision, _grad_collision])
def test_tables_name_only_values_of_the_new_program(make):
    program = verify(DataParallel(2)(make()))
    names = {v.name for v in program.values()}
    for key in ("roles", "grads", "updates"):
        for k, v in program.meta.get(key, {}).items():
            assert k in names, (key, k)
            assert key == "roles" or v in names, (key, v)


@pytest.mark.parametrize("make", [_role_collision, _grad_collision])
def test_identical_replicas_report_the_same_memory(make):
    program = verify(DataParallel(2)(make()))
    trace = simulate_function(program, load_topology("workstation-4gpu-pcie"))
    peaks = trace.meta["peak_memory_by_category"]
    assert peaks[0] == peaks[1]


def test_mlp_tables_keep_every_replica():
    """The usual step: every replica's weights, gradients and updates are
    still named (and nothing else)."""
    step = mlp_training_step(MLPConfig(layers=2, hidden=4, batch=8, dtype="f32"))
    program = DataParallel(2)(step)
    for key in ("roles", "grads"):
        table = step.meta[key]
        assert set(program.meta[key]) == {f"{k}_r{r}" for k in table for r in range(2)}
    for k, v in step.meta["updates"].items():
        for r in range(2):
            assert program.meta["updates"][f"{k}_r{r}"] == f"{v}_r{r}"
