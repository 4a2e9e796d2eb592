"""The network: point-to-point flows over a Topology, in simulated time.

``mode="flow"``: every active flow gets the max-min fair share of every
directed link on its route (progressive filling). Rates are recomputed when
a flow starts or ends, but only for the flows that share links with it
(directly or through other flows): max-min allocations decompose over those
connected components, so the result is exact and a busy cluster with many
independent flows stays cheap. A flow transmits ``nbytes`` at its (changing)
rate and is delivered ``path_latency_s`` after its last byte leaves.

``mode="analytical"``: no sharing; a flow takes ``latency + nbytes /
bottleneck bandwidth``. Both modes agree wherever no link is shared.

Utilisation samples (``record_samples=True``, for ``links.png`` and the
link counters of trace.json): a :class:`LinkSample` per link whenever its
use changes. Flows simulated one by one give the exact use (their rates over
the capacity); a run of fast-forwarded identical steps (below), and a
transfer or steps in analytical mode, give the mean use over their run
(bytes over capacity x time), so recording costs O(links) per run of steps,
not per step. In analytical mode the uses of overlapping transfers add up
and may pass 1: that mode ignores contention.

Flows that start at the same simulated instant are allocated together in
one recomputation (a settle event at a priority below SimPy's normal one),
and every flow keeps its projected finish time in a heap, so that a
recomputation touches only the flows whose rates change.

:meth:`Network.run_steps` runs ``count`` identical barrier-separated steps
(a ring's 2(p-1) steps); once a step ran with its links to itself, later
identical steps whose links are free are fast-forwarded from the cached
duration (several at once on disjoint links), holding their links, and
materialised again as real flows the moment other traffic arrives on one
of those links (see :mod:`.network_steps`). ``fast_steps=False`` runs
every step flow by flow.
"""
from __future__ import annotations

import heapq
import math
from operator import itemgetter
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

import simpy

from ..errors import ConfigError
from ..topology import Topology
from .collective_algos.schedule import FlowSpec
from .network_steps import StepRunner
from .route_table import route_table
from .trace import LinkRecord, LinkSample

#: A flow's (source, destination) and its bytes (flows are (src, dst, bytes)).
_PAIR = itemgetter(0, 1)
_BYTES = itemgetter(2)

_new_tuple = tuple.__new__

MODES = ("flow", "analytical")

#: (link ids, path latency, bottleneck bandwidth) of a route
Route = Tuple[Tuple[int, ...], float, float]

_SETTLE_PRIORITY = 2      # after SimPy's NORMAL (1): every same-time start is in


class Flow:
    """One transfer in flight (internal)."""

    __slots__ = ("links", "nbytes", "latency_s", "event", "rate", "finish_s", "version",
                 "seq", "start_s", "rate_changes")

    def __init__(self, links: Tuple[int, ...], nbytes: float, latency_s: float,
                 event: simpy.Event, seq: int, start_s: float) -> None:
        self.links = links
        self.nbytes = nbytes
        self.latency_s = latency_s
        self.event = event
        self.rate = 0.0
        self.finish_s = math.inf
        self.version = 0
        self.seq = seq
        self.start_s = start_s
        self.rate_changes = 0

    def remaining(self, now: float) -> float:
        if self.rate == 0.0:
            return self.nbytes
        return max(0.0, self.rate * (self.finish_s - now))


class _LinkStats:
    """Totals of one link; ``active`` counts the flows transmitting on it
    now, ``starts`` every flow ever started on it."""

    __slots__ = ("bytes", "busy_s", "busy_since", "active", "peak", "starts")

    def __init__(self) -> None:
        self.bytes = 0.0
        self.busy_s = 0.0
        self.busy_since = 0.0
        self.active = 0
        self.peak = 0
        self.starts = 0


