"""The simulator's integer view of a local-view program, built in one pass.

The engine (:mod:`.simulator`) never walks :class:`~distsim.ir.core.Value`
or :class:`~distsim.ir.core.Op` objects in its hot paths: this module numbers
every value once (its bytes, device, memory category, whether it stays
resident) and turns each simulated device's compute stream into flat lists
(durations, operand numbers) cut into *blocks*.

A block is a run of compute ops of one stream whose only operands from
outside the stream are read by its first op. Inside a block every op starts
when the previous one ends (an operand made earlier on the same stream is
ready by then), so its ops' times are prefix sums of their durations from
the block's start: the engine spends Python work per block (one wait for
the operands that arrive by communication), not per op, and numpy fills in
the per-op times after the run. The values a block must announce while the
simulation runs are those read by communication (or by another stream);
every other value's times are derived afterwards.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from itertools import chain, compress, count, islice, repeat
from operator import attrgetter, itemgetter, methodcaller
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

import numpy as np

from ..cost.model import CostModel
from ..errors import SimulationError, TopologyError
from ..ir.core import Function, Op, Value
from ..ir.occupancy import held_bytes, marked
from ..ir.types import Type
from ..ir.value_table import ValueTable, identity_numbers
from .op_costs import program_costs
from .program_columns import (ProgramColumns, cut, groups as _groups, kinds_of as _kinds_of,
                              pick, spans)

# Memory category of a function input, by its role in ``meta["roles"]``.
INPUT_CATEGORY = {"param": "weights", "data": "activations", "optimizer": "optimizer",
                  "master": "optimizer", "const": "weights", "grad_buffer": "gradients"}
# Input roles that stay resident for the whole step (never freed): weights,
# optimizer state, gradient buffers (written in place by the step) and
# constants a model carries (e.g. ONNX initializers that are not trained).
RESIDENT_ROLES = frozenset({"param", "optimizer", "master", "const", "grad_buffer"})
#: ``ProgramIndex.producer`` of a value made by a compute op that is not
#: simulated (a device another stands for)
NOT_SIMULATED = -(1 << 62)


def category_of(explicit: Any, role: Any, phase: Any) -> str:
    """The memory category of the results of an op with these ``meta``
    entries (``category``, ``role``, ``phase``), gradient names aside."""
    if explicit:
        return explicit
    if role == "grad_sync":
        return "gradients"
    if phase == "optimizer":
        return "weights"
    if phase == "backward":
        return "temporaries"
    return "activations"


def value_category(value: Value, producer: Optional[Op], roles: Dict[str, str],
                   grad_names: Set[str]) -> str:
    """Which memory category a value counts under."""
    if producer is None:
        return INPUT_CATEGORY.get(roles.get(value.name, ""), "activations")
    meta = producer.meta
    explicit = meta.get("category")
    if not explicit and value.name in grad_names:
        return "gradients"
    return category_of(explicit, meta.get("role"), meta.get("phase"))


def _no_ints() -> np.ndarray:
    return np.zeros(0, np.int64)


@dataclass
class ComputeStream:
    """One simulated device's compute ops in program order, as numbers.

    ``ops``: indices into :attr:`ProgramIndex.compute`; ``durations``: their
    times; ``block_starts``: the position (in ``ops``) of each block's first
    op with the value numbers it reads from outside the stream;
    ``exports``: (position, value number) of outputs that other streams
    read, in position order."""

    rank: int
    ops: List[int] = field(default_factory=list)
    durations: List[float] = field(default_factory=list)
    block_starts: List[Tuple[int, Tuple[int, ...]]] = field(default_factory=list)
    exports: List[Tuple[int, int]] = field(default_factory=list)


@dataclass
class ProgramIndex:
    """Everything the engine needs about a program, by number, in columns.

    Values (function inputs first, then each op's results in program
    order): ``values`` (number -> Value) and the arrays ``size``,
    ``device``, ``category`` (an index into ``categories``), ``kept``
    (never freed), ``producer`` (-1: a function input; ``k >= 0``: compute
    op k; ``-2 - c``: collective c; :data:`NOT_SIMULATED`: a compute op of
    a device not simulated).

    Compute ops (simulated devices only, in program order): ``compute``
    (the Op objects), the arrays ``compute_rank``, ``compute_time``,
    ``compute_flops``, ``compute_bytes``, and the value numbers they read,
    flat (``compute_reads``, ``compute_read_counts`` of them per op).

    Collectives: ``collectives`` (every communication op, in program order),
    their kinds (``collective_kinds``, ``collective_kind``,
    ``kind_members``), the bytes of each one's first operand and result,
    ``collective_inputs`` / ``collective_outputs`` (value numbers; the
    inputs flat too, as the compute ops' are), and for
    every simulated rank its collectives in program order (``comm_streams``)
    with its own operands of each (``comm_inputs``).
    """

    function: Function
    values: List[Value] = field(default_factory=list)
    size: np.ndarray = field(default_factory=_no_ints)
    device: np.ndarray = field(default_factory=_no_ints)
    category: np.ndarray = field(default_factory=_no_ints)
    categories: List[str] = field(default_factory=list)
    kept: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))
    producer: np.ndarray = field(default_factory=_no_ints)
    compute: List[Op] = field(default_factory=list)
    compute_rank: np.ndarray = field(default_factory=_no_ints)
    compute_time: np.ndarray = field(default_factory=lambda: np.zeros(0))
    compute_flops: np.ndarray = field(default_factory=lambda: np.zeros(0))
    compute_bytes: np.ndarray = field(default_factory=lambda: np.zeros(0))
    compute_reads: np.ndarray = field(default_factory=_no_ints)
    compute_read_counts: np.ndarray = field(default_factory=_no_ints)
    collectives: List[Op] = field(default_factory=list)
    #: the kinds of collective (an op standing for each, see
    #: :mod:`.program_columns`), each collective's (a position in that list),
    #: and each kind's members (its team, or in a reduced program the
    #: members present)
    collective_kinds: List[Op] = field(default_factory=list)
    collective_kind: np.ndarray = field(default_factory=_no_ints)
    kind_members: List[Tuple[int, ...]] = field(default_factory=list)
    #: each collective's first operand's and first result's bytes (-1: none)
    collective_operand_bytes: np.ndarray = field(default_factory=_no_ints)
    collective_result_bytes: np.ndarray = field(default_factory=_no_ints)
    collective_inputs: List[Tuple[int, ...]] = field(default_factory=list)
    collective_outputs: List[Tuple[int, ...]] = field(default_factory=list)
    collective_reads: np.ndarray = field(default_factory=_no_ints)
    collective_read_counts: np.ndarray = field(default_factory=_no_ints)
    #: (old, new) value numbers of in-place updates (``meta["updates"]``),
    #: one row each, sorted: ``new`` reuses ``old``'s bytes
    in_place: np.ndarray = field(default_factory=lambda: np.zeros((0, 2), np.int64))
    compute_streams: Dict[int, ComputeStream] = field(default_factory=dict)
    comm_streams: Dict[int, List[int]] = field(default_factory=dict)
    #: for each simulated rank, its own operands (those on its device) of
    #: each collective of its comm stream, in the same order
    comm_inputs: Dict[int, List[Tuple[int, ...]]] = field(default_factory=dict)
    used_devices: Set[int] = field(default_factory=set)
    #: each compute op's and each collective's place in the program's op
    #: list (the order the host launches them in, :mod:`.launch_queue`)
    compute_position: np.ndarray = field(default_factory=_no_ints)
    collective_position: np.ndarray = field(default_factory=_no_ints)

    def op_label(self, op: Op) -> str:
        return f"%{op.name} ({op.op_type})"


def device_of(value: Value, known: Set[int], topology) -> int:
    """The device of ``value``; a SimulationError if it has none, a
    TopologyError if ``topology`` (whose ranks are ``known``) lacks it."""
    return _device_of_type(value.type, value, known, topology)


def _device_of_type(t: Type, value: Value, known: Set[int], topology) -> int:
    """The device of type ``t``, the type of ``value`` (named in errors)."""
    dev = getattr(t, "device", None)
    if dev is None:
        raise SimulationError(f"value %{value.name} has no device: the simulator needs a "
                              "local-view program with every value placed")
    if dev not in known:
        raise TopologyError(f"value %{value.name} is on device {dev}, but topology "
                            f"'{topology.name}' has devices 0..{len(known) - 1}")
    return dev


_OUTPUTS = attrgetter("outputs")
_NAME, _META, _ATTRS = attrgetter("name"), attrgetter("meta"), attrgetter("attrs")
_OP_TYPE, _SUBS = attrgetter("op_type"), attrgetter("subfunctions")
_RANKS, _PRESENT = itemgetter("ranks"), methodcaller("get", "present")
_FIRST = itemgetter(0)


def _type_table(types: List[Type], values: List[Value], known: Set[int], topology,
                numbered: Optional[Tuple[np.ndarray, np.ndarray]] = None
                ) -> Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(device, bytes, shape class) per value (``types[n]`` is value n's),
    and the distinct devices.

    Each type object is looked at once, and equal types (transforms make a
    type object per value) share their details; the shape class stands for
    (shape, dtype, kind of type), what an op's cost depends on besides its
    attributes. ``numbered``: the type objects numbered by identity
    (:func:`~distsim.ir.value_table.identity_numbers`), if the caller has
    them (the verifier's value table does), else numbered here."""
    firsts, number = numbered if numbered is not None else identity_numbers(types)
    by_value: Dict[Any, int] = {}
    shape_class: Dict[tuple, int] = {}
    rows: List[Tuple[int, int, int]] = []
    row_of = np.empty(len(firsts), np.int64)      # each distinct type object's row
    for j, i in enumerate(firsts.tolist()):
        t = types[i]
        try:   # an equal type seen before
            c = by_value.get(t)
        except TypeError:  # an unhashable type
            c = None
        if c is None:
            dev = _device_of_type(t, values[i], known, topology)
            sd = (getattr(t, "shape", None), getattr(t, "dtype", None), type(t))
            sc = shape_class.setdefault(sd, len(shape_class))
            c = len(rows)
            rows.append((dev, t.size_bytes, sc))
            try:
                by_value[t] = c
            except TypeError:
                pass
        row_of[j] = c
    table = np.array(rows, dtype=np.int64).reshape(-1, 3)
    of_value = row_of[number]
    return (table[:, 0][of_value], table[:, 1][of_value], table[:, 2][of_value],
            np.unique(table[:, 0]))


def index_program(function: Function, topology, cost: CostModel,
                  simulated: Callable[[int], bool],
                  values: Optional[ValueTable] = None) -> ProgramIndex:
    """Number the values of ``function``, cost its compute ops on the
    simulated devices and cut their streams into blocks. Raises a
    :class:`SimulationError` for an operand nobody defines, a value defined
    twice or a value with no device, a :class:`TopologyError` for a device
    or team rank the topology lacks.

    Written for programs of millions of ops: the program comes as flat
    arrays (:class:`~.program_columns.ProgramColumns`: as its builder logged
    them, else read by C-level maps), everything else is numpy over those
    arrays, and Python works once per distinct type, per kind of op, per
    distinct costed op (op type, operand shapes, attributes), per block and
    per collective, never once per op. ``values``: the function's
    :class:`~distsim.ir.value_table.ValueTable`, if the caller read one
    (the verifier does)."""
    f = function
    ix = ProgramIndex(f)
    col = ProgramColumns(f, values)
    ops, n_ops, nv = col.ops, col.n_ops, col.n_values
    ix.values = col.values
    known = set(topology.ranks)
    device, size, shape_of, devices = _type_table(col.types, col.values, known, topology,
                                                  col.type_numbers())
    ix.used_devices = set(devices.tolist())
    is_sim = {d: bool(simulated(d)) for d in devices.tolist()}
    sim_of = np.zeros(max(is_sim, default=0) + 1, bool)
    sim_of[list(is_sim)] = list(is_sim.values())

    first = col.first_operand()
    if (first < 0).any():
        op = ops[int(np.flatnonzero(first < 0)[0])]
        raise SimulationError(f"op %{op.name} ({op.op_type}) has neither operands nor "
                              "results: the simulator cannot place it on a device")
    op_dev = device[first]
    is_comm = col.is_comm
    computes = np.flatnonzero(~is_comm & sim_of[op_dev])
    comms = np.flatnonzero(is_comm)
    nc = len(computes)

    # the producer of every value and where its ready time is known
    op_producer = np.full(n_ops, NOT_SIMULATED, np.int64)
    op_producer[computes] = np.arange(nc)
    op_producer[comms] = -2 - np.arange(len(comms))
    maker = col.maker
    producer = np.full(nv, -1, np.int64)
    producer[col.n_inputs:] = op_producer[maker[col.n_inputs:]]

    _categorise(ix, f, col)
    # bytes as the types say (before in-place results are given none)
    ix.collective_operand_bytes = _first_bytes(size, col.reads, col.in_start[comms],
                                               col.n_in[comms])
    ix.collective_result_bytes = _first_bytes(size, None, col.out_start[comms],
                                              col.n_out[comms])
    _held(size, col)
    _finish_values(ix, f, col, size)
    ix.size, ix.device, ix.producer = size, device, producer

    # compute ops of the simulated devices
    ix.compute = pick(ops, computes)
    ix.compute_position, ix.collective_position = computes, comms
    c_dev = op_dev[computes]
    ix.compute_rank = c_dev
    ix.compute_time, ix.compute_flops, ix.compute_bytes = program_costs(col, computes, shape_of,
                                                                        cost)
    entry_compute = op_producer[col.reader] >= 0     # read by a simulated compute op
    ix.compute_reads = col.reads[entry_compute]
    ix.compute_read_counts = col.n_in[computes]

    # reads from outside a compute op's own stream: not a function input
    # and not made earlier by the same device's compute stream (a value
    # read before it is made is outside too: the program deadlocks)
    reads, reader = col.reads, col.reader
    made_by = maker[reads]
    inside = (made_by < 0) | ((op_producer[np.maximum(made_by, 0)] >= 0)
                              & (op_dev[np.maximum(made_by, 0)] == op_dev[reader])
                              & (made_by < reader))
    outside = entry_compute & ~inside
    exported = np.zeros(nv, bool)
    exported[reads[outside]] = True
    exported[reads[is_comm[reader]]] = True
    exported = np.flatnonzero(exported)
    _build_streams(ix, col, computes, c_dev, outside, exported)
    _collectives(ix, col, comms, known, topology, is_sim, simulated)
    return ix


def _first_bytes(size: np.ndarray, numbers: Optional[np.ndarray], starts: np.ndarray,
                 counts: np.ndarray) -> np.ndarray:
    """The bytes of value ``numbers[start]`` (of value ``start`` when
    ``numbers`` is None) for each start with a count, -1 for those without."""
    out = np.full(len(starts), -1, np.int64)
    has = counts > 0
    first = starts[has] if numbers is None else numbers[starts[has]]
    out[has] = size[first]
    return out


def _categorise(ix: ProgramIndex, f: Function, col: ProgramColumns) -> None:
    """Each value's memory category (:func:`value_category`), worked out
    once per distinct (category, role, phase) of the ops' ``meta``."""
    roles = f.meta.get("roles", {})
    grad_names = set(f.meta.get("grads", {}).values())
    cat_index: Dict[str, int] = {}

    def cat_of(name: str) -> int:
        return cat_index.setdefault(name, len(cat_index))

    n_in, nv = col.n_inputs, col.n_values
    category = np.empty(nv, np.int64)
    # function inputs by role (value_category of an input), once per role
    input_roles = list(map(roles.get, map(_NAME, f.inputs), repeat("")))
    by_role = {role: cat_of(INPUT_CATEGORY.get(role, "activations"))
               for role in dict.fromkeys(input_roles)}
    category[:n_in] = np.fromiter(map(by_role.__getitem__, input_roles), np.int64, n_in)
    grad_cat = cat_of("gradients")
    # by kind of op: the meta entries are a kind's (see ProgramColumns)
    metas = list(map(_META, col.kinds))
    explicit = list(map(methodcaller("get", "category"), metas))
    keys = list(zip(explicit, map(methodcaller("get", "role"), metas),
                    map(methodcaller("get", "phase"), metas)))
    try:
        code = {key: cat_of(category_of(*key)) for key in dict.fromkeys(keys)}
        op_cat = col.per_kind(map(code.__getitem__, keys))
    except TypeError:   # a meta entry that is not hashable: kind by kind
        op_cat = col.per_kind(cat_of(category_of(*key)) for key in keys)
    made = col.maker[n_in:]
    category[n_in:] = op_cat[made]
    if grad_names:
        # a result named as a gradient is one, unless its op says otherwise
        if col.gradients is not None:     # as the builder numbered them
            is_grad = np.zeros(nv - n_in, bool)
            is_grad[col.gradients - n_in] = True
        else:
            is_grad = np.fromiter(map(grad_names.__contains__, islice(col.names(), n_in, None)),
                                  bool, nv - n_in)
        has_explicit = col.per_kind(map(bool, explicit), bool)
        category[n_in:][is_grad & ~has_explicit[made]] = grad_cat
    ix.category = category
    ix.categories = list(cat_index)


def _held(size: np.ndarray, col: ProgramColumns) -> None:
    """The results of the ops a dropless dispatch marks (and of fused
    segments holding them) at the bytes they hold
    (:func:`~distsim.ir.occupancy.held_bytes`), in place; a program
    without such marks is left as it is, each segment asked once."""
    flags: Dict[int, bool] = {}
    bodies: Dict[int, Dict[int, int]] = {}
    ops, out_start = col.ops, col.out_start
    for i in compress(count(), [marked(op, flags) for op in ops]):
        op = ops[i]
        start = int(out_start[i])
        for k in range(len(op.outputs)):
            size[start + k] = held_bytes(op, k, bodies)


def _finish_values(ix: ProgramIndex, f: Function, col: ProgramColumns, size: np.ndarray) -> None:
    """Which values stay resident, and the in-place updates: a value that
    updates another in place (``meta["updates"]``) takes no new bytes."""
    roles = f.meta.get("roles", {})
    kept = np.zeros(col.n_values, bool)
    kept[:col.n_inputs] = np.fromiter(
        map(RESIDENT_ROLES.__contains__, map(roles.get, map(_NAME, f.inputs))), bool,
        col.n_inputs)
    returned = col.outputs
    kept[returned[returned >= 0]] = True
    ix.kept = kept
    updates = f.meta.get("updates", {})
    if not updates:
        return
    if col.in_place is not None:          # as the builder gave them
        old, new = col.in_place
    else:
        wanted = set(updates)
        wanted.update(updates.values())
        names = col.names()
        hit = list(map(wanted.__contains__, names))
        number = dict(zip(compress(names, hit), compress(count(), hit)))  # the last of a name
        old = np.fromiter(map(number.get, updates, repeat(-1)), np.int64, len(updates))
        new = np.fromiter(map(number.get, updates.values(), repeat(-1)), np.int64,
                          len(updates))
    size[new[new >= 0]] = 0
    both = (old >= 0) & (new >= 0)
    old, new = old[both], new[both]
    order = np.lexsort((new, old))
    ix.in_place = np.stack([old[order], new[order]], axis=1)


def _build_streams(ix: ProgramIndex, col: ProgramColumns, computes: np.ndarray, c_dev: np.ndarray,
                   outside: np.ndarray, exported: np.ndarray) -> None:
    """Each simulated device's compute stream: its ops, their durations,
    its blocks (cut before each op that reads from outside the stream) and
    the values it announces (``exported`` ones it makes)."""
    nc = len(computes)
    if nc == 0:
        return
    streams = ix.compute_streams
    pos = np.empty(nc, np.int64)                # each compute op's place in its stream
    # streams in the order their devices first compute
    for dev, ks in _groups(c_dev):
        pos[ks] = np.arange(len(ks))
        streams[dev] = ComputeStream(dev, ks.tolist(), ix.compute_time[ks].tolist())
    # blocks: each op reading from outside its stream starts one (and each
    # stream's first op does)
    k_of_op = np.full(col.n_ops, -1, np.int64)
    k_of_op[computes] = np.arange(nc)
    block_k = k_of_op[col.reader[outside]]
    read = col.reads[outside]
    starts_at = np.flatnonzero(np.r_[True, block_k[1:] != block_k[:-1]]) if len(block_k) \
        else _no_ints()
    counts = np.diff(np.r_[starts_at, len(block_k)])
    heads = block_k[starts_at]
    starts_block = set(heads.tolist())
    for stream in streams.values():
        if stream.ops[0] not in starts_block:
            stream.block_starts.append((0, ()))
    # per stream (heads come in program order, so each stream's in its
    # order): the blocks' positions, each with the tuple of values it reads
    for dev, blocks in _groups(c_dev[heads]):
        n = counts[blocks]
        reads = cut(read[spans(starts_at[blocks], n)].tolist(), n.tolist())
        streams[dev].block_starts.extend(zip(pos[heads[blocks]].tolist(), reads))
    # exports: values other streams read, made by a simulated compute op
    p = ix.producer[exported]
    mine = p >= 0
    values, p = exported[mine], p[mine]
    dev_p, pos_p = c_dev[p], pos[p]
    order = np.lexsort((values, pos_p, dev_p))
    values, dev_p, pos_p = values[order], dev_p[order], pos_p[order]
    for dev, at in _groups(dev_p):
        streams[dev].exports.extend(zip(pos_p[at].tolist(), values[at].tolist()))


def _collectives(ix: ProgramIndex, col: ProgramColumns, comms: np.ndarray, known: Set[int],
                 topology, is_sim: Dict[int, bool], simulated: Callable[[int], bool]) -> None:
    """The communication ops in program order, their operands and results
    by number, and each simulated rank's comm stream (the collectives its
    :func:`~distsim.ir.comm.members` take part in). A team rank the
    topology lacks is a TopologyError naming the first op with it."""
    ix.collectives = colls = pick(col.ops, comms)
    n = len(colls)
    # teams are a kind's (see ProgramColumns): read once per kind
    kinds, at = _kinds_of(col, comms)
    attrs = list(map(_ATTRS, kinds))
    teams = list(map(_RANKS, attrs))
    first: Dict[int, int] = {}     # each distinct team object, its first kind
    deque(map(first.setdefault, map(id, teams), count()), maxlen=0)
    for k in first.values():
        for r in teams[k]:
            if r not in known:
                op = kinds[k]   # kinds come in program order: the first op with the team
                raise TopologyError(f"op %{op.name} ({op.op_type}): team rank {r} is not "
                                    f"a device of topology '{topology.name}'")
    ix.collective_reads = col.reads[col.is_comm[col.reader]]
    ix.collective_read_counts = col.n_in[comms]
    ix.collective_inputs = cut(ix.collective_reads.tolist(),
                               ix.collective_read_counts.tolist())
    out_starts = col.out_start[comms]
    ix.collective_outputs = list(map(tuple, map(range, out_starts.tolist(),
                                                (out_starts + col.n_out[comms]).tolist())))
    # members: the team, or in a reduced program the members present, per
    # kind, then each collective's gathered from its kind's
    taking_part = [tuple(team if present is None else present)
                   for team, present in zip(teams, map(_PRESENT, attrs))]
    ix.collective_kinds, ix.collective_kind, ix.kind_members = kinds, at, taking_part
    kind_counts = np.fromiter(map(len, taking_part), np.int64, len(kinds))
    kind_ranks = np.fromiter(chain.from_iterable(taking_part), np.int64, int(kind_counts.sum()))
    counts = kind_counts[at]
    rank = kind_ranks[spans((np.cumsum(kind_counts) - kind_counts)[at], counts)]
    which = np.repeat(np.arange(n), counts)
    for r in np.unique(rank).tolist():
        if r not in is_sim:
            is_sim[r] = bool(simulated(r))
    simulated_rank = np.array([is_sim.get(r, False) for r in range(int(rank.max()) + 1)]
                              if len(rank) else [], bool)
    keep = simulated_rank[rank] if len(rank) else np.zeros(0, bool)
    rank, which = rank[keep], which[keep]
    # each member reads its own operands of a collective, those on its
    # device: the reads ordered by (device, collective), each member's slice
    read_coll = np.repeat(np.arange(n), ix.collective_read_counts)
    read_key = ix.device[ix.collective_reads] * max(n, 1) + read_coll
    order = np.argsort(read_key, kind="stable")
    read_key = read_key[order]
    own_reads = ix.collective_reads[order]
    # streams in the order their ranks first take part
    for r, at in _groups(rank):
        colls = which[at]
        ix.comm_streams[r] = colls.tolist()
        member_key = r * max(n, 1) + colls
        lo = np.searchsorted(read_key, member_key, "left")
        own = np.searchsorted(read_key, member_key, "right") - lo
        ix.comm_inputs[r] = cut(own_reads[spans(lo, own)].tolist(), own.tolist())
