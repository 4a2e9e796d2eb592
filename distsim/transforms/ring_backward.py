"""The backward of ring attention, written as TransformerEngine's and
Megatron-LM's ring attention write it.

The forward (:func:`distsim.models.gpt_context.ring_attention`, every op
tagged ``meta["ring"]``) attends a rank's queries to one key/value block
per ring step and merges the blocks' outputs by their log-sum-exps.
Differentiating those ops one by one would keep every received block and
every partial output for the backward. Instead, a FlashAttention backward
of one block needs only the queries, the block's keys and values and the
*merged* output and log-sum-exp (``P = exp(S - lse)`` with the final lse is
the block's share of the softmax; ``D = rowsum(dO * O)`` with the final O):
so the backward runs one ``fused_attention_grad`` per block in ring order,
reading the blocks again (:mod:`.recompute` redoes the ring's shifts before
the layer's backward) and the merged results. Each block's key/value
gradients travel with it around the ring: the partial sum received from
the rank before (its ``spmd.shift`` issued before the block's gradient,
so that the two overlap) is added to this rank's share and passed on,
and one last step brings the total to the block's owner.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from ..ir.core import Op, Value


@dataclass
class Ring:
    """One ring attention of the forward: its block attentions in ring
    order and its merged output and log-sum-exp."""
    blocks: List[Op] = field(default_factory=list)
    out: Optional[Value] = None
    lse: Optional[Value] = None


def find_rings(ops: Sequence[Op]) -> Dict[str, Ring]:
    """The ring attentions of ``ops`` (forward ops tagged ``meta["ring"]``)
    that merge at least two blocks."""
    rings: Dict[str, Ring] = {}
    for op in ops:
        name = op.meta.get("ring")
        if name is None:
            continue
        ring = rings.setdefault(name, Ring())
        if op.op_type == "fused_attention":
            ring.blocks.append(op)
        elif op.meta.get("ring_lse"):
            ring.lse = op.outputs[0]
        elif op.op_type != "spmd.shift":
            ring.out = op.outputs[0]   # a merge's last op gives its output
    return {n: r for n, r in rings.items() if r.lse is not None}


def ring_backward(b, ring: Ring, dout: Value) -> List[Tuple[Value, Value]]:
    """Emit the backward of ``ring`` given its output's gradient; returns
    (forward value, gradient) for the queries and the rank's own keys and
    values."""
    first = ring.blocks[0]
    q, k, v = first.inputs
    dq: Optional[Value] = None
    carried: List[Optional[Value]] = [None, None]   # dK, dV partial sums on the ring
    for step, block in enumerate(ring.blocks):
        meta = {key: block.meta[key] for key in ("layer", "cp_rank_attrs") if key in block.meta}
        names = [f"d_{x.name}_ring" for x in block.inputs]
        # the partial sums of the block before issued first: they travel
        # while this block's gradient is computed
        passed = [b.op("spmd.shift", [c], _shift(block), name=n, meta=_plain(meta))
                  for c, n in zip(carried, names[1:])] if step else [None, None]
        dq_b, dk_b, dv_b = b.op("fused_attention_grad",
                                [dout, *block.inputs, ring.out, ring.lse],
                                dict(block.attrs), name=names, meta=meta)
        dq = dq_b if dq is None else b.op("add", [dq, dq_b], name=f"d_{q.name}", meta=meta)
        for i, d in enumerate((dk_b, dv_b)):
            if step:
                d = b.op("add", [passed[i], d], name=d.name, meta=_plain(meta))
            carried[i] = d
    last = ring.blocks[-1]
    home = [b.op("spmd.shift", [c], _shift(last), name=f"d_{x.name}", meta=_plain(
        {key: last.meta[key] for key in ("layer",) if key in last.meta}))
        for c, x in zip(carried, (k, v))]
    return [(q, dq), (k, home[0]), (v, home[1])]


def _shift(block: Op) -> Dict[str, object]:
    cp = len(block.meta["cp_rank_attrs"]["k_chunks"])
    return {"group": "cp", "size": cp, "offset": 1}


def _plain(meta: Dict[str, object]) -> Dict[str, object]:
    return {k: val for k, val in meta.items() if k != "cp_rank_attrs"}
