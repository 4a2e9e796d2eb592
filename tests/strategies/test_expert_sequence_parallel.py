"""Expert parallelism with tensor and sequence parallelism (Megatron-LM's
MoE layer, expert tensor parallel size = tp): each tensor-parallel rank
routes its own sequence shard (``groups`` of the MoE ops), the slots go
by all-to-all over ep, are all-gathered over tp for the experts' split
FFNs, reduce-scattered back and returned by the inverse all-to-all. That
the step updates the weights as the one-device step does is in
``test_moe_strategies.py``; here: the grouped ops against one op per
group, the lowered layer's collectives in order, and a simulated
two-layer Mixtral's weights and collective sizes written out by hand."""
from __future__ import annotations

import numpy as np
import pytest

import distsim
from distsim.cli import main
from distsim.interp import execute
from distsim.ir import DType, FunctionBuilder, TensorType
from distsim.report.phases import KEYS, record_phases

MOE = dict(experts=4, top_k=2, expert_ffn=8, shared_experts=1, dense_layers=1,
           activation="swiglu", routing_skew=1.0)


def _run(op_type, arrays, attrs, outputs=1):
    b = FunctionBuilder("f")
    ins = [b.input(f"x{i}", TensorType(a.shape, DType.F64, 0)) for i, a in enumerate(arrays)]
    out = b.op(op_type, ins, attrs, name=["o0", "o1"] if outputs == 2 else "o")
    got = execute(b.finish(list(out) if outputs == 2 else [out]), arrays)
    return got if outputs == 2 else got[0]


@pytest.mark.parametrize("normalize", [True, False])
def test_groups_route_each_sequence_piece_alone(normalize):
    # mb 2 x seq 6 tokens in 2 groups of 3 positions, top 2 of 3 experts; capacity
    # 4, 2 slots of each expert a group: a group's choices past them are dropped
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2, 6, 5))
    p = rng.dirichlet(np.ones(3), size=(2, 6))
    top = np.argsort(-p, axis=-1)[..., :2]
    assert max(np.bincount(top[:, :3].ravel()).max(), np.bincount(top[:, 3:].ravel()).max()) > 2
    route = {"top_k": 2, "capacity": 4}
    grouped = dict(route, groups=2)
    halves = [(x[:, :3], p[:, :3]), (x[:, 3:], p[:, 3:])]
    one = dict(route, capacity=2)
    slots = _run("moe_dispatch", [x, p], grouped)
    pieces = [_run("moe_dispatch", [xx, pp], one) for xx, pp in halves]
    np.testing.assert_array_equal(slots, np.concatenate(pieces, axis=1))
    y = rng.normal(size=slots.shape)
    out = _run("moe_combine", [y, p], dict(grouped, normalize=normalize))
    for g, (xx, pp) in enumerate(halves):
        expected = _run("moe_combine", [y[:, 2 * g:2 * g + 2], pp], dict(one, normalize=normalize))
        np.testing.assert_allclose(out[:, 3 * g:3 * g + 3], expected, rtol=1e-12)
    dx = _run("moe_dispatch_grad", [y, p], grouped)
    dout = rng.normal(size=x.shape)
    dy, dp = _run("moe_combine_grad", [dout, y, p], dict(grouped, normalize=normalize), 2)
    for g, (xx, pp) in enumerate(halves):
        part = slice(3 * g, 3 * g + 3)
        ys = y[:, 2 * g:2 * g + 2]
        np.testing.assert_allclose(dx[:, part], _run("moe_dispatch_grad", [ys, pp], one))
        gy, gp = _run("moe_combine_grad", [dout[:, part], ys, pp],
                      dict(one, normalize=normalize), 2)
        np.testing.assert_allclose(dy[:, 2 * g:2 * g + 2], gy)
        np.testing.assert_allclose(dp[:, part], gp)


