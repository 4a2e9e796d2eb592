"""Kernel fusion as the simulated framework runs it (``--fusion``): a fused
group's cost by hand, its trace slice, and the kernels the rules find in a
GPT layer."""
import json
from collections import Counter

import pytest

import distsim
from distsim.cost import CostModel, DeviceSpec
from distsim.errors import ConfigError
from distsim.ir import DType, FunctionBuilder, TensorType
from distsim.ir.ops_fused import FUSED
from distsim.models.gpt_family import build_gpt_step, gpt_config
from distsim.models.registry import load_model_config
from distsim.transforms.fusion import Fuse
from distsim.transforms.strategy import Strategy

# bandwidth 1e12 B/s, 5 us per launch; arithmetic far below memory time
DEVICE = DeviceSpec(name="t", peak_flops={"bf16": 1e15}, memory_bandwidth_Bps=1e12,
                    memory_bytes=10**10, launch_overhead_s=5e-6)


def softmax_chain():
    """scale -> causal_mask -> softmax on a 1024 x 1024 bf16 tensor."""
    b = FunctionBuilder("f")
    x = b.input("x", TensorType((1, 1024, 1024), DType.BF16, 0))
    y = b.op("scale", [x], {"factor": 0.125})
    y = b.op("causal_mask", [y])
    y = b.op("softmax", [y], {"axis": -1})
    f = b.finish([y])
    f.meta["grads"] = {}
    return f


def test_a_fused_group_reads_its_input_once_and_writes_its_output_once():
    step = softmax_chain()
    cost = CostModel(DEVICE)
    mib2 = 1024 * 1024 * 2                   # one 1024 x 1024 bf16 tensor: 2 MiB
    # unfused: three kernels, each reading and writing 2 MiB and paying a launch
    unfused = sum(cost.op_cost(op).time_s for op in step.ops)
    assert unfused == pytest.approx(3 * (5e-6 + 2 * mib2 / 1e12), rel=1e-12)
    fused = Fuse("megatron")(step)
    [op] = fused.ops
    assert op.op_type == FUSED and op.attrs["kernel"] == "scale+mask+softmax"
    c = cost.op_cost(op)
    # one launch, x read once and the probabilities written once
    assert c.bytes == 2 * mib2
    assert c.time_s == pytest.approx(5e-6 + 2 * mib2 / 1e12, rel=1e-12)
    assert c.time_s == pytest.approx(9.194304e-6, rel=1e-9)
    assert unfused == pytest.approx(27.582912e-6, rel=1e-9)
    # the same arithmetic as the parts
    assert c.flops == sum(cost.op_cost(o).flops for o in step.ops)


def test_a_result_read_outside_the_group_is_written():
    # bias + dropout + residual add: the dropout mask is read later (by the
    # backward pass), so it leaves the kernel; the biased sum never does
    b = FunctionBuilder("f")
    t = TensorType((1, 256, 512), DType.BF16, 0)
    x, res = b.input("x", t), b.input("res", t)
    bias = b.input("bias", TensorType((512,), DType.BF16, 0))
    y = b.op("add", [x, bias])
    dropped, mask = b.op("dropout", [y], {"p": 0.1})
    out = b.op("add", [res, dropped])
    f = b.finish([out, mask])
    f.meta["grads"] = {}
    [op] = Fuse("megatron")(f).ops
    assert op.attrs["kernel"] == "bias+dropout+add"
    assert [v.name for v in op.outputs] == [out.name, mask.name]
    elems = 256 * 512
    # x, res (bf16), bias; the mask and the output
    expected = 2 * elems * 2 + 512 * 2 + mask.type.size_bytes + elems * 2
    assert CostModel(DEVICE).op_cost(op).bytes == expected


def gpt_step(attention="explicit", tp=1, dropout=0.1):
    cfg = {k: v for k, v in load_model_config("tiny").items() if k not in ("path", "family",
                                                                           "name")}
    cfg.update(attention=attention, dropout=dropout)
    return build_gpt_step(gpt_config(cfg), Strategy(tp=tp, fusion="none"), 1)


def kernels_of_layer(step, layer=1):
    return Counter(op.attrs["kernel"] for op in step.ops
                   if op.op_type == FUSED and op.meta.get("layer") == layer)


@pytest.mark.parametrize("tp", [1, 2])
def test_megatron_rules_find_the_gpt_layers_fused_kernels(tp):
    kernels = kernels_of_layer(Fuse("megatron")(gpt_step(tp=tp)))
    # forward: the QKV bias in its GEMM, fused scale-mask-softmax, bias-GeLU,
    # two bias-dropout-adds (attention and MLP); backward: the fused softmax
    assert kernels == {"matmul+bias": 1, "scale+mask+softmax": 1, "bias+gelu": 1,
                       "bias+dropout+add": 2, "softmax_grad+mask+scale": 1}


def test_pytorch_eager_fuses_only_the_linear_bias_into_the_gemm():
    kernels = kernels_of_layer(Fuse("pytorch-eager")(gpt_step()))
    # qkv, proj, fc1 and fc2 (at tp 1 no all-reduce separates a bias from its GEMM)
    assert kernels == {"matmul+bias": 4}


def test_flash_attention_leaves_no_softmax_to_fuse():
    kernels = kernels_of_layer(Fuse("megatron")(gpt_step(attention="fused")))
    assert kernels == {"matmul+bias": 1, "bias+gelu": 1, "bias+dropout+add": 2}


