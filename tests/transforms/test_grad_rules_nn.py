"""The nn ops: shape rules, numpy kernels and gradient rules, each gradient
checked against central finite differences in float64 (rtol 1e-5)."""
import numpy as np
import pytest

from distsim.cost import op_flops
from distsim.errors import VerifyError
from distsim.interp import execute
from distsim.interp.gradcheck import finite_difference
from distsim.ir import DType, FunctionBuilder, TensorType, verify
from distsim.transforms.autodiff import Autodiff

F64, I64 = DType.F64, DType.I64


def t(*shape, dtype=F64):
    return TensorType(shape, dtype, 0)


def scalar_loss(b, y):
    """sum(y * fixed weights): a scalar with a non-uniform gradient."""
    w = b.input("loss_w", y.type)
    return b.op("reduce_sum", [b.op("mul", [y, w])], name="loss")


def check(build, specs, wrt, seed=0, int_high=None, positive=()):
    """build(b, *inputs) -> value; specs: name -> TensorType."""
    b = FunctionBuilder("f")
    ins = [b.input(n, ty) for n, ty in specs.items()]
    y = build(b, *ins)
    if isinstance(y, tuple):
        y = y[0]
    f = b.finish([scalar_loss(b, y)])
    verify(f)
    rng = np.random.default_rng(seed)
    inputs = []
    for v in f.inputs:
        if v.type.dtype.is_float:
            a = rng.uniform(-1, 1, v.type.shape)
            if v.name in positive:
                a = np.abs(a) + 0.5
            inputs.append(a)
        else:
            inputs.append(rng.integers(0, int_high, v.type.shape))
    g = verify(Autodiff("loss", wrt)(f))
    results = execute(g, inputs)
    names = [v.name for v in f.inputs]
    for k, name in enumerate(wrt):
        expected = finite_difference(f, inputs, names.index(name))
        np.testing.assert_allclose(results[1 + k], expected, rtol=1e-5, atol=1e-7,
                                   err_msg=f"gradient of {name}")
    return g


@pytest.mark.parametrize("op", ["gelu", "silu", "tanh", "sigmoid", "softmax", "log_softmax"])
def test_unary_gradients(op):
    check(lambda b, x: b.op(op, [x]), {"x": t(3, 5)}, ["x"])


def test_sqrt_log_div_gradients():
    check(lambda b, x: b.op("sqrt", [x]), {"x": t(4)}, ["x"], positive=("x",))
    check(lambda b, x: b.op("log", [x]), {"x": t(4)}, ["x"], positive=("x",))
    check(lambda b, x, y: b.op("div", [x, y]), {"x": t(2, 3), "y": t(3)}, ["x", "y"],
          positive=("y",))


def test_layernorm_and_rmsnorm_gradients():
    check(lambda b, x, g, be: b.op("layernorm", [x, g, be]),
          {"x": t(2, 3, 4), "g": t(4), "be": t(4)}, ["x", "g", "be"])
    check(lambda b, x, g, be: b.op("layernorm", [x, g, be], {"axis": 1}),
          {"x": t(2, 3, 4), "g": t(3, 4), "be": t(3, 4)}, ["x", "g", "be"])
    check(lambda b, x, g: b.op("rmsnorm", [x, g]), {"x": t(2, 3, 4), "g": t(4)}, ["x", "g"])


def test_layernorm_normalises():
    b = FunctionBuilder("f")
    x, g, be = b.input("x", t(3, 6)), b.input("g", t(6)), b.input("be", t(6))
    f = b.finish([b.op("layernorm", [x, g, be], {"eps": 0.0})])
    (y,) = execute(f, [np.random.default_rng(0).normal(size=(3, 6)), np.ones(6), np.zeros(6)])
    np.testing.assert_allclose(y.mean(-1), 0, atol=1e-12)
    np.testing.assert_allclose(y.std(-1), 1, rtol=1e-9)


def test_embedding_gradient_and_vocab_shard():
    check(lambda b, w, ids: b.op("embedding", [w, ids]),
          {"w": t(5, 3), "ids": t(2, 4, dtype=I64)}, ["w"], int_high=5)
    check(lambda b, w, ids: b.op("embedding", [w, ids], {"offset": 2}),
          {"w": t(3, 3), "ids": t(2, 4, dtype=I64)}, ["w"], int_high=6)
    b = FunctionBuilder("f")
    w, ids = b.input("w", t(2, 1)), b.input("ids", t(4, dtype=I64))
    f = b.finish([b.op("embedding", [w, ids], {"offset": 2})])
    (y,) = execute(f, [np.array([[10.0], [20.0]]), np.array([0, 2, 3, 5])])
    np.testing.assert_array_equal(y[:, 0], [0, 10, 20, 0])


