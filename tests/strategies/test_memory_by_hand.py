"""Memory and utilisation of small runs against figures worked out by hand.

Every expected number below is arithmetic on the model's shape, written
out in the comments; none is read off a simulation. The models:

- ``tiny`` (models/tiny.yaml): 4 layers, hidden h = 32, 4 heads, vocab
  V = 64, seq s = 16, tied embeddings, learned positions, bf16, global
  batch 8, micro-batch 1. Parameters: a layer has 12 h^2 + 13 h =
  12 x 1024 + 13 x 32 = 12,704; the model 4 x 12,704 + V h (64 x 32 =
  2,048) + s h (16 x 32 = 512) + the final layernorm 2 h (64) = 53,440;
- the MLP: 2 layers of 1024 x 1024 f16 weights and 1024 biases, batch 512.

The network is made fast (1e6 GB/s, no latency) where the point is the
memory model: with a slow network ZeRO 2's fresh gradients wait for their
reduce-scatters and pile up (a real effect of a backlog, not the static
accounting checked here).
"""
from __future__ import annotations

import pytest
import yaml

import distsim
from distsim.models import load_model_config
from distsim.models.gpt_family import build_gpt_step, gpt_config
from distsim.transforms.memory_model import saved_activation_bytes
from distsim.transforms.strategy import Strategy

#: tiny's parameters, by hand (module docstring)
P = 4 * (12 * 32 * 32 + 13 * 32) + 64 * 32 + 16 * 32 + 2 * 32
DEVICE = {"name": "toy", "peak_flops": {"bf16": 100.0e12, "f16": 100.0e12, "f32": 10.0e12},
          "memory_bandwidth_Bps": 1.0e12, "memory_bytes": 80.0e9}


def star(tmp_path, devices: int, link_GBps: float = 1e6, latency_us: float = 0.0, **device):
    """A YAML star topology of ``devices`` toy devices; its path."""
    path = tmp_path / f"star{devices}.yaml"
    path.write_text(yaml.safe_dump({
        "name": f"star{devices}", "device": {**DEVICE, **device}, "builder": "star",
        "params": {"devices": devices, "link_GBps": link_GBps, "latency_us": latency_us}}))
    return str(path)


def test_tiny_has_53440_parameters():
    assert P == 53_440
    step = build_gpt_step(gpt_config(load_model_config("tiny")), Strategy(dp=1), micro_batch=1)
    roles = step.meta["roles"]
    assert sum(v.type.numel for v in step.inputs if roles.get(v.name) == "param") == P


# ZeRO stage -> bytes a parameter on each of dp = 2 ranks (mixed-precision
# AdamW, README "Memory accounting"): (bf16 weights, bf16 gradient buffer,
# fp32 master + m + v)
#   0: 2, 2, 12        (16)
#   1: 2, 2, 12/2 = 6  (10 = 4 + 12/dp)
#   2: 2, 2/2, 6       (9 = 2 + 14/dp)
#   3: 2/2, 2/2, 6     (8 = 16/dp)
STATE = {0: (2, 2, 12), 1: (2, 2, 6), 2: (2, 1, 6), 3: (1, 1, 6)}


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_resident_state_and_curve_ends_follow_2_2_12(tmp_path, zero):
    """The step's resident inputs on rank 0 hold the ZeRO paper's bytes;
    the memory curve ends at exactly that state plus the four micro-batch
    losses (bf16 scalars, 4 x 2 = 8 bytes): every activation, gradient
    and temporary freed, updates in place."""
    weights, grads, optim = STATE[zero]
    r = distsim.simulate(model="tiny", topology=star(tmp_path, 2), dp=2, zero=zero)
    roles = r.program.meta["roles"]
    held = {}
    for v in r.program.inputs:
        if v.type.device == 0:
            held[roles.get(v.name)] = held.get(roles.get(v.name), 0) + v.type.size_bytes
    assert held["param"] == weights * P
    assert held["grad_buffer"] == grads * P
    # fp32 master (4) + m and v (8) = 12, halved from ZeRO 1 on
    assert held["master"] + held["optimizer"] == optim * P
    assert held["master"] == 4 * P // (2 if zero else 1)
    curve = [s.live_bytes for s in r.trace.memory if s.rank == 0]
    assert curve[-1] == (weights + grads + optim) * P + 4 * 2
    peak = r.summary()["memory_by_category"]["0"]
    assert peak["optimizer"] == optim * P
    if zero < 3:
        assert peak["weights"] == weights * P


