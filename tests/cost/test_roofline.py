"""The roofline cost model: exact times from hand-computed FLOPs and bytes."""
import pytest

from distsim.cost import CostModel, DeviceSpec, op_flops
from distsim.ir import DType, FunctionBuilder, TensorType

DEVICE = DeviceSpec(name="test", peak_flops={"f16": 100e12, "f32": 10e12},
                    memory_bandwidth_Bps=1e12, memory_bytes=10**10)


def one_op(op_type, shapes, attrs=None, dtype=DType.F16):
    b = FunctionBuilder("f")
    ins = [b.input(f"x{i}", TensorType(s, dtype, 0)) for i, s in enumerate(shapes)]
    b.op(op_type, ins, attrs)
    return b.function.ops[0]


def test_compute_bound_matmul_takes_flops_over_peak():
    op = one_op("matmul", [(4096, 4096), (4096, 4096)])
    flops = 2 * 4096 ** 3
    assert op_flops(op) == flops
    assert CostModel(DEVICE).op_cost(op).time_s == pytest.approx(flops / 100e12, rel=1e-12)


def test_memory_bound_add_takes_bytes_over_bandwidth():
    op = one_op("add", [(1024, 1024), (1024, 1024)])
    nbytes = 3 * 1024 * 1024 * 2  # two inputs and one output, 2 bytes each
    cost = CostModel(DEVICE).op_cost(op)
    assert cost.bytes == nbytes
    assert cost.time_s == pytest.approx(nbytes / 1e12, rel=1e-12)


def test_dtype_selects_peak_and_efficiency_and_launch_apply():
    spec = DeviceSpec(name="t", peak_flops={"f16": 100e12, "f32": 10e12}, memory_bandwidth_Bps=1e12,
                      memory_bytes=10**10, launch_overhead_s=5e-6, matmul_efficiency=0.5)
    op = one_op("matmul", [(2048, 2048), (2048, 2048)], dtype=DType.F32)
    expected = 5e-6 + 2 * 2048 ** 3 / (10e12 * 0.5)
    assert CostModel(spec).op_cost(op).time_s == pytest.approx(expected, rel=1e-12)


def test_an_op_types_own_memory_efficiency_replaces_the_devices():
    spec = DeviceSpec(name="t", peak_flops={"f16": 100e12}, memory_bandwidth_Bps=1e12,
                      memory_bytes=10**10, launch_overhead_s=4e-6, memory_efficiency=0.9,
                      memory_efficiency_by_op={"layernorm": 0.5})
    norm = one_op("layernorm", [(4096, 1024), (1024,), (1024,)])
    # reads x, gamma and beta, writes y: 2 bytes each; memory-bound at 1e12 B/s x 0.5
    nbytes = (2 * 4096 * 1024 + 2 * 1024) * 2
    assert CostModel(spec).op_cost(norm).bytes == nbytes
    assert CostModel(spec).op_cost(norm).time_s == pytest.approx(4e-6 + nbytes / 0.5e12,
                                                                 rel=1e-12)
    add = one_op("add", [(1024, 1024), (1024, 1024)])   # not listed: the device's 0.9
    assert CostModel(spec).op_cost(add).time_s == pytest.approx(
        4e-6 + 3 * 1024 * 1024 * 2 / 0.9e12, rel=1e-12)


def test_profile_overrides_formula():
    op = one_op("add", [(8,), (8,)])
    assert CostModel(DEVICE, profile={"add": 1.5}).op_cost(op).time_s == 1.5


def test_transposed_matmul_flops():
    op = one_op("matmul", [(64, 32), (64, 16)], {"trans_a": True})
    assert op_flops(op) == 2 * 32 * 16 * 64


def test_h100_layernorm_and_softmax_run_at_their_measured_bandwidth():
    """dgx-h100.yaml's kernel-class figures (reports/calibration, the median
    of each class's kernels, launch overhead taken out): a bf16 layernorm
    moves its bytes at 0.563 of 3.35 TB/s (norm), softmax at 0.509, an add
    at 0.894 (element-wise); each after the 3.68 us launch."""
    from distsim.topology import load_topology
    model = CostModel(load_topology("dgx-h100").device_spec)
    bf16 = DType.BF16
    norm = one_op("layernorm", [(4096, 12288), (12288,), (12288,)], dtype=bf16)
    soft = one_op("softmax", [(48, 2048, 2048)], dtype=bf16)
    add = one_op("add", [(4096, 12288), (4096, 12288)], dtype=bf16)
    norm_bytes = (2 * 4096 * 12288 + 2 * 12288) * 2
    soft_bytes = 2 * 48 * 2048 * 2048 * 2
    add_bytes = 3 * 4096 * 12288 * 2
    assert model.op_cost(norm).time_s == pytest.approx(
        3.68e-6 + norm_bytes / (3.35e12 * 0.563), rel=1e-12)
    assert model.op_cost(soft).time_s == pytest.approx(
        3.68e-6 + soft_bytes / (3.35e12 * 0.509), rel=1e-12)
    assert model.op_cost(add).time_s == pytest.approx(
        3.68e-6 + add_bytes / (3.35e12 * 0.894), rel=1e-12)


def test_h200_is_the_h100_with_more_and_faster_memory():
    """dgx-h200.yaml (HARDWARE.md: H200 SXM, 141 GB HBM3e at 4.8 TB/s, the
    H100's compute): a bf16 add streams its bytes at 0.894 of 4.8 TB/s
    instead of 3.35; a large matmul, compute-bound, takes the H100's time:
    whole waves of whole tiles (8192 x 12288 splits evenly into every tile
    shape), so the GEMM model's time is the FLOPs at the bf16 ceiling
    (0.7255) stretched by the 128-element tile overhead over K = 12288."""
    from distsim.topology import load_topology
    h100 = CostModel(load_topology("dgx-h100").device_spec)
    h200_spec = load_topology("dgx-h200-x2").device_spec
    h200 = CostModel(h200_spec)
    assert h200_spec.memory_bytes == 141e9
    bf16 = DType.BF16
    add = one_op("add", [(4096, 12288), (4096, 12288)], dtype=bf16)
    add_bytes = 3 * 4096 * 12288 * 2
    assert h200.op_cost(add).time_s == pytest.approx(3.68e-6 + add_bytes / (4.8e12 * 0.894),
                                                     rel=1e-12)
    mm = one_op("matmul", [(8192, 12288), (12288, 12288)], dtype=bf16)
    assert h200.op_cost(mm).time_s == pytest.approx(h100.op_cost(mm).time_s, rel=1e-12)
    assert h200.op_cost(mm).time_s == pytest.approx(
        3.68e-6 + 2 * 8192 * 12288 * 12288 / (989e12 * 0.7255) * (12288 + 128) / 12288,
        rel=1e-12)
