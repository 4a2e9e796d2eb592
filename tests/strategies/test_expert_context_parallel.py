"""Expert parallelism with context parallelism (``--ep`` with ``--cp``), as
Megatron-core lays it out: the experts see the cp ranks as data-parallel
ones (its expert rank generator has no cp axis), so an expert-parallel
group is ``ep`` consecutive ranks of the flat axis of ``dp x cp`` ranks,
a data-parallel rank's cp ranks first, and each rank routes its own
tokens (its two chunks of every sequence, at the capacity of those
tokens). Here: the groups, the refusals (one line, exit 2), the step
against the one-device step (NumpyExecutor, float64; every expert has
room for every token, so no token is dropped in either), the lowered
program's teams, a simulated MoE layer's dispatch bytes per rank
written from the formula, the reduced program (symmetry) against the
full one, and the estimator's one-line refusal."""
from __future__ import annotations

import pytest

import distsim
from distsim.cli import main
from distsim.errors import ConfigError
from distsim.sim.simulator import collective_bytes
from distsim.transforms.strategy import Strategy

MOE = dict(experts=4, top_k=2, expert_ffn=8, shared_experts=1, dense_layers=1,
           activation="swiglu", routing_skew=1.0)


def _ids(s):
    return ",".join(f"{k}={v}" for k, v in s.items())


def test_groups_take_a_data_parallel_ranks_cp_ranks_first():
    # dp 2 x cp 2: flat positions d * cp + c; ep 2 is each dp rank's cp pair,
    # ep 4 all four; the experts' gradient team strides by ep
    flat = Strategy(dp=2, cp=2, ep=2).flat_cp()
    assert flat.ep_team(1) == (0, 1) and flat.ep_team(2) == (2, 3)
    assert flat.edp_team(1) == (1, 3)
    assert Strategy(dp=2, cp=2, ep=4).flat_cp().ep_team(3) == (0, 1, 2, 3)
    # cp 4, ep 2: a dp rank's four cp ranks make two groups
    assert Strategy(dp=1, cp=4, ep=2).flat_cp().edp_team(0) == (0, 2)


@pytest.mark.parametrize("fields,message", [
    (dict(dp=1, cp=2, ep=4), "--ep 4 does not divide dp x cp = 1 x 2 = 2 (expert-parallel "
                             "groups are made of data- and context-parallel ranks)"),
    (dict(dp=3, cp=2, ep=4), "--ep 4 does not divide dp x cp = 3 x 2 = 6"),
])
def test_strategy_refuses_ep_not_dividing_dp_times_cp(fields, message):
    with pytest.raises(ConfigError) as info:
        Strategy(**fields)
    assert str(info.value).startswith(message)


