"""The discrete-event simulator: a local-view program on a topology.

Each device has two streams, ``compute`` and ``comm`` (like a CUDA stream
and an NCCL stream); each stream is a SimPy process that takes its ops in
program order. An op starts when its stream is free and its inputs on that
device are ready. A communication op is on the ``comm`` stream of every
rank of its team; the collective starts when every member has reached it
and its inputs are ready, and runs as point-to-point flows on the network
(:mod:`.collectives`, :mod:`.network`). Compute time comes from the cost
model. Memory is logged per device (:mod:`.memory`).

Speed: compute ops share no resource but their stream, so a stream does not
wait on the simulation clock for them. It schedules each compute op as soon
as the ready times of its inputs are *known* (start = max(stream free,
inputs ready)), running ahead of the clock, and blocks only on a value whose
ready time is not known yet (the output of a collective in flight, or of an
op another stream has not reached). Collectives, which share the network,
wait for the clock to reach their start time, so the network sees flows in
time order. Every op scheduled while the clock is at T starts at or after T,
so this gives exactly the times an op-by-op simulation would, with about one
SimPy event per collective instead of several per op.

A program that cannot finish ends with a :class:`SimulationError` that lists
every blocked op per device.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from operator import itemgetter
from typing import Dict, List, Optional, Sequence, Set, Tuple

import simpy

from ..cost.model import CostModel
from ..errors import SimulationError, TopologyError
from ..ir.comm import COMM_PREFIX, CollectiveType, collective_of, is_communication, members
from ..ir.core import Function, Op, Value, gc_paused
from .collectives import bytes_sent_per_rank, resolve_algorithm, run_collective
from .memory import MemoryLog
from .symmetry import class_members, comm_positions, symmetry_classes
from .network import Network
from .trace import COMM_STREAM, COMPUTE_STREAM, DeviceInfo, OpRecord, Trace

# Memory category of a function input, by its role in ``meta["roles"]``.
INPUT_CATEGORY = {"param": "weights", "data": "activations", "optimizer": "optimizer",
                  "master": "optimizer", "const": "weights", "grad_buffer": "gradients"}
# Input roles that stay resident for the whole step (never freed): weights,
# optimizer state, gradient buffers (written in place by the step) and
# constants a model carries (e.g. ONNX initializers that are not trained).
RESIDENT_ROLES = frozenset({"param", "optimizer", "master", "const", "grad_buffer"})


@dataclass
class SimulationOptions:
    """``network_mode``: "flow" (max-min fair sharing) or "analytical";
    ``collective_algorithm``: "auto" or an algorithm name;
    ``record_memory``: keep the memory curve (peaks are always kept);
    ``record_links``: keep each link's utilisation over time
    (``Trace.link_samples``, for links.png and trace.json's link counters;
    off by default: the samples cost memory on big runs, so sweeps and
    benchmarks leave it off; ``distsim simulate`` turns it on);
    ``symmetry``: simulate one representative per class of equivalent
    devices (see :mod:`.symmetry`) and copy its results to the others.

    Liveness bounds (issue 9): a run that cannot finish stops with a
    :class:`SimulationError` listing every blocked op per device, either
    when no event is left (a deadlock, always detected) or when one of
    these bounds is passed: ``stall_events``: that many SimPy events in a
    row without an op finishing (None: no bound); ``max_events``: events
    in all; ``max_wall_s``: wall-clock seconds of the event loop (checked
    every 256 events)."""

    network_mode: str = "flow"
    collective_algorithm: str = "auto"
    record_memory: bool = True
    record_links: bool = False
    symmetry: bool = False
    stall_events: Optional[int] = 10_000_000
    max_events: Optional[int] = None
    max_wall_s: Optional[float] = None


def collective_bytes(op: Op) -> int:
    """The message size S a collective algorithm is given (see
    :func:`distsim.sim.collectives.run_collective`)."""
    kind = collective_of(op)
    if kind in (CollectiveType.ALL_GATHER, CollectiveType.GATHER):
        return op.outputs[0].type.size_bytes
    return op.inputs[0].type.size_bytes


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


class _Collective:
    """Rendezvous of the team members of one communication op."""

    __slots__ = ("op", "members", "arrivals", "done", "simulated", "started")

    def __init__(self, env: simpy.Environment, op: Op, simulated: bool = True) -> None:
        self.op = op
        self.members: Tuple[int, ...] = members(op)
        self.arrivals: Dict[int, float] = {}
        self.done = env.event()
        self.simulated = simulated
        self.started = False


class Simulator:
    """Owns the SimPy environment of one run. Use :func:`simulate_function`."""

    def __init__(self, function: Function, topology, cost_model: Optional[CostModel] = None,
                 options: Optional[SimulationOptions] = None) -> None:
        self.function = function
        self.topology = topology
        self.cost = cost_model or CostModel(topology.device_spec)
        self.options = options or SimulationOptions()
        self.env = simpy.Environment()
        self.network = Network(self.env, topology, mode=self.options.network_mode,
                               record_samples=self.options.record_links)
        self.memory = MemoryLog(self.options.record_memory)
        self.records: List[OpRecord] = []
        self._ready_at: Dict[Value, float] = {}
        self._waiters: Dict[Value, List[simpy.Event]] = {}
        self._users_left: Dict[Value, int] = {}
        self._last_use: Dict[Value, float] = {}
        self._category: Dict[Value, str] = {}
        self._size: Dict[Value, int] = {}
        # Returned values and resident inputs (weights, optimizer state) are
        # never freed.
        self._kept: Set[Value] = set(function.outputs)
        self._collectives: Dict[int, _Collective] = {}
        self._blocked: Dict[Tuple[int, str], Tuple[Op, Optional[Value]]] = {}
        # Symmetry: representative of each rank, and for each representative
        # the collectives its followers reach at each comm-stream position.
        self._rep: Dict[int, int] = {}
        self._followers: Dict[int, List[Tuple[int, List[_Collective]]]] = {}
        # Filled by _prepare's pass over the ops: each stream's ops, and the
        # compute ops simulated (in program order).
        self._stream_ops: Optional[Dict[Tuple[int, str], List[Op]]] = None
        self._compute_ops: Optional[List[Op]] = None
        self._used_devices: Set[int] = set()
        self._check_devices()

    # -- setup ----------------------------------------------------------
    def _check_devices(self) -> None:
        known = set(self.topology.ranks)
        used = self._used_devices
        seen = set()  # ids of the type objects checked (the values hold them)
        for v in self.function.values():
            if id(v.type) in seen:
                continue
            dev = getattr(v.type, "device", None)
            if dev in used:
                seen.add(id(v.type))
                continue
            if dev is None:
                raise SimulationError(f"value %{v.name} has no device: the simulator needs a "
                                      "local-view program with every value placed")
            if dev not in known:
                raise TopologyError(f"value %{v.name} is on device {dev}, but topology "
                                    f"'{self.topology.name}' has devices 0..{len(known) - 1}")
            used.add(dev)
        for op in self.function.ops:
            if is_communication(op):
                for r in op.attrs["ranks"]:
                    if r not in known:
                        raise TopologyError(f"op %{op.name} ({op.op_type}): team rank {r} is not a "
                                            f"device of topology '{self.topology.name}'")

    def _simulated(self, rank: int) -> bool:
        return self._rep.get(rank, rank) == rank

    def _streams(self) -> Dict[Tuple[int, str], List[Op]]:
        if self._stream_ops is not None:  # found by _prepare's pass over the ops
            return self._stream_ops
        streams: Dict[Tuple[int, str], List[Op]] = {}
        simulated = self._simulated
        for op in self.function.ops:
            if is_communication(op):
                for r in members(op):
                    if simulated(r):
                        streams.setdefault((r, COMM_STREAM), []).append(op)
            else:
                dev = op.outputs[0].type.device if op.outputs else op.inputs[0].type.device
                if simulated(dev):
                    streams.setdefault((dev, COMPUTE_STREAM), []).append(op)
        return streams

    def _op_costs(self) -> Dict[int, tuple]:
        """(time, flops, bytes) per compute op; replicas of one op on several
        devices (same type, attributes, shapes) are costed once."""
        cache: Dict[tuple, tuple] = {}
        by_types: Dict[tuple, tuple] = {}
        costs: Dict[int, tuple] = {}
        simulated = self._simulated
        compute_ops = self._compute_ops
        if compute_ops is None:
            compute_ops = [op for op in self.function.ops
                           if not op.op_type.startswith(COMM_PREFIX) and
                           simulated(op.outputs[0].type.device if op.outputs
                                     else op.inputs[0].type.device)]
        for op in compute_ops:
            outputs, inputs = op.outputs, op.inputs
            attrs = tuple(op.attrs.items())
            subs = tuple(id(f) for f in op.subfunctions)
            # first by the identity of the type objects (a builder shares them
            # between the repeats of an op; the program keeps them alive), then,
            # for each new combination, by shapes and dtypes (the same op on
            # any device)
            try:
                fast = (op.op_type, attrs, subs, tuple([id(v.type) for v in inputs]),
                        tuple([id(v.type) for v in outputs]))
                hit = by_types.get(fast)
            except TypeError:  # an unhashable attribute
                fast, hit = None, None
            if hit is None:
                key = (op.op_type, attrs, subs,
                       tuple((v.type.shape, v.type.dtype) for v in inputs),
                       tuple((v.type.shape, v.type.dtype) for v in outputs))
                hit = cache.get(key)
                if hit is None:
                    c = self.cost.op_cost(op)
                    hit = cache[key] = (c.time_s, c.flops, c.bytes)
                if fast is not None:
                    by_types[fast] = hit
            costs[id(op)] = hit
        return costs

    # -- value bookkeeping ---------------------------------------------
    def _publish(self, values: Sequence[Value], time_s: float) -> None:
        """The values are ready at ``time_s``: wake the streams waiting to
        learn it, and free values nobody reads."""
        for v in values:
            self._ready_at[v] = time_s
            waiters = self._waiters.pop(v, None)
            if waiters:
                for ev in waiters:
                    ev.succeed()
            if self._users_left[v] == 0 and v not in self._kept:
                self.memory.free(v.type.device, self._size[v], self._category[v], time_s)

    def _consume(self, values: Sequence[Value], end_s: float) -> None:
        """An op reading ``values`` ends at ``end_s``; free each value after
        the last of its readers ends."""
        last_use = self._last_use
        for v in values:
            last = last_use.get(v)
            if last is None or end_s > last:
                last = last_use[v] = end_s
            left = self._users_left[v] - 1
            self._users_left[v] = left
            if left == 0 and v not in self._kept:
                self.memory.free(v.type.device, self._size[v], self._category[v], last)

    def _wait_known(self, key: Tuple[int, str], op: Op, v: Value) -> simpy.Event:
        ev = self.env.event()
        self._waiters.setdefault(v, []).append(ev)
        self._blocked[key] = (op, v)
        return ev

    # -- processes ------------------------------------------------------
    def _compute_stream(self, rank: int, ops: List[Op], costs: Dict[int, tuple]):
        # The hot loop of the simulator (once per compute op): _publish and
        # _consume inlined, every lookup bound to a local.
        key = (rank, COMPUTE_STREAM)
        ready_at = self._ready_at
        waiters = self._waiters
        users_left = self._users_left
        last_use = self._last_use
        kept = self._kept
        size = self._size
        category = self._category
        allocate = self.memory.allocate
        free = self.memory.free
        add_record = self.records.append
        make = tuple.__new__
        t = 0.0
        for op in ops:
            start = t
            inputs = op.inputs
            for v in inputs:
                r = ready_at.get(v)
                if r is None:
                    yield self._wait_known(key, op, v)
                    r = ready_at[v]
                if r > start:
                    start = r
            time_s, flops, nbytes = costs[id(op)]
            end = start + time_s
            outputs = op.outputs
            for v in outputs:
                allocate(rank, size[v], category[v], start)  # as before: the stream's device
            add_record(make(OpRecord, (rank, COMPUTE_STREAM, op.name, op.op_type, "compute",
                                       start, end, flops, nbytes, op.meta.get("detail", ""))))
            # publish the outputs (as _publish)
            for v in outputs:
                ready_at[v] = end
                if v in waiters:
                    for ev in waiters.pop(v):
                        ev.succeed()
                if users_left[v] == 0 and v not in kept:
                    free(v.type.device, size[v], category[v], end)
            # consume the inputs (as _consume)
            for v in inputs:
                last = last_use.get(v)
                if last is None or end > last:
                    last = last_use[v] = end
                left = users_left[v] - 1
                users_left[v] = left
                if left == 0 and v not in kept:
                    free(v.type.device, size[v], category[v], last)
            t = end
        self._blocked.pop(key, None)

    def _arrive(self, coll: _Collective, rank: int, time_s: float) -> None:
        coll.arrivals[rank] = time_s
        if coll.simulated and not coll.started and len(coll.arrivals) == len(coll.members):
            coll.started = True
            self.env.process(self._run_collective(coll))

    def _comm_stream(self, rank: int, ops: List[Op]):
        key = (rank, COMM_STREAM)
        ready_at = self._ready_at
        followers = self._followers.get(rank)
        t = 0.0
        for k, op in enumerate(ops):
            arrival = t
            for v in op.inputs:
                if v.type.device != rank:
                    continue
                r = ready_at.get(v)
                if r is None:
                    yield self._wait_known(key, op, v)
                    r = ready_at[v]
                if r > arrival:
                    arrival = r
            coll = self._collectives[id(op)]
            if followers:
                # followers reach their k-th collective when this rank does
                for follower_rank, colls in followers:
                    self._arrive(colls[k], follower_rank, arrival)
            self._arrive(coll, rank, arrival)
            self._blocked[key] = (op, None)
            yield coll.done
            t = self.env.now
        self._blocked.pop(key, None)

    def _run_collective(self, coll: _Collective):
        env = self.env
        op = coll.op
        start = max(coll.arrivals.values())
        if start > env.now:
            yield env.timeout(start - env.now)
        kind = collective_of(op)
        ranks = tuple(op.attrs["ranks"])  # the whole team loads the network
        root = ranks[0] if kind is CollectiveType.SEND_RECV else op.attrs.get("root")
        nbytes = collective_bytes(op)
        for v in op.outputs:
            self.memory.allocate(v.type.device, self._size[v], self._category[v], start)
        algorithm = op.attrs.get("algorithm") or resolve_algorithm(
            kind, self.options.collective_algorithm, per_run=True)
        used = yield env.process(run_collective(env, self.network, kind, ranks, nbytes,
                                                root=root, algorithm=algorithm))
        used = str(used or algorithm)
        end = env.now
        sent = float(bytes_sent_per_rank(kind, len(ranks), nbytes, used))
        for r in coll.members:
            self.records.append(OpRecord(r, COMM_STREAM, op.name, op.op_type, "communication",
                                         start, end, 0.0, sent, used))
        self._publish(op.outputs, end)
        self._consume(op.inputs, end)
        coll.done.succeed()

    # -- run ------------------------------------------------------------
    def _prepare(self) -> None:
        f = self.function
        roles = f.meta.get("roles", {})
        grad_names = set(f.meta.get("grads", {}).values())
        # Optimizer updates overwrite their parameter in place: no new bytes.
        in_place = set(f.meta.get("updates", {}).values())
        for v in f.inputs:
            self._category[v] = value_category(v, None, roles, grad_names)
            self._size[v] = 0 if v.name in in_place else v.type.size_bytes
            self._users_left[v] = 0
        for v in f.inputs:
            if roles.get(v.name) in RESIDENT_ROLES:
                self._kept.add(v)
        if self.options.symmetry:
            self._rep = symmetry_classes(f, self.topology.node_of)
        category, size, users_left = self._category, self._size, self._users_left
        for op in f.ops:
            explicit = op.meta.get("category")
            for v in op.outputs:
                category[v] = explicit or value_category(v, op, roles, grad_names)
                size[v] = 0 if v.name in in_place else v.type.size_bytes
                users_left[v] = 0
        rep = self._rep
        streams: Dict[Tuple[int, str], List[Op]] = {}
        compute_ops: List[Op] = []
        for op in f.ops:
            for v in op.inputs:
                n = users_left.get(v)
                if n is None:  # read but defined nowhere: it would never come
                    raise SimulationError(f"op %{op.name} ({op.op_type}) reads %{v.name}, which "
                                          "no op or input of the program defines")
                users_left[v] = n + 1
            if op.op_type.startswith(COMM_PREFIX):
                self._collectives[id(op)] = _Collective(
                    self.env, op, any(rep.get(r, r) == r for r in op.attrs["ranks"]))
                for r in members(op):
                    if rep.get(r, r) == r:
                        streams.setdefault((r, COMM_STREAM), []).append(op)
            else:
                dev = op.outputs[0].type.device if op.outputs else op.inputs[0].type.device
                if rep.get(dev, dev) == dev:
                    streams.setdefault((dev, COMPUTE_STREAM), []).append(op)
                    compute_ops.append(op)
        self._stream_ops, self._compute_ops = streams, compute_ops
        if self._rep:
            positions = comm_positions(f)
            for head, group in class_members(self._rep).items():
                self._followers[head] = [(m, [self._collectives[id(op)]
                                              for op in positions.get(m, [])])
                                         for m in group[1:]]

    def run(self) -> Trace:
        with gc_paused():
            return self._run()

    def _run(self) -> Trace:
        self._prepare()
        costs = self._op_costs()
        for v in self.function.inputs:
            self.memory.allocate(v.type.device, self._size[v], self._category[v], 0.0)
        self._publish(self.function.inputs, 0.0)
        for (rank, stream), ops in sorted(self._streams().items()):
            if stream == COMPUTE_STREAM:
                self.env.process(self._compute_stream(rank, ops, costs))
            else:
                self.env.process(self._comm_stream(rank, ops))
        self._run_events()
        if self._blocked:
            raise SimulationError(self._deadlock_report())
        if self._rep:
            self._expand_symmetry()
        self.memory.finish()
        return self._trace()

    def _expand_symmetry(self) -> None:
        """Give every follower its representative's records and memory."""
        members = class_members(self._rep)
        records = [r for r in self.records if self._simulated(r.rank)]
        copies = []
        make = tuple.__new__  # NamedTuple._replace is slow for millions of records
        for rec in records:
            rest = rec[1:]
            for m in members[rec.rank][1:]:
                copies.append(make(OpRecord, (m,) + rest))
        self.records = records + copies
        events = [e for e in self.memory.events if self._simulated(e[3])]
        extra = []
        for (time_s, kind, seq, rank, nbytes, cat) in events:
            for m in members[rank][1:]:
                extra.append((time_s, kind, seq, m, nbytes, cat))
        self.memory.events = events + extra

    def _run_events(self) -> None:
        """``env.run()`` under the liveness bounds of the options."""
        opts = self.options
        stall, most, wall = opts.stall_events, opts.max_events, opts.max_wall_s
        for name, bound in (("stall_events", stall), ("max_events", most),
                            ("max_wall_s", wall)):
            if bound is not None and (isinstance(bound, bool) or
                                      not isinstance(bound, (int, float)) or bound < 0):
                raise SimulationError(f"SimulationOptions.{name}: must be a non-negative "
                                      f"number or None, got {bound!r}")
        env = self.env
        step = env.step
        records = self.records
        deadline = None if wall is None else time.monotonic() + wall
        n = 0
        progress_at, seen = 0, len(records)  # event count at the last op finished
        try:
            while True:
                step()
                n += 1
                if stall is not None:
                    if len(records) != seen:
                        seen, progress_at = len(records), n
                    elif n - progress_at >= stall:
                        raise SimulationError(self._deadlock_report(
                            f"no progress for {stall} events (stall_events)"))
                if most is not None and n >= most:
                    raise SimulationError(self._deadlock_report(
                        f"event budget of {most} events spent (max_events)"))
                if deadline is not None and not n & 255 and time.monotonic() > deadline:
                    raise SimulationError(self._deadlock_report(
                        f"wall-clock budget of {wall:g} s spent (max_wall_s)"))
        except simpy.core.EmptySchedule:
            pass

    def _deadlock_report(self, reason: Optional[str] = None) -> str:
        parts = []
        for (rank, stream), (op, value) in sorted(self._blocked.items()):
            if value is not None:
                why = f"waiting for input %{value.name}"
            else:
                coll = self._collectives[id(op)]
                missing = [r for r in coll.members if r not in coll.arrivals]
                why = (f"waiting for ranks {missing} to reach it" if missing
                       else "in flight (every member has reached it)")
            parts.append(f"device {rank} {stream}: %{op.name} ({op.op_type}) {why}")
        # compute streams run ahead of the clock: report the latest time reached
        reached = max([self.env.now] + [r.end_s for r in self.records])
        head = "deadlock" if reason is None else f"stopped ({reason})"
        return (f"{head} at t={reached:.6g} s: {len(self._blocked)} stream(s) blocked: "
                + "; ".join(parts))

    def _trace(self) -> Trace:
        spec = self.topology.device_spec
        used = self._used_devices  # every value's device (see _check_devices)
        devices = [DeviceInfo(r, self.topology.device_node(r), int(spec.memory_bytes))
                   for r in self.topology.ranks if r in used]
        # (start_s, rank, stream, end_s), as a C-level key
        records = sorted(self.records, key=itemgetter(5, 0, 1, 6))
        end = max([self.env.now] + [r.end_s for r in records])
        peaks = {r: dict(sorted(c.items())) for r, c in sorted(self.memory.peak_by_category.items())}
        return Trace(devices=devices, ops=records, memory=self.memory.samples,
                     links=self.network.link_records(),
                     link_samples=self.network.link_samples(), step_time_s=float(end),
                     meta={"peak_memory_by_category": peaks,
                           # a reduced program: how many devices each simulated one stands for
                           "represents": dict(self.function.meta.get("represents", {})),
                           "network_mode": self.options.network_mode,
                           "simulated_devices": len(set(self._rep.values())) if self._rep
                           else len(devices)})


def simulate_function(function: Function, topology, cost_model: Optional[CostModel] = None,
                      options: Optional[SimulationOptions] = None) -> Trace:
    """Simulate one run of ``function`` (local view) on ``topology``."""
    return Simulator(function, topology, cost_model, options).run()
