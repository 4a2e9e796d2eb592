"""The estimator's timeline: work items on the streams of pipeline stages.

Each pipeline stage is represented by one rank with the simulator's
streams: compute, communication, and a point-to-point queue per direction
of each pair of stages. An item is a piece of work in program order on one or more
streams: a run of compute (one stream), a collective (the communication
streams of every stage in its team), a pipeline send/receive (the queue of
its direction between its pair of stages), or a forward/backward task with tensor-parallel
collectives inside (both streams of its stage: its collectives hold the
communication stream while it runs). An item starts when every stream it
is on has finished the items before it and the items it depends on have
ended -- the simulator's rule (a stream takes its ops in program order; a
collective starts when every member has reached it) with no network
contention, as in the analytical mode; but under the flow network
(:attr:`Timeline.links`, :mod:`.shared_links`) pipeline transfers that
share links at once are timed together.

With ``per_group`` (the simulator's ``comm_streams: per-group``, one
stream per process group as NCCL communicators run) the communication
stream is the tensor-parallel group's, and each stage has a second one for
its data-parallel group (the gradient syncs, ZeRO's gathers and
reduce-scatters, the optimizer's all-gathers: :meth:`Timeline.comm_on`
without ``tp``, :meth:`Timeline.chain`), and each pair of stages one for
the tied embedding's all-reduce (:meth:`Timeline.comm` over several
stages): they run beside the tensor-parallel collectives and do not delay
them. Their spans are counted with the communication in
:func:`.time_split.stage_breakdown`. A record (:meth:`Timeline.since`) then
holds the stage's data-parallel stream too; a task that put an item on a
tied embedding's stream records nothing.

With ``stream_order`` (the simulator's ``comm_order: stream``,
:mod:`distsim.sim.launch_queue`) a collective or transfer starts no
earlier than the end of the compute its devices issued before it: items
are added in each stage's program order, so that is the stage's compute
stream's end when the item is added (:meth:`Timeline.issued`, which every
communication item goes through). Under an engine that waits for its
pipeline transfers (``p2p: synchronous`` / ``separate``) what a stage
issues after a group of them waits for it (:mod:`.p2p_groups`).

Items are added in program order, and an item can only depend on items
added before it, so the order of addition is an order in which every item
can be settled: :class:`Timeline` gives each item its start and end as it
is added (no graph is kept, no event queue is needed, and nothing can
deadlock). An item is then just its end time: what later items depend on
is the latest end among their dependencies (``ready``, 0.0 for none).
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from .p2p_groups import TransferGroups
from .spans import Run, shifted, spans

COMPUTE, COMM = 0, 1


class Timeline:
    """Two streams per stage (``2 * stage + COMPUTE`` and ``+ COMM``),
    settled as items are added, with what :func:`.time_split.stage_breakdown` needs
    kept per stage."""

    def __init__(self, stages: int, per_group: bool = False, stream_order: bool = False,
                 p2p: str = "async") -> None:
        self.stages = stages
        self.per_group = per_group
        self.stream_order = stream_order
        #: the simulator's ``p2p``: None for ``async``
        self.groups = None if p2p == "async" else TransferGroups(p2p == "synchronous")
        # per_group: the data-parallel group's stream of each stage, the
        # tied embedding's of each pair of stages, and per stage the spans
        # of both (in no order: unioned with the others when counted)
        self.dp_free: List[float] = [0.0] * stages
        self.emb_free: Dict[Tuple[int, ...], float] = {}
        self.emb_items = 0      # how many items the tied embeddings' streams took
        self.group_starts: List[List[float]] = [[] for _ in range(stages)]
        self.group_ends: List[List[float]] = [[] for _ in range(stages)]
        # ... and those of replayed records, (starts, ends, origin) each:
        # the spans are made when counted, a numpy call per record
        self.group_runs: List[List[Tuple[np.ndarray, np.ndarray, float]]] = \
            [[] for _ in range(stages)]
        # a span starting where the list's last ends extends it (the same
        # union), but not one listed before a :meth:`mark`: per stage, how
        # many of its spans are sealed so (see :attr:`sealed`)
        self.group_sealed: List[int] = [0] * stages
        self.free: List[float] = [0.0] * (2 * stages)   # end of each stream's last item
        self.end = 0.0                                  # the latest end of any item
        # per stage: the spans (start, start + busy) of its compute items, the
        # tensor-parallel waits inside them, and the spans of its
        # communication-only items, each in stream order (starts and ends
        # apart)
        self.compute_starts: List[List[float]] = [[] for _ in range(stages)]
        self.compute_ends: List[List[float]] = [[] for _ in range(stages)]
        self.waits: List[float] = [0.0] * stages
        self.comm_starts: List[List[float]] = [[] for _ in range(stages)]
        self.comm_ends: List[List[float]] = [[] for _ in range(stages)]
        # the lengths of those spans, summed as they come (as a sum over the
        # list would, in the same order)
        self.busy: List[float] = [0.0] * stages
        self.comm_s: List[float] = [0.0] * stages
        # of comm_s, the tensor-parallel collectives emitted as items of
        # their own (the op-by-op backward's), not as waits in compute; of
        # waits, those of single items holding the communication stream
        # (:meth:`compute`: ZeRO 2/3's reduce-scatters that a micro-batch's
        # accumulation waits for), not of a task's tensor-parallel pieces
        self.tp_items: List[float] = [0.0] * stages
        self.sync_waits: List[float] = [0.0] * stages
        # point-to-point queues: the end of the last transfer from one stage
        # to another (each direction its own queue), and per stage the spans
        # of its transfers (those with its two neighbours, and the two ways
        # to one, may overlap each other and the collectives)
        self.p2p_free: Dict[Tuple[int, int], float] = {}
        self.p2p_starts: List[List[float]] = [[] for _ in range(stages)]
        self.p2p_ends: List[List[float]] = [[] for _ in range(stages)]
        #: under the flow network, the transfers placed so far, timed
        #: together where they share links (:mod:`.shared_links`); None:
        #: each alone, as the analytical network times them
        self.links: Optional[Any] = None
        # runs of spans replayed whole (:meth:`replay`), per stage and
        # stream, in stream order: each run's place among the spans in the
        # lists above (how many were there before it), its record's starts
        # and ends relative to its origin, and the origin; the spans are
        # made when asked for (:func:`.spans.spans`), a numpy call per record
        self.compute_runs: List[List[Run]] = [[] for _ in range(stages)]
        self.comm_runs: List[List[Run]] = [[] for _ in range(stages)]
        # a span that starts where the stream's last one ends extends it
        # (most of a backward's compute runs back to back: a third of the
        # spans to keep and to sweep in :func:`.time_split.stage_breakdown`), but not
        # one listed before a :meth:`mark` (a record starts there) or a
        # replayed run (its spans come after the lists' last): per stream,
        # how many spans of its list are sealed so. (Each method that adds
        # spans applies this rule inline: four lines, on the hottest path,
        # where a call per item would cost more than the rule.)
        self.sealed: List[int] = [0] * (2 * stages)

    def copy(self) -> "Timeline":
        """An independent copy (to continue two walks from a shared prefix)."""
        t = Timeline.__new__(Timeline)
        t.stages, t.free, t.end = self.stages, list(self.free), self.end
        t.per_group, t.dp_free, t.emb_free = self.per_group, list(self.dp_free), \
            dict(self.emb_free)
        t.stream_order = self.stream_order
        t.groups = None if self.groups is None else self.groups.copy()
        t.emb_items = self.emb_items
        t.group_starts = [list(x) for x in self.group_starts]
        t.group_ends = [list(x) for x in self.group_ends]
        t.group_runs = [list(x) for x in self.group_runs]     # records shared: never changed
        t.group_sealed = list(self.group_sealed)
        t.compute_starts = [list(x) for x in self.compute_starts]
        t.compute_ends = [list(x) for x in self.compute_ends]
        t.waits = list(self.waits)
        t.comm_starts = [list(x) for x in self.comm_starts]
        t.comm_ends = [list(x) for x in self.comm_ends]
        t.busy, t.comm_s = list(self.busy), list(self.comm_s)
        t.tp_items, t.sync_waits = list(self.tp_items), list(self.sync_waits)
        t.p2p_free = dict(self.p2p_free)
        t.p2p_starts = [list(x) for x in self.p2p_starts]
        t.p2p_ends = [list(x) for x in self.p2p_ends]
        t.links = None if self.links is None else self.links.copy()
        t.compute_runs = [list(x) for x in self.compute_runs]     # records shared: never changed
        t.comm_runs = [list(x) for x in self.comm_runs]
        t.sealed = list(self.sealed)
        return t

    def issued(self, stages: Sequence[int], ready: float) -> float:
        """When a communication item on ``stages`` that may start at
        ``ready`` is issued: with ``stream_order``, no earlier than each
        stage's compute stream's end (the compute issued before it; the
        collective's stream waits on it, as ProcessGroupNCCL's
        ``syncStreams`` makes it), else ``ready``."""
        if self.stream_order:
            free = self.free
            for stage in stages:
                if free[2 * stage] > ready:
                    ready = free[2 * stage]
        return ready

    def compute(self, stage: int, time_s: float, ready: float = 0.0,
                busy_s: Optional[float] = None, holds_comm: bool = False) -> float:
        """A run of compute on ``stage`` (``holds_comm``: with
        tensor-parallel collectives inside, holding the communication stream
        too; ``busy_s`` of its ``time_s`` computes, the rest waits) that may
        start at ``ready``; returns its end."""
        free = self.free
        s = 2 * stage
        start = free[s] if free[s] > 0.0 else 0.0
        if holds_comm and free[s + 1] > start:
            start = free[s + 1]
        if ready > start:
            start = ready
        end = start + time_s
        free[s] = end
        if holds_comm:
            free[s + 1] = end
        if end > self.end:
            self.end = end
        busy = time_s if busy_s is None else busy_s
        busy_end = start + busy
        ends = self.compute_ends[stage]
        if len(ends) > self.sealed[s] and ends[-1] == start:
            ends[-1] = busy_end
        else:
            self.compute_starts[stage].append(start)
            ends.append(busy_end)
        self.busy[stage] += busy_end - start
        if holds_comm:
            self.waits[stage] += time_s - busy
            self.sync_waits[stage] += time_s - busy
        return end

    def compute_pieces(self, stage: int, pieces: Sequence[Tuple[float, Optional[float], bool]],
                       ready: float) -> float:
        """:meth:`compute` of each piece ``(time, busy time, holds the
        communication stream)`` in turn, the first from ``ready``, each
        from the end of the one before (a task's compute items); returns
        the last end."""
        # compute()'s body, inlined (the hottest loop of a sweep): the same
        # operations in the same order, so the same sums to the bit
        free = self.free
        s = 2 * stage
        starts, ends = self.compute_starts[stage], self.compute_ends[stage]
        busy_sum, waits, latest = self.busy[stage], self.waits[stage], self.end
        sealed = self.sealed[s]
        end = ready
        for time_s, busy_s, holds_comm in pieces:
            start = free[s] if free[s] > 0.0 else 0.0
            if holds_comm and free[s + 1] > start:
                start = free[s + 1]
            if end > start:
                start = end
            end = start + time_s
            free[s] = end
            if holds_comm:
                free[s + 1] = end
            if end > latest:
                latest = end
            busy = time_s if busy_s is None else busy_s
            busy_end = start + busy
            if len(ends) > sealed and ends[-1] == start:
                ends[-1] = busy_end
            else:
                starts.append(start)
                ends.append(busy_end)
            busy_sum += busy_end - start
            if holds_comm:
                waits += time_s - busy
        self.end = latest
        self.busy[stage], self.waits[stage] = busy_sum, waits
        return end

    def compute_each(self, stage: int, times: Sequence[float], readies: Sequence[float]
                     ) -> None:
        """:meth:`compute` of ``times[i]`` from ``readies[i]``, for each i in
        turn, on the compute stream alone (the optimizer's updates of a
        stage's parameters, each from when its gradient is synchronised)."""
        free = self.free
        s = 2 * stage
        starts, ends = self.compute_starts[stage], self.compute_ends[stage]
        busy_sum, latest = self.busy[stage], self.end
        sealed = self.sealed[s]
        for time_s, ready in zip(times, readies):
            start = free[s] if free[s] > 0.0 else 0.0
            if ready > start:
                start = ready
            end = start + time_s
            free[s] = end
            if end > latest:
                latest = end
            if len(ends) > sealed and ends[-1] == start:
                ends[-1] = end
            else:
                starts.append(start)
                ends.append(end)
            busy_sum += end - start
        self.end = latest
        self.busy[stage] = busy_sum

    def chain(self, stage: int, items: Sequence[Sequence[Tuple[bool, float]]],
              readies: Sequence[float]) -> None:
        """Chains of items on ``stage``, chain ``i`` from ``readies[i]``,
        each item ``(on the communication stream, time)`` from the end of
        the one before it: :meth:`compute` (no waits inside) or
        :meth:`comm_on` of each item in turn (the optimizer of ZeRO 1/2,
        a parameter's chain: its update, the all-gather of the new
        parameter, the reshape after it; thousands per step, so the two
        methods' bodies inlined: the same operations in the same order).
        The streams' free times are kept in locals while the chains run
        (nothing else reads them meanwhile); a chain's ends only grow
        (times are not negative), so the step's end is checked once per
        chain, at its last; a stream's last span is open to extension once
        this call has added one (the sealed ones come before)."""
        free = self.free
        s, m = 2 * stage, 2 * stage + 1
        c_starts, c_ends = self.compute_starts[stage], self.compute_ends[stage]
        m_starts, m_ends = self.comm_starts[stage], self.comm_ends[stage]
        c_open, m_open = len(c_ends) > self.sealed[s], len(m_ends) > self.sealed[m]
        busy, comm_s, latest = self.busy[stage], self.comm_s[stage], self.end
        free_c, free_m = free[s], free[m]
        per_group, stream_order = self.per_group, self.stream_order
        for chain, end in zip(items, readies):
            for on_comm, time_s in chain:
                if not on_comm:
                    start = free_c if free_c > 0.0 else 0.0
                    if end > start:
                        start = end
                    end = free_c = start + time_s
                    if c_open and c_ends[-1] == start:
                        c_ends[-1] = end
                    else:
                        c_starts.append(start)
                        c_ends.append(end)
                        c_open = True
                    busy += end - start
                elif per_group:      # the all-gather, on the data-parallel stream
                    free[s] = free_c     # what it is issued behind (stream order)
                    end = self.comm_on(stage, time_s, end)
                else:
                    if stream_order and free_c > end:   # as :meth:`issued`
                        end = free_c
                    start = free_m if free_m > 0.0 else 0.0
                    if end > start:
                        start = end
                    end = free_m = start + time_s
                    if m_open and m_ends[-1] == start:
                        m_ends[-1] = end
                    else:
                        m_starts.append(start)
                        m_ends.append(end)
                        m_open = True
                    comm_s += end - start
            if chain and end > latest:
                latest = end
        free[s], free[m] = free_c, free_m
        self.end = latest
        self.busy[stage], self.comm_s[stage] = busy, comm_s

    def comm(self, stages: Sequence[int], time_s: float, ready: float = 0.0) -> float:
        """A collective on the communication streams of ``stages`` that may
        start at ``ready``; returns its end."""
        if len(stages) == 1:
            return self.comm_on(stages[0], time_s, ready)
        ready = self.issued(stages, ready)
        if self.per_group:
            return self._on_embedding(tuple(sorted(set(stages))), time_s, ready)
        free = self.free
        start = 0.0
        for stage in stages:
            if free[2 * stage + 1] > start:
                start = free[2 * stage + 1]
        if ready > start:
            start = ready
        end = start + time_s
        if end > self.end:
            self.end = end
        for stage in dict.fromkeys(stages):
            free[2 * stage + 1] = end
            ends = self.comm_ends[stage]
            if len(ends) > self.sealed[2 * stage + 1] and ends[-1] == start:
                ends[-1] = end
            else:
                self.comm_starts[stage].append(start)
                ends.append(end)
            self.comm_s[stage] += end - start
        return end

    def comm_on(self, stage: int, time_s: float, ready: float = 0.0, tp: bool = False) -> float:
        """:meth:`comm` on one stage's communication stream (most of them:
        gradient syncs, ZeRO gathers, tensor-parallel collectives: ``tp``;
        with ``per_group`` the others on the data-parallel stream)."""
        free = self.free
        if self.stream_order and free[2 * stage] > ready:     # :meth:`issued`, one stage
            ready = free[2 * stage]
        if not tp and self.per_group:
            # the data-parallel stream (per stage: every reduce-scatter
            # and gradient sync of a backward, ZeRO-3's gathers)
            start = self.dp_free[stage]
            end = self.dp_free[stage] = self._group_item((stage,), start if start > ready
                                                         else ready, time_s)
            return end
        s = 2 * stage + 1
        start = free[s] if free[s] > 0.0 else 0.0
        if ready > start:
            start = ready
        end = start + time_s
        if end > self.end:
            self.end = end
        free[s] = end
        ends = self.comm_ends[stage]
        if len(ends) > self.sealed[s] and ends[-1] == start:
            ends[-1] = end
        else:
            self.comm_starts[stage].append(start)
            ends.append(end)
        self.comm_s[stage] += end - start
        if tp:
            self.tp_items[stage] += end - start
        return end

    def _on_embedding(self, stages: Tuple[int, ...], time_s: float, ready: float) -> float:
        """``per_group``: a collective on the tied embedding's stream of
        ``stages``; returns its end."""
        start = self.emb_free.get(stages, 0.0)
        end = self.emb_free[stages] = self._group_item(stages, start if start > ready else ready,
                                                       time_s)
        self.emb_items += 1
        return end

    def _group_item(self, stages: Tuple[int, ...], start: float, time_s: float) -> float:
        """``per_group``: an item from ``start`` on a stream of a group of
        ``stages`` (the data-parallel one of a stage, a tied embedding's),
        its span listed for each; returns its end."""
        end = start + time_s
        if end > self.end:
            self.end = end
        for stage in stages:
            ends = self.group_ends[stage]
            if len(ends) > self.group_sealed[stage] and ends[-1] == start:
                ends[-1] = end
            else:
                self.group_starts[stage].append(start)
                ends.append(end)
        return end

    def p2p_chain(self, a: int, b: int, times: Sequence[float], ready: float,
                  arrived: float, sizes: Sequence[float] = (), key: Any = None) -> float:
        """Pipeline sends/receives between stages ``a != b``, one of each of
        ``times`` after another (a task's outputs), on the point-to-point
        queue from ``a`` to ``b`` (not behind the collectives, nor behind
        the transfers the other way, as in the simulator), the first from
        ``ready``; returns the latest of ``arrived`` and their ends. With
        :attr:`links` (the flow network) each is placed there with its
        bytes (``sizes``) and receiving task (``key``), sharing links with
        the transfers placed before it (:mod:`.shared_links`)."""
        pair = (a, b)
        groups = self.groups
        if groups is not None:          # behind the stages' compute or open groups
            at_a, at_b = groups.issued(self, a), groups.issued(self, b)
            ready = max(ready, at_a, at_b)
        elif self.stream_order:         # :meth:`issued`, the two stages
            free = self.free
            if free[2 * a] > ready:
                ready = free[2 * a]
            if free[2 * b] > ready:
                ready = free[2 * b]
        p2p_free = self.p2p_free
        start = p2p_free.get(pair, 0.0)
        starts_a, ends_a = self.p2p_starts[a], self.p2p_ends[a]
        starts_b, ends_b = self.p2p_starts[b], self.p2p_ends[b]
        links = self.links
        for i, time_s in enumerate(times):
            if ready > start:
                start = ready
            end = start + time_s if links is None else \
                links.place(self, a, b, start, time_s, sizes[i], key)
            p2p_free[pair] = end
            if end > self.end:
                self.end = end
            starts_a.append(start)
            ends_a.append(end)
            starts_b.append(start)
            ends_b.append(end)
            if end > arrived:
                arrived = end
            start = end
        if groups is not None and times:
            groups.waited(self, a, at_a, start)
            groups.waited(self, b, at_b, start)
        return arrived

    def run(self) -> float:
        """The step time: the last end."""
        return self.end

    # -- recorded tasks ------------------------------------------------------
    def mark(self, stage: int) -> tuple:
        """Where ``stage``'s streams stand now, for :meth:`since` (the spans
        listed so far sealed: a record starts after them)."""
        self.sealed[2 * stage] = len(self.compute_starts[stage])
        self.sealed[2 * stage + 1] = len(self.comm_starts[stage])
        self.group_sealed[stage] = len(self.group_starts[stage])
        return (len(self.compute_runs[stage]), len(self.comm_runs[stage]),
                len(self.compute_starts[stage]), len(self.comm_starts[stage]),
                self.busy[stage], self.waits[stage], self.comm_s[stage], self.tp_items[stage],
                self.sync_waits[stage], self.free[2 * stage], self.free[2 * stage + 1],
                len(self.group_starts[stage]), self.dp_free[stage], self.emb_items,
                len(self.group_runs[stage]))

    def idle_by(self, stage: int, at: float) -> bool:
        """Whether ``stage``'s communication streams (the tensor-parallel
        one, and per group the data-parallel one) are done by ``at``: a
        task starting there then depends only on where it starts (a
        :meth:`since` record of it stands for the next)."""
        return self.free[2 * stage + 1] <= at and self.dp_free[stage] <= at

    def since(self, stage: int, mark: tuple, origin: float, with_runs: bool = False
              ) -> Optional[tuple]:
        """What ``stage``'s streams gained since ``mark`` (one task's items),
        relative to ``origin``, for :meth:`replay`; where a run was
        replayed in between (the items are not all at the ends of its
        lists), None, or with ``with_runs`` the spans of the lists and the
        runs in stream order (:func:`.spans.spans`: the floats the time split
        would read). A stream the task did not touch keeps its end where it
        is replayed (None in the record). Under ``per_group`` the record
        holds the stage's data-parallel stream too (its spans and end, or
        None without), and a task that put an item on a tied embedding's
        stream gives None."""
        (runs, comm_runs, nc, nm, busy, waits, comm_s, tp_items, sync_waits,
         free_c, free_m, ng, free_g, emb, group_runs) = mark
        group = None
        if self.per_group:
            if self.emb_items != emb:
                return None
            gs = np.asarray(self.group_starts[stage][ng:], dtype=float)
            ge = np.asarray(self.group_ends[stage][ng:], dtype=float)
            runs_g = self.group_runs[stage][group_runs:]
            if runs_g:      # replayed in between (in no order: any will do)
                gs = np.concatenate((gs, shifted(runs_g, 0)))
                ge = np.concatenate((ge, shifted(runs_g, 1)))
            group = (gs - origin, ge - origin,
                     None if self.dp_free[stage] == free_g else self.dp_free[stage] - origin)
        c_runs, m_runs = self.compute_runs[stage], self.comm_runs[stage]
        cs, ce = self.compute_starts[stage][nc:], self.compute_ends[stage][nc:]
        ms, me = self.comm_starts[stage][nm:], self.comm_ends[stage][nm:]
        if runs != len(c_runs) or comm_runs != len(m_runs):
            if not with_runs:
                return None
            cs, ce = spans([(at - nc, *rest) for at, *rest in c_runs[runs:]], cs, ce)
            ms, me = spans([(at - nm, *rest) for at, *rest in m_runs[comm_runs:]], ms, me)
        s = 2 * stage
        return (np.asarray(cs, dtype=float) - origin, np.asarray(ce, dtype=float) - origin,
                np.asarray(ms, dtype=float) - origin, np.asarray(me, dtype=float) - origin,
                (self.busy[stage] - busy, self.waits[stage] - waits, self.comm_s[stage] - comm_s,
                 self.tp_items[stage] - tp_items, self.sync_waits[stage] - sync_waits),
                (None if self.free[s] == free_c else self.free[s] - origin,
                 None if self.free[s + 1] == free_m else self.free[s + 1] - origin), group)

    def replay(self, stage: int, record: tuple, origin: float) -> None:
        """The items of a :meth:`since` record again on ``stage``, from
        ``origin``: the same items shifted (to rounding), for a task whose
        items depend only on where it starts."""
        c_starts, c_ends, m_starts, m_ends, sums, (free_c, free_m), group = record
        # after the stream's spans so far; made when asked for (a replay
        # adds hundreds of spans: neither a Python float each nor a numpy
        # call per replay)
        if len(c_starts):
            at = self.sealed[2 * stage] = len(self.compute_starts[stage])
            self.compute_runs[stage].append((at, c_starts, c_ends, origin))
        if len(m_starts):
            at = self.sealed[2 * stage + 1] = len(self.comm_starts[stage])
            self.comm_runs[stage].append((at, m_starts, m_ends, origin))
        busy, waits, comm_s, tp_items, sync_waits = sums
        self.busy[stage] += busy
        # (a sum a record did not add to is left as it is: adding 0.0
        # changes no sum here, none being -0.0)
        if waits:
            self.waits[stage] += waits
        if comm_s:
            self.comm_s[stage] += comm_s
        if tp_items:
            self.tp_items[stage] += tp_items
        if sync_waits:
            self.sync_waits[stage] += sync_waits
        s = 2 * stage
        free = self.free
        if free_c is not None:
            free[s] = origin + free_c
        if free_m is not None:
            free[s + 1] = origin + free_m
        # each stream's last item ends last
        end = free[s] if free[s] > free[s + 1] else free[s + 1]
        if group is not None:
            # per group: the data-parallel stream's spans (in no order:
            # unioned with the others when counted)
            g_starts, g_ends, free_g = group
            if len(g_starts):
                self.group_runs[stage].append((g_starts, g_ends, origin))
            if free_g is not None:
                self.dp_free[stage] = origin + free_g
                if self.dp_free[stage] > end:
                    end = self.dp_free[stage]
        if end > self.end:
            self.end = end