def test_cross_entropy_value_and_gradient():
    check(lambda b, x, lab: b.op("cross_entropy", [x, lab]),
          {"x": t(2, 3, 5), "lab": t(2, 3, dtype=I64)}, ["x"], int_high=5)
    b = FunctionBuilder("f")
    x, lab = b.input("x", t(2, 4)), b.input("lab", t(2, dtype=I64))
    f = b.finish([b.op("cross_entropy", [x, lab])])
    logits = np.array([[1.0, 2.0, 3.0, 4.0], [0.0, 0.0, 0.0, 0.0]])
    (loss,) = execute(f, [logits, np.array([3, 1])])
    lse = np.log(np.exp(logits).sum(-1))
    assert loss == pytest.approx(np.mean([lse[0] - 4.0, lse[1] - 0.0]))


def test_select_label_and_causal_mask_gradients():
    check(lambda b, x, lab: b.op("select_label", [x, lab], {"offset": 1}),
          {"x": t(2, 3, 4), "lab": t(2, 3, dtype=I64)}, ["x"], int_high=6)
    check(lambda b, x: b.op("causal_mask", [x]), {"x": t(2, 4, 4)}, ["x"])


def test_transpose_concat_split_slice_pad_gradients():
    check(lambda b, x: b.op("transpose", [x], {"perm": [2, 0, 1]}), {"x": t(2, 3, 4)}, ["x"])
    check(lambda b, x, y: b.op("concat", [x, y], {"axis": 1}),
          {"x": t(2, 3), "y": t(2, 2)}, ["x", "y"])
    check(lambda b, x: b.op("split", [x], {"axis": 0, "sizes": [1, 3]})[1], {"x": t(4, 2)}, ["x"])
    check(lambda b, x: b.op("slice", [x], {"axis": 1, "start": 1, "stop": 3}), {"x": t(2, 4)},
          ["x"])
    check(lambda b, x: b.op("pad", [x], {"axis": 0, "before": 1, "after": 2}), {"x": t(2, 2)},
          ["x"])


def test_dropout_is_deterministic_identity_with_a_byte_mask():
    g = check(lambda b, x: b.op("dropout", [x], {"p": 0.1}), {"x": t(3, 4)}, ["x"])
    op = next(o for o in g.ops if o.op_type == "dropout")
    assert op.outputs[1].type.dtype is DType.BOOL and op.outputs[1].type.size_bytes == 12
    assert op_flops(op) == 24


def test_causal_mask_sets_the_upper_triangle():
    b = FunctionBuilder("f")
    x = b.input("x", t(3, 3))
    f = b.finish([b.op("causal_mask", [x], {"fill": -9.0})])
    (y,) = execute(f, [np.zeros((3, 3))])
    np.testing.assert_array_equal(y, [[0, -9, -9], [0, 0, -9], [0, 0, 0]])


def test_adamw_step_matches_the_formula():
    b = FunctionBuilder("f")
    w, g, m, v = (b.input(n, t(3)) for n in "wgmv")
    f = b.finish(list(b.op("adamw", [w, g, m, v], {"lr": 0.1, "weight_decay": 0.01})))
    wv, gv = np.array([1.0, -2.0, 0.5]), np.array([0.1, 0.2, -0.3])
    w1, m1, v1 = execute(f, [wv, gv, np.zeros(3), np.zeros(3)])
    np.testing.assert_allclose(m1, 0.1 * gv)
    np.testing.assert_allclose(v1, 0.05 * gv * gv)
    np.testing.assert_allclose(w1, wv - 0.1 * (np.sign(gv) * np.abs(gv) / (np.abs(gv) + 1e-8)
                                               + 0.01 * wv), rtol=1e-6)


def test_shape_errors_name_the_op():
    b = FunctionBuilder("f")
    x = b.input("x", t(2, 3))
    with pytest.raises(VerifyError, match="perm"):
        b.op("transpose", [x], {"perm": [0, 0]})
    with pytest.raises(VerifyError, match="do not add up"):
        b.op("split", [x], {"axis": 1, "sizes": [1, 1]})
    with pytest.raises(VerifyError, match="gamma"):
        b.op("layernorm", [x, b.input("g", t(2)), b.input("be", t(3))])
    with pytest.raises(VerifyError, match="integers"):
        b.op("embedding", [x, x])
