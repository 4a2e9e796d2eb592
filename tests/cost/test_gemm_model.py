"""The tile/wave GEMM model on shapes whose time is derived by hand.

Device: 100 TFLOP/s bf16 peak, 4 SMs, ceiling 0.5: one SM runs
100e12 * 0.5 / 4 = 12.5e12 FLOP/s, so a 128 x 128 tile over K elements
takes 2 * 128 * 128 * K / 12.5e12 s (2.68435456 us at K = 1024).
"""
import pytest

from distsim.cost import CostModel, DeviceSpec
from distsim.cost.gemm import GemmModel, GemmShape, gemm_shape, tile_intensity_of
from distsim.ir import DType, FunctionBuilder, TensorType

BF16 = DType.BF16
PEAK, BW = 100e12, 1e12
TILE_1024 = 2 * 128 * 128 * 1024 / 12.5e12          # one 128 x 128 tile, K = 1024


def model(**kw):
    fields = dict(sms=4, efficiency={"bf16": 0.5}, tiles=((128, 128),))
    fields.update(kw)
    return GemmModel(**fields)


def t(m, n, k, batch=1, **kw):
    return model(**kw).time(GemmShape(batch, m, n, k), BF16, PEAK, BW)


def test_one_full_wave_is_flops_over_the_ceiling():
    # 2 x 2 tiles on 4 SMs: one wave, every SM busy
    assert TILE_1024 == pytest.approx(2.68435456e-6, rel=1e-12)
    assert t(256, 256, 1024) == pytest.approx(TILE_1024, rel=1e-12)
    assert t(256, 256, 1024) == pytest.approx(2 * 256 * 256 * 1024 / (PEAK * 0.5), rel=1e-12)


def test_a_partial_wave_costs_a_whole_wave_or_its_share():
    # 3 x 2 = 6 tiles on 4 SMs: 1.5 waves
    assert t(384, 256, 1024) == pytest.approx(2 * TILE_1024, rel=1e-12)          # strict: 2
    assert t(384, 256, 1024, wave_quantization=0.5) == pytest.approx(1.75 * TILE_1024,
                                                                     rel=1e-12)
    assert t(384, 256, 1024, wave_quantization=0.0) == pytest.approx(1.5 * TILE_1024,
                                                                     rel=1e-12)


def test_a_tiny_k_pays_the_tile_overhead():
    # K = 64 with a 64-element overhead per tile: twice the FLOP time
    assert t(256, 256, 64, k_overhead=64) == pytest.approx(2 * 128 * 128 * 128 / 12.5e12,
                                                           rel=1e-12)
    assert t(256, 256, 64, k_overhead=64) == pytest.approx(2 * t(256, 256, 64), rel=1e-12)


def test_batched_gemms_share_the_waves():
    # 8 GEMMs of one tile each: 8 tiles, 2 waves over K = 512
    assert t(128, 128, 512, batch=8) == pytest.approx(2 * 2 * 128 * 128 * 512 / 12.5e12,
                                                      rel=1e-12)


def test_split_k_fills_idle_sms_and_pays_for_its_partial_sums():
    # one tile, K = 4096: s = 1 takes a quarter wave (costs a whole one) of
    # K 4096; s = 4 fills the 4 SMs with K 1024 each and moves 4 fp32
    # partial products of 128 x 128 written and read (8 bytes each) at 1e12 B/s
    unsplit = 4 * TILE_1024
    split4 = TILE_1024 + 8 * 4 * 128 * 128 / BW
    split2 = 2 * TILE_1024 + 8 * 2 * 128 * 128 / BW
    assert split4 < split2 < unsplit
    assert t(128, 128, 4096) == pytest.approx(split4, rel=1e-12)


def test_small_tiles_lose_rate_below_the_needed_intensity():
    # 192 x 192: four 128-tiles (one wave) or nine 64-tiles (2.25 -> 3 waves of
    # a quarter of the work). 64-tiles load 32 FLOP/B, 128-tiles 64 FLOP/B.
    assert tile_intensity_of(128, 128, 2) == 64 and tile_intensity_of(64, 64, 2) == 32
    tiles = ((128, 128), (64, 64))
    tile64 = 2 * 64 * 64 * 1024 / 12.5e12
    assert t(192, 192, 1024, tiles=tiles) == pytest.approx(3 * tile64, rel=1e-12)
    # needing 64 FLOP/B, a 64-tile runs at half rate: 6 tile64 > one 128 wave
    assert t(192, 192, 1024, tiles=tiles, tile_intensity=64) == pytest.approx(TILE_1024,
                                                                             rel=1e-12)


def test_sixteen_bit_types_stand_in_for_each_other_only():
    m = model()
    assert m.efficiency_for(DType.F16) == 0.5 and m.efficiency_for(DType.F32) is None


def op(shapes, attrs=None, dtype=BF16):
    b = FunctionBuilder("f")
    ins = [b.input(f"x{i}", TensorType(s, dtype, 0)) for i, s in enumerate(shapes)]
    b.op("matmul", ins, attrs)
    return b.function.ops[0]


def test_gemm_shapes_of_linear_batched_and_weight_gradient_products():
    assert gemm_shape(op([(2, 64, 32), (32, 16)])) == GemmShape(1, 128, 16, 32)   # folds
    assert gemm_shape(op([(6, 64, 32), (6, 16, 32)], {"trans_b": True})) == \
        GemmShape(6, 64, 16, 32)                                                # batched
    assert gemm_shape(op([(2, 64, 32), (2, 64, 16)], {"trans_a": True, "sum_batch": True})) == \
        GemmShape(1, 32, 16, 128)                                               # dW


def gemm_device(**kw):
    return DeviceSpec("g", {"bf16": PEAK, "f32": 10e12}, memory_bandwidth_Bps=BW,
                      memory_bytes=10 ** 10, launch_overhead_s=3e-6, matmul_efficiency=0.7,
                      gemm=model(), **kw)


def test_the_cost_model_adds_launch_overhead_and_the_memory_floor():
    cost = CostModel(gemm_device())
    assert cost.op_cost(op([(256, 1024), (1024, 256)])).time_s == pytest.approx(
        3e-6 + TILE_1024, rel=1e-12)
    # K = 16: 2 * 256 * 256 * 16 FLOP take 0.04 us; the 256 KiB moved take 0.26 us
    skinny = op([(256, 16), (16, 256)])
    nbytes = (256 * 16 * 2 + 256 * 256) * 2
    assert cost.op_cost(skinny).time_s == pytest.approx(3e-6 + nbytes / BW, rel=1e-12)


def test_a_dtype_without_gemm_figures_keeps_the_flat_roofline():
    f32 = op([(256, 1024), (1024, 256)], dtype=DType.F32)
    assert CostModel(gemm_device()).op_cost(f32).time_s == pytest.approx(
        3e-6 + 2 * 256 * 256 * 1024 / (10e12 * 0.7), rel=1e-12)
