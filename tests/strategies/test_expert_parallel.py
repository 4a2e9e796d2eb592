"""Expert parallelism (``--ep``): the groups, the refusals (one line, exit
2), the lowered program's all-to-alls and gradient teams, ZeRO 3's shards
and gathers of the experts over their team, and a simulated
two-layer Mixtral's expert weights, optimizer state and all-to-all sizes
per rank written out by hand. That the ep step updates the weights as the
one-device step does is in ``test_moe_strategies.py``."""
from __future__ import annotations

import numpy as np
import pytest

import distsim
from distsim.cli import main
from distsim.errors import ConfigError
from distsim.report.phases import KEYS, record_phases
from distsim.transforms.strategy import Strategy

MOE = dict(experts=4, top_k=2, expert_ffn=8, shared_experts=1, dense_layers=1,
           activation="swiglu", routing_skew=1.0)


def test_groups_are_consecutive_dp_ranks_and_their_strides():
    s = Strategy(dp=8, ep=4)
    assert s.ep_team(5) == (4, 5, 6, 7)
    assert s.edp_team(5) == (1, 5)
    assert Strategy(dp=4, ep=4).edp_team(2) == (2,)


@pytest.mark.parametrize("fields,message", [
    (dict(dp=4, ep=3), "--ep 3 does not divide --dp 4"),
    (dict(dp=4, ep=0), "--ep: must be a positive integer"),
])
def test_strategy_refuses(fields, message):
    with pytest.raises(ConfigError) as info:
        Strategy(**fields)
    assert str(info.value).startswith(message)


