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
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List

from ..ir.core import Value
from ..transforms.context_parallel import balanced_chunks, gathered_chunks

#: the dim of the sequence in the attention's (batch, kv heads, group, seq, d)
SEQ_DIM = 3


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
