"""The discrete-event simulator: a local-view program on a topology.

Each device has two streams, ``compute`` and ``comm`` (like a CUDA stream
and an NCCL stream); each stream is a SimPy process that takes its ops in
program order. An op starts when its stream is free and its inputs on that
device are ready. A communication op is on the ``comm`` stream of every
rank of its team; the collective starts when every member has reached it
and its inputs are ready, and runs as point-to-point flows on the network
(:mod:`.collectives`, :mod:`.network`). Compute time comes from the cost
model. Memory is tracked per device (:mod:`.memory`).

A program that cannot finish ends with a :class:`SimulationError` that lists
every blocked op per device.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Set, Tuple

import simpy

from ..cost.model import CostModel
from ..errors import SimulationError, TopologyError
from ..ir.comm import CollectiveType, collective_of, io_ranks, is_communication
from ..ir.core import Function, Op, Value
from .collectives import bytes_sent_per_rank, run_collective
from .memory import MemoryTracker
from .network import Network
from .trace import COMM_STREAM, COMPUTE_STREAM, DeviceInfo, OpRecord, Trace

# Memory category of a function input, by its role in ``meta["roles"]``.
INPUT_CATEGORY = {"param": "weights", "data": "activations", "optimizer": "optimizer",
                  "master": "optimizer"}
# Input roles that stay resident for the whole step (never freed).
RESIDENT_ROLES = frozenset({"param", "optimizer", "master"})


@dataclass
class SimulationOptions:
    """``network_mode``: "flow" (max-min fair sharing) or "analytical";
    ``collective_algorithm``: "auto" or an algorithm name;
    ``record_memory``: keep the memory curve (peaks are always kept)."""

    network_mode: str = "flow"
    collective_algorithm: str = "auto"
    record_memory: bool = True


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

    __slots__ = ("op", "members", "arrived", "done", "start_s", "algorithm")

    def __init__(self, env: simpy.Environment, op: Op, members: Tuple[int, ...]) -> None:
        self.op = op
        self.members = members
        self.arrived: Set[int] = set()
        self.done = env.event()
        self.start_s = 0.0
        self.algorithm = ""


class Simulator:
    """Owns the SimPy environment of one run. Use :func:`simulate_function`."""

    def __init__(self, function: Function, topology, cost_model: Optional[CostModel] = None,
                 options: Optional[SimulationOptions] = None) -> None:
        self.function = function
        self.topology = topology
        self.cost = cost_model or CostModel(topology.device_spec)
        self.options = options or SimulationOptions()
        self.env = simpy.Environment()
        self.network = Network(self.env, topology, mode=self.options.network_mode)
        self.memory = MemoryTracker(self.options.record_memory)
        self.records: List[OpRecord] = []
        self._ready: Dict[Value, simpy.Event] = {}
        self._users_left: Dict[Value, int] = {}
        self._category: Dict[Value, str] = {}
        self._size: Dict[Value, int] = {}
        # Returned values and resident inputs (weights, optimizer state) are
        # never freed.
        self._outputs = set(function.outputs)
        self._collectives: Dict[int, _Collective] = {}
        self._position: Dict[Tuple[int, str], Optional[Op]] = {}
        self._check_devices()

    # -- setup ----------------------------------------------------------
    def _check_devices(self) -> None:
        known = set(self.topology.ranks)
        for v in self.function.values():
            dev = getattr(v.type, "device", None)
            if dev is None:
                raise SimulationError(f"value %{v.name} has no device: the simulator needs a "
                                      "local-view program with every value placed")
            if dev not in known:
                raise TopologyError(f"value %{v.name} is on device {dev}, but topology "
                                    f"'{self.topology.name}' has devices 0..{len(known) - 1}")
        for op in self.function.ops:
            if is_communication(op):
                for r in op.attrs["ranks"]:
                    if r not in known:
                        raise TopologyError(f"op %{op.name} ({op.op_type}): team rank {r} is not a "
                                            f"device of topology '{self.topology.name}'")

    def _streams(self) -> Dict[Tuple[int, str], List[Op]]:
        streams: Dict[Tuple[int, str], List[Op]] = {}
        for op in self.function.ops:
            if is_communication(op):
                for r in op.attrs["ranks"]:
                    streams.setdefault((r, COMM_STREAM), []).append(op)
            else:
                dev = op.outputs[0].type.device if op.outputs else op.inputs[0].type.device
                streams.setdefault((dev, COMPUTE_STREAM), []).append(op)
        return streams

    # -- value bookkeeping ---------------------------------------------
    def _event(self, v: Value) -> simpy.Event:
        ev = self._ready.get(v)
        if ev is None:
            ev = self._ready[v] = self.env.event()
        return ev

    def _produce(self, values: Sequence[Value]) -> None:
        now = self.env.now
        for v in values:
            self.memory.allocate(v.type.device, self._size[v], self._category[v], now)

    def _publish(self, values: Sequence[Value]) -> None:
        for v in values:
            ev = self._event(v)
            if not ev.triggered:
                ev.succeed()
            if self._users_left.get(v, 0) == 0 and v not in self._outputs:
                self._release(v)

    def _consume(self, values: Sequence[Value]) -> None:
        for v in values:
            left = self._users_left[v] - 1
            self._users_left[v] = left
            if left == 0 and v not in self._outputs:
                self._release(v)

    def _release(self, v: Value) -> None:
        self.memory.free(v.type.device, self._size[v], self._category[v], self.env.now)

    # -- processes ------------------------------------------------------
    def _stream(self, rank: int, stream: str, ops: List[Op]):
        env = self.env
        key = (rank, stream)
        for op in ops:
            self._position[key] = op
            if stream == COMPUTE_STREAM:
                pending = [self._event(v) for v in op.inputs if not self._event(v).triggered]
                if pending:
                    yield pending[0] if len(pending) == 1 else env.all_of(pending)
                cost = self.cost.op_cost(op)
                start = env.now
                self._produce(op.outputs)
                if cost.time_s > 0:
                    yield env.timeout(cost.time_s)
                self.records.append(OpRecord(rank, stream, op.name, op.op_type, "compute",
                                             start, env.now, cost.flops, cost.bytes,
                                             op.meta.get("detail", "")))
                self._publish(op.outputs)
                self._consume(op.inputs)
            else:
                own = [self._event(v) for v in op.inputs
                       if v.type.device == rank and not self._event(v).triggered]
                if own:
                    yield own[0] if len(own) == 1 else env.all_of(own)
                coll = self._collectives[id(op)]
                coll.arrived.add(rank)
                if len(coll.arrived) == len(coll.members):
                    env.process(self._run_collective(coll))
                yield coll.done
        self._position[key] = None

    def _run_collective(self, coll: _Collective):
        env = self.env
        op = coll.op
        kind = collective_of(op)
        ranks = tuple(op.attrs["ranks"])
        root = op.attrs.get("root")
        if kind is CollectiveType.SEND_RECV:
            root = ranks[0]
        nbytes = collective_bytes(op)
        coll.start_s = env.now
        self._produce(op.outputs)
        algorithm = op.attrs.get("algorithm") or self.options.collective_algorithm
        used = yield env.process(run_collective(env, self.network, kind, ranks, nbytes,
                                                root=root, algorithm=algorithm))
        coll.algorithm = str(used or algorithm)
        sent = bytes_sent_per_rank(kind, len(ranks), nbytes, coll.algorithm)
        for r in coll.members:
            self.records.append(OpRecord(r, COMM_STREAM, op.name, op.op_type, "communication",
                                         coll.start_s, env.now, 0.0, float(sent), coll.algorithm))
        self._publish(op.outputs)
        self._consume(op.inputs)
        coll.done.succeed()

    # -- run ------------------------------------------------------------
    def run(self) -> Trace:
        f = self.function
        roles = f.meta.get("roles", {})
        grad_names = set(f.meta.get("grads", {}).values())
        # Optimizer updates overwrite their parameter in place: no new bytes.
        in_place = set(f.meta.get("updates", {}).values())
        producers = f.producers()
        for v in f.values():
            self._category[v] = value_category(v, producers.get(v), roles, grad_names)
            self._size[v] = 0 if v.name in in_place else v.type.size_bytes
            self._users_left[v] = 0
        for v in f.inputs:
            if roles.get(v.name) in RESIDENT_ROLES:
                self._outputs.add(v)
        for op in f.ops:
            for v in op.inputs:
                self._users_left[v] += 1
            if is_communication(op):
                kind = collective_of(op)
                ranks = tuple(op.attrs["ranks"])
                self._collectives[id(op)] = _Collective(self.env, op, ranks)
        for v in f.inputs:
            self.memory.allocate(v.type.device, self._size[v], self._category[v], 0.0)
        for v in f.inputs:
            self._publish([v])
        procs = []
        for (rank, stream), ops in sorted(self._streams().items()):
            self._position[(rank, stream)] = ops[0] if ops else None
            procs.append(self.env.process(self._stream(rank, stream, ops)))
        self.env.run()
        blocked = {k: op for k, op in self._position.items() if op is not None}
        if blocked:
            raise SimulationError(self._deadlock_report(blocked))
        return self._trace()

    def _deadlock_report(self, blocked: Dict[Tuple[int, str], Op]) -> str:
        parts = []
        for (rank, stream), op in sorted(blocked.items()):
            why = ""
            if is_communication(op):
                coll = self._collectives[id(op)]
                missing = [r for r in coll.members if r not in coll.arrived]
                if missing:
                    why = f"waiting for ranks {missing} to reach it"
            if not why:
                missing_in = [v.name for v in op.inputs if not self._event(v).triggered
                              and (stream == COMPUTE_STREAM or v.type.device == rank)]
                why = "waiting for inputs " + ", ".join("%" + n for n in missing_in)
            parts.append(f"device {rank} {stream}: %{op.name} ({op.op_type}) {why}")
        return (f"deadlock at t={self.env.now:.6g} s: {len(blocked)} stream(s) blocked: "
                + "; ".join(parts))

    def _trace(self) -> Trace:
        spec = self.topology.device_spec
        devices = [DeviceInfo(r, self.topology.device_node(r), int(spec.memory_bytes))
                   for r in self.topology.ranks]
        used = set(self.function.devices())
        devices = [d for d in devices if d.rank in used]
        records = sorted(self.records, key=lambda r: (r.start_s, r.rank, r.stream, r.end_s))
        return Trace(devices=devices, ops=records, memory=self.memory.samples,
                     links=self.network.link_records(), step_time_s=float(self.env.now),
                     meta={"peak_memory_by_category": {r: dict(c) for r, c in
                                                       sorted(self.memory.peak_by_category.items())},
                           "network_mode": self.options.network_mode})


def simulate_function(function: Function, topology, cost_model: Optional[CostModel] = None,
                      options: Optional[SimulationOptions] = None) -> Trace:
    """Simulate one run of ``function`` (local view) on ``topology``."""
    return Simulator(function, topology, cost_model, options).run()
