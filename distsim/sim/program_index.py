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

from dataclasses import dataclass, field
from operator import attrgetter, itemgetter
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

from ..cost.model import CostModel
from ..errors import SimulationError, TopologyError
from ..ir.comm import COMM_PREFIX, members
from ..ir.core import Function, Op, Value

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


def value_category(value: Value, producer: Optional[Op], roles: Dict[str, str],
                   grad_names: Set[str]) -> str:
    """Which memory category a value counts under."""
    if producer is None:
        return INPUT_CATEGORY.get(roles.get(value.name, ""), "activations")
    explicit = producer.meta.get("category")
    if explicit:
        return explicit
    if value.name in grad_names or producer.meta.get("role") == "grad_sync":
        return "gradients"
    phase = producer.meta.get("phase")
    if phase == "optimizer":
        return "weights"
    if phase == "backward":
        return "temporaries"
    return "activations"


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
    """Everything the engine needs about a program, by number.

    Values: ``values`` (number -> Value), ``size``, ``device``, ``category``
    (an index into ``categories``), ``kept`` (never freed), ``producer`` (-1:
    a function input; ``k >= 0``: compute op k; ``-2 - c``: collective c;
    :data:`NOT_SIMULATED`: a compute op of a device not simulated).

    Compute ops (simulated devices only): ``compute`` (the Op objects),
    ``compute_rank``, ``compute_cost`` ((time, flops, bytes)),
    ``compute_inputs`` / ``compute_outputs`` (value numbers).

    Collectives: ``collectives`` (every communication op, in program order),
    ``collective_inputs`` / ``collective_outputs`` (value numbers), and for
    every simulated rank its collectives in program order (``comm_streams``).
    """

    function: Function
    values: List[Value] = field(default_factory=list)
    size: List[int] = field(default_factory=list)
    device: List[int] = field(default_factory=list)
    category: List[int] = field(default_factory=list)
    categories: List[str] = field(default_factory=list)
    kept: List[bool] = field(default_factory=list)
    producer: List[int] = field(default_factory=list)
    compute: List[Op] = field(default_factory=list)
    compute_rank: List[int] = field(default_factory=list)
    compute_cost: List[Tuple[float, float, float]] = field(default_factory=list)
    compute_inputs: List[Tuple[int, ...]] = field(default_factory=list)
    compute_outputs: List[Tuple[int, ...]] = field(default_factory=list)
    collectives: List[Op] = field(default_factory=list)
    collective_inputs: List[Tuple[int, ...]] = field(default_factory=list)
    collective_outputs: List[Tuple[int, ...]] = field(default_factory=list)
    #: (old, new) value numbers of in-place updates (``meta["updates"]``):
    #: ``new`` reuses ``old``'s bytes
    in_place: List[Tuple[int, int]] = field(default_factory=list)
    compute_streams: Dict[int, ComputeStream] = field(default_factory=dict)
    comm_streams: Dict[int, List[int]] = field(default_factory=dict)
    used_devices: Set[int] = field(default_factory=set)

    def op_label(self, op: Op) -> str:
        return f"%{op.name} ({op.op_type})"


def device_of(value: Value, known: Set[int], topology) -> int:
    """The device of ``value``; a SimulationError if it has none, a
    TopologyError if ``topology`` (whose ranks are ``known``) lacks it."""
    dev = getattr(value.type, "device", None)
    if dev is None:
        raise SimulationError(f"value %{value.name} has no device: the simulator needs a "
                              "local-view program with every value placed")
    if dev not in known:
        raise TopologyError(f"value %{value.name} is on device {dev}, but topology "
                            f"'{topology.name}' has devices 0..{len(known) - 1}")
    return dev


