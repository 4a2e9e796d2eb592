"""Differential test: DataParallel(n) of the MLP step computes the same
updated weights as the one-device step, in the numpy executor.

Tolerance: relative 1e-10 in float64 (the only difference is the order of
summation of the gradient, split across ranks then averaged).
"""
import numpy as np
import pytest

from distsim.errors import PassPreconditionError
from distsim.interp import execute, random_inputs
from distsim.ir import is_communication, verify
from distsim.models import MLPConfig, mlp_training_step
from distsim.transforms.data_parallel import DataParallel


def split_inputs(step, inputs, n):
    out = []
    for v, a in zip(step.inputs, inputs):
        if v.name in step.meta["batch_inputs"]:
            out += np.split(a, n)
        else:
            out += [a] * n
    return out


@pytest.mark.parametrize("n", [1, 2, 4])
@pytest.mark.parametrize("bias", [True, False])
def test_dp_updates_match_single_device(n, bias):
    step = mlp_training_step(MLPConfig(layers=3, hidden=6, batch=8, dtype="f64", bias=bias))
    dp = verify(DataParallel(n)(step))
    inputs = random_inputs(step, seed=3)
    reference = execute(step, inputs)
    results = execute(dp, split_inputs(step, inputs, n))
    for j in range(1, len(reference)):  # skip the loss (local per rank)
        for r in range(n):
            np.testing.assert_allclose(results[j * n + r], reference[j], rtol=1e-10, atol=1e-12)
    assert any(not np.allclose(reference[j], inputs[1 + j]) for j in range(1, len(reference)))


def test_dp_mean_loss_matches():
    step = mlp_training_step(MLPConfig(layers=2, hidden=4, batch=6, dtype="f64"))
    inputs = random_inputs(step, seed=1)
    ref_loss = execute(step, inputs)[0]
    res = execute(DataParallel(3)(step), split_inputs(step, inputs, 3))
    np.testing.assert_allclose(np.mean(res[:3]), ref_loss, rtol=1e-12)


def test_one_allreduce_per_gradient_right_after_it():
    step = mlp_training_step(MLPConfig(layers=4, hidden=8, batch=8, dtype="f32"))
    dp = DataParallel(2)(step)
    comms = [op for op in dp.ops if is_communication(op)]
    assert len(comms) == len(step.meta["grads"]) == 8
    assert all(op.attrs["reduce_op"] == "avg" and op.attrs["ranks"] == (0, 1) for op in comms)
    # the first all-reduce is issued before the backward pass ends (overlap possible)
    first = dp.ops.index(comms[0])
    last_backward = max(i for i, op in enumerate(dp.ops) if op.op_type == "matmul")
    assert first < last_backward


def test_batch_not_divisible_is_rejected():
    step = mlp_training_step(MLPConfig(layers=2, hidden=4, batch=6, dtype="f32"))
    with pytest.raises(PassPreconditionError,
                       match="batch size 6 of input %x is not divisible by the data-parallel "
                             "degree 4"):
        DataParallel(4)(step)


def test_data_parallel_memory_counts_resident_weights_and_one_gradient_each():
    """The replicas' weights are resident 'weights' (their roles follow the
    renamed inputs), each gradient is one buffer averaged in place (NCCL
    all-reduces in place), and the SGD update writes the weights in place:
    at a replica's peak, weights and gradients are each the parameter bytes,
    counted by hand: 3 layers x (64 x 64 + 64) f16 values."""
    import distsim
    r = distsim.simulate(model="mlp", topology="dgx-a100", dp=4, layers=3, hidden=64,
                         batch=32, dtype="f16")
    param_bytes = 3 * (64 * 64 + 64) * 2
    for rank in range(4):
        peak = r.trace.meta["peak_memory_by_category"][rank]
        assert peak["weights"] == param_bytes
        assert peak["gradients"] == param_bytes