@pytest.mark.parametrize("args,message", [
    (["--model", "gpt2", "--ep", "2", "--batch", "32"], "--ep 2: the model has no experts"),
    (["--model", "mixtral-8x7b", "--layers", "2", "--ep", "3"], "--ep 3 does not divide --dp 8"),
    (["--model", "{moe6}", "--ep", "4"], "--ep 4 does not divide the model's 6 experts"),
])
def test_cli_refusals_are_one_line_exit_2(tmp_path, capsys, args, message):
    path = tmp_path / "m.yaml"
    path.write_text("family: gpt\nlayers: 2\nhidden: 64\nheads: 4\nvocab: 128\nseq: 16\n"
                    "global_batch: 8\nmicro_batch: 1\nexperts: 6\ntop_k: 2\n")
    args = [a.replace("{moe6}", str(path)) for a in args]
    assert main(["simulate", *args, "--topology", "dgx-h100",
                 "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err, err


def test_lowered_program_teams(make_reference):
    # dp 4, ep 2: expert-parallel groups {0, 1} and {2, 3} exchange tokens;
    # ranks holding the same experts, {0, 2} and {1, 3}, average their gradients
    program = make_reference(**MOE).lower(dp=4, ep=2)
    alltoalls = [op for op in program.ops if op.op_type == "comm.alltoall"]
    # 3 MoE layers (the first is dense), 2 forward and 2 backward each, 2 groups,
    # 1 micro-batch (global batch 8 = dp 4 x micro-batch 2)
    assert len(alltoalls) == 3 * 4 * 2
    assert {tuple(op.attrs["ranks"]) for op in alltoalls} == {(0, 1), (2, 3)}
    experts = set(program.meta["expert_params"])
    assert experts == {f"l{i}_experts_{w}" for i in (1, 2, 3) for w in ("w1", "b1", "w2", "b2")}
    io = program.meta["io"]
    for v in program.inputs:
        info = io[v.name]
        if info.get("role") == "param" and info["name"] == "l1_experts_w1":
            assert v.type.shape == (2, 16, 16)        # 4 / 2 experts x hidden x 2 x 8
            assert info["ep_rank"] == info["dp_rank"] % 2
    teams = {}
    for op in program.ops:
        if op.op_type == "comm.allreduce" and op.meta.get("role") == "grad_sync":
            teams.setdefault("expert" if "experts" in op.inputs[0].name else "dense",
                             set()).add(tuple(op.attrs["ranks"]))
    assert teams == {"expert": {(0, 2), (1, 3)}, "dense": {(0, 1, 2, 3)}}


@pytest.mark.parametrize("unit", ["param", "layer"])
def test_zero3_shards_the_experts_over_their_team(make_reference, unit):
    # dp 4, ep 2, ZeRO 3: an expert's weights (this rank's 4 / 2 experts) are
    # sharded over its expert-data-parallel team {0, 2}, gathered there before
    # use and their gradients reduce-scattered there; the others over dp
    program = make_reference(**MOE).lower(dp=4, ep=2, zero=3, zero3_unit=unit)
    io = program.meta["io"]
    for v in program.inputs:
        info = io[v.name]
        if info.get("role") == "param" and info["name"] == "l1_experts_w1":
            # 2 experts x hidden 16 x 2 x 8 = 512 elements, half a rank
            assert v.type.shape == (256,)
            assert info["flat"] == [256 * (info["dp_rank"] // 2), 256 * (info["dp_rank"] // 2 + 1)]
        if info.get("role") == "param" and info["name"] == "l1_router":
            assert v.type.shape == (16,)                  # 16 x 4 over 4 ranks
    teams = {}
    for op in program.ops:
        if op.meta.get("role") in ("zero_gather", "grad_sync") and op.op_type.startswith("comm."):
            names = op.inputs[0].name
            key = (op.op_type, "experts" in names and "shared" not in names)
            teams.setdefault(key, set()).add(tuple(op.attrs["ranks"]))
    assert teams == {("comm.allgather", True): {(0, 2), (1, 3)},
                     ("comm.allgather", False): {(0, 1, 2, 3)},
                     ("comm.reducescatter", True): {(0, 2), (1, 3)},
                     ("comm.reducescatter", False): {(0, 1, 2, 3)}}


@pytest.mark.parametrize("ep", [2, 8])
def test_simulated_mixtral_by_hand(ep):
    # two Mixtral layers on dgx-h100 (dp 8), bf16 weights: per layer attention
    # 41,943,040, norms 8192, router 32,768 and 8 / ep of the 8 experts of
    # 3 x 4096 x 14336; embedding and output layer 2 x 32000 x 4096, final norm
    # 4096; AdamW's fp32 master, m and v: 12 bytes a parameter.
    layer = 41_943_040 + 8192 + 32_768 + 8 // ep * 3 * 4096 * 14336
    params = 2 * layer + 2 * 32000 * 4096 + 4096
    result = distsim.simulate("mixtral-8x7b", "dgx-h100", layers=2, global_batch=16, ep=ep,
                              symmetry=True)
    summary = result.summary()
    memory = summary["memory_by_category"]["0"]
    assert memory["weights"] == 2 * params
    assert memory["optimizer"] == 12 * params
    # each rank's micro-batch (1 sequence, 4096 tokens), top 2 of 8 experts:
    # 1024 slots per expert; the dispatch sends 8 x 1024 x 4096 bf16 values
    # in ep pieces, the combine returns as many; 2 micro-batches per rank
    alltoalls = [op for op in result.program.ops if op.op_type == "comm.alltoall"]
    assert len(alltoalls) == 2 * 4 * 2
    assert {op.inputs[0].type.size_bytes for op in alltoalls} == {8 * 1024 * 4096 * 2}
    phases = record_phases(result.trace, result.program)
    labels = result.trace.op_columns.labels.lists()[1]
    ep_key = KEYS.index("EP")
    keyed = {t for t, k in zip(labels, phases.key.tolist()) if k == ep_key}
    assert keyed == {"comm.alltoall"}
    assert summary["step_time_s"] > 0 and not summary["oom"]


def test_simulated_mixtral_zero3_shards_by_hand():
    # two Mixtral layers on dgx-h100 (dp 8), ep 2, ZeRO 3: the dense parameters
    # (per layer attention 41,943,040, norms 8192, router 32,768; embedding and
    # output layer 2 x 32000 x 4096, final norm 4096) sharded over the 8 ranks,
    # a rank's 8 / 2 experts of 3 x 4096 x 14336 a layer over its dp / ep = 4;
    # AdamW's fp32 master, m and v of the shards: 12 bytes a parameter
    dense = 2 * (41_943_040 + 8192 + 32_768) + 2 * 32000 * 4096 + 4096
    experts = 2 * 4 * 3 * 4096 * 14336
    result = distsim.simulate("mixtral-8x7b", "dgx-h100", layers=2, global_batch=16, ep=2,
                              zero=3, symmetry=True)
    summary = result.summary()
    assert summary["memory_by_category"]["0"]["optimizer"] == 12 * (dense // 8 + experts // 4)
    assert summary["step_time_s"] > 0 and not summary["oom"]


@pytest.mark.parametrize("strategy", [dict(zero=1), dict(zero=3), dict(tp=2, sp=True)],
                         ids=["zero1", "zero3", "tp2-sp"])
def test_reduced_program_equals_full_with_ep(strategy):
    model = {"family": "gpt", "layers": 2, "hidden": 256, "heads": 4, "vocab": 1024,
             "seq": 128, "global_batch": 16, "micro_batch": 1, "experts": 8, "top_k": 2}
    full = distsim.simulate(model, "dgx-a100", ep=4, **strategy)
    reduced = distsim.simulate(model, "dgx-a100", ep=4, symmetry=True, **strategy)
    assert reduced.step_time_s == pytest.approx(full.step_time_s, rel=1e-3)
    peaks = {d["rank"]: d["peak_memory_bytes"] for d in full.summary()["devices"]}
    for d in reduced.summary()["devices"]:
        assert d["peak_memory_bytes"] == peaks[d["rank"]]
    assert np.isfinite(full.step_time_s)