def test_none_changes_nothing():
    step = gpt_step()
    assert Fuse("none")(step) is step


def test_fusion_is_a_run_option_shown_in_the_trace_and_config(tmp_path):
    runs = {f: distsim.simulate("tiny", "dgx-a100", dp=4, tp=2, fusion=f)
            for f in ("none", "megatron")}
    assert runs["megatron"].summary()["config"]["fusion"] == "megatron"
    # the GPT family's default is Megatron's
    default = distsim.simulate("tiny", "dgx-a100", dp=8)
    assert default.summary()["config"]["fusion"] == "megatron"
    names = Counter(r.op_type for r in runs["megatron"].trace.ops if r.rank == 0)
    # 4 layers x 2 micro-batches on rank 0 (global batch 8 over dp 4, one sequence each)
    assert names["scale+mask+softmax"] == 4 * 2
    assert names["bias+gelu"] == 4 * 2
    assert "scale+mask+softmax" not in {r.op_type for r in runs["none"].trace.ops}
    assert runs["megatron"].step_time_s < runs["none"].step_time_s
    # the chrome trace shows each as one slice named after its parts
    path = tmp_path / "trace.json"
    runs["megatron"].write_trace(path)
    slices = Counter(e["name"] for e in json.loads(path.read_text())["traceEvents"]
                     if e.get("ph") == "X" and e.get("pid") == 0)
    assert slices["scale+mask+softmax"] == 4 * 2


def test_an_unset_fusion_is_the_model_familys():
    from distsim.transforms.strategy import Strategy, fusion_for
    assert fusion_for(Strategy(), "gpt") == "megatron"
    assert fusion_for(Strategy(), "mlp") == fusion_for(Strategy()) == "none"
    assert fusion_for(Strategy(fusion="none"), "gpt") == "none"


def test_coarsening_keeps_the_fused_step_time():
    plain = distsim.simulate("tiny", "dgx-a100", dp=4, tp=2, fusion="megatron")
    coarse = distsim.simulate("tiny", "dgx-a100", dp=4, tp=2, fusion="megatron", coarsen=True)
    assert coarse.step_time_s == pytest.approx(plain.step_time_s, rel=1e-12)


def test_a_bad_fusion_value_is_one_clear_error():
    with pytest.raises(ConfigError, match="--fusion: must be one of megatron, megatron-core, "
                                          "pytorch-eager, none, got 'xla'"):
        distsim.simulate("tiny", "dgx-a100", dp=8, fusion="xla")


def test_sweeps_take_fusion_as_an_axis(tmp_path):
    base = {"model": "tiny", "topology": "dgx-a100", "network_mode": "analytical"}
    df = distsim.sweep(base, grid={"fusion": ["none", "megatron"]}, workers=1,
                       out_dir=tmp_path / "ok")
    rows = {r.fusion: r for r in df.itertuples()}
    assert rows["none"].status == rows["megatron"].status == "ok"
    assert rows["megatron"].step_time_s < rows["none"].step_time_s
    with pytest.raises(ConfigError, match=r"grid\.fusion\[0\]: must be one of megatron, "):
        distsim.sweep(base, grid={"fusion": ["xla"]}, workers=1, out_dir=tmp_path / "bad")


def test_the_mlp_fuses_only_when_asked():
    plain = distsim.simulate("mlp", "dgx-a100", dp=8)
    assert plain.summary()["config"]["fusion"] == "none"
    eager = distsim.simulate("mlp", "dgx-a100", dp=8, fusion="pytorch-eager")
    assert eager.summary()["config"]["fusion"] == "pytorch-eager"
    assert "matmul+bias" in {r.op_type for r in eager.trace.ops}
    assert "matmul+bias" not in {r.op_type for r in plain.trace.ops}


def test_megatron_core_runs_swiglus_forward_as_one_kernel():
    # silu(gate) * up on 256 x 1024 bf16: fused, gate and up read once and
    # the product written once (three 512 KiB passes, one launch); unfused,
    # silu reads and writes one, mul reads two and writes one (five, two launches)
    b = FunctionBuilder("f")
    t = TensorType((1, 256, 1024), DType.BF16, 0)
    gate, up = b.input("gate", t), b.input("up", t)
    y = b.op("mul", [b.op("silu", [gate]), up])
    f = b.finish([y])
    f.meta["grads"] = {}
    cost = CostModel(DEVICE)
    one = 256 * 1024 * 2
    assert sum(cost.op_cost(op).time_s for op in f.ops) == pytest.approx(
        2 * 5e-6 + 5 * one / 1e12, rel=1e-12)
    assert Fuse("megatron")(f).ops[0].op_type == "silu"      # Megatron-LM: not fused
    [op] = Fuse("megatron-core")(f).ops
    assert op.attrs["kernel"] == "silu+mul"
    assert cost.op_cost(op).bytes == 3 * one
    assert cost.op_cost(op).time_s == pytest.approx(5e-6 + 3 * one / 1e12, rel=1e-12)


def test_megatron_core_fuses_megatrons_kernels_too():
    assert kernels_of_layer(Fuse("megatron-core")(gpt_step())) == \
        kernels_of_layer(Fuse("megatron")(gpt_step()))
