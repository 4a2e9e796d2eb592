"""Constant folding cannot be made to allocate without bound, and Gemm takes
matrices only.

Folding evaluates a node whose inputs are all known at import time, and
the size of some results depends on the data: three scalars asked Range for
2**31 int64 (16 GiB), a (1, 1) constant was Expand-ed to 2**16 x 2**16,
and ``--dtype f16`` cast a broadcast ConstantOfShape element by element
(32 GiB, an internal error). Past ``FOLD_OUTPUT_LIMIT`` elements an op that
also runs at run time stays an op of the program; one supported only on
constants (Range, Tile, OneHot, ...) is refused naming the node and the
size. Gemm with a 3-D (or 1-D) A or B was imported as a batched matmul;
ONNX requires 2-D.

The sizes used at the real limit are 2**56 elements or more: more bytes than
a 64-bit address space holds, so that even without the limit the allocation
fails at once. These tests never allocate much, with or without the fix.
"""
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from distsim.cli import main
from distsim.errors import VerifyError
from distsim.importers import onnx_fold
from distsim.importers.onnx import import_onnx, onnx_input_arrays
from distsim.importers.onnx_fold import FOLD_OUTPUT_LIMIT, fold_output_numel
from distsim.interp import execute

F, I64 = TensorProto.FLOAT, TensorProto.INT64
HUGE = 1 << 28  # per dim: 2**56 elements in two dims (2**58 bytes in f32)


