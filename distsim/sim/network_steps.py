"""Repeated identical steps on the network, fast-forwarded where exact.

A ring collective is 2(p-1) steps that each start the same flows and wait
until all are delivered. Simulating each step flow by flow costs O(p)
Python work per step; at 1024 ranks that is millions of flows. Yet max-min
fair rates depend only on the flows that share links with each other (a
connected component of flows over links): a step whose links carry no
other flow while it runs takes the same time, at the same per-flow rates,
every time, whatever the rest of the network does. So:

1. a step runs as real flows until one run is *clean*: no other flow was
   transmitting on any of its links when it started, and no other flow
   started on them while it ran. Its duration and per-flow rates (when
   every flow kept one rate throughout) are then cached under the step's
   signature;
2. later, when none of the step's links carries a transmitting flow and
   no other phantom holds them, the remaining steps become one *phantom*:
   a single timeout of ``steps * duration`` that *reserves* the step's
   links; link statistics are added in bulk. Phantoms on disjoint links
   run side by side;
3. a real flow about to start on a reserved link (from another step, a
   transfer, or a step whose links are held by a phantom) first
   *materialises* that phantom: finished steps are accounted, the step in
   progress is turned back into real flows carrying exactly the bytes not
   yet sent (or deliveries still in their latency), and the remaining
   steps run normally. The result equals the step-by-step simulation.

In analytical mode there is no sharing, so every step takes the same time
and the steps are always a single timeout.

With utilisation samples on, a phantom samples each of its links once at
its start (the mean use over its steps: bytes over capacity x duration)
and once at its end or when it materialises (0, before the real flows take
over), so samples do not turn the fast path off. When it materialises
part-way through a step, its start samples are rewritten to the mean use
over the time it ran (the bytes each link carried by then, which a step's
flows send at their rate, sooner than the step's mean use spreads them), so
that each link's samples still integrate to the bytes it carried.
"""
from __future__ import annotations

from typing import Any, Dict, Iterable, List, Optional, Protocol, Sequence, Set, Tuple

import simpy

from .collective_algos.schedule import FlowSpec

#: a step's flows, route key and latency (None: the flows' path latencies)
Signature = Tuple[Tuple[FlowSpec, ...], int, Optional[float]]


class StepNetwork(Protocol):
    """What the step runner uses of its network: the public interface of
    :class:`~distsim.sim.network.Network` (which imports this module, so
    it is named here, not imported)."""

    env: simpy.Environment
    topology: Any
    mode: str
    link_stats: bool
    record_samples: bool
    samples: List[Any]

    def route(self, src: int, dst: int, key: int = 0) -> Tuple[Tuple[int, ...], float, float]: ...
    def start_flow(self, src: int, dst: int, nbytes: float, key: int,
                   event: simpy.Event, latency_s: Optional[float] = None) -> Any: ...
    def start_group(self, flows: Sequence[FlowSpec], key: int = 0,
                    latency_s: Optional[float] = None) -> Tuple[simpy.Event, list]: ...
    def analytical_step_s(self, flows: Sequence[FlowSpec], key: int = 0,
                          latency_s: Optional[float] = None) -> float: ...
    def links_idle(self, links: Iterable[int]) -> bool: ...
    def starts_on(self, links: Iterable[int]) -> int: ...
    def link_capacity(self, link: int) -> float: ...
    def add_link_stats(self, link: int, nbytes: float, busy_s: float, peak: int) -> None: ...
    def mean_uses(self, link_bytes: Iterable[Tuple[int, float]],
                  duration_s: float) -> Dict[int, float]: ...
    def add_use(self, uses: Dict[int, float], sign: int) -> None: ...
    def sample(self, link: int, utilisation: float) -> None: ...


