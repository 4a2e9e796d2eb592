"""Lowering an SPMD training step to the local view of a 3-D mesh.

Input: the step of one micro-batch on one tensor-parallel rank (forward,
autodiff backward, optionally recomputation), as the model builders write
it (:mod:`distsim.models.gpt`): ops tagged with ``meta["layer"]``, SPMD
collectives for the tensor-parallel group, ``meta["params"]``,
``meta["grads"]``, ``meta["param_shards"]``. Output: one local-view
program for every rank of the ``dp x pp x tp`` mesh (rank numbering in
:class:`~distsim.transforms.strategy.Strategy`), with

- the layers split into pipeline chunks, each chunk's forward (F) and
  backward (B) ops instantiated once per micro-batch and ordered on each
  rank by the pipeline schedule (:mod:`.pipeline`; a zero-bubble schedule's
  backward split into input-gradient B and weight-gradient W tasks by
  :mod:`.backward_split`); values that cross
  stages travel by ``comm.sendrecv`` right after the task producing them;
- SPMD collectives turned into ``comm.*`` ops over each TP group (an
  ``spmd.alltoall``, expert parallelism's, over each expert-parallel group);
- gradient accumulation over the micro-batches (in the backward tasks),
  data-parallel gradient synchronisation and the AdamW update with
  mixed precision, sharded as the ZeRO stage says (:mod:`.zero`).

The result's ``meta["io"]`` describes every input and output (which
global parameter, which TP / DP shard, which micro-batch) so that
:func:`distsim.transforms.zero_numbers.local_inputs` and
:func:`~distsim.transforms.zero_numbers.global_updates` can move numbers between a
single-device step and the lowered one.

With ``representatives=True`` the pass writes a *reduced* program for
simulation only: the ops of one rank per pipeline stage (data- and
tensor-parallel rank 0), whose peers run the same ops at the same times.
Collectives keep their whole team (so the network carries the full load)
and list the ranks present in the program (``present``); collectives with
no present member are left out, as mirrors of those kept.
``meta["represents"]`` says how many devices each present rank stands for,
``meta["represented_ranks"]`` which ones.

With ``coarsen=True`` each run of compute ops of a task (between
collectives, sends and values arriving by them, within one layer and
phase) becomes one ``fused`` op holding the run as a shared segment
function (:mod:`distsim.ir.ops_fused`): its time is the sum of the run's,
so step times are unchanged, with far fewer ops to build, verify and
simulate; values internal to a run are not tracked in memory. The
forward ``spmd.copy`` (the identity) is fused through, and the gradients
of every micro-batch but the last are accumulated inside the segments
(see :meth:`.coarsen.Coarsening._grad_mode`): the last micro-batch's feed the
data-parallel sync and stay separate ops. Results of a segment that the
same segments read travel as one bundle (:mod:`.coarsen`).
"""
from __future__ import annotations

from typing import (Any, Callable, Dict, List, Optional, Sequence, Set, Tuple,
                    Union)

from ..cost.device import DeviceSpec
from ..cost.flops import op_flops
from ..cost.model import CostModel
from ..errors import PassPreconditionError
from ..ir.comm import CollectiveType
from ..ir.core import Function, Op, Value, gc_paused, normalize_attr
from ..ir.ops_fused import fused_result_types
from ..ir.registry import infer_types, lookup, with_defaults
from ..ir.types import DType
from .adam import AdamHyper
from .coarsen import Coarsening, Segment
from .emitter import Emitter
from .lowering_context import LoweringContext, RankPlacement, StepTasks
from .optimizer import SGDHyper
from .backward_split import WEIGHT_DETAIL, split_tasks, weight_gradient_ops
from .pipeline import (SPLIT_BACKWARD, chunk_of_layer, partition_balanced, partition_layers,
                       program_order)
from .fusion import Fuse
from .pipeline_split import splits
from .stage_sends import StageSends
from .strategy import Strategy, fusion_for
from .zero import GradientSync

