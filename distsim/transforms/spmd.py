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
  rank by the pipeline schedule (:mod:`.pipeline`); values that cross
  stages travel by ``comm.sendrecv`` right after the task producing them;
- SPMD collectives turned into ``comm.*`` ops over each TP group;
- gradient accumulation over the micro-batches (in the backward tasks),
  data-parallel gradient synchronisation and the AdamW update with
  mixed precision, sharded as the ZeRO stage says (:mod:`.zero`).

The result's ``meta["io"]`` describes every input and output (which
global parameter, which TP / DP shard, which micro-batch) so that
:func:`distsim.transforms.zero.local_inputs` and
:func:`~distsim.transforms.zero.global_updates` can move numbers between a
single-device step and the lowered one.
"""
from __future__ import annotations

import heapq
from typing import Any, Dict, List, Mapping, Optional, Sequence, Set, Tuple

from ..cost.flops import op_flops
from ..errors import PassPreconditionError
from ..ir.builder import NameScope
from ..ir.comm import CollectiveType
from ..ir.core import Function, Op, Value
from ..ir.registry import infer_types, lookup, with_defaults
from ..ir.types import DType, TensorType
from .adam import AdamHyper
from .pipeline import chunk_of_layer, merge_tasks, partition_layers, schedule_tasks
from .strategy import Strategy
from .zero import GradientSync

SPMD_TO_COMM = {"spmd.allreduce": CollectiveType.ALL_REDUCE,
                "spmd.allgather": CollectiveType.ALL_GATHER,
                "spmd.reducescatter": CollectiveType.REDUCE_SCATTER}


class Emitter:
    """Appends ops with inferred types to a new local-view function."""

    def __init__(self, name: str) -> None:
        self.function = Function(name)
        self.names = NameScope()
        self.roles: Dict[str, str] = {}
        self.io: Dict[str, Dict[str, Any]] = {}

    def input(self, value_name: str, type: TensorType, role: str, **info: Any) -> Value:
        v = Value(self.names.fresh(value_name), type)
        self.function.inputs.append(v)
        self.roles[v.name] = role
        self.io[v.name] = dict(info, role=role)
        return v

    def op(self, op_type: str, inputs: Sequence[Value], attrs: Optional[Mapping[str, Any]],
           names: Sequence[str], meta: Optional[Dict[str, Any]] = None) -> List[Value]:
        attrs = with_defaults(op_type, dict(attrs or {}))
        types = infer_types(op_type, [v.type for v in inputs], attrs)
        if len(names) != len(types):
            names = [f"{names[0]}.{i}" for i in range(len(types))]
        outs = [Value(self.names.fresh(n), t) for n, t in zip(names, types)]
        self.function.ops.append(Op(op_type, inputs, outs, attrs, meta=meta))
        return outs

    def one(self, op_type: str, inputs: Sequence[Value], attrs: Optional[Mapping[str, Any]],
            name: str, meta: Optional[Dict[str, Any]] = None) -> Value:
        return self.op(op_type, inputs, attrs, [name], meta)[0]

    def collective(self, kind: CollectiveType, inputs: Sequence[Value], ranks: Sequence[int],
                   names: Sequence[str], meta: Optional[Dict[str, Any]] = None,
                   **attrs: Any) -> List[Value]:
        return self.op(kind.op_type, inputs, dict(attrs, ranks=list(ranks)), names, meta)


class LowerSPMD:
    """The pass: ``LowerSPMD(strategy, microbatches, hyper)(step)``."""

    def __init__(self, strategy: Strategy, microbatches: int = 1,
                 hyper: AdamHyper = AdamHyper(), master_dtype: str = "f32") -> None:
        if strategy.dp is None:
            raise PassPreconditionError("LowerSPMD: the strategy's dp must be resolved")
        self.S = strategy
        self.M = microbatches
        self.hyper = hyper
        self.master_dtype = DType.parse(master_dtype)

    # -- analysis of the step ----------------------------------------------
    def _analyse(self, step: Function) -> None:
        S = self.S
        self.C = S.pp * S.chunks
        layers = int(step.meta.get("model", {}).get("layers", 1))
        self.ranges = partition_layers(layers, self.C)
        producer = step.producers()
        self.chunk_of_op: Dict[int, int] = {}
        self.task_ops: Dict[Tuple[str, int], List[Op]] = {}
        for op in step.ops:
            layer = op.meta.get("layer")
            if isinstance(layer, int):
                c = chunk_of_layer(layer, self.ranges)
            else:
                c = max((self.chunk_of_op[id(producer[v])] for v in op.inputs if v in producer),
                        default=self.C - 1)
            self.chunk_of_op[id(op)] = c
            kind = "F" if "phase" not in op.meta else "B"
            self.task_ops.setdefault((kind, c), []).append(op)
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

    def stage_of_chunk(self, c: int) -> int:
        return c % self.S.pp

    def group(self, stage: int) -> List[Tuple[int, int, int]]:
        """(dp rank, tp rank, global rank) of a pipeline stage."""
        return [(d, t, self.S.rank(d, stage, t)) for d in range(self.S.dp) for t in range(self.S.tp)]

    # -- values ------------------------------------------------------------
    def local_name(self, v: Value, rank: int, mb: int) -> str:
        return f"{v.name}_m{mb}_r{rank}" if self.M > 1 else f"{v.name}_r{rank}"

    def get(self, v: Value, rank: int, d: int, t: int, mb: int, stage: int, layer: Any) -> Value:
        env = self.menv.setdefault((rank, mb), {})
        if v in env:
            return env[v]
        if v in self.param_chunk:
            return self.sync.param_for_use(v, rank, d, t, stage, mb, layer)
        if v in self.data_inputs:
            nv = self.em.input(self.local_name(v, rank, mb), v.type.with_device(rank), "data",
                               name=v.name, dp_rank=d, tp_rank=t, microbatch=mb)
            env[v] = nv
            return nv
        raise PassPreconditionError(f"LowerSPMD: value %{v.name} is not available on rank "
                                    f"{rank} (micro-batch {mb})")

    # -- tasks -------------------------------------------------------------
    def _flush_sends(self, until: float) -> None:
        while self.pending_sends and self.pending_sends[0][0] <= until:
            _, _, args = heapq.heappop(self.pending_sends)
            self._send(*args)

    def emit_task(self, stage: int, kind: str, mb: int, c: int, end: float = 0.0) -> None:
        em, S = self.em, self.S
        ops = self.task_ops.get((kind, c), [])
        self.current_kind = kind
        base = {"stage": stage, "microbatch": mb, "chunk": c}
        for op in ops:
            meta = dict(op.meta, **base)
            if any(o in self.grad_of for o in op.outputs):
                meta["category"] = "gradients"
            layer = op.meta.get("layer")
            if op.op_type.startswith("spmd."):
                for d in range(S.dp):
                    ranks = [S.rank(d, stage, t) for t in range(S.tp)]
                    ins = [self.get(op.inputs[0], r, d, t, mb, stage, layer)
                           for t, r in enumerate(ranks)]
                    if op.op_type == "spmd.copy":
                        for r, x in zip(ranks, ins):
                            self.menv[(r, mb)][op.outputs[0]] = x
                        continue
                    kind_c = SPMD_TO_COMM[op.op_type]
                    attrs = {}
                    if "reduce_op" in op.attrs:
                        attrs["reduce_op"] = op.attrs["reduce_op"]
                    if "dim" in op.attrs:
                        attrs["dim"] = op.attrs["dim"]
                    outs = em.collective(kind_c, ins, ranks,
                                         [self.local_name(op.outputs[0], r, mb) for r in ranks],
                                         meta, **attrs)
                    for r, o in zip(ranks, outs):
                        self.menv[(r, mb)][op.outputs[0]] = o
                self._accumulate(stage, mb, op)
                continue
            spec_attrs = lookup(op.op_type).attrs
            rank_attrs = {k: v for k, v in op.meta.get("rank_attrs", {}).items() if k in spec_attrs}
            for d, t, r in self.group(stage):
                ins = [self.get(v, r, d, t, mb, stage, layer) for v in op.inputs]
                attrs = dict(op.attrs)
                for key, per_rank in rank_attrs.items():
                    attrs[key] = per_rank[t]
                outs = em.op(op.op_type, ins, attrs,
                             [self.local_name(v, r, mb) for v in op.outputs], dict(meta))
                env = self.menv[(r, mb)]
                for v, o in zip(op.outputs, outs):
                    env[v] = o
                self.sync.note_layer_output(r, layer, outs[0])
            self._accumulate(stage, mb, op)
        heapq.heappush(self.pending_sends, (end, len(self.em.function.ops), (stage, mb, c, ops)))

    def _accumulate(self, stage: int, mb: int, op: Op) -> None:
        grads = [o for o in op.outputs if o in self.grad_of]
        if grads:
            self.sync.after_backward(stage, mb, grads)

    def _send(self, stage: int, mb: int, c: int, ops: Sequence[Op]) -> None:
        S = self.S
        for op in ops:
            for v in op.outputs:
                for c2 in sorted(self.crossing.get(v, ())):
                    dst_stage = self.stage_of_chunk(c2)
                    if dst_stage == stage:
                        continue
                    for d, t, r in self.group(stage):
                        dst = S.rank(d, dst_stage, t)
                        env = self.menv.setdefault((dst, mb), {})
                        if v in env:
                            continue
                        (out,) = self.em.collective(
                            CollectiveType.SEND_RECV, [self.menv[(r, mb)][v]], [r, dst],
                            [self.local_name(v, dst, mb)],
                            {"stage": stage, "microbatch": mb, "chunk": c, "role": "pipeline",
                             "detail": "forward" if "phase" not in op.meta else "backward"})
                        env[v] = out

    # -- the pass ----------------------------------------------------------
    def __call__(self, step: Function) -> Function:
        S = self.S
        self._analyse(step)
        self.em = Emitter(step.name)
        self.menv: Dict[Tuple[int, int], Dict[Value, Value]] = {}
        self.sync = GradientSync(self, step)
        self.sync.create_inputs()
        per_rank = schedule_tasks(S.schedule, S.pp, self.M, S.chunks)
        recompute = step.meta.get("recompute", "none")
        # Estimated task times (FLOPs) order the program like the time line.
        work = {key: 1.0 + sum(op_flops(op) for op in ops) for key, ops in self.task_ops.items()}
        order = merge_tasks(per_rank, self.C, lambda task: work.get((task[0], task[2]), 1.0))
        # Sends are emitted in the order of their producers' estimated end
        # (each comm stream takes its ops in program order).
        self.pending_sends: List[Tuple[float, int, tuple]] = []
        for stage, (kind, mb, c), start, end in order:
            self._flush_sends(start)
            self.emit_task(stage, kind, mb, c, end)
        self._flush_sends(float("inf"))
        self.sync.finish()
        f = self.em.function
        loss = step.value_by_name(step.meta["loss"])
        last = self.stage_of_chunk(self.value_chunk[loss])
        losses = [self.menv[(r, mb)][loss] for mb in range(self.M) for _, _, r in self.group(last)]
        for v in losses:
            self.em.io.setdefault(v.name, {})["role"] = "loss"
        f.outputs = losses + self.sync.outputs
        f.meta = {
            "roles": self.em.roles, "updates": self.sync.updates, "io": self.em.io,
            "model": step.meta.get("model", {}), "strategy": S.to_dict(),
            "microbatches": self.M, "loss": step.meta["loss"], "params": step.meta["params"],
            "param_shards": step.meta.get("param_shards", {}),
            "param_global_shapes": step.meta.get("param_global_shapes", {}),
            "stage_ranges": self.ranges, "dp": S.dp, "tp": S.tp, "pp": S.pp,
            "optimizer": "adamw", "recompute": recompute,
        }
        return f
