"""Collectives that always run alone, simulated without events.

A team's collectives run one after another: each member's queue of the
team's group (:mod:`.comm_queues`; or its one ``comm`` stream, under
``comm_streams: shared``) takes them in program order, and a collective
starts only when every member has reached it, so the next one of the same
team starts after the previous one ended. A pair's send/recvs one way run on a queue of
their own (one per direction of a pair of ranks), beside the comm stream, so they form a team of
their own (:func:`team_key`): a send/recv and an all-reduce of the same two
ranks can run at once, and share links. When no other team's collective
uses any link that a team's collectives use, each of them therefore runs on
links nobody else touches while it runs: it takes exactly the time it
takes alone, every time. The simulator then needs no events for it: when
its last member arrives, its end is that time plus its solo duration
(:func:`solo_run`, once per distinct collective: the run alone of
:func:`.solo_time.run_alone`, whose time :func:`.solo_time.collective_time`
gives), its outputs are announced with that end time, and its link
statistics are added in bulk at the end of the run.

In a training step that is most collectives: a tensor-parallel group's
all-reduces inside one server, a data-parallel group's gradient all-reduces
when nothing else crosses the same links.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, FrozenSet, Iterable, Optional, Set, Tuple, Union

from ..ir.comm import CollectiveType
from .collectives import planned_schedule
from .network import Network
from .solo_time import run_alone

#: (kind, team, root, bytes, algorithm) of one collective
Plan = Tuple[CollectiveType, Tuple[int, ...], Optional[int], float, str]


@dataclass(frozen=True)
class SoloRun:
    """How one collective runs alone: its duration, the algorithm used, per
    link ``(src, dst, bytes, busy seconds, peak flows)``, and (when link use
    over time is recorded) its link samples ``(src, dst, time from its
    start, utilisation)``."""

    duration_s: float
    algorithm: str
    links: Tuple[Tuple[str, str, float, float, int], ...]
    samples: Tuple[Tuple[str, str, float, float], ...] = ()


#: a team as the queues see it: (on a point-to-point queue?, its ranks:
#: source and destination in order for a send/recv)
TeamKey = Tuple[bool, Union[Tuple[int, ...], FrozenSet[int]]]


def team_key(plan: Plan) -> TeamKey:
    """The team whose collectives run one after another: the ranks, and
    whether they are a send/recv (on its direction's own p2p queue: its
    ranks in order, source first) or another collective (on the queue of
    the group of these ranks). Two collectives of one key never overlap; of
    two keys they may, even over the same ranks."""
    if plan[0] is CollectiveType.SEND_RECV:
        return True, tuple(plan[1])
    return False, frozenset(plan[1])


def solo_teams(network: Network, plans: Iterable[Plan]) -> Set[TeamKey]:
    """The teams (:func:`team_key`) whose collectives share no link with
    any other team's collectives among ``plans``: in the analytical model
    (without link-use samples), every team. That model shares nothing (a
    step takes its slowest flow's latency + bytes / bottleneck whatever else
    runs), so no routes need comparing (O(p) per distinct collective,
    seconds at 16k GPUs); only its samples sum concurrent transfers per
    link, which a solo run's replay would not. Each plan is checked either
    way (a bad team raises)."""
    teams_on: Dict[int, Set[TeamKey]] = {}
    teams: Set[TeamKey] = set()
    shared_nothing = network.mode == "analytical" and not network.record_samples
    for plan in set(plans):
        kind, ranks, root, nbytes, algorithm = plan
        team = team_key(plan)
        teams.add(team)
        _, schedule = planned_schedule(network, kind, ranks, nbytes, root, algorithm)
        if shared_nothing:
            continue
        # a ring's phases repeat the same pairs: each pair's route once
        pairs = {(src, dst) for phase in schedule for src, dst, _ in phase.flows if src != dst}
        for src, dst in pairs:
            for link in network.route_info(src, dst, 0)[0]:
                teams_on.setdefault(link, set()).add(team)
    shared = {team for users in teams_on.values() if len(users) > 1 for team in users}
    return teams - shared


def solo_run(topology, mode: str, plan: Plan, record_samples: bool = False) -> SoloRun:
    """One collective run alone (:func:`.solo_time.run_alone`) and what it
    did to each link."""
    kind, ranks, root, nbytes, algorithm = plan
    net, duration_s, used = run_alone(topology, mode, kind, ranks, nbytes, root, algorithm,
                                      record_samples)
    links = tuple((r.src, r.dst, r.bytes_carried, r.busy_s, r.peak_flows)
                  for r in net.link_records())
    samples = tuple((x.src, x.dst, x.time_s, x.utilisation) for x in net.link_samples())
    return SoloRun(duration_s, used, links, samples)


class SoloLedger:
    """Solo runs by plan, and how many times each was used (for the link
    statistics added at the end)."""

    def __init__(self, topology, mode: str, record_samples: bool = False) -> None:
        self.topology = topology
        self.mode = mode
        self.record_samples = record_samples
        self.runs: Dict[Plan, SoloRun] = {}
        self.uses: Dict[Plan, int] = {}

    def run(self, plan: Plan) -> SoloRun:
        found = self.runs.get(plan)
        if found is None:
            found = self.runs[plan] = solo_run(self.topology, self.mode, plan,
                                               self.record_samples)
        self.uses[plan] = self.uses.get(plan, 0) + 1
        return found

    def sample(self, network: Network, plan: Plan, start_s: float) -> None:
        """Record the link use over time of one solo run started at
        ``start_s``: the scratch run's samples, shifted (nothing else uses
        those links, so they are what the network would have recorded)."""
        network.sample_edges(self.runs[plan].samples, start_s)

    def settle(self, network: Network) -> None:
        """Add the link statistics of every solo run to ``network``."""
        for plan, n in self.uses.items():
            for src, dst, nbytes, busy_s, peak in self.runs[plan].links:
                network.add_edge_stats(src, dst, nbytes * n, busy_s * n, peak)
        self.uses.clear()