def test_tiny_activations_per_layer_are_korthikanti():
    """Bytes a layer keeps for its backward (Korthikanti et al. 2022, 16-bit
    activations and 1-byte dropout masks), s = 16, b = 1, h = 32, a = 4:
    sbh = 512 and 5 a s / h = 5 x 4 x 16 / 32 = 10.

    - no recomputation: sbh (34 + 5as/h) = 512 x 44 = 22,528;
    - selective (attention core recomputed): 34 sbh = 17,408;
    - full: the layer input only, 2 sbh = 1,024;
    - tp = 2: sbh (10 + 24/t + 5as/(ht)) = 512 x (10 + 12 + 5) = 13,824."""
    c = gpt_config(load_model_config("tiny"))
    expected = {(1, "none"): 22_528, (1, "selective"): 17_408, (1, "full"): 1_024,
                (2, "none"): 13_824}
    for (tp, recompute), per_layer in expected.items():
        step = build_gpt_step(c, Strategy(dp=1, tp=tp, recompute=recompute), micro_batch=1)
        got = saved_activation_bytes(step)
        assert [got[layer] for layer in range(4)] == [per_layer] * 4


def test_tiny_mfu_by_hand(tmp_path):
    """Model FLOPs (Narayanan et al. 2021): 3 x forward matmuls.
    Per token, forward: 2 x (layers x 12 h^2 + V h) = 2 x (4 x 12,288 +
    2,048) = 102,400, plus attention 2 x 2 x s x h x layers = 4 x 16 x 32 x
    4 = 8,192: 110,592. x 3 = 331,776 a token, x 8 x 16 = 128 tokens:
    42,467,328. MFU = that / (step x 2 devices x 100 TFLOP/s bf16)."""
    r = distsim.simulate(model="tiny", topology=star(tmp_path, 2, 10, 1), dp=2)
    s = r.summary()
    assert s["model_flops"] == 42_467_328
    assert s["mfu"] == pytest.approx(42_467_328 / (s["step_time_s"] * 2 * 100e12), rel=1e-12)
    assert s["tokens_per_s"] == pytest.approx(128 / s["step_time_s"], rel=1e-12)


def test_one_device_mlp_peak_and_step_by_hand(tmp_path):
    """MLP, 2 layers, H = 1024, batch 512, f16, SGD, one device of
    100 TFLOP/s f16 and 1 TB/s, every efficiency 0.5, no launch overhead.

    Time: a forward matmul is 2 x 512 x 1024 x 1024 = 1,073,741,824 FLOP,
    1.0737e9 / (100e12 x 0.5) = 21.475 us (its 4 MB of traffic take 8.4 us:
    compute bound). The step runs 5 (forward 2; backward: the weight
    gradients 2 and one input gradient, layer 0's input being data) ->
    107.374 us. Element-wise ops are memory bound at 0.5 TB/s:
    add 2,099,200 B (2x) 4.1984 us each; relu 2,097,152 B 4.194304 us;
    mse_loss 2,097,154 B 4.194308 us; mse_loss_grad 3,145,730 B 6.29146 us;
    relu_grad 3,145,728 B 6.291456 us; reduce_sum (bias grads)
    1,050,624 B (2x) 2.101248 us; sgd on weights 3 x 2 MB = 6,291,456 B
    (2x) 12.582912 us; sgd on biases 6,144 B (2x) 0.012288 us; ones_like
    4 B 0.000008 us. Sum of the element-wise: 58.760..., total 166.135 us.

    Peak (during the backward's second weight gradient): x, target (1 MB
    each), w0, w1 (2 MB each), b0, b1 (2 KB each) = 6,295,552 resident;
    a0 (1 MB, read by that matmul), the loss (2 B), d_h1 (1 MB), d_a0
    (1 MB), d_b1 (2 KB), d_w1 (2 MB, being produced): 11,540,482 bytes."""
    topo = star(tmp_path, 1, memory_efficiency=0.5, matmul_efficiency=0.5,
                vector_efficiency=0.5)
    r = distsim.simulate(model="mlp", topology=topo, dp=1, layers=2, hidden=1024, batch=512)
    mb, w = 512 * 1024 * 2, 1024 * 1024 * 2
    matmul = 2 * 512 * 1024 * 1024 / (100e12 * 0.5)
    bw = 1e12 * 0.5
    elementwise = (2 * 2_099_200 + 2_097_152 + 2_097_154 + 3_145_730 + 3_145_728
                   + 2 * 1_050_624 + 2 * 6_291_456 + 2 * 6_144 + 4) / bw
    assert r.step_time_s == pytest.approx(5 * matmul + elementwise, rel=1e-12)
    resident = 2 * mb + 2 * w + 2 * 2048
    assert resident == 6_295_552
    peak = resident + mb + 2 + mb + mb + 2048 + w
    assert r.summary()["max_peak_memory_bytes"] == peak == 11_540_482
    assert r.summary()["hfu"] == pytest.approx(
        r.summary()["total_flops"] / (r.step_time_s * 100e12), rel=1e-12)
