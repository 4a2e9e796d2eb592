"""Symmetry reduction: find devices that run the same program in the same
situation, so that only one representative per class is simulated.

Two ranks are *equivalent* when their local op sequences are identical
(op types, attributes other than the team, shapes, and where each operand
comes from in the rank's own sequence), their collectives sit in the same
place of the hardware (how many team members share the rank's server, how
many servers the team spans), and, refined to a fixed point as in colour
refinement of graphs, every collective they take part in has team members
of the same classes. Data-parallel
replicas and tensor-parallel peers of a Megatron layer end up in one class;
pipeline stages, which wait on different neighbours, stay apart.

The simulator then runs the streams of representatives only. A collective
is simulated (all its flows, so shared links see the full load) when a
representative is in its team; the arrival of a non-representative member
is its representative's arrival at the corresponding op (same position in
its communication stream). Collectives whose members are all
non-representatives are assumed to mirror their representatives' and are
not simulated: on hardware where such groups contend with each other for
links outside their representatives' view, the reduced result is an
approximation — compare with a full run (``symmetry=False``).
"""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

from ..ir.comm import COMM_PREFIX, collective_of, io_ranks, is_communication
from ..ir.core import Function, Op, Value
from ..ir.ops_bundle import BOOKKEEPING_OPS

_TEAM_ATTRS = ("ranks", "root", "mesh", "axes")


def _local_ops(function: Function) -> Dict[int, List[Op]]:
    """Each rank's ops in program order (compute ops on their device, a
    collective on every member)."""
    per_rank: Dict[int, List[Op]] = {}
    for op in function.ops:
        if is_communication(op):
            for r in op.attrs["ranks"]:
                per_rank.setdefault(r, []).append(op)
        else:
            dev = op.outputs[0].type.device if op.outputs else op.inputs[0].type.device
            per_rank.setdefault(dev, []).append(op)
    return per_rank


class _TeamInfo:
    """What every member of one collective needs for its signature,
    computed once per collective (not once per member)."""

    __slots__ = ("attrs", "size", "ins", "outs", "per_node", "nodes", "inputs_on", "outputs_on")

    def __init__(self, op: Op, node_of) -> None:
        ranks = tuple(op.attrs["ranks"])
        kind = collective_of(op)
        root = ranks[0] if kind.value == "sendrecv" else op.attrs.get("root")
        ins, outs = io_ranks(kind, ranks, root)
        self.attrs = tuple((k, v) for k, v in sorted(op.attrs.items()) if k not in _TEAM_ATTRS)
        self.size = len(ranks)
        self.ins, self.outs = frozenset(ins), frozenset(outs)
        self.per_node: Dict[int, int] = {}
        for m in ranks:
            n = node_of(m)
            self.per_node[n] = self.per_node.get(n, 0) + 1
        self.nodes = len(self.per_node)
        self.inputs_on: Dict[int, List[Value]] = {}
        for v in op.inputs:
            self.inputs_on.setdefault(v.type.device, []).append(v)
        self.outputs_on: Dict[int, List[Value]] = {}
        for v in op.outputs:
            self.outputs_on.setdefault(v.type.device, []).append(v)


def _local_signature(rank: int, ops: List[Op], node_of, teams: Dict[int, _TeamInfo],
                     shapes: Optional[Dict[int, tuple]] = None) -> int:
    position: Dict[Value, int] = {}
    parts = []
    home = node_of(rank)
    if shapes is None:
        shapes = {}

    def sd(v: Value) -> tuple:
        """(shape, dtype name) of a value's type, once per type object (the
        device left out; the dtype's name hashes in C, an enum does not)."""
        t = v.type
        got = shapes.get(id(t))
        if got is None:
            got = shapes[id(t)] = (t.shape, t.dtype.value)
        return got

    known = shapes.get  # hot path: a type seen before, no call to sd
    for i, op in enumerate(ops):
        if is_communication(op):
            info = teams.get(id(op))
            if info is None:
                info = teams[id(op)] = _TeamInfo(op, node_of)
            mine_in = info.inputs_on.get(rank, ())
            parts.append((op.op_type, info.attrs, info.size, rank in info.ins, rank in info.outs,
                          info.per_node.get(home, 0), info.nodes,
                          tuple([position.get(v, -1) for v in mine_in]),
                          tuple([known(id(v.type)) or sd(v) for v in mine_in])))
            for v in info.outputs_on.get(rank, ()):
                position[v] = i
        else:
            attrs = tuple(sorted(op.attrs.items()))
            parts.append((op.op_type, attrs, tuple([position.get(v, -1) for v in op.inputs]),
                          tuple([known(id(v.type)) or sd(v) for v in op.inputs]),
                          tuple([known(id(v.type)) or sd(v) for v in op.outputs])))
            for v in op.outputs:
                position[v] = i
    return hash(tuple(parts))


