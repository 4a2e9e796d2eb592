"""Semantics against numpy ground truth where onnx.reference itself is
wrong or fails (onnx 1.23) and so cannot be the judge:

- Softmax / LogSoftmax before opset 13 coerce the input to 2-D: the
  result is the softmax over the flattened dims ``[axis, rank)`` together
  (default axis 1); from opset 13 it is over ``axis`` alone (default -1).
  The reference applies the opset-13 meaning at every opset.
- BatchNormalization at opset 9 is ``scale * (x - mean) / sqrt(var + eps)
  + B`` with the per-channel vectors on axis 1, for any rank >= 2. The
  reference's opset-9 version gives other numbers (off by tenths with
  epsilon 0.1 when tried).
- Pad with negative widths (cropping) and an empty constant value (0):
  the reference raises.

Tolerances: rtol 1e-5, atol 1e-6 (float32 against a float64 truth).
"""
import numpy as np
import pytest

from distsim.importers.onnx import import_onnx, onnx_input_arrays
from distsim.interp import execute

from onnx_cases import model, x

RTOL, ATOL = 1e-5, 1e-6
SHAPE = (2, 3, 4)


def run(m, feeds):
    f = import_onnx(m)
    return execute(f, onnx_input_arrays(f, feeds))[0]


def softmax_rows(flat, log):
    e = np.exp(flat - flat.max(axis=-1, keepdims=True))
    y = e / e.sum(axis=-1, keepdims=True)
    return np.log(y) if log else y


def coerced_softmax(a, axis, log=False):
    """Opset < 13: softmax of the 2-D view (prod(shape[:axis]), rest)."""
    a = a.astype(np.float64)
    axis %= a.ndim
    lead = int(np.prod(a.shape[:axis]))
    return softmax_rows(a.reshape(lead, -1), log).reshape(a.shape)


def axis_softmax(a, axis, log=False):
    """Opset >= 13: softmax along one axis."""
    moved = np.moveaxis(a.astype(np.float64), axis, -1)
    return np.moveaxis(softmax_rows(moved, log), -1, axis)


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("opset", [9, 11, 12])
@pytest.mark.parametrize("axis", [None, 0, 1, 2, -1, -2])
def test_softmax_before_opset_13_flattens_the_trailing_dims(op, opset, axis):
    a = np.random.default_rng(opset).normal(size=SHAPE).astype(np.float32) * 3
    attrs = {} if axis is None else {"axis": axis}
    ours = run(model(op, [x(SHAPE)], attrs, opset=opset), {"x": a})
    truth = coerced_softmax(a, 1 if axis is None else axis, op == "LogSoftmax")
    np.testing.assert_allclose(ours, truth, rtol=RTOL, atol=ATOL)
    if (1 if axis is None else axis) % 3 != 2:  # the two meanings differ here
        assert np.abs(truth - axis_softmax(a, 1 if axis is None else axis,
                                           op == "LogSoftmax")).max() > 1e-2


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("axis", [None, 0, 1, -2])
def test_softmax_from_opset_13_is_along_one_axis(op, axis):
    a = np.random.default_rng(13).normal(size=SHAPE).astype(np.float32) * 3
    attrs = {} if axis is None else {"axis": axis}
    ours = run(model(op, [x(SHAPE)], attrs, opset=13), {"x": a})
    truth = axis_softmax(a, -1 if axis is None else axis, op == "LogSoftmax")
    np.testing.assert_allclose(ours, truth, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("opset", [9, 14, 15])
@pytest.mark.parametrize("shape", [(4, 3), (2, 3, 5), (2, 3, 4, 4)])
@pytest.mark.parametrize("epsilon", [None, 0.1])
def test_batchnorm_inference_formula(opset, shape, epsilon):
    rng = np.random.default_rng(len(shape) * 100 + opset)
    c = shape[1]
    stats = {"s": rng.uniform(0.5, 2.0, c), "bb": rng.normal(size=c),
             "m": rng.normal(size=c), "v": rng.uniform(0.2, 2.0, c)}
    stats = {k: v.astype(np.float32) for k, v in stats.items()}
    a = rng.normal(size=shape).astype(np.float32)
    attrs = {} if epsilon is None else {"epsilon": epsilon}
    ours = run(model("BatchNormalization", [x(shape)], attrs, consts=stats, opset=opset),
               {"x": a})
    eps = 1e-5 if epsilon is None else epsilon
    per_channel = (1, c) + (1,) * (len(shape) - 2)
    s, b, m, v = (stats[k].astype(np.float64).reshape(per_channel) for k in ("s", "bb", "m", "v"))
    truth = s * (a - m) / np.sqrt(v + eps) + b
    np.testing.assert_allclose(ours, truth, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("pads,value", [([1, -1, 2, 3], 1.5), ([0, -2, -1, 0], 0.0),
                                        ([-1, 2, 1, -3], None)])
def test_pad_with_negative_widths_crops(pads, value):
    shape = (3, 6)
    a = np.random.default_rng(7).normal(size=shape).astype(np.float32)
    consts = {"p": np.array(pads)}
    consts["v"] = np.array([], np.float32) if value is None else np.array(value, np.float32)
    ours = run(model("Pad", [x(shape)], consts=consts, opset=13), {"x": a})
    begin, end = pads[:2], pads[2:]
    cropped = a[max(-begin[0], 0):shape[0] - max(-end[0], 0),
                max(-begin[1], 0):shape[1] - max(-end[1], 0)]
    truth = np.pad(cropped, [(max(b, 0), max(e, 0)) for b, e in zip(begin, end)],
                   constant_values=0.0 if value is None else value)
    assert ours.shape == truth.shape
    np.testing.assert_allclose(ours, truth, rtol=RTOL, atol=ATOL)