def _model(nodes, inputs, inits=(), opset=17):
    graph = helper.make_graph(nodes, "g", inputs,
                              [helper.make_tensor_value_info(nodes[-1].output[0], 0, None)],
                              list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _const(values, name, dtype=np.int64):
    return numpy_helper.from_array(np.array(values, dtype), name)


def _x(shape, name="x", elem=F):
    return helper.make_tensor_value_info(name, elem, list(shape))


def _range(limit):
    """x + Range(0, limit, 1): an int64 position-ids pattern."""
    return _model([helper.make_node("Range", ["s", "l", "d"], ["r"], name="pos"),
                   helper.make_node("Add", ["x", "r"], ["y"])],
                  [_x([1], elem=I64)], [_const(0, "s"), _const(limit, "l"), _const(1, "d")])


def _tile(repeats):
    return _model([helper.make_node("Tile", ["c", "rep"], ["t"], name="tiled"),
                   helper.make_node("Add", ["x", "t"], ["y"])],
                  [_x([1, 1], elem=I64)], [_const([[1, 2], [3, 4]], "c"), _const(repeats, "rep")])


def _onehot(depth):
    return _model([helper.make_node("OneHot", ["i", "depth", "v"], ["o"], name="hot"),
                   helper.make_node("Add", ["x", "o"], ["y"])],
                  [_x([1, 1], elem=I64)], [_const([0, 1], "i"), _const(depth, "depth"),
                                           _const([0, 1], "v")])


def _expand(shape):
    return _model([helper.make_node("Expand", ["c", "shape"], ["e"], name="mask"),
                   helper.make_node("Add", ["x", "e"], ["y"])],
                  [_x([1, 1])], [_const([[0.5]], "c", np.float32), _const(shape, "shape")])


def _pad(pads):
    return _model([helper.make_node("Pad", ["c", "pads"], ["p"], name="padded"),
                   helper.make_node("Mul", ["x", "p"], ["y"])],
                  [_x([1, 1])], [_const([[2.0]], "c", np.float32), _const(pads, "pads")])


def _message(model):
    with pytest.raises(VerifyError) as e:
        import_onnx(model)
    text = str(e.value)
    assert "\n" not in text
    return text


# ----- the real limit --------------------------------------------------------------
@pytest.mark.parametrize("model, label, numel", [
    (_range(1 << 62), "'pos' (Range)", 1 << 62),
    (_tile([HUGE, HUGE]), "'tiled' (Tile)", 4 << 56),
    (_onehot(1 << 61), "'hot' (OneHot)", 2 << 61),
])
def test_a_constant_only_op_past_the_limit_is_refused_with_its_size(model, label, numel):
    text = _message(model)
    assert label in text
    assert f"{numel:,} elements" in text and f"{FOLD_OUTPUT_LIMIT:,}" in text


def test_the_limit_is_generous():
    # a (1, 1, 8192, 8192) causal mask still folds
    assert FOLD_OUTPUT_LIMIT >= 8192 * 8192


def test_an_expand_past_the_limit_stays_an_op_of_the_program():
    f = import_onnx(_expand([HUGE, HUGE]))
    assert [op.op_type for op in f.ops] == ["broadcast_to", "add"]
    assert f.outputs[0].type.shape == (HUGE, HUGE)


def test_a_huge_constant_of_shape_is_not_allocated_by_dtype_f16():
    model = _model([helper.make_node("ConstantOfShape", ["shape"], ["z"], name="ones",
                                     value=numpy_helper.from_array(np.ones(1, np.float32))),
                    helper.make_node("Add", ["x", "z"], ["y"])],
                   [_x([1, 1])], [_const([HUGE, HUGE], "shape")])
    f = import_onnx(model, dtype="f16")
    ones = f.meta["constants"]["z"]
    assert ones.shape == (HUGE, HUGE) and ones.dtype == np.float16
    assert not any(ones.strides) and float(ones[0, 0]) == 1.0  # a view of one element


def test_the_cli_refuses_in_one_line(tmp_path, capsys):
    path = tmp_path / "range.onnx"
    path.write_bytes(_range(1 << 62).SerializeToString())
    assert main(["import", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'pos' (Range)" in err and "elements" in err


# ----- the boundary, under a small limit -------------------------------------------
@pytest.fixture
def limit_1000(monkeypatch):
    monkeypatch.setattr(onnx_fold, "FOLD_OUTPUT_LIMIT", 1000)


@pytest.mark.parametrize("make, at_limit, past_limit, label, numel", [
    (_range, 1000, 1001, "(Range)", 1001),
    (_tile, [10, 25], [10, 26], "(Tile)", 1040),     # a 2x2 tiled to 20 x 50, 20 x 52
    (_onehot, 500, 501, "(OneHot)", 1002),           # 2 indices x depth
])
def test_the_limit_is_inclusive(limit_1000, make, at_limit, past_limit, label, numel):
    import_onnx(make(at_limit))
    text = _message(make(past_limit))
    assert label in text and f"{numel:,} elements" in text and "more than the 1,000" in text


def _outer_add(shape):
    """x + (column + row): a shape-dependent size (two vectors, a matrix)."""
    rows, cols = shape
    return _model([helper.make_node("Add", ["col", "row"], ["grid"], name="grid"),
                   helper.make_node("Add", ["x", "grid"], ["y"])],
                  [_x([1, 1], elem=I64)], [_const(np.arange(rows).reshape(rows, 1), "col"),
                                           _const(np.arange(cols).reshape(1, cols), "row")])


@pytest.mark.parametrize("make, small, large", [
    (_expand, [10, 10], [40, 30]),
    (_pad, [0, 0, 3, 4], [0, 0, 30, 40]),
    (_outer_add, [10, 10], [40, 30]),
])
def test_an_op_past_the_limit_runs_and_matches_the_reference(limit_1000, make, small, large):
    folded = import_onnx(make(small))
    assert len(folded.ops) == 1  # the constant was folded: only the Add / Mul remains
    model = make(large)
    f = import_onnx(model)
    assert f.ops[0].op_type in ("broadcast_to", "pad", "add") and len(f.ops) >= 2
    x = np.full((1, 1), 3, np.int64 if make is _outer_add else np.float32)
    ours = execute(f, onnx_input_arrays(f, {"x": x}))[0]
    theirs = ReferenceEvaluator(model).run(None, {"x": x})[0]
    np.testing.assert_array_equal(ours, theirs)


# ----- output sizes without evaluating ---------------------------------------------
def _range_numel(start, limit, delta):
    node = helper.make_node("Range", ["s", "l", "d"], ["r"])
    return fold_output_numel(node, {"s": np.array(start), "l": np.array(limit),
                                    "d": np.array(delta)}, [helper.make_opsetid("", 17)])


@pytest.mark.parametrize("start, limit, delta, numel", [
    (0, 10, 3, 4), (10, 0, -3, 4), (10, 0, 1, 0), (-(1 << 62), 1 << 62, 1, 1 << 63),
    (np.float32(0), np.float32(2.5), np.float32(0.5), 5),
    (0, 10, 0, None), (np.float32(0), np.float32(np.inf), np.float32(1), None),
])
def test_range_size(start, limit, delta, numel):
    assert _range_numel(start, limit, delta) == numel


# ----- Gemm --------------------------------------------------------------------------
@pytest.mark.parametrize("a_shape, w_shape, trans_b, bad", [
    ((2, 3, 4), (4, 5), 0, "A 'a' of shape (2, 3, 4)"),
    ((3, 4), (2, 5, 4), 1, "B 'w' of shape (2, 5, 4)"),
    ((4,), (4, 5), 0, "A 'a' of shape (4,)"),
])
def test_gemm_needs_matrices(a_shape, w_shape, trans_b, bad):
    model = _model([helper.make_node("Gemm", ["a", "w"], ["y"], name="fc", transB=trans_b)],
                   [_x(a_shape, "a")], [_const(np.ones(w_shape), "w", np.float32)])
    text = _message(model)
    assert "'fc' (Gemm)" in text and "2-D" in text and bad in text


def test_gemm_of_constant_matrices_is_checked_before_folding():
    model = _model([helper.make_node("Gemm", ["a", "b"], ["g"], name="fc"),
                    helper.make_node("Add", ["x", "g"], ["y"])],
                   [_x([1], elem=I64)], [_const(np.ones((2, 2, 2)), "a"),
                                         _const(np.ones((2, 2)), "b")])
    assert "'fc' (Gemm)" in _message(model)


def test_gemm_of_matrices_still_matches_the_reference():
    model = _model([helper.make_node("Gemm", ["a", "w", "c"], ["y"], transB=1, alpha=0.5)],
                   [_x((3, 4), "a")], [_const(np.arange(20).reshape(5, 4), "w", np.float32),
                                       _const(np.ones(5), "c", np.float32)])
    a = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    f = import_onnx(model)
    ours = execute(f, onnx_input_arrays(f, {"a": a}))[0]
    np.testing.assert_allclose(ours, ReferenceEvaluator(model).run(None, {"a": a})[0],
                               rtol=1e-5)
