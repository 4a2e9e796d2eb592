"""What the parts of one estimate share: the configuration (:class:`Case`)
and its layout (chunks, stages, blocks, parameters), the costs worked out
once (collectives, small ops, a parameter's sync and update), and the
walk's timeline with what it accumulates (FLOPs, flat copies in flight,
ZeRO-3 units, records of tasks to replay).

A :class:`StepContext` is made per walk of the step
(:class:`~.timeline.Builder` makes one and hands it to its parts: the
memory notes, the gradient sync, the op-by-op backwards); the parts read
and advance it, none refers back to another, so an estimate leaves no
reference cycle behind. What the walks of one configuration share across
micro-batch counts lives in its :class:`~.state.Memo`.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ..ir.comm import CollectiveType
from ..ir.types import DType
from ..models.gpt import GPTConfig
from ..run_options import DEFAULT_NETWORK_MODE
from ..sim.launch_queue import DEFAULT_COMM_ORDER, DEFAULT_P2P
from ..topology import Topology
from ..transforms.pipeline import partition_balanced, partition_layers
from ..transforms.strategy import Strategy
from ..transforms.sync_policy import (accumulation_ops, bucket_bytes_of, grad_buffer_dtype,
                                      gradient_share,
                                      scatters_each_microbatch, sync_route, sync_team,
                                      unit_indices)
from .costs import ParamCost, collectives, op_costs
from .engine import Timeline
from .shared_links import SharedLinks
from .blocks import EMB, HEAD, LAYER, Block, LayerProfile, Param
from .state import Memo, ScatterTerms

__all__ = ["Case", "StepContext"]


@dataclass
class Case:
    """One configuration, resolved: the GPT config with its batch sizes,
    the strategy (dp filled in), micro-batches per step, the topology."""

    model: Dict[str, Any]
    config: GPTConfig
    strategy: Strategy
    microbatches: int
    topology: Topology
    topology_name: str
    collective_algo: str
    #: the simulator's ``comm_streams`` (:mod:`distsim.sim.comm_queues`)
    comm_streams: str = "shared"
    #: the simulator's ``comm_order`` (:mod:`distsim.sim.launch_queue`)
    comm_order: str = DEFAULT_COMM_ORDER
    #: context parallelism (``strategy`` is then its flat view,
    #: :meth:`~distsim.transforms.strategy.Strategy.flat_cp`: the cp ranks
    #: data-parallel ranks for the weights, as the lowering sees them)
    cp: int = 1
    cp_comm: str = "allgather"
    #: the simulator's ``network_mode``: under ``flow`` pipeline transfers
    #: that share links at once are timed together (:mod:`.shared_links`)
    network_mode: str = DEFAULT_NETWORK_MODE
    #: the simulator's ``p2p`` (:mod:`distsim.sim.launch_queue`)
    p2p: str = DEFAULT_P2P


@lru_cache(maxsize=256)
def _all_params(emb: Tuple[int, ...], layers: Tuple[Tuple[str, int], ...],
                layer_stages: Tuple[int, ...], head: Tuple[int, ...], last_stage: int
                ) -> Tuple[Tuple[tuple, int], ...]:
    """:meth:`StepContext.all_params` of a layout (the same for many points):
    ``layers``, each layer's block and its number of parameters."""
    out = [((EMB, None, i), 0) for i in emb]
    for layer, ((block, count), stage) in enumerate(zip(layers, layer_stages)):
        out.extend(((block, layer, i), stage) for i in range(count))
    out.extend(((HEAD, None, i), last_stage) for i in head)
    return tuple(out)


@lru_cache(maxsize=256)
def _param_counts(emb: Tuple[int, ...], layers: Tuple[Tuple[str, int], ...],
                  layer_stages: Tuple[int, ...], head: Tuple[int, ...], last_stage: int
                  ) -> Tuple[Dict[Tuple[str, int], int], ...]:
    """:meth:`StepContext.param_counts` of a layout."""
    counts: List[Dict[Tuple[str, int], int]] = [{} for _ in range(1 + max((0, last_stage,
                                                                         *layer_stages)))]
    for (block, _, i), stage in _all_params(emb, layers, layer_stages, head, last_stage):
        counts[stage][(block, i)] = counts[stage].get((block, i), 0) + 1
    return tuple(counts)