def index_program(function: Function, topology, cost: CostModel,
                  simulated: Callable[[int], bool]) -> ProgramIndex:
    """Number the values of ``function``, cost its compute ops on the
    simulated devices and cut their streams into blocks. Raises a
    :class:`SimulationError` for an operand nobody defines or a value with
    no device, a :class:`TopologyError` for a device or team rank the
    topology lacks.

    One pass over the ops, written for speed (it runs once per op of
    programs of a million ops): each type object is looked at once
    (device, bytes, and a small integer standing for its shape and dtype);
    an op is costed once per (op type, operand shapes, attributes)."""
    f = function
    ix = ProgramIndex(f)
    roles = f.meta.get("roles", {})
    grad_names = set(f.meta.get("grads", {}).values())
    # Updates overwrite their old value in place: no new bytes (every
    # value's size is set to 0 after the loop for the new names here).
    updates = f.meta.get("updates", {})
    in_place = set(updates.values())
    # the numbers of the values named in updates, noted as they are numbered
    # (a pass over every value's name afterwards cost ~0.5 s on a million)
    wanted = set(updates) | in_place
    number: Dict[str, int] = {}
    known = set(topology.ranks)
    cat_index: Dict[str, int] = {}
    # id(type) -> (device, bytes, shape-and-dtype class); the function keeps
    # its types alive while this runs
    type_info: Dict[int, Tuple[int, int, int]] = {}
    by_value: Dict[Any, Tuple[int, int, int]] = {}   # the same, by type equality
    shape_class: Dict[tuple, int] = {}
    vid: Dict[Value, int] = {}
    values, size, device, category, producer = (ix.values, ix.size, ix.device, ix.category,
                                                 ix.producer)
    # where a value is ready: -1 at time 0 (a function input), a rank (made
    # by that rank's simulated compute stream), -2 (by a collective or an
    # op not simulated: announced while the simulation runs)
    home: List[int] = []
    shape_of: List[int] = []   # each value's shape-and-dtype class

    def cat_of(name: str) -> int:
        c = cat_index.get(name)
        if c is None:
            c = cat_index[name] = len(ix.categories)
            ix.categories.append(name)
        return c

    def info_of(v: Value) -> Tuple[int, int, int]:
        t = v.type
        try:   # an equal type seen before (transforms make a type object per value)
            info = by_value.get(t)
        except TypeError:  # an unhashable type
            info = None
        if info is not None:
            type_info[id(t)] = info
            return info
        dev = device_of(v, known, topology)
        sd = (getattr(t, "shape", None), getattr(t, "dtype", None), type(t))
        c = shape_class.get(sd)
        if c is None:
            c = shape_class[sd] = len(shape_class)
        info = type_info[id(t)] = (dev, t.size_bytes, c)
        try:
            by_value[t] = info
        except TypeError:
            pass
        return info

    defined_later: Set[Value] = set()   # filled on the first forward reference

    def operands(op: Op) -> Tuple[int, ...]:
        """The slow path of numbering an op's operands: a value the op reads
        before the op defining it (a program out of order, which deadlocks)
        gets its number now, its details when its definition comes."""
        if not defined_later:
            defined_later.update(v for o in f.ops for v in o.outputs)
        out = []
        for v in op.inputs:
            n = vid.get(v)
            if n is None:
                if v not in defined_later:  # read but defined nowhere: it would never come
                    raise SimulationError(f"op %{op.name} ({op.op_type}) reads %{v.name}, "
                                          "which no op or input of the program defines")
                n = vid[v] = len(values)
                if v.name in wanted:
                    number[v.name] = n
                values.append(v)
                size.append(0)
                device.append(-1)
                category.append(0)
                producer.append(NOT_SIMULATED)
                home.append(-2)
                shape_of.append(-1)
            out.append(n)
        return tuple(out)

    def define(v: Value, dev: int, nbytes: int, cat: int, prod: int, where: int,
               sc: int) -> int:
        """Fill in a value numbered by a forward reference."""
        n = vid[v]
        size[n] = nbytes
        device[n], category[n], producer[n], home[n], shape_of[n] = dev, cat, prod, where, sc
        return n

    def place(v: Value, dev: int, nbytes: int, cat: int, prod: int, where: int,
              sc: int) -> int:
        """Number one result (the paths that go value by value: collectives,
        results some of which a forward reference numbered already)."""
        if v in vid:
            return define(v, dev, nbytes, cat, prod, where, sc)
        n = vid[v] = len(values)
        if v.name in wanted:
            number[v.name] = n
        values.append(v)
        size.append(nbytes)
        device.append(dev)
        category.append(cat)
        producer.append(prod)
        home.append(where)
        shape_of.append(sc)
        return n

    for v in f.inputs:
        dev, nbytes, c = type_info.get(id(v.type)) or info_of(v)
        vid[v] = len(values)
        if v.name in wanted:
            number[v.name] = len(values)
        values.append(v)
        size.append(nbytes)
        device.append(dev)
        category.append(cat_of(value_category(v, None, roles, grad_names)))
        producer.append(-1)
        home.append(-1)
        shape_of.append(c)
    streams = ix.compute_streams
    grad_cat = cat_of("gradients")
    temp_cat, act_cat, weight_cat = cat_of("temporaries"), cat_of("activations"), cat_of("weights")
    is_sim: Dict[int, bool] = {}
    compute, compute_rank, compute_cost = ix.compute, ix.compute_rank, ix.compute_cost
    compute_inputs, compute_outputs = ix.compute_inputs, ix.compute_outputs
    exported: Set[int] = set()
    compute_pos: List[int] = []  # each compute op's position in its stream
    costs: Dict[tuple, List[Tuple[Dict[str, Any], Tuple[float, float, float]]]] = {}
    get_info = type_info.get
    check_names = bool(grad_names)
    number_of = vid.__getitem__
    shape_at = shape_of.__getitem__
    type_of, name_of = attrgetter("type"), attrgetter("name")
    first_of, second, third = itemgetter(0), itemgetter(1), itemgetter(2)
    for op in f.ops:
        # map() with C callables, not comprehensions: in CPython 3.11 each
        # comprehension call makes a frame, a real cost once per op
        try:
            ins = tuple(map(number_of, op.inputs))
        except KeyError:
            ins = operands(op)
        meta = op.meta
        op_type = op.op_type
        if op_type.startswith(COMM_PREFIX):
            c = len(ix.collectives)
            for r in op.attrs["ranks"]:
                if r not in known:
                    raise TopologyError(f"op %{op.name} ({op_type}): team rank {r} is not a "
                                        f"device of topology '{topology.name}'")
            ix.collectives.append(op)
            ix.collective_inputs.append(ins)
            exported.update(ins)
            outs = []
            for v in op.outputs:
                cat = cat_of(value_category(v, op, roles, grad_names))
                dev, nbytes, sc = get_info(id(v.type)) or info_of(v)
                outs.append(place(v, dev, nbytes, cat, -2 - c, -2, sc))
            ix.collective_outputs.append(tuple(outs))
            for r in members(op):
                sim = is_sim.get(r)
                if sim is None:
                    sim = is_sim[r] = simulated(r)
                if sim:
                    ix.comm_streams.setdefault(r, []).append(c)
            continue
        outputs = op.outputs
        first = outputs[0] if outputs else op.inputs[0]
        dev = (get_info(id(first.type)) or info_of(first))[0]
        sim = is_sim.get(dev)
        if sim is None:
            sim = is_sim[dev] = simulated(dev)
        # the op's memory category, as value_category decides it
        explicit = meta.get("category")
        if explicit:
            cat = cat_of(explicit)
        elif meta.get("role") == "grad_sync":
            cat = grad_cat
        else:
            phase = meta.get("phase")
            cat = (weight_cat if phase == "optimizer" else
                   temp_cat if phase == "backward" else act_cat)
        k = len(compute) if sim else NOT_SIMULATED
        where = dev if sim else -2
        if len(outputs) == 1 and not defined_later:
            # the common case, without lists
            v = outputs[0]
            vdev, nbytes, sc = get_info(id(v.type)) or info_of(v)
            out_shapes = (sc,)
            n0 = len(values)
            outs = (n0,)
            vid[v] = n0
            if wanted and v.name in wanted:
                number[v.name] = n0
            values.append(v)
            size.append(nbytes)
            device.append(vdev)
            category.append(grad_cat if check_names and not explicit and v.name in grad_names
                            else cat)
            producer.append(k)
            home.append(where)
            shape_of.append(sc)
        else:
            infos = list(map(get_info, map(id, map(type_of, outputs))))
            if None in infos:
                infos = [info or info_of(v) for info, v in zip(infos, outputs)]
            out_shapes = tuple(map(third, infos))
            if defined_later and any(v in vid for v in outputs):
                # some were numbered by a forward reference: one by one
                outs = tuple(
                    place(v, vdev, nbytes, grad_cat if check_names and not explicit
                          and v.name in grad_names else cat, k, where, sc)
                    for v, (vdev, nbytes, sc) in zip(outputs, infos))
            else:
                # numbered together (a fused op has many outputs)
                n0 = len(values)
                nout = len(outputs)
                outs = tuple(range(n0, n0 + nout))
                vid.update(zip(outputs, outs))
                values.extend(outputs)
                device.extend(map(first_of, infos))
                size.extend(map(second, infos))
                shape_of.extend(out_shapes)
                if check_names and not explicit:
                    category.extend([grad_cat if v.name in grad_names else cat
                                     for v in outputs])
                else:
                    category.extend([cat] * nout)
                producer.extend([k] * nout)
                home.extend([where] * nout)
                if wanted and not wanted.isdisjoint(map(name_of, outputs)):
                    for v, n in zip(outputs, outs):
                        if v.name in wanted:
                            number[v.name] = n
        if not sim:
            continue
        # cost: once per (op type, operand shapes, sub-functions, attributes)
        subs = op.subfunctions
        key = (op_type, tuple(map(shape_at, ins)), out_shapes,
               tuple(map(id, subs)) if subs else ())
        entries = costs.get(key)
        attrs = op.attrs
        hit = None
        if entries is None:
            entries = costs[key] = []
        else:
            for a, h in entries:
                if a == attrs:
                    hit = h
                    break
        if hit is None:
            oc = cost.op_cost(op)
            hit = (oc.time_s, oc.flops, oc.bytes)
            entries.append((attrs, hit))
        compute.append(op)
        compute_rank.append(dev)
        compute_cost.append(hit)
        compute_inputs.append(ins)
        compute_outputs.append(outs)
        stream = streams.get(dev)
        if stream is None:
            stream = streams[dev] = ComputeStream(dev)
        pos = len(stream.ops)
        # operands from outside the stream: anything not a function input
        # and not made earlier by this device's compute stream
        outside = ()
        for n in ins:
            h = home[n]
            if h != dev and h != -1:
                outside += (n,)
        if outside:
            # another device's compute output (a malformed program) is
            # announced like one read by communication
            exported.update(outside)
            stream.block_starts.append((pos, outside))
        elif pos == 0:
            stream.block_starts.append((pos, outside))
        compute_pos.append(pos)
        stream.ops.append(k)
        stream.durations.append(hit[0])
    kept = [False] * len(values)
    for v in f.inputs:
        if roles.get(v.name) in RESIDENT_ROLES:
            kept[vid[v]] = True
    for v in f.outputs:
        n = vid.get(v)
        if n is not None:
            kept[n] = True
    ix.kept = kept
    if updates:
        # values updated in place take no new bytes; (old, new) pairs
        for name in in_place:
            n = number.get(name)
            if n is not None:
                size[n] = 0
        ix.in_place = sorted((number[a], number[b]) for a, b in updates.items()
                             if a in number and b in number)
    # values read by communication (or, in a malformed program, by another
    # device's compute op) are announced while the simulation runs
    for n in sorted(exported):
        p = producer[n]
        if p >= 0:
            streams[compute_rank[p]].exports.append((compute_pos[p], n))
    for stream in streams.values():
        stream.exports.sort()
    ix.used_devices = {info[0] for info in type_info.values()}
    return ix
