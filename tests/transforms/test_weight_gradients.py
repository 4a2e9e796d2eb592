"""A weight's gradient from a batch of sequences is one GEMM whose
contraction spans the batch (``matmul`` with ``sum_batch``), as frameworks
compute it (``x.reshape(-1, h).T @ g.reshape(-1, v)``): not a batch of
per-sequence products, ``(b, h, v)``, summed afterwards, which wrote and
read the weight's size once per sequence (a cost and a temporary no real
run has; on GPT-3 175B, tp 8, about 0.6 ms per layer and micro-batch).
"""
import numpy as np
import pytest

import distsim
from distsim.cost import op_flops
from distsim.cost.model import CostModel
from distsim.errors import VerifyError
from distsim.interp import execute
from distsim.interp.gradcheck import finite_difference
from distsim.ir import DType, FunctionBuilder, TensorType, verify
from distsim.topology import load_topology
from distsim.transforms.autodiff import Autodiff

F64, BF16 = DType.F64, DType.BF16


def t(*shape, dtype=F64):
    return TensorType(shape, dtype, 0)


def _one(a_shape, b_shape, attrs, dtype=F64):
    b = FunctionBuilder("f")
    x, y = b.input("a", t(*a_shape, dtype=dtype)), b.input("b", t(*b_shape, dtype=dtype))
    return verify(b.finish([b.op("matmul", [x, y], attrs, name="y")]))


def test_sum_batch_is_the_per_sequence_products_summed():
    rng = np.random.default_rng(0)
    a, g = rng.normal(size=(2, 3, 4, 6)), rng.normal(size=(2, 3, 4, 5))
    f = _one(a.shape, g.shape, {"trans_a": True, "sum_batch": True})
    assert f.outputs[0].type.shape == (6, 5)
    (y,) = execute(f, [a, g])
    np.testing.assert_allclose(y, np.einsum("bcsh,bcsv->hv", a, g), rtol=1e-12)
    x, z = rng.normal(size=(2, 5, 4)), rng.normal(size=(2, 6, 4))
    f = _one(x.shape, z.shape, {"trans_b": True, "sum_batch": True})
    (y,) = execute(f, [x, z])
    np.testing.assert_allclose(y, np.einsum("bmk,bnk->mn", x, z), rtol=1e-12)


def test_sum_batch_refuses_different_batch_dims():
    with pytest.raises(VerifyError, match="op 'y' \\(matmul\\): sum_batch needs the same"):
        _one((1, 3, 4), (2, 3, 5), {"trans_a": True, "sum_batch": True})   # broadcast: no
    with pytest.raises(VerifyError, match="sum_batch"):
        _one((3, 4), (4, 5), {"sum_batch": True})          # no batch dims to sum


def test_sum_batch_flops_count_the_whole_contraction():
    # 2 x (batch 2 x 3 x seq 4 = 24 rows contracted) x h 6 x v 5
    f = _one((2, 3, 4, 6), (2, 3, 4, 5), {"trans_a": True, "sum_batch": True})
    assert op_flops(f.ops[0]) == 2 * 24 * 6 * 5


def _linear_step(x_shape, w_shape):
    b = FunctionBuilder("f")
    x, w = b.input("x", t(*x_shape)), b.input("w", t(*w_shape))
    y = b.op("matmul", [x, w], name="y")
    lw = b.input("loss_w", y.type)
    loss = b.op("reduce_sum", [b.op("mul", [y, lw])], name="loss")
    return verify(b.finish([loss]))


@pytest.mark.parametrize("x_shape", [(3, 4, 6), (2, 3, 4, 6)])
def test_weight_gradient_is_one_gemm_and_correct(x_shape):
    f = _linear_step(x_shape, (6, 5))
    g = verify(Autodiff("loss", ["x", "w"])(f))
    made = {v.name: op for op in g.ops for v in op.outputs}
    dw = g.outputs[2]
    assert made[dw.name].op_type == "matmul" and made[dw.name].attrs.get("sum_batch")
    assert not [op for op in g.ops if op.op_type == "reduce_sum" and op.outputs[0].type.shape
                == (6, 5)]
    rng = np.random.default_rng(1)
    inputs = [rng.uniform(-1, 1, v.type.shape) for v in f.inputs]
    results = execute(g, inputs)
    for k, index in enumerate((0, 1)):
        np.testing.assert_allclose(results[1 + k], finite_difference(f, inputs, index),
                                   rtol=1e-6, atol=1e-8)
    # the input's gradient comes first, as Megatron orders them
    order = [op.outputs[0].name for op in g.ops if op.op_type == "matmul"]
    assert order.index(g.outputs[1].name) < order.index(dw.name)


def test_gpt3_weight_gradient_time_by_hand():
    """GPT-3 175B, tp 8, micro-batch 1: the fc1 weight's gradient is one
    GEMM, M x N = 12288 x 6144 over the 2048 tokens (K), after the 5 us
    launch, and no weight-sized reduction follows it. dgx-a100's GEMM model
    (108 SMs, ceiling 0.8522, 256-element tile overhead, 128 x 128 tiles
    at full rate): 96 x 48 = 4608 tiles of 128 x 128 are 43 waves (42.67),
    fewer tile-rounds than 2304 tiles of 256 x 128 in 22 waves, each
    2 x 128 x 128 x (2048 + 256) FLOP at 312 TFLOP/s x 0.8522 / 108 a SM."""
    r = distsim.simulate(model="gpt3-175b", topology="dgx-a100", tp=8, layers=1,
                         global_batch=1, network_mode="analytical")
    ops = {op.outputs[0].name: op for op in r.program.ops if op.outputs}
    dw = ops["d_l0_w1_r0"]
    assert dw.attrs.get("sum_batch") and dw.outputs[0].type.shape == (12288, 6144)
    model = CostModel(load_topology("dgx-a100").device_spec)
    spec = load_topology("dgx-a100").device_spec
    flops = 2 * 2048 * 12288 * 6144
    assert op_flops(dw) == flops
    assert (spec.launch_overhead_s, spec.gemm.efficiency["bf16"], spec.gemm.k_overhead) == \
        (5e-6, 0.8522, 256)
    assert model.op_cost(dw).time_s == pytest.approx(
        5e-6 + 43 * 2 * 128 * 128 * (2048 + 256) / (312e12 * 0.8522 / 108), rel=1e-12)
    # the matmuls' weights (not the learned positions, whose gradient is a
    # true sum over the batch of the broadcast add)
    roles = r.program.meta["roles"]
    shapes = {v.type.shape for op in r.program.ops if op.op_type == "matmul"
              for v in op.inputs if roles.get(v.name) == "param"}
    assert (12288, 6144) in shapes
    assert not [op for op in r.program.ops if op.op_type == "reduce_sum"
                and op.outputs[0].type.shape in shapes]


def test_sum_batch_prints_and_parses_back():
    from distsim.text.parser import parse_function
    from distsim.text.printer import print_function
    g = verify(Autodiff("loss", ["x", "w"])(_linear_step((3, 4, 6), (6, 5))))
    text = print_function(g)
    assert "sum_batch = true" in text
    assert print_function(parse_function(text)) == text
