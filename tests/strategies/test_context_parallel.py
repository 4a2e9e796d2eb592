"""Context parallelism (``cp``) updates the weights exactly as the
single-device step does (NumpyExecutor, float64, rtol 1e-9): each rank
holds two of the ``2 x cp`` chunks of every sequence, gathers the keys and
values over its group (or, ``cp_comm: ring``, receives them block by block
around the ring and merges the blocks' attentions) and masks them by the
chunks' global positions; alone and composed with tensor (and sequence),
pipeline and data parallelism, ZeRO, recomputation and fusion, for both
attention cores and learned positions (their rows are each rank's own)."""
import pytest

from distsim.errors import ConfigError

STRATEGIES = [
    dict(cp=2),
    dict(cp=2, tp=2),
    dict(cp=2, tp=2, sp=True),
    dict(cp=4),
    dict(cp=2, dp=2, zero=1),
    dict(cp=2, dp=2, pp=2, zero=3),
    dict(cp=2, tp=2, recompute="full", coarsen=True),
    dict(cp=2, recompute="selective", fusion="megatron"),
    dict(cp=2, tp=2, pp=2, schedule="interleaved"),
    dict(cp=2, pp=2, schedule="zb-h1"),
]


def _ids(s):
    return ",".join(f"{k}={v}" for k, v in s.items())


@pytest.mark.parametrize("attention", ["fused", "explicit"])
@pytest.mark.parametrize("strategy", STRATEGIES, ids=_ids)
def test_context_parallel_matches_single_device(make_reference, attention, strategy):
    program = make_reference(attention=attention).check(**strategy)
    gathers = [op for op in program.ops if op.op_type == "comm.allgather"
               and op.meta.get("role") == "cp"]
    # keys and values of every layer gathered over cp ranks (and their
    # gradients reduce-scattered back)
    assert gathers and {len(op.attrs["ranks"]) for op in gathers} == {strategy["cp"]}
    assert any(op.op_type == "comm.reducescatter" and op.meta.get("role") == "cp"
               for op in program.ops)


RING = [
    dict(cp=2),
    dict(cp=4),
    dict(cp=2, tp=2),
    dict(cp=2, tp=2, sp=True),
    dict(cp=2, dp=2, zero=2),
    dict(cp=2, pp=2, recompute="full", coarsen=True),
    dict(cp=4, recompute="selective", fusion="megatron"),
]


@pytest.mark.parametrize("strategy", RING, ids=_ids)
def test_ring_attention_matches_single_device(make_reference, strategy):
    program = make_reference(attention="fused").check(cp_comm="ring", **strategy)
    cp = strategy["cp"]
    ring = [op for op in program.ops if op.meta.get("role") == "cp_ring"]
    # every transfer is one rank's block to the next rank of its cp group
    assert ring and {op.op_type for op in ring} == {"comm.sendrecv"}
    assert not any(op.meta.get("role") == "cp" for op in program.ops)
    # per layer of its stage and micro-batch on each rank: cp - 1 steps of k and v in the
    # forward and again before the backward (once, whatever the recomputation), and cp
    # steps of the dk and dv partial sums (the last brings them to their owner)
    rank0 = [op for op in ring if op.attrs["ranks"][1] == 0]
    layers, microbatches = 4 // strategy.get("pp", 1), program.meta["microbatches"]
    assert len(rank0) == layers * microbatches * 2 * (2 * (cp - 1) + cp)


