"""FlashAttention's measured figures and the kernel classes' bandwidths,
on ops whose time is derived by hand."""
import pytest

from distsim.cost import CostModel, DeviceSpec, op_flops
from distsim.cost.attention_time import AttentionModel
from distsim.cost.gemm import GemmModel
from distsim.cost.kernel_classes import kernel_class
from distsim.ir import DType, FunctionBuilder, TensorType
from distsim.transforms.autodiff import Autodiff

PEAK = 100e12


def attention(causal, heads=8, s=1024, d=64):
    fb = FunctionBuilder("f")
    q, k, v = (fb.input(n, TensorType((2, heads // 2, s, d), DType.BF16, 0)) for n in "qkv")
    out, _ = fb.op("fused_attention", [q, k, v], {"causal": causal})
    f = Autodiff("loss", ["q", "k", "v"])(fb.finish([fb.op("reduce_sum", [out], name="loss")]))
    return [next(o for o in f.ops if o.op_type == t)
            for t in ("fused_attention", "fused_attention_grad")]


def device(sms=None):
    gemm = GemmModel(sms=sms, efficiency={"bf16": 0.8}) if sms else None
    return DeviceSpec("a", {"bf16": PEAK}, memory_bandwidth_Bps=1e15, memory_bytes=10 ** 10,
                      attention=AttentionModel(fwd_efficiency=0.5, bwd_efficiency=0.4,
                                               key_overhead=128), gemm=gemm)


def test_forward_and_backward_take_their_own_efficiency_and_the_key_overhead():
    fwd, bwd = attention(causal=False)
    # 8 heads x 1024 x 1024 pairs x d 64: 4 FLOP a pair and dim forward
    assert op_flops(fwd) == 4 * 8 * 1024 * 1024 * 64
    overhead = (1024 + 128) / 1024
    cost = CostModel(device())
    assert cost.op_cost(fwd).time_s == pytest.approx(op_flops(fwd) / (PEAK * 0.5) * overhead,
                                                     rel=1e-12)
    assert cost.op_cost(bwd).time_s == pytest.approx(op_flops(bwd) / (PEAK * 0.4) * overhead,
                                                     rel=1e-12)


def test_a_causal_block_walks_half_the_keys_so_pays_more_overhead():
    fwd, _ = attention(causal=True)
    assert CostModel(device()).op_cost(fwd).time_s == pytest.approx(
        op_flops(fwd) / (PEAK * 0.5) * (512 + 128) / 512, rel=1e-12)


def test_query_blocks_run_in_waves_over_the_sms():
    fwd, _ = attention(causal=False)
    base = op_flops(fwd) / (PEAK * 0.5) * (1024 + 128) / 1024
    # 8 heads x 1024 / 128 = 64 blocks: 16 waves on 4 SMs; 10.67 -> 11 on 6
    assert CostModel(device(sms=4)).op_cost(fwd).time_s == pytest.approx(base, rel=1e-12)
    assert CostModel(device(sms=6)).op_cost(fwd).time_s == pytest.approx(
        base * 11 / (64 / 6), rel=1e-12)


def test_kernel_classes_set_the_bandwidth_of_their_op_types():
    assert [kernel_class(t) for t in ("add", "gelu", "layernorm_grad", "softmax_grad",
                                      "transpose", "reduce_sum", "matmul")] == \
        ["elementwise", "elementwise", "norm", "softmax", "copy", "reduction", None]
    spec = DeviceSpec("c", {"bf16": PEAK}, memory_bandwidth_Bps=1e12, memory_bytes=10 ** 10,
                      memory_efficiency=0.9, memory_efficiency_by_op={"softmax": 0.25},
                      memory_efficiency_by_class={"norm": 0.5, "softmax": 0.6})
    assert spec.memory_efficiency_of("layernorm_grad") == 0.5          # its class
    assert spec.memory_efficiency_of("softmax") == 0.25                # its own figure
    assert spec.memory_efficiency_of("softmax_grad") == 0.6
    assert spec.memory_efficiency_of("add") == 0.9                     # no class figure


def kernel_attention(kernel, heads=8, s=1024, d=64):
    fb = FunctionBuilder("f")
    q, k, v = (fb.input(n, TensorType((2, heads // 2, s, d), DType.BF16, 0)) for n in "qkv")
    out, _ = fb.op("fused_attention", [q, k, v], {"causal": False, "kernel": kernel})
    f = Autodiff("loss", ["q", "k", "v"])(fb.finish([fb.op("reduce_sum", [out], name="loss")]))
    return [next(o for o in f.ops if o.op_type == t)
            for t in ("fused_attention", "fused_attention_grad")]


def kernel_device(**attention):
    from distsim.cost.device_blocks import attention_model_from_dict
    block = {"fwd_efficiency": 0.5, "bwd_efficiency": 0.4, "key_overhead": 128, **attention}
    return DeviceSpec("k", {"bf16": PEAK}, memory_bandwidth_Bps=1e15, memory_bytes=10 ** 10,
                      attention=attention_model_from_dict(block, "device.attention"))


def test_an_op_naming_a_kernel_takes_that_kernels_figures_both_ways():
    spec = kernel_device(kernels={"cudnn": {"fwd_efficiency": 0.75, "bwd_efficiency": 0.6,
                                            "key_overhead": 64}})
    fwd, bwd = kernel_attention("cudnn")
    assert bwd.attrs["kernel"] == "cudnn"           # the gradient keeps the forward's kernel
    cost = CostModel(spec)
    # 8 heads x 1024 x 1024 x 64 x 4 FLOPs forward, 2.5x backward, 64 keys of overhead
    flops = 4 * 8 * 1024 * 1024 * 64
    assert cost.op_cost(fwd).time_s == pytest.approx(
        flops / (PEAK * 0.75) * (1024 + 64) / 1024, rel=1e-12)
    assert cost.op_cost(bwd).time_s == pytest.approx(
        2.5 * flops / (PEAK * 0.6) * (1024 + 64) / 1024, rel=1e-12)
    # no kernel named: the block's own (default) figures
    plain, _ = attention(causal=False)
    assert cost.op_cost(plain).time_s == pytest.approx(
        flops / (PEAK * 0.5) * (1024 + 128) / 1024, rel=1e-12)


def test_a_kernel_the_device_has_no_figures_for_is_one_line_naming_the_field():
    from distsim.errors import ConfigError
    fwd, _ = kernel_attention("cudnn")
    with pytest.raises(ConfigError, match=r"^attention_kernel: cudnn: device k has no figures "
                                          r"for it \(its attention.kernels block"):
        CostModel(kernel_device()).op_cost(fwd)
    with pytest.raises(ConfigError, match=r"^device.attention.kernels.cudnn.bwd_efficiency: "
                                          r"missing required field"):
        kernel_device(kernels={"cudnn": {"fwd_efficiency": 0.7}})
    with pytest.raises(ConfigError, match=r"^device.attention.kernels.cudnn.kernels: unknown"):
        kernel_device(kernels={"cudnn": {"fwd_efficiency": 0.7, "bwd_efficiency": 0.6,
                                         "kernels": {}}})
