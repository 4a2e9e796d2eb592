"""NumpyExecutor checks each kernel's result against the op's declared
result type (shape and dtype): the cost model and the simulator read the
declared types, so a shape rule that disagreed with its kernel would make
every differential test pass while the simulated bytes and FLOPs were
wrong. It used to return whatever the kernel gave."""
import numpy as np
import pytest

from distsim.errors import ExecutionError
from distsim.interp import execute
from distsim.ir import DType, TensorType
from distsim.ir.core import Function, Op, Value


def one_op(op_type, attrs, in_type, declared):
    """``op_type`` on one input, its result typed ``declared`` (not inferred)."""
    x = Value("x", in_type)
    y = Value("y", declared)
    return Function("f", [x], [Op.trusted(op_type, (x,), (y,), attrs)], [y])


def test_a_result_shape_that_differs_from_its_type_is_an_error():
    f = one_op("transpose", {"perm": (1, 0)}, TensorType((2, 3), DType.F32, 0),
               TensorType((2, 3), DType.F32, 0))
    with pytest.raises(ExecutionError, match=r"%y \(transpose\): the kernel gave shape \(3, 2\), "
                                             r"the result type says \(2, 3\)"):
        execute(f, [np.zeros((2, 3), np.float32)])


def test_a_result_dtype_that_differs_from_its_type_is_an_error():
    f = one_op("relu", {}, TensorType((4,), DType.F32, 0), TensorType((4,), DType.F64, 0))
    with pytest.raises(ExecutionError, match=r"gave dtype float32, the result type says f64"):
        execute(f, [np.zeros(4, np.float32)])


def test_bf16_results_are_float32_arrays():
    # bf16 has no numpy type: computed in float32, which its type accepts
    f = one_op("relu", {}, TensorType((4,), DType.BF16, 0), TensorType((4,), DType.BF16, 0))
    (out,) = execute(f, [np.ones(4, np.float32)])
    assert out.dtype == np.float32