def test_lowered_layer_collectives_in_order(make_reference):
    # dp 2 x tp 2, ep 2: rank = 2 dp + tp; the ep group of rank 0 is the dp ranks
    # with its tp rank, {0, 2}; its tp group {0, 1}
    program = make_reference(**MOE).lower(dp=2, ep=2, tp=2, sp=True)
    forward = [op for op in program.ops if op.meta.get("layer") == 1 and "phase" not in op.meta
               and op.op_type.startswith("comm.") and 0 in op.attrs["ranks"]
               and op.inputs[0].name.endswith("_m0_r0")]       # micro-batch 0
    # attention: AG(tp) of its input, RS(tp) of its output; the routed experts:
    # A2A(ep), AG(tp), RS(tp), A2A(ep); the shared expert (a dense MLP): AG, RS
    assert [(op.op_type, tuple(op.attrs["ranks"])) for op in forward] == [
        ("comm.allgather", (0, 1)), ("comm.reducescatter", (0, 1)),
        ("comm.alltoall", (0, 2)), ("comm.allgather", (0, 1)),
        ("comm.reducescatter", (0, 1)), ("comm.alltoall", (0, 2)),
        ("comm.allgather", (0, 1)), ("comm.reducescatter", (0, 1))]
    # the tiny model: micro-batch 2 x seq 8 = 16 tokens, 8 on a rank's sequence
    # shard; every expert has room for all of them (routing_skew 1): 8 slots a rank
    a2a, ag, rs, back = forward[2:6]
    assert a2a.inputs[0].type.shape == (4, 8, 16)          # experts x slots x hidden
    assert ag.inputs[0].type.shape == (2, 16, 16)          # 4 / ep experts x ep ranks' slots
    assert ag.outputs[0].type.shape == (2, 32, 16)         # x tp ranks'
    assert rs.outputs[0].type.shape == (2, 16, 16)
    assert back.outputs[0].type.shape == (4, 8, 16)
    # the router reads the shard: its weight's gradient is summed over tp
    reduced = {op.inputs[0].name for op in program.ops if op.op_type == "comm.allreduce"
               and tuple(op.attrs["ranks"]) == (0, 1)}
    assert "d_l1_router_tp_m0_r0" in reduced


def test_simulated_mixtral_by_hand():
    # two Mixtral layers on dgx-h100, tp 2 (dp 4), ep 2, sp; bf16 weights. Per
    # layer: attention 41,943,040 / tp, norms 8192 and router 32,768 whole (on
    # sequence shards), 8 / ep experts of 3 x 4096 x 14336 split over tp;
    # embedding and output layer 2 x 32000 x 4096 / tp; final norm 4096.
    layer = 41_943_040 // 2 + 8192 + 32_768 + 8 // 2 * 3 * 4096 * 14336 // 2
    params = 2 * layer + 2 * 32000 * 4096 // 2 + 4096
    result = distsim.simulate("mixtral-8x7b", "dgx-h100", layers=2, global_batch=16, ep=2,
                              tp=2, sp=True, symmetry=True)
    summary = result.summary()
    memory = summary["memory_by_category"]["0"]
    assert memory["weights"] == 2 * params
    assert memory["optimizer"] == 12 * params
    # a rank's micro-batch: 1 sequence, 4096 tokens, 2048 on its sequence shard;
    # top 2 of 8 experts: 512 slots per expert; 4 micro-batches per rank (16 / dp 4)
    slots = 8 * 512 * 4096 * 2
    comms = {}
    for op in result.program.ops:
        if op.op_type.startswith("comm.") and op.meta.get("role") != "grad_sync":
            key = (op.op_type, op.inputs[0].type.size_bytes, op.outputs[0].type.size_bytes)
            comms[key] = comms.get(key, 0) + 1
    # dispatch and combine, forward and backward: 2 layers x 4 x 4 micro-batches
    assert comms[("comm.alltoall", slots, slots)] == 2 * 4 * 4
    # the slots of 4 experts all-gathered over tp (the forward, and the backward
    # of the reduce-scatter), reduce-scattered back (and the gather's backward):
    # kept for the experts' weight gradients, not gathered again
    assert comms[("comm.allgather", slots, 2 * slots)] == 2 * 2 * 4
    assert comms[("comm.reducescatter", 2 * slots, slots)] == 2 * 2 * 4
    phases = record_phases(result.trace, result.program)
    labels = result.trace.op_columns.labels.lists()[1]
    kinds = {(t, KEYS[k]) for t, k in zip(labels, phases.key.tolist()) if t.startswith("comm.")}
    assert {("comm.alltoall", "EP"), ("comm.allgather", "SP"),
            ("comm.reducescatter", "SP")} <= kinds
    assert summary["step_time_s"] > 0 and not summary["oom"]


def test_cli_runs_it_and_refuses_in_one_line(tmp_path, capsys):
    path = tmp_path / "m.yaml"
    path.write_text("family: gpt\nlayers: 2\nhidden: 64\nheads: 4\nvocab: 128\nseq: 16\n"
                    "global_batch: 8\nmicro_batch: 1\nexperts: 4\ntop_k: 2\n")
    base = ["simulate", "--model", str(path), "--topology", "dgx-h100", "--tp", "2", "--sp",
            "--out", str(tmp_path / "o")]
    assert main([*base, "--ep", "2"]) == 0
    capsys.readouterr()
    assert main([*base, "--ep", "3"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--ep 3 does not divide --dp 4" in err, err
