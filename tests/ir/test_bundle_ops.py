"""pack and unpack (distsim.ir.ops_bundle): a bundle is its parts' summed
bytes, unpack gives the parts back, the text format round-trips them,
they cost nothing and the numpy executor passes the tensors through."""
import numpy as np
import pytest

from distsim.cost.device import DeviceSpec
from distsim.cost.model import CostModel
from distsim.errors import VerifyError
from distsim.interp import execute
from distsim.ir import DType, FunctionBuilder, TensorType, verify
from distsim.ir.ops_bundle import unpack_attrs
from distsim.text import parse_function, print_function

DEVICE = DeviceSpec("d", {"f32": 1e12, "bf16": 1e12}, memory_bandwidth_Bps=1e12,
                    memory_bytes=10**9, launch_overhead_s=1e-5)


def _bundled():
    """x (f32[2,3], 24 bytes) and y (bf16[5], 10 bytes) packed, unpacked,
    then added up."""
    b = FunctionBuilder("f")
    x = b.input("x", TensorType((2, 3), DType.F32, 0))
    y = b.input("y", TensorType((5,), DType.BF16, 0))
    packed = b.op("pack", [x, y])
    x2, y2 = b.op("unpack", [packed], unpack_attrs([x.type, y.type]))
    s = b.op("reduce_sum", [x2], {"axes": (0, 1)})
    return b.finish([s, y2]), packed


def test_a_bundle_is_the_summed_bytes_on_the_parts_device():
    f, packed = _bundled()
    assert packed.type == TensorType((24 + 10,), DType.U8, 0)
    assert packed.type.size_bytes == 34
    verify(f)


def test_bundles_round_trip_through_the_text_format():
    f, _ = _bundled()
    text = print_function(f)
    assert "u8[34]@0" in text and "unpack(" in text
    g = parse_function(text)
    verify(g)
    assert print_function(g) == text


def test_the_numpy_executor_passes_the_parts_through():
    f, _ = _bundled()
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    y = np.linspace(0, 1, 5).astype(np.float32)
    total, y_back = execute(f, [x, y])
    assert float(total) == 15.0
    np.testing.assert_array_equal(y_back, y)


def test_pack_and_unpack_cost_nothing():
    f, _ = _bundled()
    model = CostModel(DEVICE)
    pack, unpack = f.ops[0], f.ops[1]
    for op in (pack, unpack):
        cost = model.op_cost(op)
        assert (cost.time_s, cost.flops, cost.bytes) == (0.0, 0.0, 0.0)
    # the function costs exactly its one real op
    assert model.function_cost(f).time_s == model.op_cost(f.ops[2]).time_s > 0


@pytest.mark.parametrize("shapes,dtypes,message", [
    (((2, 3),), ("f32",), "the parts hold 24 bytes, the bundle 34"),
    (((2, 3), (5,)), ("f32",), "2 shapes but 1 dtypes"),
    (((2, 3), (4,)), ("f32", "bf16"), "the parts hold 32 bytes, the bundle 34"),
])
def test_an_unpack_that_does_not_fit_its_bundle_is_refused(shapes, dtypes, message):
    b = FunctionBuilder("f")
    x = b.input("x", TensorType((2, 3), DType.F32, 0))
    y = b.input("y", TensorType((5,), DType.BF16, 0))
    packed = b.op("pack", [x, y])
    with pytest.raises(VerifyError, match=message):
        b.op("unpack", [packed], {"shapes": shapes, "dtypes": dtypes})


def test_only_a_bundle_unpacks_and_parts_share_a_device():
    b = FunctionBuilder("f")
    x = b.input("x", TensorType((8,), DType.F32, 0))
    z = b.input("z", TensorType((8,), DType.F32, 1))
    with pytest.raises(VerifyError, match=r"unpack takes a bundle \(u8\[bytes\]\)"):
        b.op("unpack", [x], {"shapes": ((8,),), "dtypes": ("f32",)})
    with pytest.raises(VerifyError, match="pack: inputs on different devices"):
        b.op("pack", [x, z])
