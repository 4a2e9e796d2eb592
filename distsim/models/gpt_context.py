"""The context-parallel pieces of the GPT forward (:mod:`.gpt`): what one
of ``cp`` ranks writes differently from the one-device model.

A rank holds two of the sequence's ``2 x cp`` chunks
(:mod:`distsim.transforms.context_parallel`). Its learned position rows
are those chunks' (two ``slice`` ops and a ``concat``); its attention
gathers the keys and values of the whole sequence over the ``cp`` group
(``spmd.allgather{group: cp}``, whose gradient is the reduce-scatter of
dK and dV) and masks them by the chunks' global positions (the ops'
``q_chunks`` / ``k_chunks`` attributes). The template is written for rank 0;
what differs on rank ``r`` is in the ops' ``meta["cp_rank_attrs"]``
(``attribute -> [value on cp rank 0, 1, ...]``), which the lowering
applies to each rank's copy and the backward ops inherit.

Ring attention (``cp_comm: ring``, :func:`ring_attention`) instead passes
the key/value blocks around the ring, one ``spmd.shift{group: cp}`` per
step, and attends the queries to each block as it arrives; the blocks'
partial results are merged by their log-sum-exps. A step's transfer
depends only on the block before it and is issued before that block's
attention (as Megatron-LM's and TransformerEngine's ring attention post
the next block's send/receive first), so it overlaps the attention of the
block at hand also where a collective waits for the compute issued before
it (``comm_order: stream``). With the balanced chunks every step computes half of its
block's scores (a block of an earlier rank is seen by both query chunks
but only in its first chunk; a later one only by the second query chunk),
as Megatron-LM's ring attention does. Every op of the ring carries
``meta["ring"]`` (the attention's name): the backward writes the ring
itself (:mod:`distsim.transforms.ring_backward`), so that a rank keeps
only its own keys and values and the merged output and log-sum-exp.

DeepSpeed-Ulysses (``cp_comm: alltoall``) exchanges sequence for heads
instead: an all-to-all of the queries, keys and values gives each rank
the whole sequence of 1/cp of the (key/value) heads, the attention runs
on it (its rows in the gathered chunk order, the same mask on every
rank), and an all-to-all of the output gives back the rank's tokens with
all heads.
"""
from __future__ import annotations

import functools
from typing import Any, Callable, Dict, List, Tuple

from ..ir.core import Value
from ..transforms.context_parallel import balanced_chunks, gathered_chunks

#: the dims of the sequence and of the key/value heads in the attention's
#: (batch, kv heads, group, seq, d)
SEQ_DIM = 3
HEAD_DIM = 1


def chunk_attrs(cp: int) -> Dict[str, Any]:
    """The attention's chunk attributes on rank 0 and its ``meta`` for the
    other ranks (``cp_rank_attrs``)."""
    per_rank = [list(balanced_chunks(r, cp)) for r in range(cp)]
    return {"attrs": {"q_chunks": per_rank[0], "k_chunks": list(gathered_chunks(cp))},
            "meta": {"cp_rank_attrs": {"q_chunks": per_rank}}}


def gather_sequence(op: Callable[..., Value], x: Value, cp: int, name: str) -> Value:
    """``x`` (keys or values of this rank's chunks) gathered over the ``cp``
    group along the sequence."""
    return op("spmd.allgather", [x], {"group": "cp", "size": cp, "dim": SEQ_DIM},
              name=f"{name}_cp")


def heads_for_sequence(op: Callable[..., Value], xs: List[Value], cp: int,
                       name: str) -> List[Value]:
    """DeepSpeed-Ulysses: queries, keys and values of this rank's tokens and
    all heads exchanged over the ``cp`` group (one all-to-all each) for the
    whole sequence and 1/cp of the heads (its tokens in the gathered chunk
    order, :func:`ulysses_chunk_attrs`)."""
    swap = {"group": "cp", "size": cp, "split_dim": HEAD_DIM, "concat_dim": SEQ_DIM}
    return [op("spmd.alltoall", [x], swap, name=f"{name}_{what}_a2a")
            for x, what in zip(xs, ("q", "k", "v"))]


def sequence_for_heads(op: Callable[..., Value], ctx: Value, cp: int, name: str) -> Value:
    """The attention's output of 1/cp of the heads over the whole sequence
    exchanged back for all heads of this rank's tokens."""
    back = {"group": "cp", "size": cp, "split_dim": SEQ_DIM, "concat_dim": HEAD_DIM}
    return op("spmd.alltoall", [ctx], back, name=f"{name}_ctx_a2a")


