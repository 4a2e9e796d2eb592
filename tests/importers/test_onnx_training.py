"""Training imported models: gradient rules of the importer's ops against
central finite differences (float64), and training steps of imported
models simulated data-parallel."""
import numpy as np
import pytest

import distsim
from distsim.interp import execute, random_inputs
from distsim.ir import DType, FunctionBuilder, TensorType, verify
from distsim.models.onnx_family import training_step
from distsim.paths import models_dir
from distsim.importers.onnx import import_onnx, onnx_input_arrays
from distsim.transforms.autodiff import Autodiff

F64 = DType.F64
MODELS = models_dir()


def numeric_grad(f, inputs, index, eps=1e-6):
    base = [np.array(a, dtype=np.float64) if a.dtype.kind == "f" else a for a in inputs]
    grad = np.zeros_like(base[index])
    for i in np.ndindex(base[index].shape):
        plus, minus = [a.copy() for a in base], [a.copy() for a in base]
        plus[index][i] += eps
        minus[index][i] -= eps
        grad[i] = (execute(f, plus)[0] - execute(f, minus)[0]) / (2 * eps)
    return grad


def check(build, shapes, wrt, seed=0):
    """``build(b, *inputs) -> y``; loss = sum(y * fixed random weights)."""
    b = FunctionBuilder("f")
    ins = [b.input(n, TensorType(s, dt, 0)) for n, (s, dt) in shapes.items()]
    y = build(b, *ins)
    w = b.input("w_out", y.type)
    loss = b.op("reduce_sum", [b.op("mul", [y, w])], name="loss")
    f = b.finish([loss])
    g = verify(Autodiff("loss", wrt)(f))
    inputs = random_inputs(f, seed)
    results = execute(g, inputs)
    names = [v.name for v in f.inputs]
    for k, name in enumerate(wrt):
        np.testing.assert_allclose(results[1 + k], numeric_grad(f, inputs, names.index(name)),
                                   rtol=1e-5, atol=1e-7)


