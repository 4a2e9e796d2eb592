"""How a template block's backward (its ops on rank 0, timed by the
template's simulation) begins and ends beyond its own compute: the
compute after its input gradient, the collectives outlasting its compute,
the wait before its first tensor-parallel collective (read by
:mod:`.profile` into :class:`~.blocks.Block`)."""
from __future__ import annotations

from typing import Dict, List

from ..ir.comm import is_communication
from ..ir.core import Op
from .profile_memory import block_collective

__all__ = ["comm_tail", "first_wait", "issued_after", "out_tail"]


def out_tail(ops: List[Op], times, outs: set) -> float:
    """The compute of a template block's backward (``ops``) after the op
    that makes its input gradient (``outs``: its id), which a pipeline
    stage sends as soon as it is made. 0 where the block makes none."""
    compute = [o for o in ops if not is_communication(o)]
    made = [times[o.name][1] for o in compute if any(id(v) in outs for v in o.outputs)]
    if not made:
        return 0.0
    return max(0.0, max(times[o.name][1] for o in compute) - max(made))


def comm_tail(ops: List[Op], times) -> float:
    """How long a template block's backward (``ops``) keeps the
    communication stream busy after its last compute op ends (its last
    tensor-parallel collectives, which the next task's queue behind); 0
    where the compute ends last."""
    comm = [times[o.name][1] for o in ops if block_collective(o)]
    compute = [times[o.name][1] for o in ops if not is_communication(o)]
    if not comm or not compute:
        return 0.0
    return max(0.0, max(comm) - max(compute))


def first_wait(ops: List[Op], times, made_by: Dict[int, str], forward_made: set,
                issued: Dict[str, float]) -> float:
    """:attr:`~.blocks.Block.b_wait_first` of a template block's backward
    (``ops``; ``made_by``: rank 0's op making each value): its first
    tensor-parallel collective reading a value of the backward, from
    when its inputs were made (and under stream order the compute issued
    before it ended: ``issued``, :func:`issued_after`; a wait of the
    block's own) to its start."""
    for op in ops:
        if not block_collective(op):
            continue
        if all(id(v) in forward_made for v in op.inputs):
            continue                   # an early one: reads only what the forward kept
        made = [times[made_by[id(v)]][1] for v in op.inputs if id(v) in made_by]
        if op.name in issued:
            made.append(issued[op.name])
        return max(0.0, times[op.name][0] - max(made)) if made else 0.0
    return 0.0


def issued_after(rank0: List[Op], times) -> Dict[str, float]:
    """Under stream order, each of rank 0's collectives (by name): the end
    of the compute op issued last before it, where it may start."""
    out: Dict[str, float] = {}
    last = 0.0
    for op in rank0:
        if is_communication(op):
            out[op.name] = last
        elif op.name in times:
            last = times[op.name][1]
    return out