def test_ring_steps_overlap_the_attention_of_the_block_at_hand():
    """In the simulated step the ring's transfers run while the rank
    computes: the next block is on its way during the attention of the
    current one (and its merge): each step's transfer is issued before the
    attention of the block at hand, so it overlaps it also where a transfer
    waits for the compute issued before it (stream order, the default)."""
    from distsim.api import simulate
    result = simulate("gpt2", "dgx-a100", layers=1, seq=1024, attention="fused", cp=4,
                      cp_comm="ring", global_batch=2, micro_batch=1)
    records = [r for r in result.trace.op_columns.records() if r.rank == 0]
    ring = [r for r in records if r.op_type == "comm.sendrecv"]
    compute = [r for r in records if r.category == "compute"]
    assert ring and any(r.op_type == "fused_attention" for r in compute)
    overlapping = [c for c in ring if any(a.start_s < c.end_s and c.start_s < a.end_s
                                          for a in compute)]
    assert len(overlapping) >= 0.75 * len(ring)


def test_ring_needs_fused_attention_and_cp(make_reference):
    with pytest.raises(ConfigError, match="--cp-comm ring: .* needs attention: fused"):
        make_reference(attention="explicit").lower(cp=2, cp_comm="ring")
    with pytest.raises(ConfigError,
                       match=r"--cp-comm ring: needs context parallelism \(--cp > 1\)"):
        make_reference(attention="fused").lower(cp_comm="ring")


ULYSSES = [
    dict(cp=2),
    dict(cp=4),
    dict(cp=2, tp=2),
    dict(cp=2, tp=2, sp=True, recompute="full"),
    dict(cp=2, dp=2, pp=2, zero=3, coarsen=True),
]


@pytest.mark.parametrize("attention", ["fused", "explicit"])
@pytest.mark.parametrize("strategy", ULYSSES, ids=_ids)
def test_ulysses_matches_single_device(make_reference, attention, strategy):
    """DeepSpeed-Ulysses (``cp_comm: alltoall``): sequence exchanged for heads
    before attention and back after it (4 key/value heads: tp x cp divides them)."""
    program = make_reference(attention=attention, kv_heads=4).check(cp_comm="alltoall",
                                                                      **strategy)
    kinds = {op.op_type for op in program.ops if op.meta.get("role") == "cp"}
    assert kinds == {"comm.alltoall"}


def test_ulysses_needs_cp_to_divide_the_heads_of_a_tp_rank(make_reference):
    with pytest.raises(ConfigError, match="--cp-comm alltoall: --cp 2 does not divide the 1 "
                                          "key/value heads of each tensor-parallel rank"):
        make_reference().lower(cp=2, tp=2, cp_comm="alltoall")


def test_the_gantt_draws_each_cp_kind_as_its_own():
    from distsim.report.phases import COMM_KEYS, comm_key
    assert comm_key("comm.sendrecv", {"role": "cp_ring"}, sp=False) == "CP ring"
    assert comm_key("comm.allgather", {"role": "cp"}, sp=True) == "CP"
    assert comm_key("comm.sendrecv", {"role": "pipeline"}, sp=False) == "pipeline p2p"
    assert {"CP", "CP ring"} <= set(COMM_KEYS)


