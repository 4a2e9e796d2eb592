"""A dropless mixture-of-experts dispatch (``dispatch: dropless``,
Megatron-core's default) against the padded one, with numbers written by
hand: a histogram where one expert gets 5 / 8 of the tokens, so that the
padded experts each compute the busiest expert's slots while the dropless
ones compute the busiest expert-parallel rank's real tokens, and their
slot buffers count those rows in memory. The refusal
of ``capacity_factor`` with it is one line, exit 2. That the dropless step
updates the weights as its one-device step does is in
``test_moe_strategies.py``."""
from __future__ import annotations

import pytest

import distsim
from distsim.cli import main
from distsim.cost.model import CostModel
from distsim.errors import ConfigError
from distsim.ir.occupancy import held_bytes, marked
from distsim.ir.ops_fused import FUSED
from distsim.sim.simulator import collective_bytes

# 64 tokens per micro-batch (seq 64, micro-batch 1), top 1 of 4 experts,
# loads 5 : 1 : 1 : 1; 8 ranks of dgx-h100, ep 2 (experts 0, 1 on ep rank 0)
MODEL = dict(family="gpt", layers=2, hidden=64, heads=4, vocab=128, seq=64, global_batch=16,
             micro_batch=1, experts=4, top_k=1, expert_ffn=32, activation="gelu",
             expert_loads=[5, 1, 1, 1])


def _first(program, op_type, name):
    return next(op for op in program.ops if op.op_type == op_type
                and op.outputs[0].name.startswith(name))


@pytest.fixture(scope="module")
def programs():
    return {d: distsim.build_program(dict(MODEL, dispatch=d), "dgx-h100", dp=8, ep=2)
            for d in ("padded", "dropless")}


def test_alltoall_bytes_by_hand(programs):
    # padded: 4 experts x 40 slots (5 / 8 of 64 tokens) x 64 hidden x 2 bytes
    # dropless: ep rank 0's experts get 40 + 8 = 48 tokens from each rank, so a
    # rank's message is 48 x 2 ranks = 96 rows: 96 x 64 x 2 bytes (a factor 5 / 3)
    padded = _first(programs["padded"][0], "comm.alltoall", "l0_dispatch_ep")
    dropless = _first(programs["dropless"][0], "comm.alltoall", "l0_dispatch_ep")
    assert collective_bytes(padded) == 4 * 40 * 64 * 2 == 20480
    assert collective_bytes(dropless) == 96 * 64 * 2 == 12288
    # the trace shows the padded shapes: every expert has room for all 64 tokens
    assert dropless.inputs[0].type.shape == (4, 64, 64)
    assert dropless.meta["occupancy"] == 48 / (2 * 64)


def test_expert_gemm_flops_by_hand(programs):
    # fc1 of the 2 local experts: padded 2 x (2 ranks x 40 slots) rows, dropless
    # the busiest rank's 2 x 48 rows; 2 x rows x 64 x 32 FLOPs (5 / 3 apart)
    device = programs["padded"][2].device_spec
    cost = CostModel(device)
    padded = _first(programs["padded"][0], "matmul", "l0_experts_fc1")
    dropless = _first(programs["dropless"][0], "matmul", "l0_experts_fc1")
    assert cost.op_cost(padded).flops == 2 * (2 * 80) * 64 * 32 == 655_360
    assert cost.op_cost(dropless).flops == 2 * 96 * 64 * 32 == 393_216
    # its time past the launch is 3 / 8 of the padded 2 x 128 rows' (grouped GEMM
    # at the batched GEMM's rate); the backward's GEMMs inherit the share
    launch = device.launch_overhead_s
    full = cost.roofline_time(dropless, cost.op_cost(dropless).flops / 0.375,
                              cost.op_cost(dropless).bytes / 0.375)
    assert cost.op_cost(dropless).time_s == pytest.approx(launch + 0.375 * (full - launch),
                                                          rel=1e-12)
    grads = [op for op in programs["dropless"][0].ops
             if op.outputs and op.outputs[0].name.startswith("d_l0_experts_w1")]
    assert grads and all(op.meta["occupancy"] == 0.375 for op in grads)


def test_one_device_dropless_uses_top_k_over_experts():
    # ep 1: all 4 experts on the rank, their 64 tokens in 4 x 64 slots: 1 / 4 hold
    # tokens (every ep rank's tokens are the micro-batch's 64 x top_k)
    program = distsim.build_program(dict(MODEL, dispatch="dropless"), "dgx-h100", dp=8)[0]
    fc1 = _first(program, "matmul", "l0_experts_fc1")
    assert fc1.inputs[0].type.shape == (4, 64, 64) and fc1.meta["occupancy"] == 0.25


def test_capacity_factor_refused():
    with pytest.raises(ConfigError, match="capacity_factor: a dropless dispatch drops no"):
        distsim.build_program(dict(MODEL, dispatch="dropless", capacity_factor=1.0),
                              "dgx-h100", dp=8)
    with pytest.raises(ConfigError, match="dispatch: must be one of padded, dropless"):
        distsim.build_program(dict(MODEL, dispatch="grouped"), "dgx-h100", dp=8)


