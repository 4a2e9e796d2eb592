"""ZeRO-3's parameters: sharded over the data-parallel ranks and
all-gathered before each use, prefetched, by parameter or by layer (see
:mod:`.zero`'s docstring for the whole protocol; which layers a task
gathers when, and in which groups, is :mod:`.sync_policy`'s
:func:`~.sync_policy.prefetch_window` and :func:`~.sync_policy.layer_gathers`)."""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from ..ir.comm import CollectiveType
from ..ir.core import Op, Value
from .lowering_context import LoweringContext
from .strategy import Strategy
from .sync_policy import layer_gathers, prefetch_window, sync_team

#: ZeRO-3: a gathered parameter takes its shape where it is first used,
#: in a reshape named ``{param}{USE_MARK}{micro-batch}_r{rank}``
#: (:meth:`ParamGathers.param_for_use`): the only op that waits for the gather
#: (by layer, the ``chunk_split`` of the layer's buffer, its results so named)
USE_MARK = "_use_m"


def used_param_name(op: Op) -> Optional[str]:
    """The parameter whose gathered value ``op`` shapes for its first use
    (ZeRO-3), or None for any other op."""
    if op.op_type != "reshape" or USE_MARK not in op.name:
        return None
    return op.name.split(USE_MARK)[0]


