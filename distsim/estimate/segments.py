"""A template block's op-level backward for the estimator's per-layer
profiles (:mod:`.profile`): rank 0's ops of one block compressed
into :class:`~.blocks.Segment` entries (compute runs, tensor-parallel collectives,
gradients becoming final), with ZeRO-3's reads of gathered parameters
(where each entry waits for the block's gathers), the recomputation a
backward starts with, and the compute before the first / after the last
collective.
"""
from __future__ import annotations

import re
from typing import Dict, List, Optional, Tuple

from ..ir.comm import is_communication
from ..ir.core import Op
from ..transforms.zero3 import used_param_name
from .blocks import Block, Param, Segment

#: a rank-local value's rank suffix (:meth:`LowerSPMD.local_name`)
_RANK = re.compile(r"_r\d+$")


def ring_peer(op: Op, rank: int = 0) -> int:
    """The point-to-point queue of ``rank`` that ``op`` is on where it is a
    step of ring attention (a send or receive of keys and values between
    context-parallel neighbours): ``1 + 2 peer`` for a send, ``2 + 2 peer``
    for a receive (each direction of a pair has a queue,
    :mod:`distsim.sim.comm_queues`); 0 otherwise."""
    if op.meta.get("role") != "cp_ring":
        return 0
    src, dst = op.attrs["ranks"]
    return 1 + 2 * dst if src == rank else 2 + 2 * src


def leading_recompute(ops: List[Op]) -> List[Op]:
    """The recompute ops a block's backward starts with (program order)."""
    out = []
    for op in ops:
        if not op.meta.get("recompute"):
            break
        out.append(op)
    return out


def fill_lead(blk: Block, ops: List[Op], times: Dict[str, tuple], start: float) -> None:
    """Fill ``blk``'s ``b_lead*`` and ``b_rest_pre`` from its first
    backward's ops (``start``: where the compute stream finished the block
    before)."""
    lead = leading_recompute(ops)
    compute = [o for o in lead if not is_communication(o)]
    if not compute:
        return
    blk.b_lead = max(times[o.name][1] for o in compute) - start
    blk.b_lead_busy = sum(times[o.name][1] - times[o.name][0] for o in compute)
    blk.b_lead_comm = any(is_communication(o) for o in lead)
    if blk.b_lead_comm:
        first = next(i for i, o in enumerate(lead) if is_communication(o))
        blk.b_lead_pre = sum(times[o.name][1] - times[o.name][0] for o in lead[:first])
    rest = ops[len(lead):]
    if any(is_communication(o) for o in rest):
        first = next(i for i, o in enumerate(rest) if is_communication(o))
        blk.b_rest_pre = sum(times[o.name][1] - times[o.name][0] for o in rest[:first])


def edges(segments: List[Segment]) -> Tuple[Optional[float], Optional[float]]:
    """Compute time before the first collective and after the last one
    (not counting a backward's early collectives, which read only what the
    forward kept: no deps, they run in the task before, nor ring attention
    steps, which are not on the communication stream)."""
    kinds = ["p" if s.p2p else "e" if s.kind == "t" and not s.deps else s.kind
             for s in segments]
    if "t" not in kinds:
        return None, None
    first, last = kinds.index("t"), len(kinds) - 1 - kinds[::-1].index("t")
    return (sum(s.time_s for s in segments[:first] if s.kind == "c"),
            sum(s.time_s for s in segments[last + 1:] if s.kind == "c"))


def gathered_uses(rank0: List[Op], params: Dict[str, List[Param]],
                   gathered: List[Tuple[str, int]], zero: int) -> Optional[Dict[int, int]]:
    """ZeRO-3: the ops of rank 0 that first read a parameter of
    ``gathered`` (a block's gathers) where it is used, the reshapes
    :meth:`~distsim.transforms.zero3.ParamGathers.param_for_use` names
    ``{param}_use_m{mb}``: id -> the parameter's position in ``gathered``;
    None without ZeRO-3 (every entry waits for the block's gathers, which
    are then none)."""
    if zero != 3:
        return None
    position = {params[blk][i].name: j for j, (blk, i) in enumerate(gathered)}
    return {id(op): position[name] for op in rank0
            for name in [used_param_name(op)] if name in position}


def read_gates(ops: List[Op], times: Dict[str, tuple], params: Dict[str, List[Param]],
           gathered: List[Tuple[str, int]]) -> List[Tuple[float, int]]:
    """:attr:`Block.f_gates` / ``b_gates`` from a block's ops (rank 0,
    program order): at each first read (the ``{param}_use_m{mb}``
    reshape) of a parameter of ``gathered``, the compute time before it.
    A block's first reads attributed to the block before (the reshapes
    LowerSPMD emits ahead of the block's first op) count at its start."""
    position = {params[b][i].name: j for j, (b, i) in enumerate(gathered)}
    out: List[Tuple[float, int]] = []
    before = 0.0
    for op in ops:
        if is_communication(op):
            continue
        used = used_param_name(op)
        if used is not None:
            j = position.get(used)
            if j is not None and (not out or j > out[-1][1]):
                out.append((before, j))
        t0, t1, _ = times[op.name]
        before += t1 - t0
    if out and out[0][1] > 0:
        out.insert(0, (0.0, out[0][1] - 1))
    return out


