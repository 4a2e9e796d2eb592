"""Repeated identical steps on the network, fast-forwarded where exact.

A ring collective is 2(p-1) steps that each start the same flows and wait
until all are delivered. Simulating each step flow by flow costs
O(p) Python work per step; at 1024 ranks that is millions of flows. Yet a
step that ran *alone* on the network, with every flow at a constant rate,
takes the same time every time it runs alone again. So:

1. the first step runs as real flows; if the network was idle, nobody else
   started traffic meanwhile and no flow's rate changed, its duration and
   per-flow rates are cached under the step's signature;
2. later, when the network is idle and the signature is cached, the
   remaining steps become one *phantom*: a single timeout of
   ``steps * duration``, with link statistics added in bulk;
3. if any other traffic starts while a phantom runs, the phantom is
   *materialised*: finished steps are accounted, the step in progress is
   turned back into real flows carrying exactly the bytes not yet sent
   (or deliveries still in their latency), and the remaining steps run
   normally. The result equals the step-by-step simulation.

In analytical mode there is no sharing, so every step takes the same time
and the steps are always a single timeout.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Dict, List, Optional, Tuple

import simpy

if TYPE_CHECKING:   # pragma: no cover - typing only
    from .network import FlowSpec, Network

Signature = Tuple[Tuple["FlowSpec", ...], int]


class StepProfile:
    """How one step ran alone: its duration, each flow's (rate, transmit
    time, latency) (None for a flow that sends nothing over the network)
    and per-link (bytes, busy time, flows) totals."""

    __slots__ = ("duration_s", "flows", "links")

    def __init__(self, duration_s: float, flows: List[Optional[Tuple[float, float, float]]],
                 links: Dict[int, Tuple[float, float, int]]) -> None:
        self.duration_s = duration_s
        self.flows = flows
        self.links = links


class _Phantom:
    __slots__ = ("specs", "key", "profile", "steps", "start_s", "done", "materialized")

    def __init__(self, specs, key, profile, steps, start_s, done) -> None:
        self.specs = specs
        self.key = key
        self.profile = profile
        self.steps = steps
        self.start_s = start_s
        self.done = done
        self.materialized = False


class StepRunner:
    """Runs :meth:`Network.run_steps` (one per network)."""

    def __init__(self, network: "Network") -> None:
        self.net = network
        self.cache: Dict[Signature, StepProfile] = {}
        self.phantom: Optional[_Phantom] = None

    # ------------------------------------------------------------------ run
    def run(self, specs: Tuple["FlowSpec", ...], count: int, key: int):
        net, env = self.net, self.net.env
        if count <= 0 or not specs:
            return
        for src, dst, nbytes in specs:
            net.topology.check_rank(src)
            net.topology.check_rank(dst)
        if net.mode == "analytical":
            yield env.timeout(self._analytical(specs, count, key))
            return
        sig = (specs, key)
        done = 0
        while done < count:
            profile = self.cache.get(sig)
            if profile is not None and self.is_idle() and not net.record_samples:
                phantom = _Phantom(specs, key, profile, count - done, env.now, env.event())
                self.phantom = phantom
                env.timeout(profile.duration_s * phantom.steps).callbacks.append(
                    lambda _e, ph=phantom: self._phantom_end(ph))
                outcome = yield phantom.done
                if outcome is None:
                    return
                finished, in_flight = outcome
                done += finished
                yield in_flight
                done += 1
                continue
            idle = self.is_idle()
            before = net.flows_started
            start = env.now
            event, flows = net.start_group(specs, key)
            yield event
            done += 1
            if idle and sig not in self.cache and \
                    net.flows_started - before == sum(f is not None for f in flows):
                self._remember(sig, flows, env.now - start)

    def is_idle(self) -> bool:
        return self.phantom is None and self.net.is_idle()

    def _analytical(self, specs, count: int, key: int) -> float:
        net = self.net
        step = 0.0
        for src, dst, nbytes in specs:
            if src == dst:
                continue
            links, latency, bottleneck = net._route(src, dst, key)
            step = max(step, latency + nbytes / bottleneck)
            for i in links:
                net.add_link_stats(i, nbytes * count, nbytes / bottleneck * count, 1)
        return step * count

    def _remember(self, sig: Signature, flows, duration_s: float) -> None:
        """Cache the step if every flow kept one rate throughout."""
        per_flow: List[Optional[Tuple[float, float, float]]] = []
        links: Dict[int, Tuple[float, float, int]] = {}
        for f in flows:
            if f is None:
                per_flow.append(None)
                continue
            if f.nbytes > 0 and f.rate_changes != 1:
                return
            tx = f.nbytes / f.rate if f.nbytes > 0 else 0.0
            per_flow.append((f.rate, tx, f.latency_s))
            for i in f.links:
                b, busy, n = links.get(i, (0.0, 0.0, 0))
                links[i] = (b + f.nbytes, max(busy, tx), n + 1)
        self.cache[sig] = StepProfile(duration_s, per_flow, links)

    # ------------------------------------------------------------------ phantom
    def _account(self, profile: StepProfile, steps: int) -> None:
        if steps <= 0:
            return
        for i, (nbytes, busy, n) in profile.links.items():
            self.net.add_link_stats(i, nbytes * steps, busy * steps, n)

    def _phantom_end(self, phantom: _Phantom) -> None:
        if phantom.materialized:
            return
        self.phantom = None
        self._account(phantom.profile, phantom.steps)
        phantom.done.succeed(None)

    def before_traffic(self) -> None:
        """Called before any flow starts: a running phantom turns back into
        real flows so that the new traffic shares links with it."""
        phantom = self.phantom
        if phantom is None:
            return
        net, env = self.net, self.net.env
        profile = phantom.profile
        elapsed = env.now - phantom.start_s
        total = profile.duration_s * phantom.steps
        if elapsed >= total * (1 - 1e-12):
            return                      # it ends at this very instant
        finished = min(int(elapsed // profile.duration_s), phantom.steps - 1)
        into = elapsed - finished * profile.duration_s
        phantom.materialized = True
        self.phantom = None
        self._account(profile, finished)
        in_flight = self._resume_step(phantom, into)
        phantom.done.succeed((finished, in_flight))

    def _resume_step(self, phantom: _Phantom, into: float) -> simpy.Event:
        """Real flows for the step ``into`` seconds in: each carries the
        bytes it has not sent yet; those already sent wait out their
        latency. Returns the event of the whole step's delivery."""
        net, env = self.net, self.net.env
        done = env.event()
        left = [len(phantom.specs)]

        def one_done(_e=None) -> None:
            left[0] -= 1
            if left[0] == 0:
                done.succeed()

        for (src, dst, nbytes), prof in zip(phantom.specs, phantom.profile.flows):
            if prof is None:
                one_done()
                continue
            rate, tx, latency = prof
            links = net._route(src, dst, phantom.key)[0]
            sent = min(nbytes, rate * into)
            for i in links:
                net.add_link_stats(i, sent, min(into, tx), 1)
            if tx > into and nbytes - sent > 0:
                event = env.event()
                event.callbacks.append(one_done)
                net._start(src, dst, nbytes - sent, phantom.key, event)
            elif tx + latency > into:
                env.timeout(tx + latency - into).callbacks.append(one_done)
            else:
                one_done()
        if left[0] == 0 and not done.triggered:
            done.succeed()
        return done