def ulysses_chunk_attrs(cp: int) -> Dict[str, Any]:
    """The chunk attributes of an attention over the whole sequence in the
    order the all-to-all gathers it (the same on every rank)."""
    chunks = list(gathered_chunks(cp))
    return {"attrs": {"q_chunks": chunks, "k_chunks": chunks}, "meta": {}}


def ring_attention(op: Callable[..., Value], q: Value, k: Value, v: Value, cp: int,
                   attrs: Dict[str, Any], name: str) -> Value:
    """The attention of this rank's queries to the whole sequence, its
    key/value blocks passed around the ring (see the module docstring)."""
    own = [list(balanced_chunks(r, cp)) for r in range(cp)]
    ring = {"group": "cp", "size": cp, "offset": 1}
    out = lse = None
    for step in range(cp):
        if step + 1 < cp:   # the next block (this one, to the next rank) issued first
            k_next = op("spmd.shift", [k], ring, name=f"{name}_k_ring{step + 1}", ring=name)
            v_next = op("spmd.shift", [v], ring, name=f"{name}_v_ring{step + 1}", ring=name)
        held = [own[(r - step) % cp] for r in range(cp)]
        o, lse_b = op("fused_attention", [q, k, v], {**attrs, "q_chunks": own[0],
                                                     "k_chunks": held[0]},
                      name=[f"{name}_ctx{step}", f"{name}_lse{step}"],
                      cp_rank_attrs={"q_chunks": own, "k_chunks": held}, ring=name)
        if out is None:
            out, lse = o, lse_b
        else:
            out, lse = merge_attention(op, out, lse, o, lse_b, f"{name}_merge{step}", ring=name)
        if step + 1 < cp:
            k, v = k_next, v_next
    return out


def merge_attention(op: Callable[..., Value], out_a: Value, lse_a: Value, out_b: Value,
                    lse_b: Value, name: str, **meta: Any) -> Tuple[Value, Value]:
    """Two attentions of the same queries to disjoint keys as one: ``lse =
    log(e^lse_a + e^lse_b)`` (shifted by their maximum, held constant: the
    result does not depend on it) and ``out`` the sum of each ``out``
    weighted by ``e^(lse_x - lse)``. A row that saw no key in one block
    (lse ``-inf``) takes the other's. ``meta`` goes on every op; the merged
    lse's op also carries ``meta["ring_lse"]``."""
    op = functools.partial(op, **meta)
    top = op("stop_gradient", [op("maximum", [lse_a, lse_b], name=f"{name}_max")],
             name=f"{name}_max")
    shifted = [op("exp", [op("sub", [x, top], name=f"{name}_d")], name=f"{name}_e")
               for x in (lse_a, lse_b)]
    total = op("add", shifted, name=f"{name}_sum")
    lse = op("add", [top, op("log", [total], name=f"{name}_log")], name=f"{name}_lse",
             ring_lse=True)
    parts = []
    for o, x in ((out_a, lse_a), (out_b, lse_b)):
        w = op("exp", [op("sub", [x, lse], name=f"{name}_wd")], name=f"{name}_w")
        w = op("reshape", [w], {"shape": list(x.type.shape) + [1]}, name=f"{name}_w")
        if w.type.dtype != o.type.dtype:
            w = op("cast", [w], {"dtype": o.type.dtype.value}, name=f"{name}_w")
        parts.append(op("mul", [o, w], name=f"{name}_part"))
    return op("add", parts, name=f"{name}_out"), lse


def position_rows(op: Callable[..., Value], table: Value, cp: int, seq: int) -> Value:
    """The rows of a learned position ``table`` for this rank's tokens: its
    two chunks of a sequence of ``seq`` positions."""
    size = seq // (2 * cp)
    rows = table.type.shape[0]
    parts: List[Value] = []
    for half in (0, 1):
        starts = [balanced_chunks(r, cp)[half] * size for r in range(cp)]
        # start/stop for the slice, before/after for its gradient (a pad)
        per_rank = {"start": starts, "stop": [s + size for s in starts], "before": starts,
                    "after": [rows - s - size for s in starts]}
        parts.append(op("slice", [table], {"axis": 0, "start": starts[0],
                                           "stop": starts[0] + size},
                        name=f"wpe_rows{half}", cp_rank_attrs=per_rank))
    return op("concat", parts, {"axis": 0}, name="wpe_rows")
