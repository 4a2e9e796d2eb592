"""Autodiff against central finite differences in float64."""
import numpy as np
import pytest

from distsim.interp import execute, random_inputs
from distsim.interp.gradcheck import finite_difference
from distsim.ir import DType, FunctionBuilder, TensorType, verify
from distsim.models import MLPConfig, mlp_forward
from distsim.transforms.autodiff import Autodiff

F64 = DType.F64


def check_gradients(f, wrt, seed=0):
    g = verify(Autodiff(f.outputs[0].name, wrt)(f))
    inputs = random_inputs(f, seed)
    results = execute(g, inputs)
    names = [v.name for v in f.inputs]
    for k, name in enumerate(wrt):
        expected = finite_difference(f, inputs, names.index(name))
        np.testing.assert_allclose(results[len(f.outputs) + k], expected, rtol=1e-5, atol=1e-7)


def test_mlp_gradients_match_finite_differences():
    f = mlp_forward(MLPConfig(layers=3, hidden=4, batch=3, dtype="f64"))
    check_gradients(f, f.meta["params"] + ["x"])


@pytest.mark.parametrize("build", ["broadcast", "transposes", "reductions", "shared_use"])
def test_rules_match_finite_differences(build):
    b = FunctionBuilder("f")
    a = b.input("a", TensorType((3, 4), F64, 0))
    c = b.input("c", TensorType((4,), F64, 0))
    d = b.input("d", TensorType((5, 4), F64, 0))
    if build == "broadcast":
        y = b.op("mul", [b.op("sub", [a, c]), b.op("add", [a, c])])
    elif build == "transposes":
        y = b.op("matmul", [b.op("matmul", [a, d], {"trans_b": True}), d])
        y = b.op("matmul", [a, y], {"trans_a": True, "trans_b": False})
        y = b.op("matmul", [y, a], {"trans_a": True, "trans_b": True})
    elif build == "reductions":
        s = b.op("reduce_sum", [a], {"axes": [1], "keepdims": True})
        m = b.op("reduce_mean", [d], {"axes": [0]})
        y = b.op("mul", [b.op("exp", [b.op("scale", [a, ], {"factor": 0.5})]), s])
        y = b.op("add", [y, m])
    else:
        r = b.op("relu", [a])
        y = b.op("add", [b.op("mul", [r, r]), b.op("neg", [a])])
    target = b.op("zeros_like", [y])
    loss = b.op("mse_loss", [y, target], name="loss")
    f = b.finish([loss])
    wrt = {"broadcast": ["a", "c"], "transposes": ["a", "d"], "reductions": ["a", "d"],
           "shared_use": ["a"]}[build]
    check_gradients(f, wrt)