def symmetry_classes(function: Function, node_of=lambda r: 0) -> Dict[int, int]:
    """Map every rank to its representative (the smallest rank of its
    class). ``node_of(rank)`` gives the server a rank sits in."""
    per_rank = _local_ops(function)
    for v in function.inputs:  # ranks with inputs but no ops still count
        per_rank.setdefault(v.type.device, [])
    nodes = {r: node_of(r) for r in per_rank}
    teams: Dict[int, _TeamInfo] = {}
    shapes: Dict[int, tuple] = {}  # id(type) -> (shape, dtype); the function keeps types alive
    colour = {r: _local_signature(r, ops, nodes.__getitem__, teams, shapes)
              for r, ops in per_rank.items()}
    n_classes = len(set(colour.values()))
    comm_ops = [op for op in function.ops if is_communication(op)]
    while True:
        # the multiset of team colours of every collective, once per op
        team_colour = {id(op): hash(tuple(sorted(colour[m] for m in op.attrs["ranks"])))
                       for op in comm_ops}
        refined = {r: hash((colour[r], tuple(team_colour[id(op)] for op in ops
                                             if is_communication(op))))
                   for r, ops in per_rank.items()}
        n_refined = len(set(refined.values()))
        colour = refined
        if n_refined == n_classes:
            break
        n_classes = n_refined
    rep: Dict[int, int] = {}
    first: Dict[int, int] = {}
    for r in sorted(colour):
        rep[r] = first.setdefault(colour[r], r)
    return rep


def comm_positions(function: Function) -> Dict[int, List[Op]]:
    """Each rank's communication ops in program order."""
    out: Dict[int, List[Op]] = {}
    for op in function.ops:
        if is_communication(op):
            for r in op.attrs["ranks"]:
                out.setdefault(r, []).append(op)
    return out


def class_members(rep: Dict[int, int]) -> Dict[int, Tuple[int, ...]]:
    """Representative -> every rank it stands for (itself first)."""
    out: Dict[int, List[int]] = {}
    for r, R in sorted(rep.items()):
        out.setdefault(R, []).append(r)
    return {R: tuple(sorted(m, key=lambda x: (x != R, x))) for R, m in out.items()}


def represented_ops(function: Function) -> int:
    """How many ops the devices execute in the program a reduced or
    coarsened one stands for: a fused op counts its segment's ops (a fused
    kernel, ``kernel``, is one op); an op of
    a reduced program (``meta["represents"]``: rank -> devices) counts once
    per device its rank stands for; a collective counts once per member,
    its members present in a reduced program once per device they stand
    for (the collectives left out mirror those kept); ``pack`` and
    ``unpack`` (bookkeeping of coarsening) not at all."""
    represents = function.meta.get("represents") or {}
    weight = {r: int(n) for r, n in represents.items()}.get   # devices per rank
    total = 0
    for op in function.ops:
        t = op.op_type
        if t.startswith(COMM_PREFIX):       # is_communication
            present = op.attrs.get("present")
            for r in (op.attrs["ranks"] if present is None else present):
                total += weight(r, 1)
        elif t not in BOOKKEEPING_OPS:
            dev = op.outputs[0].type.device if op.outputs else op.inputs[0].type.device
            if t == "fused" and not op.attrs.get("kernel"):
                total += int(op.attrs.get("ops", 1)) * weight(dev, 1)
            else:
                total += weight(dev, 1)
    return total