def cast_into_buffers(ops: List[Op], finals: Dict[int, str]) -> Dict[int, str]:
    """``finals`` (a micro-batch's gradients, by value id) followed
    through the casts that write them into wider buffers (``fp32_grads``:
    :func:`~distsim.transforms.sync_policy.accumulation_ops`' "cast"): with
    one micro-batch, what the gradient sync reads. ``finals`` itself
    where no gradient is cast."""
    out = dict(finals)
    for op in ops:
        name = finals.get(id(op.inputs[0])) if op.op_type == "cast" and op.inputs else None
        if name is not None and op.meta.get("category") == "gradients":
            del out[id(op.inputs[0])]
            out[id(op.outputs[0])] = name
    return out


def compress_segments(ops: List[Op], times: Dict[str, tuple], finals: Dict[int, str],
              gates: Optional[Dict[int, int]] = None, outs: Optional[set] = None,
              kept: Optional[set] = None) -> List[Segment]:
    """Compress a block's ops (rank 0, program order) into compute runs,
    tensor-parallel collectives and gradient-final marks. A run ends at a
    collective (which waits for the run) and at a final gradient (where
    data-parallel sync is emitted); a compute op that reads a collective's
    output starts a new run waiting for it. ``gates``: ZeRO-3's first
    reads of the block's gathered parameters (:func:`gathered_uses`):
    each entry's :attr:`Segment.gate` (a run ends where it changes).
    ``outs``: ids of the values a stage sends to the stage before (a
    layer's input gradient): a run ends at the op making one, followed by
    an "o" mark (sent from there). ``kept``: ids of the values the
    forward made (and the program's inputs): a collective that reads only
    those (sequence parallelism's all-gathers of saved activations in the
    backward) waits for no compute of the backward (no deps); one that
    reads a value from before the block otherwise waits for the compute
    before it (``deps`` ``(None,)``), but a ring attention step
    (:attr:`Segment.p2p`), which waits for its queue only; a ring
    step's receive, which reads the peer's value, waits for the entry
    making rank 0's value of that name (ranks run alike)."""
    out: List[Segment] = []
    gate = None if gates is None else -1
    made: Dict[int, int] = {}          # id(value) -> entry producing it
    to_comm = {id(v) for op in ops if is_communication(op) for v in op.inputs}
    lead = {id(op) for op in leading_recompute(ops)}
    by_name: Dict[str, int] = {}       # made's, by the value's name
    open_run: Optional[int] = None
    for op in ops:
        t0, t1, _ = times[op.name]
        srcs = [made.get(id(v)) for v in op.inputs]
        is_lead = id(op) in lead
        if gates is not None and gates.get(id(op), -1) > gate:
            gate = gates[id(op)]
        if open_run is not None and (out[open_run].lead != is_lead
                                     or out[open_run].gate != gate):
            open_run = None            # the recomputation ends: a run of its own
        if is_communication(op):
            dep = next((s for s in srcs if s is not None), None)
            peer = ring_peer(op)
            if peer and dep is None:
                # a ring step's receive reads the peer's value: it waits as
                # the peer's send, for what rank 0's counterpart waits for
                dep = next((by_name[n] for v in op.inputs
                            if (n := _RANK.sub("_r0", v.name)) in by_name), None)
            # a ring step reading only what is there before the block waits
            # for its queue alone (not on the communication stream)
            forward = dep is None and ((kept is not None and all(id(v) in kept
                                                                 for v in op.inputs))
                                       or peer > 0)
            out.append(Segment("t", t1 - t0, () if forward else (dep,), lead=is_lead,
                               gate=gate, at=t0, p2p=peer))
            open_run = None
            idx = len(out) - 1
        else:
            waits = tuple(sorted({s for s in srcs if s is not None and out[s].kind == "t"}))
            if open_run is None or waits:
                out.append(Segment("c", 0.0, waits, lead=is_lead, gate=gate, at=t0))
                open_run = len(out) - 1
            out[open_run].time_s += t1 - t0
            idx = open_run
        for v in op.outputs:
            made[id(v)] = idx
            by_name[v.name] = idx
        for v in op.outputs:
            if id(v) in finals:
                out.append(Segment("g", deps=(idx,), param=finals[id(v)], at=t1,
                                   op_s=t1 - t0))
                open_run = None
            elif id(v) in to_comm:     # the collective reading it may start here
                open_run = None
            elif outs and id(v) in outs:
                out.append(Segment("o", deps=(idx,), at=t1))
                open_run = None
    return out
