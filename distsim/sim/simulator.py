"""The discrete-event simulator: a local-view program on a topology.

Each device has a ``compute`` stream (like a CUDA stream) and queues for
its communication ops (:mod:`.comm_queues`): one per process group for the
collectives, as NCCL runs each communicator on a stream of its own (or one
``comm`` stream for all, under ``comm_streams: shared``), and one per peer
for point-to-point transfers (SendRecv); each is a SimPy process that takes
its ops in program order. An op starts when its stream is free and its
inputs on that device are ready. A collective is on the queue of its group
on every rank of its team; the collective starts when every member has
reached it and its inputs are ready, and runs as point-to-point flows on
the network (:mod:`.collectives`, :mod:`.network`), where collectives of
different groups share links. Separate queues matter because the order of
the transfers is the lowering's estimate of the time line and the real
times differ: one queue for everything would make a tensor-parallel
all-reduce wait for a data-parallel one issued before it, or a collective
for a pipeline receive whose sender is late, delays the hardware does not
have. Compute time comes from the cost model. Memory is logged per device
(:mod:`.memory`).

Speed: compute ops share no resource but their stream, so a stream does not
wait on the simulation clock for them. It schedules its ops as soon as the
ready times of their inputs are *known* (start = max(stream free, inputs
ready)), running ahead of the clock, and blocks only on a value whose ready
time is not known yet (the output of a collective in flight). Collectives,
which share the network, wait for the clock to reach their start time, so
the network sees flows in time order. Every op scheduled while the clock is
at T starts at or after T, so this gives exactly the times an op-by-op
simulation would. The stream works in *blocks* (:mod:`.program_index`): the
ops between two reads of a value from outside the stream run back to back,
so their times are prefix sums of their durations, filled in with numpy
after the run, as are the records and the memory curve (:mod:`.memory`).
The Python work of the event loop is per block and per collective, not per op.

Under ``launch: blocking`` (``CUDA_LAUNCH_BLOCKING=1``) a device's host
waits for each launch to finish before the next: the streams stay, and
launch tokens (:mod:`.launch_queue`) make each launch wait for the one
before it on its device. Under ``comm_order: stream`` the same tokens make
each communication op wait for the compute op issued before it on its
device, as PyTorch's ProcessGroupNCCL does, and under ``p2p: synchronous``
or ``separate`` what a device issues after a group of pipeline transfers
wait for them, as Megatron-LM's and DeepSpeed's pipeline engines do.

A program that cannot finish ends with a :class:`SimulationError` that lists
every blocked op per device (:mod:`.liveness`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import accumulate
from types import MappingProxyType
from typing import Dict, List, Mapping, Optional, Tuple

import numpy as np
import simpy

from ..cost.model import CostModel
from ..errors import DistsimError, SimulationError
from ..ir.comm import CollectiveType, collective_of
from ..ir.core import Function, Op, Value, gc_paused
from ..ir.occupancy import occupied_bytes
from ..ir.value_table import ValueTable
from .collectives import bytes_sent_by, resolve_algorithm, run_collective
from .comm_queues import DEFAULT_COMM_STREAMS, check_comm_streams, comm_queues
from .launch_queue import (DEFAULT_COMM_ORDER, DEFAULT_LAUNCH, DEFAULT_P2P, Leads,
                           check_comm_order, check_launch, check_p2p, leads_by_rank, op_times,
                           serialise_launches)
from .liveness import PREVIOUS_LAUNCH, blocked_report, run_events
from .memory import MemoryAccounting
from .network import Network
from .program_index import (INPUT_CATEGORY, RESIDENT_ROLES, ComputeStream,
                            ProgramIndex, device_of, index_program, value_category)
from .records import expand_to_followers, op_columns
from .solo import SoloLedger, solo_teams, team_key
from .step_memory import memory_to_followers, run_memory
from .symmetry import class_members, comm_positions, symmetry_classes
from .trace import COMM_STREAM, COMPUTE_STREAM, DeviceInfo, OpColumns, Trace

__all__ = ["INPUT_CATEGORY", "RESIDENT_ROLES", "SimulationOptions", "Simulator",
           "collective_bytes", "simulate_function", "value_category"]

@dataclass
class SimulationOptions:
    """``network_mode``: "flow" (max-min fair sharing) or "analytical";
    ``collective_algorithm``: "auto" or an algorithm name;
    ``comm_streams``: "per-group" (a queue per process group, as NCCL
    communicators run) or "shared" (one ``comm`` stream per device for
    every collective), see :mod:`.comm_queues`;
    ``launch``: "async" (the host issues kernels ahead of the device) or
    "blocking" (each launch waits for its kernel to finish, as under
    ``CUDA_LAUNCH_BLOCKING=1``: a device's streams never overlap), see
    :mod:`.launch_queue`;
    ``comm_order``: "inputs" (a communication op starts once its inputs
    are ready) or "stream" (and no earlier than the end of the compute op
    issued before it on its device, as PyTorch's ProcessGroupNCCL orders
    streams), see :mod:`.launch_queue`;
    ``p2p``: how the training engine issues pipeline transfers: "async"
    (grouped, the host goes on), "synchronous" (grouped, what comes next
    waits for the group, as after Megatron-LM's ``torch.cuda.synchronize()``)
    or "separate" (each its own group, as DeepSpeed's calls), see
    :mod:`.launch_queue`;
    ``record_memory``: keep the memory curve (peaks are always kept);
    ``record_links``: keep each link's utilisation over time
    (``Trace.link_samples``, for links.png and trace.json's link counters;
    off by default: the samples cost memory on big runs, so sweeps and
    benchmarks leave it off; ``distsim simulate`` turns it on);
    ``symmetry``: simulate one representative per class of equivalent
    devices (see :mod:`.symmetry`) and copy its results to the others;
    ``solo``: collectives whose team shares no link with another team's run
    without events (see :mod:`.solo`; False runs every collective through
    the network, the reference the tests compare with).

    Liveness bounds: a run that cannot finish stops with a
    :class:`SimulationError` listing every blocked op per device, either
    when no event is left (a deadlock, always detected) or when one of
    these bounds is passed: ``stall_events``: that many SimPy events in a
    row without an op finishing (None: no bound); ``max_events``: events
    in all; ``max_wall_s``: wall-clock seconds of the event loop (checked
    at the first event and every 256 events after)."""

    network_mode: str = "flow"
    collective_algorithm: str = "auto"
    comm_streams: str = DEFAULT_COMM_STREAMS
    launch: str = DEFAULT_LAUNCH
    comm_order: str = DEFAULT_COMM_ORDER
    p2p: str = DEFAULT_P2P
    record_memory: bool = True
    record_links: bool = False
    symmetry: bool = False
    solo: bool = True
    stall_events: Optional[int] = 10_000_000
    max_events: Optional[int] = None
    max_wall_s: Optional[float] = None


_KINDS = {kind.op_type: kind for kind in CollectiveType}


def collective_bytes(op: Op, kind: Optional[CollectiveType] = None) -> int:
    """The message size S a collective algorithm is given (see
    :func:`distsim.sim.collectives.run_collective`): a share
    ``meta["occupancy"]`` of it when only that share holds data (a dropless
    mixture-of-experts dispatch's padded slots, :mod:`distsim.models.moe`)."""
    kind = kind or _KINDS.get(op.op_type) or collective_of(op)
    v = op.outputs[0] if kind in (CollectiveType.ALL_GATHER, CollectiveType.GATHER) \
        else op.inputs[0]
    return occupied_bytes(v.type.size_bytes, op)


#: a collective's bytes sent before it has run (one shared, read-only map)
_NOTHING_SENT: Mapping[int, float] = MappingProxyType({})


class _Collective:
    """Rendezvous of the team members of one communication op."""

    __slots__ = ("index", "op", "members", "arrivals", "done", "simulated", "started",
                 "finished", "start_s", "end_s", "plan", "solo", "sent", "used")

    def __init__(self, index: int, op: Op, simulated: bool, members: Tuple[int, ...]) -> None:
        self.index = index
        self.op = op
        self.members = members          # ir.comm.members(op)
        self.arrivals: Dict[int, float] = {}
        # made when a member first waits for it: most collectives of a
        # reduced program run alone and have ended by the time their last
        # member arrives, so nobody waits (see Simulator._comm_stream)
        self.done: Optional[simpy.Event] = None
        self.simulated = simulated
        self.started = False
        self.finished = False
        self.start_s = math.nan
        self.end_s = -math.inf
        self.plan: Optional[tuple] = None   # see Simulator._collective_plan
        self.solo = False                   # runs alone: no events (see .solo)
        #: once finished: the bytes each member put on the network
        self.sent: Mapping[int, float] = _NOTHING_SENT
        self.used = ""                      # once finished: the algorithm that ran


class Simulator:
    """Owns the SimPy environment of one run. Use :func:`simulate_function`."""

    def __init__(self, function: Function, topology, cost_model: Optional[CostModel] = None,
                 options: Optional[SimulationOptions] = None,
                 values: Optional[ValueTable] = None) -> None:
        self.function = function
        self._values = values
        self.topology = topology
        self.cost = cost_model or CostModel(topology.device_spec)
        self.options = options or SimulationOptions()
        check_comm_streams(self.options.comm_streams)
        self._blocking = check_launch(self.options.launch) == "blocking"
        self._stream_order = check_comm_order(self.options.comm_order) == "stream"
        self._p2p = check_p2p(self.options.p2p)
        #: under blocking launches or a p2p that waits, collective c's launch
        #: token is this + c (:func:`.launch_queue.serialise_launches`); -1 otherwise
        self._coll_token = -1
        self._waits: Dict[int, Optional[np.ndarray]] = {}   # see launch_queue.op_times
        self.env = simpy.Environment()
        self.network = Network(self.env, topology, mode=self.options.network_mode,
                               record_samples=self.options.record_links)
        self.index: Optional[ProgramIndex] = None
        self._ready: List[Optional[float]] = []         # value number -> ready time, once known
        self._waiters: Dict[int, List[simpy.Event]] = {}
        self._collectives: List[_Collective] = []
        self._blocked: Dict[Tuple[int, str], Tuple[Op, Optional[Value], Optional[_Collective]]] = {}
        self._block_starts: Dict[int, List[float]] = {}   # rank -> start time of each block
        self._reached = 0.0       # the latest time a compute stream has scheduled to
        self._progress = 0        # blocks and collectives finished (for stall_events)
        self._finished: List[_Collective] = []   # in the order they finished (their records)
        self._plans: Dict[tuple, tuple] = {}    # see _collective_plan
        self._sent: Dict[tuple, Dict[int, float]] = {}   # (plan, algorithm) -> bytes per rank
        self._solo = SoloLedger(topology, self.options.network_mode, self.options.record_links)
        # Symmetry: representative of each rank, and for each representative
        # the collectives its followers reach at each comm-stream position.
        self._rep: Dict[int, int] = {}
        self._followers: Dict[int, List[Tuple[int, List[_Collective]]]] = {}

    # -- setup ----------------------------------------------------------
    def _check_devices(self) -> None:
        """Device errors before the symmetry analysis reads devices (the
        index checks them too, for runs without symmetry)."""
        known = set(self.topology.ranks)
        seen = set()
        for v in self.function.values():
            if id(v.type) not in seen:
                seen.add(id(v.type))
                device_of(v, known, self.topology)

    def _simulated(self, rank: int) -> bool:
        return self._rep.get(rank, rank) == rank

    def _prepare(self) -> ProgramIndex:
        f = self.function
        if self.options.symmetry:
            self._check_devices()
            self._rep = symmetry_classes(f, self.topology.node_of)
        rep = self._rep
        ix = self.index = index_program(f, self.topology, self.cost,
                                        self._simulated if rep else (lambda r: True),
                                        self._values)
        self._values = None
        numbers = len(ix.values)
        if self._blocking or self._stream_order or self._p2p != DEFAULT_P2P:
            first, numbers, self._waits = serialise_launches(
                ix, self.cost, self._blocking, self._stream_order, self._p2p)
            if self._blocking or self._p2p != DEFAULT_P2P:
                self._coll_token = first
        self._ready = [None] * numbers
        for n in range(len(f.inputs)):       # function inputs are numbered first
            self._ready[n] = 0.0
        # what a collective's kind decides, once per kind (see program_index)
        simulated = [any(rep.get(r, r) == r for r in op.attrs["ranks"])
                     for op in ix.collective_kinds]
        members = ix.kind_members
        self._collectives = [
            _Collective(c, op, simulated[k], members[k])
            for c, (op, k) in enumerate(zip(ix.collectives, ix.collective_kind.tolist()))]
        self._find_solo()
        if rep:
            index_of = {id(op): c for c, op in enumerate(ix.collectives)}
            positions = comm_positions(f)
            for head, group in class_members(rep).items():
                self._followers[head] = [(m, [self._collectives[index_of[id(op)]]
                                              for op in positions.get(m, [])])
                                         for m in group[1:]]
        return ix

    def _find_solo(self) -> None:
        """Mark the collectives whose team shares no link with another
        team's (:mod:`.solo`): they run without events."""
        if not self.options.solo:
            return
        plans = self._collective_plans()
        try:
            teams = solo_teams(self.network, plans)
        except DistsimError:       # a bad team: every collective takes the full path
            return
        alone = {id(p): team_key(p) in teams for p in plans}
        for coll in self._collectives:
            if coll.plan is not None:
                coll.solo = alone[id(coll.plan)]

    def _collective_plans(self) -> List[tuple]:
        """Give every simulated collective its plan (see
        :meth:`_collective_plan`; None where that is an error, reported if
        and when the collective runs) and return the distinct plans. A plan
        depends on the collective's kind and bytes only: it is worked out
        once per distinct (kind, bytes), on one collective of each."""
        ix = self.index
        colls = self._collectives
        gathers = np.array([_KINDS.get(op.op_type) in (CollectiveType.ALL_GATHER,
                                                       CollectiveType.GATHER)
                            for op in ix.collective_kinds], bool)
        kind = ix.collective_kind
        nbytes = np.where(gathers[kind] if len(kind) else np.zeros(0, bool),
                          ix.collective_result_bytes, ix.collective_operand_bytes)
        simulated = [c for c, coll in enumerate(colls) if coll.simulated]
        which: Dict[tuple, Optional[tuple]] = {}
        for c, key in zip(simulated, zip(kind[simulated].tolist(),
                                         nbytes[simulated].tolist())):
            if key not in which:
                try:
                    which[key] = self._collective_plan(colls[c].op)
                except DistsimError:
                    which[key] = None
            colls[c].plan = which[key]
        return list({id(p): p for p in which.values() if p is not None}.values())

    # -- processes ------------------------------------------------------
    def _wait_known(self, key: Tuple[int, str], op: Op, n: int) -> simpy.Event:
        ev = self.env.event()
        self._waiters.setdefault(n, []).append(ev)
        values = self.index.values
        # past the values: a launch token (blocking launches)
        self._blocked[key] = (op, values[n] if n < len(values) else PREVIOUS_LAUNCH, None)
        return ev

    def _compute_stream(self, stream: ComputeStream, prefix: List[float],
                        leads: Optional[Leads] = None):
        """The hot loop (once per block): wait for the block's operands from
        outside the stream, then its ops run back to back; announce the
        values other streams read. ``prefix[q]`` is the summed duration of
        the stream's first q ops; ``leads``, the host's launch queue
        (:mod:`.launch_queue`; None: kernels issued at once)."""
        lead = leads[0] if leads is not None else None
        rank = stream.rank
        key = (rank, COMPUTE_STREAM)
        ready = self._ready
        waiters = self._waiters
        blocks = stream.block_starts
        exports = stream.exports
        starts = self._block_starts[rank] = []
        n_ops = len(stream.ops)
        n_blocks = len(blocks)
        n_exports = len(exports)
        e = 0
        t = 0.0
        for b in range(n_blocks):
            pos, outside = blocks[b]
            s = t
            for n in outside:
                r = ready[n]
                if r is None:
                    yield self._wait_known(key, self.index.compute[stream.ops[pos]], n)
                    r = ready[n]
                if r > s:
                    s = r
            starts.append(s)
            nxt = blocks[b + 1][0] if b + 1 < n_blocks else n_ops
            base = prefix[pos]
            while e < n_exports and exports[e][0] < nxt:
                q, n = exports[e]
                if lead is None:
                    ready[n] = s + (prefix[q + 1] - base)
                else:
                    ready[n] = prefix[q + 1] + max(s - base, lead[q])
                if n in waiters:
                    for ev in waiters.pop(n):
                        ev.succeed()
                e += 1
            if lead is None:
                t = s + (prefix[nxt] - base)
            else:
                t = prefix[nxt] + max(s - base, lead[nxt - 1])
            if t > self._reached:
                self._reached = t
            self._progress += 1
        self._blocked.pop(key, None)

    def _arrive(self, coll: _Collective, rank: int, time_s: float) -> None:
        coll.arrivals[rank] = time_s
        if coll.simulated and not coll.started and len(coll.arrivals) == len(coll.members):
            coll.started = True
            if coll.solo:   # no events: it ends its solo duration after the last arrival
                start = max(coll.arrivals.values())
                run = self._solo.run(coll.plan)
                self._complete(coll, start, start + run.duration_s, run.algorithm)
                if self.network.record_samples:
                    self._solo.sample(self.network, coll.plan, start)
            else:
                self.env.process(self._run_collective(coll))

    def _comm_stream(self, rank: int, indices: List[int], inputs: List[Tuple[int, ...]],
                     positions: Optional[List[int]] = None, stream: str = COMM_STREAM):
        """A rank's communication stream (or one of its point-to-point
        queues, named ``stream``): each collective in turn, reached when the
        previous one has ended and the rank's own operands of it
        (``inputs``, aligned with ``indices``) are ready. ``positions``: the
        positions in ``indices`` this queue takes, in order (None: all)."""
        key = (rank, stream)
        ready = self._ready
        followers = self._followers.get(rank)
        collectives = self._collectives
        # blocking launches: the host's launch time after the previous launch
        h = self.cost.device.host_launch_s if self._blocking else 0.0
        t = 0.0
        for k in range(len(indices)) if positions is None else positions:
            c, own = indices[k], inputs[k]
            coll = collectives[c]
            arrival = t
            for n in own:
                r = ready[n]
                if r is None:
                    yield self._wait_known(key, coll.op, n)
                    r = ready[n]
                if r > arrival:
                    arrival = r
            arrival += h
            if followers:
                # followers reach their k-th collective when this rank does
                for follower_rank, colls in followers:
                    self._arrive(colls[k], follower_rank, arrival)
            self._arrive(coll, rank, arrival)
            if not coll.finished:
                self._blocked[key] = (coll.op, None, coll)
                if coll.done is None:
                    coll.done = self.env.event()
                yield coll.done
            t = coll.end_s
        self._blocked.pop(key, None)

    def _collective_plan(self, op: Op) -> tuple:
        """(kind, team, root, bytes, algorithm) of a collective op, computed
        once per distinct (op type, team, root, bytes, algorithm)."""
        attrs = op.attrs
        ranks = attrs["ranks"]  # the whole team loads the network
        kind = _KINDS.get(op.op_type) or collective_of(op)
        nbytes = collective_bytes(op, kind)
        key = (kind, ranks, attrs.get("root"), nbytes, attrs.get("algorithm"))
        plan = self._plans.get(key)
        if plan is None:
            ranks = tuple(ranks)
            root = ranks[0] if kind is CollectiveType.SEND_RECV else attrs.get("root")
            algorithm = attrs.get("algorithm") or resolve_algorithm(
                kind, self.options.collective_algorithm, per_run=True)
            plan = self._plans[key] = (kind, ranks, root, nbytes, algorithm)
        return plan

    def _run_collective(self, coll: _Collective):
        env = self.env
        op = coll.op
        start = max(coll.arrivals.values())
        if start > env.now:
            yield env.timeout(start - env.now)
        if coll.plan is None:
            coll.plan = self._collective_plan(op)
        kind, ranks, root, nbytes, algorithm = coll.plan
        # the collective's steps run inside this process (no process of its own)
        used = yield from run_collective(env, self.network, kind, ranks, nbytes,
                                         root=root, algorithm=algorithm)
        self._complete(coll, start, env.now, str(used or algorithm))

    def _complete(self, coll: _Collective, start: float, end: float, used: str) -> None:
        """The collective ran from ``start`` to ``end``: keep it for the
        records (one per member, made after the run: :mod:`.records`),
        announce its outputs, wake the members waiting for it."""
        plan = coll.plan   # set by _find_solo or _run_collective
        coll.start_s, coll.end_s = start, end
        sent = self._sent.get((plan, used))
        if sent is None:
            kind, ranks, root, nbytes, _ = plan
            sent = self._sent[(plan, used)] = bytes_sent_by(kind, ranks, nbytes, root, used)
        coll.sent, coll.used = sent, used
        self._finished.append(coll)
        ready, waiters = self._ready, self._waiters
        outputs = self.index.collective_outputs[coll.index]
        if self._coll_token >= 0:     # its launch token
            outputs = (*outputs, self._coll_token + coll.index)
        for n in outputs:
            ready[n] = end
            if n in waiters:
                for ev in waiters.pop(n):
                    ev.succeed()
        self._progress += 1
        coll.finished = True
        if coll.done is not None:
            coll.done.succeed()

    # -- run ------------------------------------------------------------
    def run(self) -> Trace:
        with gc_paused():
            return self._run()

    def _run(self) -> Trace:
        ix = self._prepare()
        prefixes = {rank: list(accumulate(stream.durations, initial=0.0))
                    for rank, stream in ix.compute_streams.items()}
        leads = ({rank: None for rank in ix.compute_streams} if self._blocking
                 else leads_by_rank(ix, prefixes, self.cost))
        streams = [(rank, COMPUTE_STREAM) for rank in ix.compute_streams]
        streams += [(rank, COMM_STREAM) for rank in ix.comm_streams]
        for rank, kind in sorted(streams):
            if kind == COMPUTE_STREAM:
                self.env.process(self._compute_stream(ix.compute_streams[rank], prefixes[rank],
                                                      leads[rank]))
            else:
                indices, inputs = ix.comm_streams[rank], ix.comm_inputs[rank]
                kinds = ix.collective_kind[np.asarray(indices, dtype=np.int64)]
                for stream, positions in comm_queues(rank, kinds, ix.collective_kinds,
                                                     self.options.comm_streams):
                    self.env.process(self._comm_stream(rank, indices, inputs, positions, stream))
        self._run_events()
        if self._blocked:
            raise SimulationError(self._deadlock_report())
        start_s, end_s = self._compute_times(prefixes, leads, self._waits)
        records = self._records(start_s, end_s)
        memory = self._memory(start_s, end_s)
        if self._rep:
            records, memory = self._expand_symmetry(records, memory)
        return self._trace(records, memory)

    def _compute_times(self, prefixes: Dict[int, List[float]],
                       leads: Dict[int, Optional[Leads]],
                       waits: Dict[int, Optional[np.ndarray]]) -> Tuple[np.ndarray, np.ndarray]:
        """Start and end of every simulated compute op: each block's start
        plus the prefix sums of its ops' durations (held back by the host's
        launch queue, :mod:`.launch_queue`, where it has one; ``waits``:
        under blocking launches, the host's time before each op's first
        kernel)."""
        ix = self.index
        start_s = np.zeros(len(ix.compute))
        end_s = np.zeros(len(ix.compute))
        for rank, stream in ix.compute_streams.items():
            prefix = np.asarray(prefixes[rank])
            first = np.array([pos for pos, _ in stream.block_starts], dtype=np.int64)
            lengths = np.diff(np.append(first, len(stream.ops)))
            block = np.repeat(np.arange(len(first)), lengths)
            s0 = np.asarray(self._block_starts[rank])[block]
            base = prefix[first][block]
            ops = np.asarray(stream.ops, dtype=np.int64)
            start_s[ops], end_s[ops] = op_times(prefix, base, s0, leads.get(rank),
                                                waits.get(rank))
        return start_s, end_s

    def _records(self, start_s: np.ndarray, end_s: np.ndarray) -> OpColumns:
        """Every op record, as columns (:mod:`.records`); ``Trace.ops``
        makes them tuples, sorted by (start, rank, stream, end), if asked."""
        return op_columns(self.index, start_s, end_s, self._finished, self.options.comm_streams)

    def _memory(self, start_s: np.ndarray, end_s: np.ndarray) -> MemoryAccounting:
        """Each simulated device's memory curve and peaks (:mod:`.step_memory`)."""
        coll_start = np.array([c.start_s for c in self._collectives] or [0.0])
        coll_end = np.array([c.end_s for c in self._collectives] or [0.0])
        return run_memory(self.index, self.cost, start_s, end_s, coll_start, coll_end,
                          self._rep, self.options.record_memory)

    def _expand_symmetry(self, records: OpColumns, memory: MemoryAccounting
                         ) -> Tuple[OpColumns, MemoryAccounting]:
        """Give every follower its representative's records and memory."""
        members = class_members(self._rep)
        return expand_to_followers(records, members), memory_to_followers(memory, members)

    def _run_events(self) -> None:
        """``env.run()`` under the liveness bounds of the options (:mod:`.liveness`)."""
        run_events(self.env, self.options, lambda: self._progress, self._deadlock_report)

    def _deadlock_report(self, reason: Optional[str] = None) -> str:
        # the latest time reached (compute streams run ahead of the clock)
        return blocked_report(self._blocked, self._latest_s(), reason)

    def _latest_s(self) -> float:
        """The latest time reached: compute streams run ahead of the clock,
        and a finished collective ends when it ends."""
        return max([self.env.now, self._reached] + [c.end_s for c in self._finished])

    def _trace(self, records: OpColumns, memory: MemoryAccounting) -> Trace:
        spec = self.topology.device_spec
        used = self.index.used_devices  # every value's device
        devices = [DeviceInfo(r, self.topology.device_node(r), int(spec.memory_bytes))
                   for r in self.topology.ranks if r in used]
        end = self._latest_s()
        self._solo.settle(self.network)
        peaks = {r: dict(sorted(c.items())) for r, c in sorted(memory.peak_by_category.items())}
        return Trace(devices=devices, op_columns=records, memory_columns=memory.samples,
                     memory_peaks=dict(memory.peak),
                     links=self.network.link_records(),
                     link_samples=self.network.link_samples(), step_time_s=float(end),
                     meta={"peak_memory_by_category": peaks,
                           # a reduced program: how many devices each simulated one stands for
                           "represents": dict(self.function.meta.get("represents", {})),
                           "represented_ranks": dict(
                               self.function.meta.get("represented_ranks", {})),
                           "network_mode": self.options.network_mode,
                           "simulated_devices": len(set(self._rep.values())) if self._rep
                           else len(devices)})


def simulate_function(function: Function, topology, cost_model: Optional[CostModel] = None,
                      options: Optional[SimulationOptions] = None,
                      values: Optional[ValueTable] = None) -> Trace:
    """Simulate one run of ``function`` (local view) on ``topology``.
    ``values``: the function's :class:`~distsim.ir.value_table.ValueTable`,
    if the caller has read one (:func:`distsim.simulate` does, to verify
    the program), so that it is not read twice; the simulator lets go of
    it once the program is indexed (at a million values it holds ~130 MB
    that the run can reuse), so no caller should hold on to it."""
    simulator = Simulator(function, topology, cost_model, options, values)
    del values
    return simulator.run()