SPMD_TO_COMM = {"spmd.allreduce": CollectiveType.ALL_REDUCE,
                "spmd.allgather": CollectiveType.ALL_GATHER,
                "spmd.reducescatter": CollectiveType.REDUCE_SCATTER,
                "spmd.alltoall": CollectiveType.ALL_TO_ALL}


#: The device whose roofline times estimate each layer's cost for
#: ``partition="balanced"`` when no ``partition_cost`` is given (the
#: program is built before it meets a topology): A100 SXM figures; only the
#: ratios of compute, memory traffic and launches matter for the balance.
PARTITION_DEVICE = DeviceSpec("partition-estimate", {"bf16": 312e12, "f16": 312e12, "f32": 19.5e12},
                              memory_bandwidth_Bps=2.039e12, memory_bytes=80 * 10**9,
                              launch_overhead_s=5e-6, matmul_efficiency=0.7,
                              vector_efficiency=0.7, memory_efficiency=0.8)


class LowerSPMD(Coarsening):
    """The pass: ``LowerSPMD(strategy, microbatches, hyper)(step)``.
    ``partition_cost(op) -> seconds`` estimates layer costs for
    ``strategy.partition == "balanced"`` (default: roofline times on
    :data:`PARTITION_DEVICE`)."""

    def __init__(self, strategy: Strategy, microbatches: int = 1,
                 hyper: Union[AdamHyper, SGDHyper] = AdamHyper(), master_dtype: str = "f32",
                 representatives: bool = False, coarsen: bool = False,
                 partition_cost: Optional[Callable[[Op], float]] = None,
                 local_gradients: bool = False) -> None:
        if strategy.dp is None:
            raise PassPreconditionError("LowerSPMD: the strategy's dp must be resolved")
        #: context parallelism: its ranks lowered as data-parallel ranks
        #: (``d * cp + c``, :meth:`Strategy.flat_cp`), its collectives over
        #: each group of ``cp`` of them (:meth:`_group_collective`)
        self.given, self.cp = strategy, strategy.cp
        #: no data-parallel team for the gradients (:class:`GradientSync`'s
        #: ``local``): the estimator's template of one replica's layers
        self.local_gradients = local_gradients
        strategy = strategy.flat_cp()
        self.strategy = strategy
        self.microbatches = microbatches
        self.hyper = hyper
        self.master_dtype = DType.parse(master_dtype)
        self.representatives = representatives
        # a ring's receives come from the other cp ranks: all of a group present
        self.placement = RankPlacement(strategy, representatives,
                                       self.cp if self.given.cp_comm == "ring" else 1)
        self.coarsen = coarsen
        self.partition_cost = partition_cost
        self._init_coarsening()
        #: (template op id, tp rank, cp rank, ep rank) -> (attributes, result types by input types)
        self._op_cache: Dict[Tuple[int, int, int, int], tuple] = {}
        self._op_info: Dict[int, tuple] = {}  # id(op) -> (op, its gradients, its layer)
        self.split_axes: Dict[Value, int] = {}

    # -- analysis of the step ----------------------------------------------
    def _analyse(self, step: Function) -> None:
        S = self.strategy
        self.chunks = S.pp * S.chunks
        layers = int(step.meta.get("model", {}).get("layers", 1))
        if S.partition == "balanced":
            # estimated time of each layer: its forward, backward and
            # recomputed ops; -1 is the embedding, `layers` the head
            op_time = self.partition_cost or \
                (lambda o, m=CostModel(PARTITION_DEVICE): m.op_cost(o).time_s)
            cost: Dict[int, float] = {}
            for op in step.ops:
                layer = op.meta.get("layer")
                if isinstance(layer, int):
                    cost[layer] = cost.get(layer, 0.0) + op_time(op)
            self.ranges = partition_balanced([cost.get(i, 0.0) for i in range(layers)], self.chunks,
                                             first=cost.get(-1, 0.0),
                                             last=cost.get(layers, 0.0))
        else:
            self.ranges = partition_layers(layers, self.chunks)
        producer = self.producer_of = step.producers()
        self.chunk_of_op: Dict[int, int] = {}
        #: id(op) -> its task, (kind "F", "B" or "W", chunk)
        self.task_of_op: Dict[int, Tuple[str, int]] = {}
        self.task_ops: Dict[Tuple[str, int], List[Op]] = {}
        for op in step.ops:
            layer = op.meta.get("layer")
            if isinstance(layer, int):
                c = chunk_of_layer(layer, self.ranges)
            else:
                c = max((self.chunk_of_op[id(producer[v])] for v in op.inputs if v in producer),
                        default=self.chunks - 1)
            self.chunk_of_op[id(op)] = c
            task = self.task_of_op[id(op)] = ("F" if "phase" not in op.meta else "B", c)
            self.task_ops.setdefault(task, []).append(op)
        self.value_chunk: Dict[Value, int] = {v: self.chunk_of_op[id(p)]
                                              for v, p in producer.items()}
        # Values read by another chunk: (value -> consumer chunks).
        self.crossing: Dict[Value, Set[int]] = {}
        self.param_chunk: Dict[Value, int] = {}
        roles = step.meta.get("roles", {})
        for op in step.ops:
            c = self.chunk_of_op[id(op)]
            for v in op.inputs:
                if v in producer and self.value_chunk[v] != c:
                    self.crossing.setdefault(v, set()).add(c)
                elif v not in producer and roles.get(v.name) == "param":
                    self.param_chunk.setdefault(v, c)
        by_name = {v.name: v for v in step.values()}
        self.params = [by_name[n] for n in step.meta["params"]]
        for p in self.params:
            if p not in self.param_chunk:
                raise PassPreconditionError(f"LowerSPMD: parameter %{p.name} is never used")
        self.grad_of: Dict[Value, Value] = {by_name[g]: by_name[p]
                                           for p, g in step.meta["grads"].items()}
        self.data_inputs = {v for v in step.inputs if roles.get(v.name) == "data"}
        self.const_inputs = {v for v in step.inputs if roles.get(v.name) == "const"}
        loss = by_name.get(step.meta.get("loss", ""))
        if loss is not None and loss not in producer and loss not in self.data_inputs \
                and loss not in self.const_inputs:
            # a pass-through loss is lowered to a copy of each rank's input
            # (_loss_outputs): a parameter or optimizer state has no such copy
            raise PassPreconditionError(
                f"LowerSPMD: the loss %{loss.name} is an input of the step passed through "
                f"unchanged (role {roles.get(loss.name) or 'none'}); only a data or constant "
                "input can be, otherwise the loss must be an op's result")
        self.consumers: Dict[Value, List[Op]] = {}
        for op in step.ops:
            for v in op.inputs:
                self.consumers.setdefault(v, []).append(op)
        self.step_outputs = set(step.outputs)
        if S.schedule in SPLIT_BACKWARD:
            # the weight-gradient ops of each backward task become its W task
            split_tasks(self.task_ops, self.task_of_op, weight_gradient_ops(
                step.ops, self.chunk_of_op, self.consumers, self.grad_of, self.step_outputs,
                self.crossing))
        # ZeRO-3: per task, its layers in order with the parameters each
        # uses first in the task (what a layer's all-gathers fetch)
        self.task_layer_params: Dict[Tuple[str, int], List[Tuple[int, List[Value]]]] = {}
        if S.zero == 3:
            for key, ops in self.task_ops.items():
                order: List[Tuple[int, List[Value]]] = []
                seen: Set[Value] = set()
                for op in ops:
                    layer = op.meta.get("layer")
                    if not isinstance(layer, int):
                        continue
                    if not order or order[-1][0] != layer:
                        order.append((layer, []))
                    for v in op.inputs:
                        if v in self.param_chunk and v not in seen:
                            seen.add(v)
                            order[-1][1].append(v)
                self.task_layer_params[key] = order
        # values entering and leaving communication (spmd.copy is the
        # identity in the forward pass: no communication, fused through)
        self.spmd_inputs = {v for op in step.ops if op.op_type.startswith("spmd.")
                            and op.op_type != "spmd.copy"
                            for v in op.inputs}
        self.spmd_outputs = {v for op in step.ops if op.op_type.startswith("spmd.")
                             and op.op_type != "spmd.copy"
                             for v in op.outputs}
        #: the crossing values sent 1/tp per rank, with their axes (``p2p_scatter``)
        self.split_axes: Dict[Value, int] = splits(step, self.crossing, S.tp) \
            if S.p2p_scatter else {}

    def stage_of_chunk(self, c: int) -> int:
        return c % self.strategy.pp

    # -- values ------------------------------------------------------------
    def local_name(self, v: Value, rank: int, mb: int) -> str:
        return f"{v.name}_m{mb}_r{rank}" if self.microbatches > 1 else f"{v.name}_r{rank}"

    def env(self, rank: int, mb: int) -> Dict[Value, Value]:
        """The values of micro-batch ``mb`` on ``rank`` (template value ->
        local value)."""
        env = self.menv.get((rank, mb))
        if env is None:
            env = self.menv[(rank, mb)] = {}
        return env

    def get(self, v: Value, rank: int, d: int, t: int, mb: int, stage: int, layer: Any) -> Value:
        env = self.menv.get((rank, mb))
        if env is None:
            env = self.menv[(rank, mb)] = {}
        found = env.get(v)
        if found is not None:
            return found
        if v in self.param_chunk:
            return self.gathers.param_for_use(v, rank, d, t, stage, mb, layer)
        if v in self.data_inputs:
            nv = self.em.input(self.local_name(v, rank, mb), v.type.with_device(rank), "data",
                               name=v.name, dp_rank=d, tp_rank=t, microbatch=mb)
            env[v] = nv
            return nv
        if v in self.const_inputs:  # one per rank, shared by the micro-batches
            nv = self.consts.get((v, rank))
            if nv is None:
                nv = self.consts[(v, rank)] = self.em.input(
                    f"{v.name}_r{rank}", v.type.with_device(rank), "const", name=v.name,
                    dp_rank=d, tp_rank=t, stage=stage)
            env[v] = nv
            return nv
        raise PassPreconditionError(f"LowerSPMD: value %{v.name} is not available on rank "
                                    f"{rank} (micro-batch {mb})")

    # -- tasks -------------------------------------------------------------
    def emit_task(self, stage: int, kind: str, mb: int, c: int) -> None:
        em = self.em
        ops = self.task_ops.get((kind, c), [])
        self.ctx.kind = kind
        base = {"stage": stage, "microbatch": mb, "chunk": c}
        # the weight-gradient part of a split backward: named so in the
        # trace (``detail``) where an op has no detail of its own
        said = base
        if kind == "W":
            base["task"] = "W"
            said = dict(base, detail=WEIGHT_DETAIL)
        if self.sends.pending:
            self.sends.gather_arrived(stage, kind, mb, c)
        entered = None
        items = self._segments((kind, c), self._grad_mode((kind, c), mb)) if self.coarsen else ops
        for op in items:
            layer_now = op.layer if isinstance(op, Segment) else op.meta.get("layer")
            if isinstance(layer_now, int) and layer_now != entered:
                entered = layer_now
                self.gathers.enter_layer(stage, mb, kind, c, layer_now)  # ZeRO-3 gathers
            if isinstance(op, Segment):
                self._emit_segment(op, stage, mb, base if "detail" in op.meta else said)
                continue
            info = self._op_info.get(id(op))
            if info is None:  # once per template op
                grads = [o for o in op.outputs if o in self.grad_of]
                info = self._op_info[id(op)] = (op, grads, op.meta.get("layer"))
            _, grads, layer = info
            meta = dict(op.meta, **(base if "detail" in op.meta or op.op_type.startswith("spmd.")
                                    else said))
            if grads:
                meta["category"] = "gradients"
            if op.op_type.startswith("spmd.") and op.attrs.get("group") in ("cp", "ep"):
                self._group_collective(op, stage, mb, layer, meta)
                continue
            if op.op_type.startswith("spmd."):
                for d in self.placement.dp_indices():
                    ranks, here = self.placement.tp_team(d, stage)
                    ins = [self.get(op.inputs[0], r, d, t, mb, stage, layer)
                           if present else None for t, (r, present) in enumerate(here)]
                    if op.op_type == "spmd.copy":
                        for r, x in zip(ranks, ins):
                            if x is not None:
                                self.menv[(r, mb)][op.outputs[0]] = x
                        continue
                    kind_c = SPMD_TO_COMM[op.op_type]
                    attrs = {}
                    if "reduce_op" in op.attrs:
                        attrs["reduce_op"] = op.attrs["reduce_op"]
                    if "dim" in op.attrs:
                        attrs["dim"] = op.attrs["dim"]
                    outs = em.collective(kind_c, ins, ranks,
                                         [self.local_name(op.outputs[0], r, mb)
                                          if present else None for r, present in here],
                                         meta, **attrs)
                    for r, o in zip(ranks, outs):
                        if o is not None:
                            self.menv[(r, mb)][op.outputs[0]] = o
                if grads:
                    self.sync.after_backward(stage, mb, grads)
                continue
            for d, t, r in self.placement.group(stage):
                # :meth:`get`'s first look, inlined (most inputs are found there)
                env = self.menv.get((r, mb))
                if env is None:
                    env = self.menv[(r, mb)] = {}
                ins = [x if (x := env.get(v)) is not None
                       else self.get(v, r, d, t, mb, stage, layer) for v in op.inputs]
                # attributes and result types computed once per template op and
                # tensor-parallel rank (and input types): the micro-batches and
                # data-parallel replicas repeat them
                c_rank = d % self.cp
                e_rank = d % self.strategy.ep if "ep_rank_attrs" in op.meta else 0
                entry = self._op_cache.get((id(op), t, c_rank, e_rank))
                if entry is None:
                    attrs = dict(op.attrs)
                    spec_attrs = lookup(op.op_type).attrs
                    for key, per_rank in op.meta.get("rank_attrs", {}).items():
                        if key in spec_attrs:
                            attrs[key] = per_rank[t]
                    for key, per_rank in op.meta.get("cp_rank_attrs", {}).items():
                        if key in spec_attrs:
                            attrs[key] = per_rank[c_rank]
                    for key, per_rank in op.meta.get("ep_rank_attrs", {}).items():
                        if key in spec_attrs:
                            attrs[key] = per_rank[e_rank]
                    attrs = {k: normalize_attr(v)
                             for k, v in with_defaults(op.op_type, attrs).items()}
                    entry = self._op_cache[(id(op), t, c_rank, e_rank)] = (attrs, {})
                attrs, by_types = entry
                type_ids = tuple([id(v.type) for v in ins])  # types live as long as the program
                types = by_types.get(type_ids)
                if types is None:
                    in_types = [v.type for v in ins]
                    types = by_types[type_ids] = (
                        fused_result_types(op, in_types) if op.subfunctions
                        else infer_types(op.op_type, in_types, attrs))
                outs = em.emit(op.op_type, ins, attrs, types,
                               [self.local_name(v, r, mb) for v in op.outputs], meta, entry,
                               op.subfunctions)
                for v, o in zip(op.outputs, outs):
                    env[v] = o
                self.gathers.note_layer_output(r, outs[0])
            if grads:
                self.sync.after_backward(stage, mb, grads)
        self.sent_by[(kind, mb, c)] = (stage, mb, c, ops)

    def _group_collective(self, op: Op, stage: int, mb: int, layer: Any,
                          meta: Dict[str, Any]) -> None:
        """An SPMD collective of a group cut from the data-parallel ranks as
        one ``comm.*`` op over each such group of ``stage``: the
        context-parallel group's (``group: cp``, ``cp`` ranks, tagged ``role:
        cp``; a ring step, ``spmd.shift``, as one send/recv per rank to its
        neighbour, tagged ``role: cp_ring``) or the expert-parallel group's
        (``group: ep``, ``ep`` ranks, tagged ``role: expert_parallel``: the
        all-to-alls, and the all-gather dispatcher's all-gathers and
        reduce-scatters)."""
        shift = op.op_type == "spmd.shift"
        if op.attrs["group"] == "cp":
            size, role = self.cp, "cp_ring" if shift else "cp"
        else:
            size, role = self.strategy.ep, "expert_parallel"
        meta = dict(meta, role=role)
        attrs = {k: op.attrs[k] for k in ("reduce_op", "dim", "split_dim", "concat_dim")
                 if k in op.attrs}
        for team in self.placement.dp_blocks(stage, size):
            if shift:
                self._ring_step(op, team, mb, stage, layer, meta)
            else:
                self._team_collective(op, SPMD_TO_COMM[op.op_type], team, mb, stage, layer,
                                      meta, attrs)
        self._accumulate(stage, mb, op)

    def _team_inputs(self, op: Op, team: Sequence[Tuple[int, int, int]], mb: int, stage: int,
                     layer: Any) -> Tuple[List[int], List[bool], List[Optional[Value]]]:
        """The ranks of ``team`` ((dp rank, tp rank, global rank) each),
        whether each is in the program, and its local value of ``op``'s input
        (None where it is not)."""
        ranks = [r for _, _, r in team]
        here = [self.placement.present(r) for r in ranks]
        ins = [self.get(op.inputs[0], r, d, t, mb, stage, layer) if p else None
               for (d, t, r), p in zip(team, here)]
        return ranks, here, ins

    def _team_collective(self, op: Op, kind: CollectiveType,
                         team: Sequence[Tuple[int, int, int]], mb: int, stage: int, layer: Any,
                         meta: Dict[str, Any], attrs: Dict[str, Any]) -> None:
        """``op`` as one ``kind`` collective over ``team``, its result
        recorded for every member in the program."""
        ranks, here, ins = self._team_inputs(op, team, mb, stage, layer)
        outs = self.em.collective(kind, ins, ranks,
                                  [self.local_name(op.outputs[0], r, mb) if p else None
                                   for r, p in zip(ranks, here)], meta, **attrs)
        for r, o in zip(ranks, outs):
            if o is not None:
                self.menv[(r, mb)][op.outputs[0]] = o

    def _ring_step(self, op: Op, team: Sequence[Tuple[int, int, int]], mb: int, stage: int,
                   layer: Any, meta: Dict[str, Any]) -> None:
        """``spmd.shift``: member ``i``'s value sent to member ``i + offset``."""
        ranks, here, ins = self._team_inputs(op, team, mb, stage, layer)
        n = len(ranks)
        for i, src in enumerate(ranks):
            j = (i + int(op.attrs["offset"])) % n
            dst = ranks[j]
            name = self.local_name(op.outputs[0], dst, mb) if here[j] else None
            (out,) = self.em.collective(CollectiveType.SEND_RECV, [ins[i]], [src, dst], [name],
                                        meta)
            if out is not None:
                self.menv[(dst, mb)][op.outputs[0]] = out

    def _accumulate(self, stage: int, mb: int, op: Op) -> None:
        grads = [o for o in op.outputs if o in self.grad_of]
        if grads:
            self.sync.after_backward(stage, mb, grads)

    def _loss_outputs(self, step: Function) -> List[Value]:
        """The loss of every micro-batch on every rank of its stage, the
        program's first outputs.

        The loss is normally an op's result, found in the environments the
        tasks filled. It may also be an input of the step passed through
        (a forward-only step whose first output is an argument): no op
        computes it, so it has no chunk and no environment entry (this was
        a KeyError). Such a loss is a copy (``identity``) of the rank's own
        input on the last stage, as the ONNX importer makes its pass-through
        outputs: an output that is an input would be relabelled ``loss`` in
        ``meta["io"]``, and :func:`~distsim.transforms.zero_numbers.local_inputs`
        could no longer feed it. Only a data or constant input can be passed
        through (a parameter or optimizer state has no per-micro-batch copy
        to return): anything else is refused by :meth:`_analyse`, before
        anything is emitted."""
        loss = step.value_by_name(step.meta["loss"])
        chunk = self.value_chunk.get(loss)
        if chunk is not None:
            last = self.stage_of_chunk(chunk)
            return [self.menv[(r, mb)][loss] for mb in range(self.microbatches)
                    for _, _, r in self.placement.group(last)]
        c = self.chunks - 1   # where ops with no layer and no producer go (_analyse)
        last = self.stage_of_chunk(c)
        out = []
        for mb in range(self.microbatches):
            meta = {"stage": last, "microbatch": mb, "chunk": c}
            for d, t, r in self.placement.group(last):
                x = self.get(loss, r, d, t, mb, last, None)
                out.append(self.em.one("identity", [x], None,
                                       f"{self.local_name(loss, r, mb)}_out", meta))
        return out

    # -- the pass ----------------------------------------------------------
    def __call__(self, step: Function) -> Function:
        with gc_paused():
            return self._lower(step)

    def _lower(self, step: Function) -> Function:
        S = self.strategy
        fusion = fusion_for(S)
        step = Fuse(fusion)(step)
        self._analyse(step)
        placement = self.placement
        self.em = Emitter(step.name, placement.reps if self.representatives else None)
        self.ctx = LoweringContext(
            S, self.microbatches, placement, self.em, self.params,
            {p: self.stage_of_chunk(c) for p, c in self.param_chunk.items()}, self.grad_of,
            StepTasks(self.task_ops, self.producer_of, self.task_of_op, self.crossing,
                      self.task_layer_params),
            self.stage_of_chunk,
            expert={v for v in self.params if v.name in set(step.meta.get("expert_params", ()))})
        #: the values of each (rank, micro-batch) so far: the context's
        self.menv: Dict[Tuple[int, int], Dict[Value, Value]] = self.ctx.values
        self.consts: Dict[Tuple[Value, int], Value] = {}
        self.sync = GradientSync(self.ctx, step, self.hyper, self.master_dtype,
                                 self.local_gradients)
        self.sends = StageSends(self.ctx, self.split_axes, self.local_name)
        self.gathers = self.sync.gathers
        self.sync.create_inputs()
        recompute = step.meta.get("recompute", "none")
        # Estimated task times (FLOPs) order the program like the time line.
        work = {key: 1.0 + sum(op_flops(op) for op in ops) for key, ops in self.task_ops.items()}
        order, sends = program_order(S.schedule, S.pp, self.microbatches, S.chunks,
                                     lambda task: work.get((task[0], task[2]), 1.0))
        # each task's sends where the schedule places them
        self.sent_by: Dict[Tuple[str, int, int], Tuple[int, int, int, Sequence[Op]]] = {}
        for i, (stage, (kind, mb, c), _, _) in enumerate(order):
            self.sends.send_all([self.sent_by.pop(sent) for sent in sends[i]])
            self.emit_task(stage, kind, mb, c)
        self.sends.send_all([self.sent_by.pop(sent) for sent in sends[-1]])
        self.sync.finish()
        f = self.em.function
        losses = self._loss_outputs(step)
        for v in losses:
            self.em.io.setdefault(v.name, {})["role"] = "loss"
        f.outputs = losses + self.sync.outputs
        f.meta = {
            "roles": self.em.roles, "updates": self.ctx.updates, "io": self.em.io,
            "model": step.meta.get("model", {}), "strategy": self.given.to_dict(),
            "microbatches": self.microbatches, "loss": step.meta["loss"],
            "params": step.meta["params"],
            "param_shards": step.meta.get("param_shards", {}),
            "param_global_shapes": step.meta.get("param_global_shapes", {}),
            "param_unpadded": step.meta.get("param_unpadded", {}),
            "consts": step.meta.get("consts", {}),
            "stage_ranges": self.ranges, "dp": S.dp, "tp": S.tp, "pp": S.pp, "ep": S.ep,
            "expert_params": step.meta.get("expert_params", []),
            "optimizer": self.hyper.name, "recompute": recompute, "fusion": fusion,
        }
        if self.cp > 1:   # dp counts the context-parallel ranks too (flat_cp)
            f.meta["cp"] = self.cp
        self.em.log.updated = (self.ctx.updates, self.ctx.updated)
        if self.representatives:
            # which devices each present rank stands for (its stage's ranks),
            # and how many
            stands_for = placement.stands_for()
            f.meta["represents"] = {r: len(stands_for[r]) for r in sorted(placement.reps)}
            f.meta["represented_ranks"] = stands_for
        return f