IMG = ((2, 4, 6, 6), F64)
CONV = {"strides": (2, 1), "pads": (1, 0, 1, 2), "dilations": (1, 2), "group": 2}
POOL = {"kernel": (3, 3), "strides": (2, 2), "pads": (1, 1, 1, 1)}
CASES = {
    "conv": (lambda b, x, w: b.op("conv", [x, w], CONV),
             {"x": IMG, "w": ((6, 2, 3, 2), F64)}, ["x", "w"]),
    "maxpool": (lambda b, x: b.op("maxpool", [x], dict(POOL, ceil_mode=True)), {"x": IMG}, ["x"]),
    "averagepool": (lambda b, x: b.op("averagepool", [x], POOL), {"x": IMG}, ["x"]),
    "averagepool_pad": (lambda b, x: b.op("averagepool", [x], dict(POOL, count_include_pad=True)),
                        {"x": IMG}, ["x"]),
    "batchnorm": (lambda b, x, s, c, m: b.op("batchnorm", [x, s, c, m, b.op("exp", [m])]),
                  {"x": IMG, "s": ((4,), F64), "c": ((4,), F64), "m": ((4,), F64)},
                  ["x", "s", "c"]),
    "lrn": (lambda b, x: b.op("lrn", [x], {"size": 3, "alpha": 0.5, "bias": 2.0}), {"x": IMG},
            ["x"]),
    "gather": (lambda b, t, i: b.op("gather", [t, i], {"axis": 1}),
               {"t": ((3, 8), F64), "i": ((2, 3), DType.I64)}, ["t"]),
    "strided_slice": (lambda b, x: b.op("strided_slice", [x], {"starts": (1, -1), "ends": (4, 0),
                                                               "axes": (0, 1), "steps": (2, -2)}),
                      {"x": ((5, 6), F64)}, ["x"]),
    "where_min": (lambda b, x, y: b.op("where", [b.op("less", [x, y]), b.op("minimum", [x, y]),
                                                 y]), {"x": ((2, 3), F64), "y": ((3,), F64)},
                  ["x", "y"]),
    "pow_erf": (lambda b, x, e: b.op("erf", [b.op("pow", [b.op("exp", [x]), e])]),
                {"x": ((2, 3), F64), "e": ((), F64)}, ["x", "e"]),
    "reduce_max_unary": (lambda b, x: b.op("reduce_max", [b.op("abs", [b.op("sin", [x])])],
                                           {"axes": (1,)}), {"x": ((3, 4), F64)}, ["x"]),
    "clip_maximum": (lambda b, x, lo, hi: b.op("minimum", [b.op("maximum", [x, lo]), hi]),
                     {"x": ((3, 4), F64), "lo": ((4,), F64), "hi": ((), F64)}, ["x", "lo", "hi"]),
    "reciprocal_cos": (lambda b, x: b.op("reciprocal", [b.op("cos", [x])]),
                       {"x": ((2, 3), F64)}, ["x"]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_gradient_matches_finite_differences(case):
    build, shapes, wrt = CASES[case]
    check(build, shapes, wrt)


def test_resnet50_training_step_simulates_data_parallel_on_dgx_a100():
    result = distsim.simulate(model="resnet50", topology="dgx-a100", dp=8, batch=64)
    program = result.program
    assert program.devices() == list(range(8))
    kinds = {op.op_type for op in program.ops}
    assert {"conv_grad_input", "conv_grad_weight", "batchnorm_grad", "maxpool_grad"} <= kinds
    assert any(op.op_type.startswith("comm.") for op in program.ops)
    assert result.step_time_s > 0


def test_imported_transformer_trains_on_one_device():
    """The single-device reference step: loss, autodiff and AdamW (what
    --train lowers on any number of devices)."""
    f = import_onnx(MODELS / "gpt2-tiny.onnx", batch=2, seq=8)
    step = verify(training_step(f, lr=0.1))
    names = {v.name for v in step.inputs}
    assert "target" in names and step.meta["optimizer"] == "adamw"
    assert set(step.meta["params"]) <= set(step.meta["updates"])
    rng = np.random.default_rng(0)
    feeds = {"input_ids": rng.integers(0, 128, (2, 8)), "target": rng.normal(size=(2, 8, 128))}
    roles = step.meta["roles"]
    for v in step.inputs:
        if roles.get(v.name) == "master":
            feeds[v.name] = f.meta["constants"][v.name[:-len(".master")]]
        elif roles.get(v.name) == "optimizer":
            feeds[v.name] = np.zeros(v.type.shape)
    outputs = execute(step, onnx_input_arrays(step, feeds))
    assert np.isfinite(outputs[0]) and all(np.isfinite(o).all() for o in outputs)


def test_simulate_onnx_file_forward_and_train():
    path = str(MODELS / "bert-tiny.onnx")
    fwd = distsim.simulate(model=path, topology="dgx-a100", input_shapes={"input_ids": (8, 16)})
    train = distsim.simulate(model=path, topology="dgx-a100", input_shapes={"input_ids": (8, 16)},
                             train=True)
    assert 0 < fwd.step_time_s < train.step_time_s
    assert fwd.program.devices() == train.program.devices() == list(range(8))


def test_imported_1d_cnn_gradients_match_finite_differences():
    """Conv (1-D, lifted to 2-D), Clip, Pad (crop and pad), MaxPool (1-D)
    and LayerNormalization over axes [1, 3) as imported, differentiated
    end to end (float64) against central differences of the loss."""
    import onnx
    from onnx import helper, numpy_helper

    from distsim.models.onnx_family import with_loss

    rng = np.random.default_rng(3)
    inits = [numpy_helper.from_array(rng.normal(size=(4, 2, 3)), "w"),
             numpy_helper.from_array(rng.normal(size=4), "b"),
             numpy_helper.from_array(np.array(-0.6), "lo"),
             numpy_helper.from_array(np.array(0.8), "hi"),
             numpy_helper.from_array(np.array([0, 0, 1, 0, 0, -1]), "pads"),
             numpy_helper.from_array(rng.normal(size=(4, 4)) + 1, "g"),
             numpy_helper.from_array(rng.normal(size=(4, 4)), "beta")]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], strides=[1], pads=[1, 1]),
             helper.make_node("Clip", ["c", "lo", "hi"], ["k"]),
             helper.make_node("Pad", ["k", "pads"], ["p"]),
             helper.make_node("MaxPool", ["p"], ["m"], kernel_shape=[2], strides=[2]),
             helper.make_node("LayerNormalization", ["m", "g", "beta"], ["y"], axis=1)]
    D = onnx.TensorProto.DOUBLE
    graph = helper.make_graph(nodes, "cnn1d", [helper.make_tensor_value_info("x", D, [2, 2, 8])],
                              [helper.make_tensor_value_info("y", D, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    f = with_loss(import_onnx(model))
    assert f.outputs[0].type.shape == () and {"w", "b", "g", "beta"} <= set(f.meta["params"])
    g = verify(Autodiff(f.meta["loss"], f.meta["params"])(f))
    feeds = {"x": rng.normal(size=(2, 2, 8)), "target": rng.normal(size=(2, 4, 4))}
    inputs = onnx_input_arrays(f, feeds)
    results = execute(g, inputs)
    names = [v.name for v in f.inputs]
    for k, name in enumerate(f.meta["params"]):
        np.testing.assert_allclose(results[1 + k], numeric_grad(f, inputs, names.index(name)),
                                   rtol=1e-5, atol=1e-7, err_msg=name)