def test_a_ranks_sequence_is_its_two_chunks(reference):
    program = reference.lower(cp=2, tp=2)
    ids = [v for v in program.inputs if program.meta["io"][v.name].get("name") == "ids"]
    # 2 data-parallel positions (cp ranks) x 2 tp ranks x micro-batches, each 8 / 2 tokens
    assert {v.type.shape[1] for v in ids} == {reference.config.seq // 2}
    attention = [op for op in program.ops if op.op_type == "causal_mask"]
    chunks = {op.outputs[0].type.device: tuple(op.attrs["q_chunks"]) for op in attention}
    # rank order tp-cp-dp-pp: ranks 0, 1 are cp rank 0; 2, 3 cp rank 1
    assert chunks == {0: (0, 3), 1: (0, 3), 2: (1, 2), 3: (1, 2)}
    # each tensor-parallel rank gathers only its key/value heads (2 / tp 2),
    # over the ranks of its cp group (same tp rank)
    gathers = [op for op in program.ops if op.op_type == "comm.allgather"
               and op.meta.get("role") == "cp"]
    assert {v.type.shape[1] for op in gathers for v in op.outputs} == {1}
    assert {tuple(op.attrs["ranks"]) for op in gathers} == {(0, 2), (1, 3)}


@pytest.mark.parametrize("seq, cp, message", [
    (8, 3, "--cp 3: the sequence length 8 is not a multiple of 2 x cp = 6"),
    (12, 4, "--cp 4: the sequence length 12 is not a multiple of 2 x cp = 8"),
])
def test_cp_that_does_not_split_the_sequence_is_refused(make_reference, seq, cp, message):
    ref = make_reference(seq=seq)
    with pytest.raises(ConfigError, match=message.replace("+", r"\+")):
        ref.lower(cp=cp)


def test_sequence_parallel_share_checked_per_cp_rank(make_reference):
    ref = make_reference(seq=8)
    with pytest.raises(ConfigError, match="--sp: --tp 4 does not divide the 2 tokens"):
        ref.lower(cp=4, tp=4, sp=True, global_batch=8)


def test_cli_bad_cp_is_one_line_exit_2(capsys):
    from distsim.cli import main
    code = main(["simulate", "--model", "gpt2", "--layers", "1", "--seq", "1002", "--cp", "2",
                 "--topology", "dgx-a100"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1
    assert "--cp 2: the sequence length 1002 is not a multiple of 2 x cp = 4" in err[0]


def test_cp_on_another_family_is_refused():
    from distsim.api import build_program
    with pytest.raises(ConfigError, match="--cp 2: context parallelism is modelled for GPT "
                                          "models only"):
        build_program("mlp", "dgx-a100", cp=2)


def test_the_estimator_estimates_cp_with_zero3_as_a_sweep_point():
    """cp with ZeRO 3 (its parameters sharded over dp x cp ranks) is an
    estimated sweep point, no longer skipped."""
    from distsim.sweep.point import run_point
    options = {"model": "gpt2", "topology": "dgx-a100", "layers": 1, "seq": 64, "cp": 2,
               "zero": 3}
    assert run_point({**options, "fidelity": "estimate"})["status"] == "ok"


@pytest.mark.parametrize("cp", [2, 4, 8])
def test_activations_per_gpu_fall_as_cp_grows(cp):
    """GPT-3 175B's saved activations per layer (tp 8 + sp, fused attention)
    are 1/cp of the one-rank-per-sequence figure: every saved value is a
    rank's tokens (the keys and values gathered for attention are gathered
    again in the backward, so each rank keeps only its own), except the two layernorm gammas the
    sequence-parallel norms read through ``spmd.copy`` (2 x h bf16)."""
    from dataclasses import replace

    from distsim.models import load_model_config
    from distsim.models.gpt_family import build_gpt_step, gpt_config
    from distsim.transforms.memory_model import saved_activation_bytes
    from distsim.transforms.strategy import Strategy
    c = replace(gpt_config(load_model_config("gpt3-175b")), layers=2, attention="fused")

    def saved(n):
        step = build_gpt_step(c, Strategy(dp=1, tp=8, sp=True, cp=n), micro_batch=1)
        return saved_activation_bytes(step)[1]
    gammas = 2 * c.hidden * 2
    assert saved(cp) == (saved(1) - gammas) // cp + gammas


@pytest.mark.parametrize("strategy", [dict(dp=2, tp=2, cp=2), dict(dp=1, tp=2, cp=4),
                                      dict(dp=2, tp=2, cp=2, cp_comm="ring"),
                                      dict(tp=1, cp=4, pp=2, cp_comm="ring"),
                                      dict(dp=2, cp=4, cp_comm="alltoall")], ids=_ids)
def test_reduced_program_equals_the_full_one(strategy):
    """--symmetry: the same step time and memory as the whole program. A
    ring keeps its whole cp group present (a rank receives its blocks from
    the others); the all-gather one representative per stage."""
    import distsim
    options = dict(model="tiny", topology="dgx-a100", attention="fused", **strategy)
    full = distsim.simulate(**options)
    reduced = distsim.simulate(symmetry=True, **options)
    fs, rs = full.summary(), reduced.summary()
    for key in ("step_time_s", "compute_s", "communication_s", "exposed_communication_s",
                "max_peak_memory_bytes", "total_flops", "mfu"):
        assert rs[key] == pytest.approx(fs[key], rel=1e-3, abs=1e-12), key
    ring = strategy.get("cp_comm") == "ring"
    present = strategy.get("pp", 1) * (strategy["cp"] if ring else 1)
    assert len(rs["devices"]) == present
    assert sum(d["represents"] for d in rs["devices"]) == fs["num_devices"]


@pytest.mark.parametrize("sp", [False, True])
def test_the_gathered_keys_and_values_are_gathered_again_in_the_backward(reference, sp):
    """Each rank keeps only its own keys and values: the cp all-gather is
    redone before the backward of its layer (recomputation), with or
    without sequence parallelism."""
    from distsim.models.gpt_family import build_gpt_step
    from distsim.transforms.strategy import Strategy
    c = reference.config
    step = build_gpt_step(c, Strategy(dp=1, tp=2, sp=sp, cp=2), micro_batch=2)
    again = [op for op in step.ops if op.op_type == "spmd.allgather"
             and op.attrs.get("group") == "cp" and op.meta.get("phase") == "recompute"]
    assert len(again) == 2 * c.layers            # k and v of every layer
    gathered = {op.outputs[0] for op in step.ops if op.op_type == "spmd.allgather"
                and op.attrs.get("group") == "cp" and "phase" not in op.meta}
    readers = {v for op in step.ops if "phase" in op.meta for v in op.inputs}
    assert not gathered & readers


@pytest.mark.parametrize("cp", [2, 4, 8])
def test_ring_keeps_what_the_allgather_keeps(cp):
    """Ring attention keeps for the backward what the all-gather keeps: the
    rank's own queries, keys and values and the merged output and
    log-sum-exp, not the received blocks nor the blocks' partial outputs
    (the backward sends the blocks around the ring again)."""
    from dataclasses import replace

    from distsim.models import load_model_config
    from distsim.models.gpt_family import build_gpt_step, gpt_config
    from distsim.transforms.memory_model import saved_activation_bytes
    from distsim.transforms.strategy import Strategy
    c = replace(gpt_config(load_model_config("llama3-8b")), layers=2, attention="fused")

    def saved(comm):
        step = build_gpt_step(c, Strategy(dp=1, tp=4, sp=True, cp=cp, cp_comm=comm),
                              micro_batch=1)
        return saved_activation_bytes(step)[1]
    assert saved("ring") == saved("allgather")


def test_the_ring_blocks_are_sent_again_in_the_backward(reference):
    """No received key/value block nor partial output of the forward ring is
    read by the backward: the blocks are passed around the ring again
    (recomputation), and the backward reads only the merged output and
    log-sum-exp."""
    from dataclasses import replace

    from distsim.models.gpt_family import build_gpt_step
    from distsim.transforms.strategy import Strategy
    c = replace(reference.config, attention="fused")
    step = build_gpt_step(c, Strategy(dp=1, tp=1, cp=4, cp_comm="ring"), micro_batch=2)
    forward = [op for op in step.ops if "phase" not in op.meta and "ring" in op.meta]
    again = [op for op in step.ops if op.op_type == "spmd.shift"
             and op.meta.get("phase") == "recompute"]
    assert len(again) == 2 * 3 * c.layers            # k and v, cp - 1 steps, every layer
    readers = {v for op in step.ops if "phase" in op.meta for v in op.inputs}
    kept = {v for op in forward for v in op.outputs} & readers
    merged = {op.outputs[0] for op in forward if op.op_type == "add"}
    assert len(kept) == 2 * c.layers and kept <= merged   # the last merge's out and lse
