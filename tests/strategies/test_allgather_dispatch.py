"""The all-gather token dispatcher (``dispatch: allgather``, Megatron-core's
``allgather``) against the all-to-all one, with bytes written by hand from
the formula: per rank the all-to-alls send ``(ep - 1) / ep`` of this rank's
``experts x slots x hidden`` slots, about ``top_k x tokens x hidden x (ep -
1) / ep``; the all-gathers of the tokens and probabilities and the
reduce-scatter of the partial outputs send ``(ep - 1) x tokens x hidden``
(and ``x experts`` for the probabilities) whatever ``top_k``. The
simulator runs it, its collectives drawn as EP; at ``ep`` 1 it is the
padded dispatch. That its step updates the weights as the one-device step
does is in ``test_moe_strategies.py`` and ``test_expert_context_parallel.py``."""
from __future__ import annotations

import pytest

import distsim
from distsim.cli import main
from distsim.errors import ConfigError
from distsim.ir.comm import CollectiveType
from distsim.report.phases import KEYS, record_phases
from distsim.sim.collectives import bytes_sent_per_rank
from distsim.sim.simulator import collective_bytes

# 64 tokens per micro-batch (seq 64, micro-batch 1), 8 experts, uniform
# routing (slots: 64 x top_k / 8), hidden 64, bf16; 8 ranks of dgx-h100
MODEL = dict(family="gpt", layers=2, hidden=64, heads=4, vocab=128, seq=64, global_batch=16,
             micro_batch=1, experts=8, expert_ffn=32, activation="gelu")
KINDS = {"comm.alltoall": CollectiveType.ALL_TO_ALL, "comm.allgather": CollectiveType.ALL_GATHER,
         "comm.reducescatter": CollectiveType.REDUCE_SCATTER}


def _forward_layer0(program, rank=0):
    """Layer 0's forward expert-parallel collectives of micro-batch 0 on
    ``rank``: (op type, what it moves, S, bytes a rank sends) each."""
    out = []
    for op in program.ops:
        if op.meta.get("role") == "expert_parallel" and op.meta.get("layer") == 0 \
                and op.meta.get("detail") and op.inputs[0].name.endswith(f"_m0_r{rank}"):
            s = collective_bytes(op)
            sent = bytes_sent_per_rank(KINDS[op.op_type], len(op.attrs["ranks"]), s)
            out.append((op.op_type, op.inputs[0].name.rsplit("_m0", 1)[0], s, sent))
    return out


@pytest.mark.parametrize("top_k,ep,alltoall_sent,allgather_sent", [
    # top 2, ep 4: 16 slots; all-to-all 8 x 16 x 64 x 2 = 16384 bytes, 3/4 sent
    # = 12288 = 2 x 64 x 64 x 2 x 3/4; all-gather: 3 x 64 x 64 x 2 = 24576 of
    # tokens, 3 x 64 x 8 x 2 = 3072 of probabilities: twice the all-to-all's
    (2, 4, 12288, 24576 + 3072),
    # top 4, ep 2: 32 slots; all-to-all 8 x 32 x 64 x 2 = 32768, half sent =
    # 16384; all-gather 1 x 64 x 64 x 2 = 8192 and 1 x 64 x 8 x 2 = 1024
    (4, 2, 16384, 8192 + 1024),
])
def test_bytes_by_hand(top_k, ep, alltoall_sent, allgather_sent):
    model = dict(MODEL, top_k=top_k)
    a2a = _forward_layer0(distsim.build_program(model, "dgx-h100", dp=8, ep=ep)[0])
    slots = 64 * top_k // 8
    assert a2a == [("comm.alltoall", "l0_dispatch", 8 * slots * 64 * 2, alltoall_sent),
                   ("comm.alltoall", "l0_experts_fc2_b", 8 * slots * 64 * 2, alltoall_sent)]
    ag = _forward_layer0(distsim.build_program(dict(model, dispatch="allgather"), "dgx-h100",
                                               dp=8, ep=ep)[0])
    # the all-gathers' S is what each rank receives (ep x 64 tokens), the
    # reduce-scatter's what each rank holds before it (partial sums of the
    # ep x 64 tokens); each rank sends (ep - 1) / ep of S
    tokens, probs = ep * 64 * 64 * 2, ep * 64 * 8 * 2
    sent = (ep - 1) * 64 * 64 * 2
    assert ag == [("comm.allgather", "l0_tokens", tokens, sent),
                  ("comm.allgather", "l0_router_probs", probs, (ep - 1) * 64 * 8 * 2),
                  ("comm.reducescatter", "l0_combine_partial", tokens, sent)]
    assert ag[0][3] + ag[1][3] == allgather_sent


def test_the_experts_compute_their_slots_of_every_ranks_tokens():
    # ep 2, top 2: rank 1 holds experts 4 to 7; its dispatch routes the
    # 2 x 64 gathered tokens, each rank's at its 16 slots: 4 x 32 slots
    program = distsim.build_program(dict(MODEL, top_k=2, dispatch="allgather"), "dgx-h100",
                                    dp=8, ep=2)[0]
    op = next(op for op in program.ops if op.op_type == "moe_dispatch"
              and op.outputs[0].name == "l0_dispatch_m0_r1")
    assert op.attrs["first_expert"] == 4 and op.attrs["local_experts"] == 4
    assert op.attrs["groups"] == 2 and op.outputs[0].type.shape == (4, 32, 64)
    fc1 = next(op for op in program.ops if op.outputs and
               op.outputs[0].name == "l0_experts_fc1_m0_r1")
    assert fc1.inputs[0].type.shape == (4, 32, 64)


def test_simulated_with_its_collectives_drawn_as_ep():
    result = distsim.simulate(dict(MODEL, top_k=2, dispatch="allgather"), "dgx-h100", ep=2)
    phases = record_phases(result.trace, result.program)
    labels = result.trace.op_columns.labels.lists()[1]
    ep_key = KEYS.index("EP")
    assert {t for t, k in zip(labels, phases.key.tolist()) if k == ep_key} == \
        {"comm.allgather", "comm.reducescatter"}
    assert result.summary()["step_time_s"] > 0


def test_at_ep_1_it_is_the_padded_dispatch():
    def ops(dispatch):
        program = distsim.build_program(dict(MODEL, top_k=2, dispatch=dispatch), "dgx-h100",
                                        dp=8)[0]
        return [(op.op_type, op.attrs, [v.type for v in op.outputs]) for op in program.ops]
    assert ops("allgather") == ops("padded")


def test_refusals_are_one_line_exit_2(tmp_path, capsys):
    with pytest.raises(ConfigError, match="dispatch: must be one of padded, dropless, "
                                          "allgather, got 'scatter'"):
        distsim.build_program(dict(MODEL, top_k=2, dispatch="scatter"), "dgx-h100", dp=8)
    path = tmp_path / "m.yaml"
    path.write_text("family: gpt\nlayers: 2\nhidden: 64\nheads: 4\nvocab: 128\nseq: 16\n"
                    "global_batch: 8\nmicro_batch: 1\nexperts: 4\ntop_k: 2\n")
    base = ["simulate", "--model", str(path), "--topology", "dgx-h100", "--out",
            str(tmp_path / "o"), "--dispatch"]
    assert main([*base, "allgather", "--ep", "2"]) == 0
    capsys.readouterr()
    assert main([*base, "allgather", "--ep", "3"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--ep 3" in err, err
