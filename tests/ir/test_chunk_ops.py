"""chunk_cat and chunk_split (distsim.ir.ops_shard): ZeRO-3's copy-in of a
layer's gradients before one reduce-scatter, and the copy-out of a
layer's all-gathered buffer into its parameters. Row ``d`` of chunk_cat's
result holds every input's ``d``-th shard; chunk_split undoes it; both
are memory-bound copies (each byte read and written once)."""
import numpy as np
import pytest

from distsim.cost.device import DeviceSpec
from distsim.cost.model import CostModel
from distsim.errors import VerifyError
from distsim.interp import execute
from distsim.ir import DType, FunctionBuilder, TensorType, verify
from distsim.text import parse_function, print_function

DEVICE = DeviceSpec("d", {"f32": 1e12}, memory_bandwidth_Bps=1e12, memory_bytes=10**9,
                    launch_overhead_s=1e-5, memory_efficiency=1.0)


def _round_trip():
    """a (f32[2,4]) and b (f32[6]) as 2 rows each, concatenated, split back."""
    fb = FunctionBuilder("f")
    a = fb.input("a", TensorType((2, 4), DType.F32, 0))
    b = fb.input("b", TensorType((6,), DType.F32, 0))
    cat = fb.op("chunk_cat", [a, b], {"rows": 2})
    a2, b2 = fb.op("chunk_split", [cat], {"rows": 2, "shapes": [[2, 4], [6]]})
    return fb.finish([cat, a2, b2])


def test_rows_hold_each_inputs_shard_and_split_undoes_it():
    f = verify(_round_trip())
    a = np.arange(8, dtype=np.float32).reshape(2, 4)
    b = np.arange(100, 106, dtype=np.float32)
    cat, a2, b2 = execute(f, [a, b])
    # row 0: a's first half, b's first half; row 1: the second halves
    np.testing.assert_array_equal(cat, [0, 1, 2, 3, 100, 101, 102, 4, 5, 6, 7, 103, 104, 105])
    np.testing.assert_array_equal(a2, a)
    np.testing.assert_array_equal(b2, b)


def test_text_round_trip_and_types():
    f = verify(_round_trip())
    text = print_function(f)
    assert "shapes = [[2, 4], [6]]" in text
    assert print_function(parse_function(text)) == text
    assert [v.type.shape for v in f.outputs] == [(14,), (2, 4), (6,)]


def test_each_is_one_copy_of_its_bytes():
    f = _round_trip()
    model = CostModel(DEVICE)
    for op in f.ops:   # 14 f32 read and 14 written: 112 bytes at 1 TB/s
        cost = model.op_cost(op)
        assert cost.bytes == 112 and cost.flops == 0
        assert cost.time_s == pytest.approx(1e-5 + 112 / 1e12, rel=1e-12)


@pytest.mark.parametrize("op_type, shapes, attrs, message", [
    ("chunk_cat", [(3,)], {"rows": 2}, "does not split into 2 equal rows"),
    ("chunk_cat", [(4,)], {"rows": 0}, "rows must be positive"),
    ("chunk_split", [(8,)], {"rows": 2, "shapes": [[3], [5]]}, "do not all split into 2"),
    ("chunk_split", [(8,)], {"rows": 2, "shapes": [[2], [4]]}, "not the flat concatenation"),
])
def test_bad_shapes_are_refused(op_type, shapes, attrs, message):
    fb = FunctionBuilder("f")
    xs = [fb.input(f"x{i}", TensorType(s, DType.F32, 0)) for i, s in enumerate(shapes)]
    with pytest.raises(VerifyError, match=message):
        outs = fb.op(op_type, xs, attrs)
        verify(fb.finish(list(outs) if isinstance(outs, (list, tuple)) else [outs]))