def test_cli_refusal_is_one_line_exit_2(tmp_path, capsys):
    # 8 GPUs, cp 2: dp 4, so dp x cp = 8; ep 3 divides neither
    assert main(["simulate", "--model", "mixtral-8x7b", "--layers", "2", "--cp", "2",
                 "--ep", "3", "--topology", "dgx-h100", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--ep 3 does not divide dp x cp = 4 x 2 = 8" in err


STRATEGIES = [
    dict(cp=2, ep=2),                       # ep = the cp pair (dp 1)
    dict(cp=2, dp=2, ep=2),
    dict(cp=2, dp=2, ep=4),                 # ep over dp x cp
    dict(cp=4, ep=2),
    dict(cp=2, ep=2, tp=2),
    dict(cp=2, ep=2, tp=2, sp=True),        # each tp rank routes its shard of the cp shard
    dict(cp=2, dp=2, ep=2, pp=2),
    dict(cp=2, dp=2, ep=2, zero=1),
    dict(cp=2, dp=2, ep=2, zero=3),
    dict(cp=2, ep=2, cp_comm="ring"),
    dict(cp=2, dp=2, ep=4, tp=2, sp=True, pp=2, zero=1, recompute="selective",
         cp_comm="ring"),
]


@pytest.fixture(scope="module")
def moe_reference(make_reference):
    return make_reference(**MOE, attention="fused")


@pytest.mark.parametrize("strategy", STRATEGIES, ids=_ids)
def test_padded_dispatch_matches_single_device(moe_reference, strategy):
    moe_reference.check(**strategy)


@pytest.mark.parametrize("strategy", [dict(cp=2, ep=2), dict(cp=2, dp=2, ep=4),
                                      dict(cp=2, ep=2, tp=2, sp=True),
                                      dict(cp=2, dp=2, ep=2, zero=3)], ids=_ids)
def test_allgather_dispatch_matches_single_device(make_reference, strategy):
    # the all-gather dispatcher over dp x cp ranks: each gathers its group's
    # cp chunks' tokens, routes each rank's at its capacity
    make_reference(**MOE, attention="fused", dispatch="allgather").check(**strategy)


@pytest.mark.parametrize("strategy", [
    dict(cp=2, ep=2),
    dict(cp=2, dp=2, ep=4, tp=2, sp=True, zero=1),
], ids=_ids)
def test_ulysses_matches_single_device(make_reference, strategy):
    # 4 key/value heads: tp x cp divides them
    program = make_reference(**MOE, kv_heads=4).check(cp_comm="alltoall", **strategy)
    kinds = {(op.op_type, op.meta.get("role")) for op in program.ops
             if op.op_type == "comm.alltoall"}
    assert kinds == {("comm.alltoall", "cp"), ("comm.alltoall", "expert_parallel")}


@pytest.mark.parametrize("strategy", [
    dict(cp=2, ep=2),
    dict(cp=2, dp=2, ep=4, tp=2, sp=True, zero=1, cp_comm="ring"),
], ids=_ids)
def test_dropless_dispatch_matches_single_device(make_reference, strategy):
    # uniform routing: a padded dispatch would drop tokens; a dropless one has
    # room for every token in every expert
    ref = make_reference(**dict(MOE, routing_skew=0.0, dispatch="dropless", attention="fused"))
    ref.check(**strategy)


def test_lowered_program_teams(make_reference):
    # dp 2 x cp 2, ep 2: rank = 2 d + c; the all-to-alls over each dp rank's cp
    # pair {0, 1}, {2, 3} (the attention's gathers too); the experts' gradients
    # over the ranks holding the same experts {0, 2}, {1, 3}; the others over all
    program = make_reference(**MOE).lower(dp=2, cp=2, ep=2)
    teams = {}
    for op in program.ops:
        if not op.op_type.startswith("comm."):
            continue
        role = op.meta.get("role")
        if role == "grad_sync":
            role = "expert sync" if "experts" in op.inputs[0].name and \
                "shared" not in op.inputs[0].name else "dense sync"
        teams.setdefault((op.op_type, role), set()).add(tuple(op.attrs["ranks"]))
    assert teams[("comm.alltoall", "expert_parallel")] == {(0, 1), (2, 3)}
    assert teams[("comm.allgather", "cp")] == {(0, 1), (2, 3)}
    assert teams[("comm.allreduce", "expert sync")] == {(0, 2), (1, 3)}
    assert teams[("comm.allreduce", "dense sync")] == {(0, 1, 2, 3)}
    # a rank's micro-batch: 2 sequences x seq 8 / cp 2 = 8 tokens, all in every
    # expert's slots (routing_skew 1): experts 4 x slots 8 x hidden 16
    dispatch = next(op for op in program.ops if op.op_type == "comm.alltoall"
                    and op.inputs[0].name.startswith("l1_dispatch"))
    assert dispatch.inputs[0].type.shape == (4, 8, 16)


def test_simulated_dispatch_bytes_by_hand():
    # 8 GPUs of dgx-h100: dp 4 x cp 2, ep 4 (ranks 0-3 and 4-7, the experts'
    # gradients over {0, 4}, {1, 5}, ...). A rank's micro-batch: 1 sequence of
    # 64 / cp 2 = 32 tokens, top 2 of 4 experts, routing_skew 0.5: the busiest
    # expert gets 16 + 0.5 x (32 - 16) = 24 tokens, capped at ceil(1.25 x 32 x 2
    # / 4) = 20 slots. The dispatch sends experts 4 x 20 slots x hidden 64 bf16
    # values (2 bytes) per rank, 3/4 of it to the others; the combine as many.
    # Without cp the rank would route 64 tokens: min(48, 40) = 40 slots, twice.
    model = dict(family="gpt", layers=2, hidden=64, heads=4, vocab=128, seq=64,
                 global_batch=16, micro_batch=1, experts=4, top_k=2, expert_ffn=32,
                 activation="gelu", routing_skew=0.5, capacity_factor=1.25)
    result = distsim.simulate(model, "dgx-h100", cp=2, dp=4, ep=4)
    alltoalls = [op for op in result.program.ops if op.op_type == "comm.alltoall"
                 and op.meta.get("role") == "expert_parallel"]
    # 2 layers x (dispatch, combine, their gradients) x 4 micro-batches x 2 groups
    assert len(alltoalls) == 2 * 4 * 4 * 2
    assert {tuple(op.attrs["ranks"]) for op in alltoalls} == {(0, 1, 2, 3), (4, 5, 6, 7)}
    assert {collective_bytes(op) for op in alltoalls} == {4 * 20 * 64 * 2} == {10240}
    syncs = {tuple(op.attrs["ranks"]) for op in result.program.ops
             if op.meta.get("role") == "grad_sync" and "experts" in op.inputs[0].name}
    assert syncs == {(0, 4), (1, 5), (2, 6), (3, 7)}
    summary = result.summary()
    assert summary["step_time_s"] > 0 and not summary["oom"]


@pytest.mark.parametrize("strategy", [
    dict(cp=2, ep=4, zero=1),
    dict(cp=2, ep=4, tp=2, sp=True, cp_comm="ring"),
    dict(cp=4, ep=2, zero=3, order="dp-tp-pp"),
], ids=_ids)
def test_reduced_program_equals_full(strategy):
    # the reduced program (symmetry) keeps whole cp and ep groups present
    model = {"family": "gpt", "layers": 2, "hidden": 256, "heads": 4, "vocab": 1024,
             "seq": 128, "global_batch": 16, "micro_batch": 1, "experts": 8, "top_k": 2,
             "attention": "fused"}
    full = distsim.simulate(model, "dgx-a100", **strategy)
    reduced = distsim.simulate(model, "dgx-a100", symmetry=True, **strategy)
    assert reduced.step_time_s == pytest.approx(full.step_time_s, rel=1e-3)
    peaks = {d["rank"]: d["peak_memory_bytes"] for d in full.summary()["devices"]}
    for d in reduced.summary()["devices"]:
        assert d["peak_memory_bytes"] == peaks[d["rank"]]


def test_the_estimator_estimates_it_under_zero_0_to_3_and_refuses_what_is_past_its_bound():
    # the template lays out lcm(ep, cp) ranks of the dp x cp axis, whole ep
    # and cp groups, the experts' teams dp x cp / ep ranks (agreement:
    # tests/estimate/test_agreement_corpus.py,
    # tests/estimate/test_estimate_expert_context_parallel.py); ring
    # attention and teams of more than one rank under ZeRO 3 are refused: a
    # sweep skips the point, a search simulates it
    from distsim.errors import NotModelledError
    from distsim.estimate import estimate
    from distsim.sweep.point import run_point
    options = {"model": "mixtral-8x7b", "topology": "dgx-a100", "layers": 2, "seq": 512,
               "cp": 2, "ep": 2}
    assert estimate(options)["step_time_s"] > 0
    assert estimate({**options, "ep": 4, "zero": 2})["step_time_s"] > 0
    ring = {**options, "ep": 8, "zero": 3, "cp_comm": "ring", "attention": "fused"}
    with pytest.raises(NotModelledError) as refused:
        estimate(ring)
    assert str(refused.value) == ("estimate: expert parallelism under ZeRO 3 with ring "
                                  "attention (ep 8, cp 2, cp_comm 'ring') is not modelled by "
                                  "the estimator; use fidelity: simulate")
    assert run_point({**ring, "fidelity": "estimate"})["status"] == "skipped"
    with pytest.raises(NotModelledError, match="the experts' team of 2 ranks"):
        estimate({**options, "ep": 4, "zero": 3})
    # invalid points are refused as the simulator refuses them
    with pytest.raises(ConfigError, match="--ep 16 does not divide dp x cp = 4 x 2 = 8"):
        estimate({**options, "ep": 16})