def test_cli_refusal_is_one_line_exit_2(tmp_path, capsys):
    path = tmp_path / "m.yaml"
    path.write_text("family: gpt\nlayers: 2\nhidden: 64\nheads: 4\nvocab: 128\nseq: 16\n"
                    "global_batch: 8\nmicro_batch: 1\nexperts: 4\ntop_k: 2\n")
    base = ["simulate", "--model", str(path), "--topology", "dgx-h100", "--dispatch",
            "dropless", "--out", str(tmp_path / "o")]
    assert main([*base, "--ep", "2"]) == 0
    capsys.readouterr()
    assert main([*base, "--capacity-factor", "1.5"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "capacity_factor: a dropless" in err, err


def test_the_dispatch_moves_its_routed_rows(programs):
    # the dispatch reads the 64 tokens and their probabilities and writes the
    # 64 routed rows (top 1) of its 4 x 64 slots: 64 x 64 x 2 bytes of 32768;
    # its FLOPs are the routing's comparisons (64 x 4), as padded
    device = programs["dropless"][2].device_spec
    op = _first(programs["dropless"][0], "moe_dispatch", "l0_dispatch")
    tokens, probs = (v.type.size_bytes for v in op.inputs)
    assert op.outputs[0].type.size_bytes == 32768 and op.meta["occupancy"] == 0.25
    cost = CostModel(device).op_cost(op)
    assert cost.bytes == tokens + probs + 64 * 64 * 2
    assert cost.flops == 64 * 4


def _held(program, name):
    op = next(op for op in program.ops if any(v.name == name for v in op.outputs))
    return held_bytes(op, [v.name for v in op.outputs].index(name))


def test_slot_results_hold_their_real_rows_by_hand(programs):
    # rank 0, micro-batch 0 of layer 0; bf16 (2 bytes). The dispatch's 4 x 64
    # slots hold the 64 routed rows: 64 x 64 x 2 of 32768 bytes; ep rank 0's 2
    # experts hold the busiest rank's 96 rows of their 2 x 128: fc1 96 x 32 x 2
    dropless, padded = programs["dropless"][0], programs["padded"][0]
    assert _held(dropless, "l0_dispatch_m0_r0") == 64 * 64 * 2 == 8192
    assert _held(dropless, "l0_dispatch_ep_m0_r0") == 96 * 64 * 2 == 12288
    assert _held(dropless, "l0_experts_fc1_m0_r0") == 96 * 32 * 2 == 6144
    # not slot rows: the combined tokens, the router's gradient, the experts'
    # weight and bias gradients count their whole types
    assert _held(dropless, "l0_combine_m0_r0") == 64 * 64 * 2
    assert _held(dropless, "d_l0_router_probs_m0_r0") == 64 * 4 * 2
    assert _held(dropless, "d_l0_experts_w1_m0_r0") == 2 * 64 * 32 * 2
    assert _held(dropless, "d_l0_experts_b1_m0_r0") == 2 * 1 * 32 * 2
    # padded: every value its type's bytes (4 x 40 slots, 2 x 80 at ep 2)
    assert _held(padded, "l0_dispatch_ep_m0_r0") == 2 * 80 * 64 * 2
    assert _held(padded, "l0_experts_fc1_m0_r0") == 2 * 80 * 32 * 2


def test_slot_activations_held_for_the_backward_by_hand(programs):
    # what layer 0's experts keep on rank 0 for micro-batch 0's backward: the
    # experts' input (fc1's weight gradient reads it), fc1's output (gelu's
    # gradient) and gelu's (fc2's weight gradient), 96 rows x (64 + 32 + 32),
    # and the combine's input, the all-to-all's result counted at its share
    # 48 / 128 of 4 x 64 x 64 (the busiest rank's): 3 / 8 x 32768
    def saved(program):
        read = {id(v) for op in program.ops if "phase" in op.meta for v in op.inputs}
        return sum(held_bytes(op, k) for op in program.ops
                   if "phase" not in op.meta and op.meta.get("layer") == 0
                   and op.meta.get("occupancy") is not None
                   for k, v in enumerate(op.outputs)
                   if id(v) in read and v.name.endswith("_m0_r0"))

    assert saved(programs["dropless"][0]) == 96 * (64 + 32 + 32) * 2 + 12288 == 36864


@pytest.mark.parametrize("ep", [1, 2])
def test_dropless_peak_is_padded_under_uniform_routing(ep):
    # uniform routing: each expert gets 64 / 4 = 16 tokens, the padded capacity
    # (the busiest expert's); dropless holds top_k / experts = 1 / 4 of its 4 x
    # 64 slots (at ep 2 the busiest rank's 2 x 32 of its 2 x 128): the same
    # 16 rows per expert, so the same peak, where counting the padded buffers
    # gave dropless 4 x 64 / (4 x 16) = 4 times the experts' activations
    model = dict(MODEL, expert_loads=None)
    peaks = {d: distsim.simulate(model=dict(model, dispatch=d), topology="dgx-h100", dp=8,
                                 ep=ep).summary()["max_peak_memory_bytes"]
             for d in ("padded", "dropless")}
    assert peaks["dropless"] == peaks["padded"]


def test_coarsened_segments_hold_the_same_rows():
    # fused segments size their parts and temporaries as the ops they hold:
    # the coarsened step's peak is the op-by-op step's
    peaks = [distsim.simulate(model=dict(MODEL, dispatch="dropless"), topology="dgx-h100",
                              dp=8, ep=2, coarsen=c).summary()["max_peak_memory_bytes"]
             for c in (False, True)]
    assert peaks[0] == peaks[1]


def test_only_marked_ops_hold_less_than_their_types():
    # what the simulator's index asks held_bytes about: every other op's
    # results hold their types' bytes; coarsened segments holding the
    # experts' ops are marked
    program = distsim.build_program(dict(MODEL, dispatch="dropless"), "dgx-h100", dp=8, ep=2,
                                    coarsen=True)[0]
    flags = {}
    for op in program.ops:
        if not marked(op, flags):
            assert all(held_bytes(op, k) == v.type.size_bytes for k, v in enumerate(op.outputs))
    segments = [op for op in program.ops if op.op_type == FUSED and marked(op, flags)]
    assert segments