class StepContext:
    """One walk's configuration, costs and state (see the module docstring)."""

    def __init__(self, case: Case, profile: LayerProfile, memo: Optional[Memo] = None) -> None:
        self.case = case
        self.profile = profile
        S = self.strategy = case.strategy
        self.dp, self.tp, self.pp = S.dp, S.tp, S.pp
        #: whether the blocks have collectives of their own on the
        #: communication stream (tensor-parallel; expert parallelism's
        #: all-to-alls; context parallelism's all-gathers or all-to-alls, not
        #: a ring's steps, which run on their pairs' own queues): their tasks
        #: hold the communication stream
        self.block_comm = S.tp > 1 or S.ep > 1 or (case.cp > 1 and case.cp_comm != "ring")
        self.microbatches = case.microbatches
        self.chunks = S.pp * S.chunks
        #: each layer's block (dense layers LAYER, mixture-of-experts ones
        #: MOE where a model mixes them: :mod:`.layer_kinds`)
        self.layer_blocks = profile.layer_blocks or (LAYER,) * case.config.layers
        if S.partition == "balanced":     # as LowerSPMD balances (by roofline time)
            costs = profile.partition_costs
            self.ranges = partition_balanced([costs.get(b, 0.0) for b in self.layer_blocks],
                                             self.chunks, first=costs.get(EMB, 0.0),
                                             last=costs.get(HEAD, 0.0))
        else:
            self.ranges = partition_layers(case.config.layers, self.chunks)
        self.chunk_of_layer = [c for c, (start, end) in enumerate(self.ranges)
                               for _ in range(start, end)]
        #: What a task's costs depend on in each chunk: whether it holds the
        #: embedding, the head, and its layers' blocks (chunks alike cost alike).
        self.shapes = [(c == 0, c == self.chunks - 1, self.layer_blocks[start:end])
                       for c, (start, end) in enumerate(self.ranges)]
        #: how many chunks have each shape
        self.shape_chunks = Counter(self.shapes)
        self.colls = collectives(case.topology_name, case.collective_algo)
        self.costs = op_costs(case.topology_name)
        # every stage's data-parallel team sits on the hardware as stage 0's does
        self.dp_team = tuple(S.rank(d, 0, 0) for d in range(self.dp))
        #: expert parallelism: an expert's weights synchronise (and ZeRO
        #: shard) over their expert-data-parallel team of dp / ep ranks
        #: (:meth:`~distsim.transforms.strategy.Strategy.edp_team`)
        self.edp = sync_team(S, True)
        self.edp_team = tuple(S.rank(d, 0, 0) for d in S.edp_team(0))
        self.zero = S.zero
        self.zero3 = self.zero == 3 and self.dp > 1
        #: ZeRO-3 by layer (``zero3_unit: layer``): a block's gathers, and
        #: with a reduce-scatter per micro-batch its gradients', as one
        self.by_layer = self.zero3 and S.zero3_unit == "layer"
        #: ZeRO-3: the task kinds that gather parameters, as the
        #: template's lowering gathers them (its tasks' first reads,
        #: ``task_layer_params``): a forward and a backward, or a split
        #: backward's input-gradient part (B); its weight-gradient part (W)
        #: reads no parameter (:attr:`.blocks.Block.b_gather` of
        #: :attr:`~.blocks.LayerProfile.weight` empty; one that reads some
        #: is refused: :func:`.point.check_weight_gathers`)
        self.gathering = frozenset(("F", "B")) if self.zero3 else frozenset()
        #: the lowering's decisions (:mod:`distsim.transforms.sync_policy`):
        #: how a final gradient is synchronised, and whether ZeRO 2/3
        #: reduce-scatter every micro-batch's gradients as they are made
        self.bucket_bytes = bucket_bytes_of(S.bucket_mb)
        self.route = sync_route(self.zero, self.dp, self.bucket_bytes)
        self.scatter_each = scatters_each_microbatch(self.zero, self.dp, self.bucket_bytes)
        #: whether the experts' own sync policy holds gradients between
        #: calls (buckets, deferred syncs over dp / ep > 1 ranks), which a
        #: replayed task does not record (:mod:`.experts`)
        self.experts_held = S.ep > 1 and self.edp > 1 and self.route in ("bucket", "deferred")
        self.master = DType.parse(str(case.config.master_dtype))
        # memos: what is the same for every task / layer of the step
        self.memo = Memo() if memo is None else memo
        # -- the walk's state --------------------------------------------------
        self.tl = Timeline(S.pp, per_group=case.comm_streams == "per-group",
                           stream_order=case.comm_order == "stream", p2p=case.p2p)
        if case.network_mode == "flow" and S.pp > 1:
            self.tl.links = SharedLinks(case.topology, case.collective_algo,
                                        [self.rank0(s) for s in range(S.pp)])
        self.flops = [0.0] * S.pp
        #: per stage, the flat gradient copies (bytes, end of their
        #: reduce-scatter) that may outlive the backward that made them
        self.flats: Dict[int, List[Tuple[int, float]]] = {}
        #: tasks recorded relative to their start, to be replayed
        #: (:mod:`.replay`); this walk's own (a replay is exact to rounding,
        #: not to the bit: two walks that share a start share its records,
        #: and no others, so that a forked walk is two walks to the bit)
        self.replays: Dict[tuple, Any] = {}
        #: ZeRO-3 by layer: per stage, the units reduce-scattered and not
        #: yet settled; when each unit gradient was made, until its unit is
        #: reduce-scattered; each unit's reduce-scatter end, in order
        #: (:meth:`.sync.StepSync.reduce_scatter_unit`)
        self.unit_pending: Dict[int, list] = {}
        self.unit_made_at: Dict[tuple, float] = {}
        self.unit_ends: List[float] = []
        #: with a pipeline, per stage: where the tasks emitted as compute
        #: pieces placed their tensor-parallel collectives, by the plan
        #: whose spans they share (``id`` of the spans: the spans from a
        #: task's end, :meth:`.timeline.Builder._tp_spans`, and the ends of
        #: the tasks that placed them, in order)
        self.tp_at: Dict[int, Dict[int, Tuple[Any, List[float]]]] = {}
        #: where the backward task being emitted made the input gradient it
        #: sends to the stage before (None: not yet; the walk takes it and
        #: clears it after each backward task)
        self.out_at: Optional[float] = None
        #: ZeRO-3 by parameter: the task being emitted's key of the memory
        #: notes, and what its last block noted (a block record keeps it)
        self.peak_key: Optional[tuple] = None
        self.block_got: Optional[tuple] = None

    def resume(self, other: "StepContext") -> None:
        """Take ``other``'s walk state (a copy): the two walks go on from
        the same point (see :meth:`.timeline.Builder.resume`)."""
        self.tl = other.tl.copy()
        self.flops = list(other.flops)
        self.replays = dict(other.replays)
        self.unit_pending = {s: list(v) for s, v in other.unit_pending.items()}
        self.unit_made_at = dict(other.unit_made_at)
        self.unit_ends = list(other.unit_ends)
        self.tp_at = {s: {k: (spans, list(ends)) for k, (spans, ends) in v.items()}
                      for s, v in other.tp_at.items()}

    # -- the layout --------------------------------------------------------------
    def stage_of(self, c: int) -> int:
        return c % self.pp

    def rank0(self, stage: int) -> int:
        return self.strategy.rank(0, stage, 0)

    def blocks_of(self, kind: str, c: int) -> List[Tuple[str, Optional[int]]]:
        """The blocks of chunk ``c`` in a forward / backward task's order
        (the same list every call: do not modify it)."""
        hit = self.memo.blocks.get((kind, c))
        if hit is not None:
            return hit
        start, end = self.ranges[c]
        out: List[Tuple[str, Optional[int]]] = []
        if c == 0:
            out.append((EMB, None))
        out.extend((self.layer_blocks[layer], layer) for layer in range(start, end))
        if c == self.chunks - 1:
            out.append((HEAD, None))
        out = self.memo.blocks[(kind, c)] = out if kind == "F" else out[::-1]
        return out

    def param(self, key: tuple) -> Param:
        return self.profile.params[key[0]][key[2]]

    def all_params(self) -> Sequence[Tuple[tuple, int]]:
        """Every parameter with its stage, in the step's parameter order
        (the order the optimizer updates them)."""
        return _all_params(*self._params_layout())

    def param_counts(self) -> Sequence[Dict[Tuple[str, int], int]]:
        """Per stage, how many of its parameters are each (block, index in
        the block) (a layer's parameters once per layer of the stage)."""
        return _param_counts(*self._params_layout())

    def _params_layout(self) -> tuple:
        order = self.profile.param_order
        return (tuple(i for block, i in order if block == EMB),
                tuple((b, len(self.profile.params[b])) for b in self.layer_blocks),
                tuple(self.stage_of(c) for c in self.chunk_of_layer),
                tuple(i for block, i in order if block == HEAD), self.stage_of(self.chunks - 1))

    # -- costs -------------------------------------------------------------------
    def dp_time(self, kind: CollectiveType, nbytes: float, expert: bool = False) -> float:
        """A collective of every stage's data-parallel team (:attr:`dp_team`;
        ``expert``: an expert's weights' team, :attr:`edp_team`), memoised
        here: the shared cache's key would hash the whole team."""
        key = (kind, nbytes, expert)
        hit = self.memo.dp_times.get(key)
        if hit is None:
            hit = self.memo.dp_times[key] = self.colls.time(
                kind, self.edp_team if expert else self.dp_team, nbytes)
        return hit

    def team(self, p: Param) -> int:
        """The ranks ``p``'s gradient is synchronised, ZeRO-sharded and
        (ZeRO 3) gathered over: dp, or for an expert's weights dp / ep
        (:func:`~distsim.transforms.sync_policy.sync_team`, the lowering's)."""
        return sync_team(self.strategy, p.expert)

    def scatters(self, block: str, index: int) -> bool:
        """Whether parameter ``index`` of ``block`` has each micro-batch's
        gradient reduce-scattered as it is made (ZeRO 2/3 over its team,
        :func:`~distsim.transforms.sync_policy.scatters_each_microbatch`,
        the lowering's rule): not an expert's weights whose team is one
        rank (ep = dp), kept whole and accumulated in place."""
        return self.scatter_each and scatters_each_microbatch(
            self.zero, self.team(self.profile.params[block][index]), self.bucket_bytes)

    def grad_dtype(self, p: Param) -> DType:
        """The dtype of ``p``'s gradient buffer, as the lowering's
        (:func:`~distsim.transforms.sync_policy.grad_buffer_dtype`: fp32
        under ``fp32_grads``)."""
        return grad_buffer_dtype(self.strategy, p.dtype)

    def param_cost(self, block: str, index: int) -> ParamCost:
        """What the step charges parameter ``index`` of ``block`` (the same
        for it in every layer: kept in the memo)."""
        costs = self.memo.param_costs
        hit = costs.get((block, index))
        if hit is None:
            p = self.profile.params[block][index]
            hit = costs[(block, index)] = ParamCost(
                p, self.team(p), self.zero, self.costs,
                self.case.topology.device_spec.launch_overhead_s, self.grad_dtype(p))
        return hit

    def one_microbatch_scale(self, block: str, index: int) -> Optional[Tuple[float, float]]:
        """With one micro-batch, the (time, FLOPs) of the ``scale`` that
        averages an expert's gradient over the tokens of its ep ranks
        (:func:`~distsim.transforms.sync_policy.accumulation_ops` with the
        expert's :func:`~distsim.transforms.sync_policy.gradient_share`;
        the template's first micro-batch has none): on the whole gradient,
        or on its shard where ZeRO 2 reduce-scatters first. None otherwise."""
        p = self.profile.params[block][index]
        if self.microbatches > 1 or "scale" not in accumulation_ops(
                0, 1, gradient_share(self.strategy, p.expert)):
            return None
        pc = self.param_cost(block, index)
        n = pc.shard if self.scatter_each else pc.numel
        return self.costs.cost("scale", [(n, pc.gdtype)], [(n, pc.gdtype)])

    def small(self, stage: int, op_type: str, ins, outs, ready: float) -> float:
        """One small op the lowering adds (a reshape, a concat) on ``stage``'s
        compute stream from ``ready``; returns its end."""
        t, f = self.costs.cost(op_type, ins, outs)
        self.flops[stage] += f
        return self.tl.compute(stage, t, ready)

    def part(self, kind: str) -> Dict[str, Block]:
        """The blocks whose times a task of ``kind`` takes: a split
        backward's weight-gradient parts for "W"
        (:attr:`~.blocks.LayerProfile.weight`), else the profile's blocks."""
        return self.profile.weight if kind == "W" else self.profile.blocks

    def task_work(self, kind: str, c: int) -> float:
        """A task's estimated cost, as LowerSPMD orders tasks by (its FLOPs)."""
        blocks = self.part(kind)
        total = 1.0
        for name, _ in self.blocks_of(kind, c):
            total += blocks[name].step_f_flops if kind == "F" else blocks[name].step_b_flops
        return total

    def block_time(self, blk: Block, kind: str, mb: int) -> Tuple[float, float, float]:
        """A block's (time, busy time, FLOPs) in a forward, or in the
        backward of the first, a middle or the last micro-batch."""
        if kind == "F":
            return blk.f, blk.f_busy, blk.f_flops
        if mb == 0:
            return blk.b_first, blk.b_first_busy, blk.b_flops
        if mb == self.microbatches - 1:
            return blk.b_last, blk.b_last_busy, blk.b_flops
        return blk.b_mid, blk.b_mid_busy, blk.b_flops

    def block_scatter(self, name: str, ops: Tuple[str, ...]) -> ScatterTerms:
        """ZeRO 2/3 with a reduce-scatter per micro-batch: one block's terms,
        in the order they are added, per parameter: flattening its
        gradient; the accumulation ``ops`` of its micro-batch
        (:func:`~distsim.transforms.sync_policy.accumulation_ops`) on the
        shard (:meth:`shard_ops`), and the same on the whole gradient,
        which the template does and the lowered program does not; FLOPs;
        its reduce-scatter."""
        memo = (name, ops)
        hit = self.memo.scatter_terms.get(memo)
        if hit is not None:
            return hit
        terms = ScatterTerms()
        for i in range(len(self.profile.params[name])):
            pc = self.param_cost(name, i)
            n, d, shard = pc.numel, pc.dtype, pc.shard
            terms.flat.append(pc.flat[0])
            terms.flops.append(pc.flat[1])
            terms.rs.append(self.dp_time(CollectiveType.REDUCE_SCATTER, pc.nbytes, pc.expert))
            for op in ops:
                ins = [(n, d), (n, d)] if op == "add" else [(n, d)]
                full = self.costs.cost(op, ins, [(n, d)])
                part = self.costs.cost(op, [(shard, d)] * len(ins), [(shard, d)])
                terms.whole.append(full[0])
                terms.on_shard.append(part[0])
                terms.shard_flops.append(part[1])
                terms.flops.append(part[1] - full[1])
        hit = self.memo.scatter_terms[memo] = terms
        return hit

    def shard_ops(self, mb: int) -> Dict[Tuple[str, int], Tuple[float, float]]:
        """ZeRO 2/3's backward of micro-batch ``mb`` (past the first) op by op:
        per parameter (block, index), the time and FLOPs of the ops on its
        shard after its reduce-scatter (accumulate; at the last micro-batch
        average too)."""
        ops = accumulation_ops(mb, self.microbatches)
        hit = self.memo.shard_ops.get(ops)
        if hit is None:
            hit = self.memo.shard_ops[ops] = {}
            per = len(ops)                   # ops per parameter in the terms
            for name, params in self.profile.params.items():
                terms = self.block_scatter(name, ops)
                for i in range(len(params)):
                    at = slice(i * per, (i + 1) * per)
                    hit[(name, i)] = (sum(terms.on_shard[at]), sum(terms.shard_flops[at]))
        return hit

    def out_tail(self, c: int, mb: int) -> float:
        """A block-level backward task of chunk ``c`` (micro-batch ``mb``:
        the first, or a middle one): its compute after it makes the input
        gradient it sends to the stage before (that of its last block, the
        chunk's first layer)."""
        blk = self.profile.blocks[self.blocks_of("B", c)[-1][0]]
        return blk.out_tail_first if mb == 0 else blk.out_tail_mid

    def comm_tail(self, c: int, mb: int, kind: str = "B") -> float:
        """A block-level backward task of chunk ``c`` (micro-batch ``mb``:
        the first, or a middle one; ``kind`` "W": a split backward's
        weight-gradient task): how long the communication stream
        stays busy after its compute ends (its last block's
        :attr:`~.blocks.Block.comm_tail_first` / ``comm_tail_mid``)."""
        blk = self.part(kind)[self.blocks_of(kind, c)[-1][0]]
        return blk.comm_tail_first if mb == 0 else blk.comm_tail_mid

    def lead_in(self, c: int, mb: int) -> Tuple[float, float]:
        """A block-level backward task of chunk ``c`` (micro-batch ``mb``:
        the first, or a middle one) that starts with a block the template
        timed behind another block's backward (not the head): the wait its
        time holds there (:attr:`~.blocks.Block.b_wait_first` /
        ``b_wait_mid``), and the time of its early all-gathers, which the
        communication stream runs as soon as it is free, in the task
        before; (0, 0) otherwise."""
        name = self.blocks_of("B", c)[0][0]
        if name == HEAD:
            return 0.0, 0.0
        blk = self.profile.blocks[name]
        segs = blk.only if mb == 0 else blk.last
        early = sum(s.time_s for s in segs if s.kind == "t" and not s.deps and not s.p2p)
        return (blk.b_wait_first if mb == 0 else blk.b_wait_mid), early

    # -- ZeRO-3 by layer: a block's gradients reduce-scattered as one --------
    def grad_units(self, name: str) -> Tuple[Tuple[int, ...], ...]:
        """By layer with a reduce-scatter per micro-batch: the block's
        units of gradients that travel as one, each the indices of its
        parameters (of each team those its size divides, when more than
        one: under expert parallelism with ep < dp a MoE block's others'
        over dp and its experts' over dp / ep, the lowering's
        ``GradientSync._grad_units``), each in the order the backward makes
        its gradients, in the order the backward completes them; none
        otherwise."""
        if not (self.by_layer and self.scatter_each):
            return ()
        hit = self.memo.grad_units.get(name)
        if hit is None:
            params = self.profile.params[name]
            # in the order the backward makes them, as the lowering's unit
            # (settled in that order: the embedding's position gradient
            # before its table's)
            made = {i: k for k, i in enumerate(dict.fromkeys(
                i for indices, *_ in self.profile.blocks[name].bs_made for i in indices))}
            units = []
            for expert in (False, True):
                own = [i for i, p in enumerate(params) if p.expert == expert]
                team = sync_team(self.strategy, expert)
                members = tuple(own[j] for j in unit_indices([params[i].numel for i in own], team))
                if members:
                    units.append(tuple(sorted(members,
                                              key=lambda i: (made.get(i, len(made)), i))))
            # the unit completed last last (whose shards the next block meets)
            units.sort(key=lambda u: made.get(u[-1], len(made)))
            hit = self.memo.grad_units[name] = tuple(units)
        return hit

    def grad_unit(self, name: str, index: int) -> Optional[Tuple[int, ...]]:
        """The unit (:meth:`grad_units`) of parameter ``index`` of the
        block, or None."""
        return next((unit for unit in self.grad_units(name) if index in unit), None)

    def unit_bytes(self, name: str, unit: Tuple[int, ...]) -> int:
        """The bytes of a unit of the block's gradients (its parameters whole)."""
        params = self.profile.params[name]
        return sum(params[i].numel * params[i].dtype.itemsize for i in unit)

    def unit_team(self, name: str, unit: Tuple[int, ...]) -> int:
        """The ranks a unit of the block's gradients is reduce-scattered over."""
        return self.team(self.profile.params[name][unit[0]])