class Network:
    """Flows between device ranks of ``topology`` inside ``env``.

    ``link_stats=False`` (analytical mode, no samples): the steps of
    :meth:`run_steps` keep no per-link totals, only the time passes, for
    callers that want only that time (the sweep's estimator times
    thousands of collectives; the totals were most of the cost).
    ``record_samples=True`` keeps a :class:`LinkSample` per link whenever
    its utilisation changes (for ``links.png``; see the module docstring);
    it costs time and memory on big runs. ``fast_steps=False``
    simulates every step of :meth:`run_steps` flow by flow (the reference
    for the fast path's tests).

    Other modules use only its public methods: routes (:meth:`route`,
    :meth:`route_info`), flows (:meth:`start_flow`, :meth:`start_group`),
    link state (:meth:`links_idle`, :meth:`starts_on`,
    :meth:`link_capacity`) and statistics; the step runner names what it
    uses in :class:`~.network_steps.StepNetwork`.
    """

    def __init__(self, env: simpy.Environment, topology: Topology, mode: str = "flow",
                 record_samples: bool = False, fast_steps: bool = True,
                 link_stats: bool = True) -> None:
        if mode not in MODES:
            raise ConfigError(f"network mode must be one of {', '.join(MODES)}, got {mode!r}")
        self.env = env
        self.topology = topology
        self.mode = mode
        self.record_samples = record_samples
        self.link_stats = link_stats
        table = route_table(topology)
        self._edges = table.edges
        self._edge_index = table.edge_index
        self._capacity = table.capacity
        self._routes = table.routes
        self._route_infos = table.route_infos
        self._analytical_shapes = table.analytical_shapes
        self.team_plans = table.team_plans
        self._stats: Dict[int, _LinkStats] = {}
        self._link_flows: Dict[int, Dict[Flow, None]] = {}
        self._heap: List[Tuple[float, int, int, Flow]] = []
        self._pending: List[Flow] = []
        self._dirty_links: Dict[int, None] = {}
        self._settle_scheduled = False
        self._wakeup_at = math.inf
        self._seq = 0
        self.active_flows = 0
        self.flows_started = 0
        self.samples: List[LinkSample] = []
        #: analytical mode: per link, [summed mean use, transfers adding to it]
        self._levels: Dict[int, List[float]] = {}
        # collectives' "auto" decisions depend on the topology only: shared
        # by every network over it (a sweep estimates each collective once)
        self.algorithm_choices = table.algorithm_choices
        #: (kind, team, bytes, root, algorithm) -> (name, schedule), by run_collective
        self.schedules: Dict[tuple, tuple] = {}
        self._steps = StepRunner(self, enabled=fast_steps)
        self._reserved = self._steps.reserved     # link -> phantom holding it

    # ------------------------------------------------------------------ routes
    def route(self, src: int, dst: int, key: int = 0) -> Route:
        """(link ids, path latency, bottleneck bandwidth) of the route from
        ``src`` to ``dst`` (ranks not checked), cached per topology."""
        hit = self._routes.get((src, dst, key))
        if hit is not None:
            return hit
        topo = self.topology
        route = topo.route(src, dst, key)
        links = [self._link(edge) for edge in route]
        out = (tuple(links), topo.path_latency_s(route), topo.path_bandwidth_Bps(route))
        self._routes[(src, dst, key)] = out
        return out

    def _link(self, edge: Tuple[str, str]) -> int:
        """The index of a topology edge, numbered on first use."""
        idx = self._edge_index.get(edge)
        if idx is None:
            idx = self._edge_index[edge] = len(self._edges)
            self._edges.append(edge)
            self._capacity.append(float(self.topology.graph.edges[edge]["bandwidth_Bps"]))
        return idx

    def route_info(self, src: int, dst: int, key: int = 0
                   ) -> Tuple[Tuple[int, ...], float, Tuple[float, ...]]:
        """(link ids, path latency, link capacities) of the route (cached)."""
        hit = self._route_infos.get((src, dst, key))
        if hit is None:
            links, latency, _ = self.route(src, dst, key)
            hit = self._route_infos[(src, dst, key)] = \
                (links, latency, tuple(self._capacity[i] for i in links))
        return hit

    def analytical_step_s(self, flows: Sequence[FlowSpec], key: int = 0,
                          latency_s: Optional[float] = None) -> float:
        """Analytical mode: one step's time, the slowest flow's
        ``latency + bytes / bottleneck`` (no link totals; ``latency_s``, where
        given, in place of every path latency). A step whose flows carry
        equal bytes is routed once per topology, whatever its size; its
        ranks are checked then."""
        sizes = set(map(_BYTES, flows))
        if len(sizes) == 1:
            pairs = (tuple(map(_PAIR, flows)), key)
            paths = self._analytical_shapes.get(pairs)
            if paths is None:
                topo = self.topology
                for src, dst in pairs[0]:
                    topo.check_rank(src)
                    topo.check_rank(dst)
                paths = self._analytical_shapes[pairs] = tuple(dict.fromkeys(
                    self.route(src, dst, key)[1:] for src, dst in pairs[0] if src != dst))
            nbytes = sizes.pop()
            step = 0.0
            for latency, bottleneck in paths:
                t = (latency if latency_s is None else latency_s) + nbytes / bottleneck
                if t > step:
                    step = t
            return step
        step = 0.0
        for src, dst, nbytes in flows:
            self.topology.check_rank(src)
            self.topology.check_rank(dst)
            if src != dst:
                _, latency, bottleneck = self.route(src, dst, key)
                if latency_s is not None:
                    latency = latency_s
                step = max(step, latency + nbytes / bottleneck)
        return step

    def flow_time_s(self, src: int, dst: int, nbytes: float, key: int = 0) -> float:
        """The time one flow takes on an otherwise idle network."""
        if src == dst:
            return 0.0
        _, latency, bottleneck = self.route(src, dst, key)
        return latency + nbytes / bottleneck

    # ------------------------------------------------------------------ API
    def transfer(self, src_rank: int, dst_rank: int, nbytes: float, key: int = 0) -> simpy.Event:
        """Send ``nbytes`` from ``src_rank`` to ``dst_rank``; the event
        succeeds when the last byte has arrived."""
        self.topology.check_rank(src_rank)
        self.topology.check_rank(dst_rank)
        if nbytes < 0 or not math.isfinite(nbytes):
            raise ConfigError(f"transfer {src_rank} -> {dst_rank}: bytes must be >= 0, "
                              f"got {nbytes!r}")
        event = self.env.event()
        self.start_flow(src_rank, dst_rank, float(nbytes), key, event)
        return event

    def transfer_all(self, flows: Sequence[FlowSpec], key: int = 0) -> simpy.Event:
        """Start every ``(src, dst, nbytes)`` flow now; the event succeeds
        when all of them are delivered."""
        for src, dst, nbytes in flows:
            self.topology.check_rank(src)
            self.topology.check_rank(dst)
            if nbytes < 0 or not math.isfinite(nbytes):
                raise ConfigError(f"transfer {src} -> {dst}: bytes must be >= 0, got {nbytes!r}")
        return self.start_group(flows, key)[0]

    def start_group(self, flows: Sequence[FlowSpec], key: int = 0,
                    latency_s: Optional[float] = None
                    ) -> Tuple[simpy.Event, List[Flow | None]]:
        """Start flows of checked ranks and bytes now (``latency_s``: see
        :meth:`start_flow`): an event for the delivery of all of them, and
        what :meth:`start_flow` gave each."""
        done = self.env.event()
        left = [len(flows)]

        def one_done(_: simpy.Event) -> None:
            left[0] -= 1
            if left[0] == 0:
                done.succeed()

        if not flows:
            done.succeed()
        started = []
        for src, dst, nbytes in flows:
            event = self.env.event()
            event.callbacks.append(one_done)
            started.append(self.start_flow(src, dst, float(nbytes), key, event, latency_s))
        return done, started

    def run_steps(self, flows: Sequence[FlowSpec], count: int, key: int = 0,
                  latency_s: Optional[float] = None):
        """A SimPy process generator: ``count`` steps, each starting every
        flow of ``flows`` and waiting until all are delivered; with
        ``latency_s`` a flow is delivered that long after its last byte
        instead of its path latency (a protocol's per-step cost), and a step
        without flows just waits that long."""
        return self._steps.run(tuple(flows), count, key, latency_s)

    def is_idle(self) -> bool:
        return self.active_flows == 0 and not self._pending

    def start_flow(self, src: int, dst: int, nbytes: float, key: int, event: simpy.Event,
                   latency_s: Optional[float] = None) -> Flow | None:
        """Start one flow of checked ranks and bytes now; ``event``
        succeeds on its delivery, its path latency (or ``latency_s``) after
        its last byte. The flow, or None where nothing is sent
        (``src == dst``, or analytical mode)."""
        env = self.env
        if src == dst:
            event.succeed()
            return None
        links, latency, bottleneck = self.route(src, dst, key)
        if latency_s is not None:
            latency = latency_s
        if self._reserved:
            reserved = self._reserved
            for i in links:
                phantom = reserved.get(i)
                if phantom is not None:
                    self._steps.materialize(phantom)   # it shares the link from now on
        self.flows_started += 1
        if self.mode == "analytical":
            self._count_links(links, nbytes, +1)
            tx = nbytes / bottleneck
            for i in links:
                self._stats[i].busy_s += tx
            if self.record_samples and tx > 0:
                uses = {i: bottleneck / self._capacity[i] for i in links}
                self.add_use(uses, +1)
                env.timeout(tx).callbacks.append(lambda _e: self.add_use(uses, -1))
            done = env.timeout(tx + latency)
            done.callbacks.append(lambda _e: (self._count_links(links, 0.0, -1), event.succeed()))
            return None
        self._seq += 1
        flow = Flow(links, nbytes, latency, event, self._seq, env.now)
        self._count_links(links, nbytes, +1)
        if nbytes == 0.0:
            self._count_links(links, 0.0, -1)
            self._deliver(flow)
            return flow
        self.active_flows += 1
        self._pending.append(flow)
        if not self._settle_scheduled:
            self._settle_scheduled = True
            ev = env.event()
            ev._ok, ev._value = True, None          # a pre-triggered event (as succeed())
            ev.callbacks.append(self._on_settle)
            env.schedule(ev, _SETTLE_PRIORITY)
        return flow

    # ------------------------------------------------------------------ link state
    def links_idle(self, links: Iterable[int]) -> bool:
        """No flow transmits on any of ``links`` now."""
        stats = self._stats
        for i in links:
            s = stats.get(i)
            if s is not None and s.active:
                return False
        return True

    def starts_on(self, links: Iterable[int]) -> int:
        """Flows ever started on ``links``, each counted once per link of
        them it crosses."""
        stats = self._stats
        return sum(stats[i].starts for i in links if i in stats)

    def link_capacity(self, link: int) -> float:
        """The bandwidth of link ``link`` (an id of :meth:`route`), bytes/s."""
        return self._capacity[link]

    # ------------------------------------------------------------------ internals
    def _count_links(self, links: Iterable[int], nbytes: float, delta: int) -> None:
        now = self.env.now
        stats = self._stats
        for i in links:
            s = stats.get(i)
            if s is None:
                s = stats[i] = _LinkStats()
            if delta > 0:
                s.bytes += nbytes
                s.starts += 1
                if s.active == 0:
                    s.busy_since = now
                s.active += 1
                if s.active > s.peak:
                    s.peak = s.active
            else:
                s.active -= 1
                if s.active == 0 and self.mode == "flow":
                    s.busy_s += now - s.busy_since

    def _deliver(self, flow: Flow) -> None:
        if flow.latency_s > 0:
            self.env.timeout(flow.latency_s).callbacks.append(lambda _e: flow.event.succeed())
        else:
            flow.event.succeed()

    def _on_settle(self, _event: simpy.Event) -> None:
        self._settle_scheduled = False
        self._reallocate()

    def _reallocate(self) -> None:
        """Add pending flows, recompute max-min rates of every flow connected
        to a changed link, and re-aim the wake-up at the next finish."""
        link_flows = self._link_flows
        for flow in self._pending:
            for i in flow.links:
                link_flows.setdefault(i, {})[flow] = None
                self._dirty_links[i] = None
        self._pending.clear()
        if self._dirty_links:
            flows = self._component(self._dirty_links)
            self._dirty_links = {}
            self._fill(flows)
        self._aim_wakeup()

    def _component(self, seeds: Iterable[int]) -> List[Flow]:
        """Every flow reachable from the seed links through shared links."""
        link_flows = self._link_flows
        seen_links = set(seeds)
        stack = list(seen_links)
        found: Dict[Flow, None] = {}
        while stack:
            for flow in link_flows.get(stack.pop(), ()):
                if flow not in found:
                    found[flow] = None
                    for j in flow.links:
                        if j not in seen_links:
                            seen_links.add(j)
                            stack.append(j)
        return sorted(found, key=lambda f: f.seq)

    def _fill(self, flows: List[Flow]) -> None:
        """Max-min fair rates for ``flows`` by progressive filling: the link
        with the smallest fair share fixes the rate of all its unfixed flows,
        which then leave the other links; repeat."""
        if not flows:
            return
        now = self.env.now
        cap: Dict[int, float] = {}
        count: Dict[int, int] = {}
        for f in flows:
            for i in f.links:
                if i in count:
                    count[i] += 1
                else:
                    count[i] = 1
                    cap[i] = self._capacity[i]
        heap = [(cap[i] / n, i) for i, n in count.items()]
        heapq.heapify(heap)
        link_flows = self._link_flows
        fixed: Dict[Flow, float] = {}
        while heap:
            share, i = heapq.heappop(heap)
            n = count[i]
            if n == 0 or share != cap[i] / n:
                continue                      # stale entry
            for f in link_flows[i]:
                if f in fixed:
                    continue
                fixed[f] = share
                for j in f.links:
                    cap[j] = max(0.0, cap[j] - share)
                    count[j] -= 1
                    if count[j] and j != i:
                        heapq.heappush(heap, (cap[j] / count[j], j))
            count[i] = 0
        heap_out = self._heap
        for f in flows:
            rate = fixed[f]
            if rate == f.rate:
                continue
            left = f.remaining(now)
            f.rate = rate
            f.rate_changes += 1
            f.finish_s = now + left / rate
            f.version += 1
            heapq.heappush(heap_out, (f.finish_s, f.seq, f.version, f))
        if self.record_samples:
            for i in count:
                self.sample(i, sum(f.rate for f in link_flows[i]) / self._capacity[i])

    def _aim_wakeup(self) -> None:
        heap = self._heap
        while heap and heap[0][2] != heap[0][3].version:
            heapq.heappop(heap)
        if not heap:
            self._wakeup_at = math.inf
            return
        at = heap[0][0]
        if at < self._wakeup_at:
            self._wakeup_at = at
            wake = self.env.timeout(max(0.0, at - self.env.now))
            wake.callbacks.append(lambda _e, at=at: self._on_wakeup(at))

    def _on_wakeup(self, at: float) -> None:
        if at != self._wakeup_at:
            return                            # superseded by an earlier wake-up
        self._wakeup_at = math.inf
        now = self.env.now
        limit = now + 1e-12 * max(1.0, abs(now))
        heap = self._heap
        while heap and heap[0][0] <= limit:
            _, _, version, flow = heapq.heappop(heap)
            if version != flow.version:
                continue
            flow.version += 1                 # invalidates any other heap entry
            self._finish(flow)
        self._reallocate()

    def _finish(self, flow: Flow) -> None:
        self.active_flows -= 1
        link_flows = self._link_flows
        for i in flow.links:
            del link_flows[i][flow]
            self._dirty_links[i] = None
            if self.record_samples and not link_flows[i]:
                self.sample(i, 0.0)
        self._count_links(flow.links, 0.0, -1)
        self._deliver(flow)

    # ------------------------------------------------------------------ samples
    # Samples are made with tuple.__new__: a NamedTuple's own constructor is
    # a Python call, a real cost for the millions of samples of a large run.
    def sample(self, link: int, utilisation: float) -> None:
        """Record ``link``'s utilisation from now on."""
        a, b = self._edges[link]
        self.samples.append(_new_tuple(LinkSample, (a, b, self.env.now, utilisation)))

    def sample_edges(self, samples: Iterable[Tuple[str, str, float, float]],
                     offset_s: float) -> None:
        """Record link uses ``(src, dst, time, utilisation)``, each from
        ``time + offset_s`` on (times that may be ahead of the clock:
        readers sort samples by time)."""
        self.samples.extend([_new_tuple(LinkSample, (src, dst, offset_s + t, use))
                             for src, dst, t, use in samples])

    def mean_uses(self, link_bytes: Iterable[Tuple[int, float]], duration_s: float
                  ) -> Dict[int, float]:
        """Per link, the mean utilisation of carrying its bytes in ``duration_s``."""
        if duration_s <= 0:
            return {}
        cap = self._capacity
        return {i: b / (cap[i] * duration_s) for i, b in link_bytes if b > 0}

    def add_use(self, uses: Dict[int, float], sign: int) -> None:
        """Analytical mode: add (``sign=+1``) or take away (-1) a transfer's
        use of its links, and sample them (a link back to no transfer is
        exactly 0, whatever the rounding of the sums)."""
        levels = self._levels
        for i, u in uses.items():
            level = levels.get(i)
            if level is None:
                level = levels[i] = [0.0, 0]
            level[0] += sign * u
            level[1] += sign
            if level[1] == 0:
                level[0] = 0.0
            self.sample(i, level[0])

    # ------------------------------------------------------------------ stats
    def add_link_stats(self, link: int, nbytes: float, busy_s: float, peak: int) -> None:
        """Account traffic that was fast-forwarded rather than simulated."""
        s = self._stats.get(link)
        if s is None:
            s = self._stats[link] = _LinkStats()
        s.bytes += nbytes
        s.busy_s += busy_s
        s.peak = max(s.peak, peak)

    def add_edge_stats(self, src: str, dst: str, nbytes: float, busy_s: float,
                       peak: int) -> None:
        """:meth:`add_link_stats` for the link ``src -> dst`` of the topology."""
        self.add_link_stats(self._link((src, dst)), nbytes, busy_s, peak)

    def link_records(self) -> List[LinkRecord]:
        """Totals per directed link that carried traffic, busiest first."""
        self._steps.settle_stats()
        now = self.env.now
        out = []
        for i, s in self._stats.items():
            busy = s.busy_s + (now - s.busy_since if s.active and self.mode == "flow" else 0.0)
            a, b = self._edges[i]
            out.append(LinkRecord(a, b, self._capacity[i], s.bytes, busy, s.peak))
        out.sort(key=lambda r: (-r.busy_s, -r.bytes_carried, r.src, r.dst))
        return out

    def link_samples(self) -> List[LinkSample]:
        return list(self.samples)
