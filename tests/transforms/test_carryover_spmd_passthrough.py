"""LowerSPMD on a step whose loss (its first output) is one of its inputs,
passed through unchanged.

The lowering looked the loss up among op results only (its chunk, then each
rank's environment): a pass-through loss was a ``KeyError`` traceback. The
ONNX importer never makes one (it writes an ``identity`` op for a graph
output that is a graph input), but a hand-built or transformed DistIR step
can. Now a data (or constant) input passed through is lowered to a copy of
each rank's own input, checked here against the original step in the numpy
executor; any other input as the loss is a PassPreconditionError naming it.
"""
from __future__ import annotations

import numpy as np
import pytest

from distsim.errors import PassPreconditionError
from distsim.interp import execute
from distsim.ir import DType, FunctionBuilder, TensorType, verify
from distsim.sim.simulator import simulate_function
from distsim.topology import load_topology
from distsim.transforms.adam import AdamHyper
from distsim.transforms.spmd import LowerSPMD
from distsim.transforms.strategy import Strategy
from distsim.transforms.zero_numbers import local_inputs

LOCAL = (4, 3)   # the per-rank micro-batch of the step


def forward_step(pass_through: bool):
    """A forward-only step ``x -> (x, relu(x))`` (``pass_through``) or
    ``(relu(x), x)``: the loss is its first output, as the ONNX family sets
    it for a forward pass."""
    b = FunctionBuilder("f")
    x = b.input("x", TensorType(LOCAL, DType.F64, device=0))
    y = b.op("relu", [x], name="y")
    f = b.finish([x, y] if pass_through else [y, x])
    f.meta.update(roles={"x": "data"}, params=[], grads={}, loss=f.outputs[0].name,
                  batch_inputs=["x"])
    return f


@pytest.mark.parametrize("pass_through", [True, False])
@pytest.mark.parametrize("dp, microbatches, coarsen", [(1, 1, False), (2, 1, False),
                                                       (2, 2, False), (2, 2, True)])
def test_lowered_loss_matches_the_step(pass_through, dp, microbatches, coarsen):
    """Differential: each rank's and micro-batch's loss of the lowered
    program equals the original step's first output on that slice."""
    step = forward_step(pass_through)
    program = verify(LowerSPMD(Strategy(dp=dp, coarsen=coarsen), microbatches, AdamHyper(),
                               "f64", coarsen=coarsen)(step))
    rng = np.random.default_rng(0)
    batch = rng.normal(size=(LOCAL[0] * dp * microbatches, LOCAL[1]))
    outputs = execute(program, local_inputs(program, {}, {"x": batch}))
    assert len(outputs) == dp * microbatches
    for v, got in zip(program.outputs, outputs):
        info = program.meta["io"][v.name]
        assert info["role"] == "loss"
        # an output is never an input of the lowered program either
        assert v not in program.inputs
        src = next(u for u in program.inputs if program.meta["io"][u.name]["role"] == "data"
                   and program.meta["io"][u.name]["microbatch"] == _microbatch(program, v)
                   and u.type.device == v.type.device)
        start = (program.meta["io"][src.name]["dp_rank"] * microbatches
                 + program.meta["io"][src.name]["microbatch"]) * LOCAL[0]
        expected = execute(step, [batch[start:start + LOCAL[0]]])[0]
        np.testing.assert_array_equal(got, expected)


def _microbatch(program, v):
    op = next(op for op in program.ops if v in op.outputs)
    return op.meta["microbatch"]


def test_pass_through_loss_simulates():
    """The lowered pass-through is an ordinary program for the simulator."""
    step = forward_step(True)
    program = verify(LowerSPMD(Strategy(dp=2), 2, AdamHyper(), "f64")(step))
    trace = simulate_function(program, load_topology("workstation-4gpu-pcie"))
    assert trace is not None


def test_representative_program_keeps_one_rank():
    step = forward_step(True)
    program = verify(LowerSPMD(Strategy(dp=4), 1, AdamHyper(), "f64",
                               representatives=True)(step))
    assert [v.name for v in program.outputs] == ["x_r0_out"]


def test_a_parameter_passed_through_as_loss_is_refused_naming_it():
    """A parameter that is also the loss: no per-micro-batch copy to return."""
    b = FunctionBuilder("f")
    w = b.input("w", TensorType((3,), DType.F64, device=0))
    x = b.input("x", TensorType(LOCAL, DType.F64, device=0))
    y = b.op("mul", [x, w], name="y")
    f = b.finish([w, y])
    f.meta.update(roles={"w": "param", "x": "data"}, params=[], grads={}, loss="w",
                  batch_inputs=["x"])
    with pytest.raises(PassPreconditionError,
                       match=r"^LowerSPMD: the loss %w is an input of the step passed through "
                             r"unchanged \(role param\)"):
        LowerSPMD(Strategy(dp=2), 1, AdamHyper(), "f64")(f)