class ParamGathers:
    """ZeRO-3's all-gathers of a lowered step's parameters (``param_in``:
    each parameter's shard input per rank), prefetched and gated (see the
    module docstring); a part of :class:`~distsim.transforms.zero.GradientSync`.
    ``strategy``: the sync's (dp 1 where it keeps gradients ``local``: then
    every rank gathers over no team, its parameters whole, as at dp 1)."""

    def __init__(self, ctx: LoweringContext, param_in: Dict[Tuple[Value, int], Value],
                 strategy: Optional[Strategy] = None) -> None:
        self.ctx = ctx
        self.strategy = ctx.strategy if strategy is None else strategy
        self.param_in = param_in
        #: (parameter, task kind, micro-batch, stage) whose gathers are issued
        self.gathered: set = set()
        #: per rank, the latest compute result emitted (a gather's gate)
        self.last_out: Dict[int, Value] = {}
        # the task whose gathers are being issued, and per rank the inputs
        # it received from another stage (gates of its first gathers)
        self._task: Optional[Tuple[str, int, int, int]] = None
        self._received: Dict[int, List[Value]] = {}
        self._crossing_in: Dict[Tuple[str, int, int], List[Value]] = {}

    def note_layer_output(self, rank: int, value: Value) -> None:
        """``value`` is the latest compute result emitted on ``rank``."""
        self.last_out[rank] = value

    def enter_layer(self, stage: int, mb: int, kind: str, chunk: int, layer: int) -> None:
        """A task of ``stage`` starts ``layer``: issue the all-gathers of
        this layer (unless prefetched) and of the next ``prefetch`` layers
        of the task, before the layer's compute in program order."""
        S = self.strategy
        if S.zero != 3:
            return
        order = self.ctx.tasks.task_layer_params.get((kind, chunk), [])
        layers = [entry[0] for entry in order]
        if layer not in layers:
            return
        task = (kind, mb, chunk, stage)
        if task != self._task:
            # the task's first layer: nothing of it has computed yet
            self._task = task
            self._received = self._task_inputs(stage, mb, kind, chunk)
        for j in prefetch_window(layers.index(layer), len(order), S.prefetch):
            ahead, params = order[j]
            # an expert's weights gather over their expert-data-parallel team:
            # units of their own
            todo = [p for p in params if (p, kind, mb, stage) not in self.gathered]
            for group, _ in layer_gathers([p.type.numel for p in todo],
                                          [p in self.ctx.expert for p in todo], S):
                if len(group) > 1:
                    self._gather_unit([todo[i] for i in group], stage, mb, kind, ahead)
                else:
                    self._gather(todo[group[0]], stage, mb, kind, ahead)
        self._received = {}

    def team_size(self, p: Value) -> int:
        """The ranks ``p`` is sharded over: dp, or dp / ep for an expert's weights."""
        return sync_team(self.strategy, p in self.ctx.expert)

    def _gates(self, shard: Value, r: int, name: str, meta: Dict[str, Any]) -> Value:
        """``shard`` gated on the compute emitted so far on ``r`` and on the
        inputs the task has received from another stage (a prefetched
        gather starts no earlier)."""
        em = self.ctx.emitter
        token = self.last_out.get(r)
        if token is not None:
            # not before the compute that precedes this point ends
            shard = em.one("depend", [shard, token], None, f"{name}_gate_r{r}",
                           dict(meta, detail="zero3 prefetch gate"))
        for got in self._received.get(r, ()):
            # nor before the task has its inputs from another stage
            shard = em.one("depend", [shard, got], None, f"{name}_gate_r{r}",
                           dict(meta, detail="zero3 prefetch gate"))
        return shard

    def _gather_unit(self, params: Sequence[Value], stage: int, mb: int, kind: str,
                     layer: Any) -> None:
        """All-gather a layer's parameters in one collective (FSDP's unit):
        each rank concatenates its shards (FSDP2's copy-in), the ranks
        all-gather the buffer, and the first use of any of them splits it
        into the parameters (the copy-out, :meth:`param_for_use`)."""
        em = self.ctx.emitter
        meta = {"stage": stage, "microbatch": mb, "category": "weights", "layer": layer}
        unit = f"{params[0].name}_unit{len(params)}"
        for p in params:
            self.gathered.add((p, kind, mb, stage))

        def packed(r: int) -> Optional[Value]:
            if not self.ctx.placement.present(r):
                return None
            buf = em.one("concat", [self.param_in[(p, r)] for p in params], {"axis": 0},
                         f"{unit}_in_m{mb}_r{r}", dict(meta, detail="zero3 copy-in"))
            return self._gates(buf, r, unit, meta)
        full = self._all_gather(stage, f"{unit}_full_m{mb}", packed, meta,
                                params[0] in self.ctx.expert)
        for r, x in full.items():
            env = self.ctx.env(r, mb)
            for p in params:
                env[("zero3_unit", p, kind)] = (x, params)

    def _task_inputs(self, stage: int, mb: int, kind: str, chunk: int) -> Dict[int, List[Value]]:
        """Per rank of ``stage``, the values the task ``(kind, mb, chunk)``
        receives from another stage (from tasks of its kind: a forward's
        activations, a backward's gradients), already received in program
        order."""
        ctx = self.ctx
        tasks = ctx.tasks
        key = (kind, chunk, stage)
        crossing = self._crossing_in.get(key)
        if crossing is None:
            seen: set = set()
            crossing = []
            producer, task_of = tasks.producer_of, tasks.task_of_op
            for op in tasks.task_ops.get((kind, chunk), []):
                for v in op.inputs:
                    if v in seen or v not in tasks.crossing:
                        continue
                    seen.add(v)
                    src_kind, src_chunk = task_of[id(producer[v])]
                    if src_kind == kind and ctx.stage_of_chunk(src_chunk) != stage:
                        crossing.append(v)
            self._crossing_in[key] = crossing
        out: Dict[int, List[Value]] = {}
        if crossing:
            for _, _, r in ctx.placement.group(stage):
                env = ctx.values.get((r, mb), {})
                got = [env[v] for v in crossing if v in env]
                if got:
                    out[r] = got
        return out

    def _gather(self, p: Value, stage: int, mb: int, kind: str, layer: Any) -> None:
        """All-gather the shards of ``p`` over the dp ranks of every tensor-
        parallel rank of ``stage`` (an expert's weights: over their
        expert-data-parallel team), gated on the compute emitted so far."""
        self.gathered.add((p, kind, mb, stage))
        meta = {"stage": stage, "microbatch": mb, "category": "weights", "layer": layer}
        full = self._all_gather(
            stage, f"{p.name}_full_m{mb}",
            lambda r: self._gates(self.param_in[(p, r)], r, p.name, meta)
            if self.ctx.placement.present(r) else None, meta, p in self.ctx.expert)
        for r, x in full.items():
            self.ctx.env(r, mb)[("zero3_flat", p, kind)] = x

    def _all_gather(self, stage: int, name: str, local: Callable[[int], Optional[Value]],
                    meta: Dict[str, Any], expert: bool) -> Dict[int, Value]:
        """The all-gather of ``local(rank)`` over each data-parallel team of
        ``stage`` (an expert's weights: over their expert-data-parallel
        team; :meth:`LoweringContext.dp_collective`); with the sync's dp 1
        (its gradients kept local over a wider mesh) over no team: each
        rank's input unchanged, as a team of one."""
        if self.strategy.dp == 1:
            got = {r: local(r) for _, _, r in self.ctx.placement.group(stage)}
            return {r: x for r, x in got.items() if x is not None}
        return self.ctx.dp_collective(CollectiveType.ALL_GATHER, stage, name, local,
                                      dict(meta, role="zero_gather"), expert, dim=0)

    def param_for_use(self, p: Value, rank: int, d: int, t: int, stage: int, mb: int,
                      layer: Any) -> Value:
        if self.strategy.zero != 3:
            return self.param_in[(p, rank)]
        kind = self.ctx.kind
        key = ("zero3", p, kind)
        env = self.ctx.env(rank, mb)
        if key in env:
            return env[key]
        if ("zero3_unit", p, kind) in env:
            self._copy_out(env[("zero3_unit", p, kind)], env, kind, rank, stage, mb)
            return env[key]
        if ("zero3_flat", p, kind) not in env:  # not prefetched: gathered now
            self._gather(p, stage, mb, kind, layer)
        # the gathered parameter takes its shape where it is first used, so
        # that no compute op waits for a prefetched gather before its layer
        local = self.ctx.emitter.one("reshape", [env[("zero3_flat", p, kind)]],
                                     {"shape": list(p.type.shape)},
                                     f"{p.name}{USE_MARK}{mb}_r{rank}",
                                     {"stage": stage, "microbatch": mb, "category": "weights"})
        env[key] = local
        return local

    def _copy_out(self, unit: Tuple[Value, Sequence[Value]], env: Dict[Any, Any],
                  kind: str, rank: int, stage: int, mb: int) -> None:
        """Split a layer's gathered buffer (the team's concatenated
        shards) into its parameters, at the first use of any of them:
        FSDP2's copy-out, the op the layer's compute waits on."""
        buf, params = unit
        meta = {"stage": stage, "microbatch": mb, "category": "weights",
                "detail": "zero3 copy-out"}
        pieces = self.ctx.emitter.op("chunk_split", [buf],
                                     {"rows": self.team_size(params[0]),
                                      "shapes": [list(p.type.shape) for p in params]},
                                     [f"{p.name}{USE_MARK}{mb}_r{rank}" for p in params],
                                     dict(meta))
        for p, piece in zip(params, pieces):
            env[("zero3", p, kind)] = piece
            del env[("zero3_unit", p, kind)]