class StepProfile:
    """How one step ran alone: its duration, each flow's (rate, transmit
    time, latency) (None for a flow that sends nothing over the network)
    and per-link (bytes, busy time, flows) totals; ``link_ids`` lists the
    links in first-use order; ``owed`` counts fast-forwarded steps whose
    link statistics are not added yet."""

    __slots__ = ("duration_s", "flows", "links", "link_ids", "owed")

    def __init__(self, duration_s: float, flows: List[Optional[Tuple[float, float, float]]],
                 links: Dict[int, Tuple[float, float, int]]) -> None:
        self.duration_s = duration_s
        self.flows = flows
        self.links = links
        self.link_ids = tuple(links)
        self.owed = 0


class _Phantom:
    __slots__ = ("specs", "key", "latency_s", "profile", "steps", "start_s", "done",
                 "materialized", "first_sample")

    def __init__(self, specs, key, latency_s, profile, steps, start_s, done) -> None:
        self.specs = specs
        self.key = key
        self.latency_s = latency_s
        self.profile = profile
        self.steps = steps
        self.start_s = start_s
        self.done = done
        self.materialized = False
        #: with samples on: where its start samples (one per link, in
        #: ``profile.link_ids`` order) are in the network's list
        self.first_sample = -1


class StepRunner:
    """Runs :meth:`Network.run_steps` (one per network). ``enabled=False``
    simulates every step flow by flow (the reference the fast path is
    tested against)."""

    def __init__(self, network: StepNetwork, enabled: bool = True) -> None:
        self.net = network
        self.enabled = enabled
        self.cache: Dict[Signature, StepProfile] = {}
        self.uncacheable: Set[Signature] = set()
        self._checked: Set[Tuple[FlowSpec, ...]] = set()  # steps whose ranks are known good
        self._step_links: Dict[Signature, Tuple[Tuple[int, ...], int]] = {}
        #: link index -> the phantom holding it
        self.reserved: Dict[int, _Phantom] = {}
        self._owing: List[StepProfile] = []

    # ------------------------------------------------------------------ run
    def run(self, specs: Tuple[FlowSpec, ...], count: int, key: int,
            latency_s: Optional[float] = None):
        net, env = self.net, self.net.env
        if count <= 0:
            return
        if not specs:
            if latency_s:
                yield env.timeout(latency_s * count)
            return
        if net.mode == "analytical" and not net.link_stats and not net.record_samples:
            yield env.timeout(net.analytical_step_s(specs, key, latency_s) * count)
            return
        if specs not in self._checked:  # a training step repeats the same steps
            for src, dst, nbytes in specs:
                net.topology.check_rank(src)
                net.topology.check_rank(dst)
            self._checked.add(specs)
        if net.mode == "analytical":
            uses: Dict[int, float] = {}
            done_ev = env.timeout(self._analytical(specs, count, key, uses, latency_s))
            if uses:
                net.add_use(uses, +1)
                done_ev.callbacks.append(lambda _e: net.add_use(uses, -1))
            yield done_ev
            return
        fast = self.enabled
        sig = (specs, key, latency_s)
        done = 0
        while done < count:
            profile = self.cache.get(sig) if fast else None
            if profile is not None and self._free(profile.link_ids):
                phantom = _Phantom(specs, key, latency_s, profile, count - done, env.now,
                                   env.event())
                reserved = self.reserved
                for i in profile.link_ids:
                    reserved[i] = phantom
                env.timeout(profile.duration_s * phantom.steps).callbacks.append(
                    lambda _e, ph=phantom: self._phantom_end(ph))
                if net.record_samples:
                    uses = net.mean_uses(((i, b) for i, (b, _, _) in profile.links.items()),
                                         profile.duration_s)
                    phantom.first_sample = len(net.samples)
                    for i in profile.link_ids:
                        net.sample(i, uses.get(i, 0.0))
                outcome = yield phantom.done
                if outcome is None:
                    return
                finished, in_flight = outcome
                done += finished
                yield in_flight
                done += 1
                continue
            watch = fast and profile is None and sig not in self.uncacheable
            if watch:
                links, own = self._links_of(sig)
                watch = self._free(links, reserved_ok=True)
                before = net.starts_on(links) if watch else 0
            start = env.now
            event, flows = net.start_group(specs, key, latency_s)
            yield event
            done += 1
            if watch and net.starts_on(links) - before == own and sig not in self.cache:
                self._remember(sig, flows, env.now - start)

    def _links_of(self, sig: Signature) -> Tuple[Tuple[int, ...], int]:
        """(distinct links of the step, flow-link incidences of the step)."""
        hit = self._step_links.get(sig)
        if hit is None:
            specs, key = sig[0], sig[1]
            seen: Dict[int, None] = {}
            own = 0
            for src, dst, _ in specs:
                if src == dst:
                    continue
                links = self.net.route(src, dst, key)[0]
                own += len(links)
                for i in links:
                    seen[i] = None
            hit = self._step_links[sig] = (tuple(seen), own)
        return hit

    def _free(self, links, reserved_ok: bool = False) -> bool:
        """No flow transmits on any of ``links`` (and, unless
        ``reserved_ok``, no phantom holds one)."""
        if not reserved_ok:
            reserved = self.reserved
            if reserved and any(i in reserved for i in links):
                return False
        return self.net.links_idle(links)

    def _analytical(self, specs, count: int, key: int,
                    uses: Optional[Dict[int, float]] = None,
                    latency_s: Optional[float] = None) -> float:
        """The time of ``count`` steps in analytical mode (link statistics
        added; ``latency_s``, where given, in place of the path latencies);
        with samples on, fills ``uses`` with each link's mean use."""
        net = self.net
        route = net.route
        step = 0.0
        per_link: Dict[int, float] = {}
        busy: Dict[int, float] = {}
        # summed per link, then added once per link (not once per flow and
        # link: a 256-rank step crosses a link with several of its flows)
        for src, dst, nbytes in specs:
            if src == dst:
                continue
            links, latency, bottleneck = route(src, dst, key)
            if latency_s is not None:
                latency = latency_s
            tx = nbytes / bottleneck
            if latency + tx > step:
                step = latency + tx
            for i in links:
                if i in per_link:
                    per_link[i] += nbytes
                    busy[i] += tx
                else:
                    per_link[i] = nbytes
                    busy[i] = tx
        add = net.add_link_stats
        for i, nbytes in per_link.items():
            add(i, nbytes * count, busy[i] * count, 1)
        if uses is not None and net.record_samples:
            uses.update(net.mean_uses(per_link.items(), step))
        return step * count

    def _remember(self, sig: Signature, flows, duration_s: float) -> None:
        """Cache the step if every flow kept one rate throughout (a clean
        run that did not is never cacheable: it runs the same way again)."""
        per_flow: List[Optional[Tuple[float, float, float]]] = []
        links: Dict[int, Tuple[float, float, int]] = {}
        for f in flows:
            if f is None:
                per_flow.append(None)
                continue
            if f.nbytes > 0 and f.rate_changes != 1:
                self.uncacheable.add(sig)
                return
            tx = f.nbytes / f.rate if f.nbytes > 0 else 0.0
            per_flow.append((f.rate, tx, f.latency_s))
            for i in f.links:
                b, busy, n = links.get(i, (0.0, 0.0, 0))
                links[i] = (b + f.nbytes, max(busy, tx), n + 1)
        self.cache[sig] = StepProfile(duration_s, per_flow, links)
        self._step_links.pop(sig, None)

    # ------------------------------------------------------------------ phantom
    def _account(self, profile: StepProfile, steps: int) -> None:
        """Owe the link statistics of ``steps`` fast-forwarded steps (added
        in bulk by :meth:`settle_stats`: a phantom costs O(1), not O(links))."""
        if steps <= 0:
            return
        if profile.owed == 0:
            self._owing.append(profile)
        profile.owed += steps

    def settle_stats(self) -> None:
        """Add the owed link statistics (before anyone reads them)."""
        add = self.net.add_link_stats
        for profile in self._owing:
            steps, profile.owed = profile.owed, 0
            for i, (nbytes, busy, n) in profile.links.items():
                add(i, nbytes * steps, busy * steps, n)
        self._owing.clear()

    def _release(self, phantom: _Phantom) -> None:
        reserved = self.reserved
        sample = self.net.sample if self.net.record_samples else None
        for i in phantom.profile.link_ids:
            if reserved.get(i) is phantom:
                del reserved[i]
                if sample is not None:
                    sample(i, 0.0)

    def _phantom_end(self, phantom: _Phantom) -> None:
        if phantom.materialized:
            return
        self._release(phantom)
        self._account(phantom.profile, phantom.steps)
        phantom.done.succeed(None)

    def materialize(self, phantom: _Phantom) -> None:
        """Called before a flow starts on one of ``phantom``'s links: the
        phantom turns back into real flows so that the new traffic shares
        links with it."""
        if phantom.materialized:
            return
        env = self.net.env
        profile = phantom.profile
        elapsed = env.now - phantom.start_s
        total = profile.duration_s * phantom.steps
        if elapsed >= total * (1 - 1e-12):
            return                      # it ends at this very instant
        finished = min(int(elapsed // profile.duration_s), phantom.steps - 1)
        into = elapsed - finished * profile.duration_s
        phantom.materialized = True
        self._release(phantom)
        self._account(profile, finished)
        in_flight = self._resume_step(phantom, finished, into)
        phantom.done.succeed((finished, in_flight))

    def _resample(self, phantom: _Phantom, finished: int, sent_on: Dict[int, float]) -> None:
        """Rewrite the start samples of a phantom that materialised: each
        link's use from the phantom's start until now is the bytes it
        carried by now (``finished`` whole steps and ``sent_on`` of the
        step in progress) over its capacity x the time."""
        net = self.net
        elapsed = net.env.now - phantom.start_s
        if elapsed <= 0:
            return                      # no time between the start and the 0 sample
        samples, cap = net.samples, net.link_capacity
        for k, (i, (nbytes, _, _)) in enumerate(phantom.profile.links.items()):
            at = phantom.first_sample + k
            carried = finished * nbytes + sent_on.get(i, 0.0)
            samples[at] = samples[at]._replace(utilisation=carried / (cap(i) * elapsed))

    def _resume_step(self, phantom: _Phantom, finished: int, into: float) -> simpy.Event:
        """Real flows for the step ``into`` seconds in (after ``finished``
        whole steps): each carries the bytes it has not sent yet; those
        already sent wait out their latency. Link statistics get the part
        of the step already run (and the start samples the use so far).
        Returns the event of the whole step's delivery."""
        net, env = self.net, self.net.env
        done = env.event()
        left = [len(phantom.specs)]

        def one_done(_e=None) -> None:
            left[0] -= 1
            if left[0] == 0:
                done.succeed()

        sent_on: Dict[int, float] = {}
        restart = []
        for (src, dst, nbytes), prof in zip(phantom.specs, phantom.profile.flows):
            if prof is None:
                one_done()
                continue
            rate, tx, latency = prof
            links = net.route(src, dst, phantom.key)[0]
            sent = min(nbytes, rate * into)
            for i in links:
                sent_on[i] = sent_on.get(i, 0.0) + sent
            if tx > into and nbytes - sent > 0:
                restart.append((src, dst, nbytes - sent))
            elif tx + latency > into:
                env.timeout(tx + latency - into).callbacks.append(one_done)
            else:
                one_done()
        for i, (_, busy, n) in phantom.profile.links.items():
            # every flow of the step started at its beginning: the link has
            # been busy since then, for at most its longest transmission
            net.add_link_stats(i, sent_on.get(i, 0.0), min(into, busy), n)
        if phantom.first_sample >= 0:
            self._resample(phantom, finished, sent_on)
        for src, dst, nbytes in restart:
            event = env.event()
            event.callbacks.append(one_done)
            net.start_flow(src, dst, nbytes, phantom.key, event, phantom.latency_s)
        if left[0] == 0 and not done.triggered:
            done.succeed()
        return done
