"""What the parts of a lowered step share: the strategy, which ranks of
the mesh the program holds, which stage each parameter lives on, the
step's tasks, the emitter and the values each rank has so far.
:class:`~distsim.transforms.spmd.LowerSPMD` makes one
:class:`LoweringContext` per step and hands it to the parts it delegates
to (gradient sync, ZeRO-3 gathers, bundled gradient buffers), which read
what they need from it rather than the whole lowering."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Set, Tuple

from ..ir.comm import CollectiveType
from ..ir.core import Op, Value
from .emitter import Emitter
from .strategy import Strategy

#: A task of the step: (kind "F", "B" or "W", chunk)
TaskKey = Tuple[str, int]


class RankPlacement:
    """Which ranks of the ``dp x pp x tp`` mesh are in the program: all of
    them, or with ``representatives`` one per pipeline stage (data- and
    tensor-parallel rank 0), whose peers run the same ops; ``keep_dp``
    representatives per stage (data-parallel ranks ``0 .. keep_dp - 1``)
    where the program passes values between those (a ring attention's
    context-parallel ranks: a rank's peers would not mirror its receives)."""

    def __init__(self, strategy: Strategy, representatives: bool, keep_dp: int = 1) -> None:
        self.strategy = strategy
        self.representatives = representatives
        self.keep_dp = keep_dp
        self.reps: Set[int] = {strategy.rank(d, s, 0) for s in range(strategy.pp)
                               for d in range(keep_dp)}
        self._groups: Dict[int, List[Tuple[int, int, int]]] = {}
        self._tp_teams: Dict[Tuple[int, int], tuple] = {}

    def present(self, rank: int) -> bool:
        return not self.representatives or rank in self.reps

    def dp_indices(self) -> range:
        """Data-parallel ranks whose ops are in the program."""
        return range(self.keep_dp) if self.representatives else range(self.strategy.dp)

    def tp_indices(self) -> range:
        """Tensor-parallel ranks whose ops are in the program."""
        return range(1) if self.representatives else range(self.strategy.tp)

    def group(self, stage: int) -> List[Tuple[int, int, int]]:
        """(dp rank, tp rank, global rank) of a pipeline stage's ranks in the
        program (only the representative in a reduced program)."""
        g = self._groups.get(stage)
        if g is None:
            g = self._groups[stage] = [(d, t, self.strategy.rank(d, stage, t))
                                       for d in self.dp_indices() for t in self.tp_indices()]
        return g

    def tp_team(self, d: int, stage: int) -> Tuple[Tuple[int, ...], Tuple[Tuple[int, bool], ...]]:
        """The tensor-parallel team of data-parallel rank ``d`` on ``stage``,
        and each member with whether it is in the program (once per team)."""
        team = self._tp_teams.get((d, stage))
        if team is None:
            ranks = tuple(self.strategy.rank(d, stage, t) for t in range(self.strategy.tp))
            team = self._tp_teams[(d, stage)] = (ranks,
                                                 tuple((r, self.present(r)) for r in ranks))
        return team

    def stands_for(self) -> Dict[int, List[int]]:
        """The ranks each representative stands for: those of its stage and
        of its data-parallel rank modulo ``keep_dp`` (every tensor-parallel rank)."""
        S = self.strategy
        return {S.rank(k, s, 0): sorted(S.rank(d, s, t) for d in range(k, S.dp, self.keep_dp)
                                        for t in range(S.tp))
                for s in range(S.pp) for k in range(self.keep_dp)}

    def dp_team(self, stage: int, t: int) -> List[int]:
        """The data-parallel team of tensor-parallel rank ``t`` on ``stage``."""
        S = self.strategy
        return [S.rank(d, stage, t) for d in range(S.dp)]

    def sync_teams(self, stage: int, expert: bool) -> List[List[int]]:
        """The teams that synchronise a parameter's gradients on ``stage``:
        per tensor-parallel rank its data-parallel team, or for an
        expert's weights (``expert``) each expert-data-parallel team
        (:meth:`~.strategy.Strategy.edp_team`) with a member in the program."""
        if not expert:
            return [self.dp_team(stage, t) for t in self.tp_indices()]
        S = self.strategy
        shards = range(1) if self.representatives else range(S.ep)
        return [[S.rank(d, stage, t) for d in S.edp_team(e)]
                for t in self.tp_indices() for e in shards]

    def dp_blocks(self, stage: int, size: int) -> List[Tuple[Tuple[int, int, int], ...]]:
        """The groups of ``size`` consecutive data-parallel ranks of ``stage``
        (the expert-parallel groups, :meth:`~.strategy.Strategy.ep_team`; the
        context-parallel groups, the data-parallel axis counting ``dp x cp``
        ranks) with a member in the program, for each tensor-parallel rank:
        each member as (dp rank, tp rank, global rank)."""
        S = self.strategy
        firsts = sorted({d - d % size for d in self.dp_indices()})
        return [tuple((d, t, S.rank(d, stage, t)) for d in range(first, first + size))
                for t in self.tp_indices() for first in firsts]


@dataclass
class StepTasks:
    """The one-device step cut into tasks: each task's ops, the producer of
    every value, each op's task, the values read by another chunk (and
    by which), and ZeRO-3's layers of each task with the parameters each
    reads first in it."""

    task_ops: Dict[TaskKey, List[Op]]
    producer_of: Dict[Value, Op]
    task_of_op: Dict[int, TaskKey]
    crossing: Dict[Value, Set[int]]
    task_layer_params: Dict[TaskKey, List[Tuple[int, List[Value]]]]


@dataclass
class LoweringContext:
    """One step's lowering as its parts see it (see the module docstring).
    ``values[(rank, micro-batch)]`` maps template values to the local
    values emitted so far; ``kind`` is the kind of the task being emitted."""

    strategy: Strategy
    microbatches: int
    placement: RankPlacement
    emitter: Emitter
    params: List[Value]
    param_stage: Dict[Value, int]
    grad_of: Dict[Value, Value]
    tasks: StepTasks
    stage_of_chunk: Callable[[int], int]
    #: the experts' stacked weights, shared out over expert-parallel groups
    expert: Set[Value] = field(default_factory=set)
    values: Dict[Tuple[int, int], Dict[Any, Value]] = field(default_factory=dict)
    kind: str = "F"
    #: in-place updates, old value name -> new (``meta["updates"]``), and
    #: the same as (old, new) values in the order made (for the build log)
    updates: Dict[str, str] = field(default_factory=dict)
    updated: List[Tuple[Value, Value]] = field(default_factory=list)

    def env(self, rank: int, microbatch: int) -> Dict[Any, Value]:
        """The values of ``microbatch`` on ``rank`` (template value -> local)."""
        env = self.values.get((rank, microbatch))
        if env is None:
            env = self.values[(rank, microbatch)] = {}
        return env

    def note_update(self, old: Value, new: Value) -> None:
        """``new`` is ``old`` updated in place."""
        self.updates[old.name] = new.name
        self.updated.append((old, new))

    def dp_collective(self, kind: CollectiveType, stage: int, name: str,
                      local: Callable[[int], Optional[Value]], meta: Dict[str, Any],
                      expert: bool = False, **attrs: Any) -> Dict[int, Value]:
        """One ``kind`` collective over the dp ranks of each tensor-parallel
        rank of ``stage`` (``local(rank)``: its input, None where the rank
        is not in the program), results named ``{name}_r{rank}``; per rank,
        its result (its input unchanged with dp 1). ``expert``: over the
        expert-data-parallel teams instead (an expert's weights). The ZeRO
        gathers and reduce-scatters all go through here."""
        out = {}
        for ranks in self.placement.sync_teams(stage, expert):
            ins: Sequence[Optional[Value]] = [local(r) for r in ranks]
            if len(ranks) > 1:
                ins = self.emitter.collective(kind, ins, ranks, [f"{name}_r{r}" for r in ranks],
                                              meta, **attrs)
            out.update({r: x for r, x in zip(ranks, ins) if x is not None})
        return out
