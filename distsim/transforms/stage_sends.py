"""The values a lowered pipeline sends between stages: each task's outputs
that another stage's chunk reads, one ``comm.sendrecv`` per rank of the
sending stage to its peer (same data- and tensor-parallel rank) of the
reading stage, where the schedule places the send
(:func:`~distsim.transforms.pipeline.program_order`).

With ``p2p_scatter`` (:mod:`.pipeline_split`) a value every
tensor-parallel rank holds whole goes as one piece per rank: all of an
exchange point's pieces are sliced before its transfers (so that a rank's
transfers there stay one group, as Megatron-LM slices before its
``batch_isend_irecv``), and the reading stage all-gathers them over each
tensor-parallel group as the first task reading the value starts
(:meth:`StageSends.gather_arrived`).
"""
from __future__ import annotations

from typing import Callable, Dict, List, Sequence, Tuple

from ..ir.comm import CollectiveType
from ..ir.core import Op, Value
from .lowering_context import LoweringContext

#: a task whose outputs are sent: its stage, micro-batch, chunk and ops
Sent = Tuple[int, int, int, Sequence[Op]]


class StageSends:
    """The sends of one lowering (``ctx``), the values split over the
    tensor-parallel ranks with their axes (``split_axes``: empty without
    ``p2p_scatter``), and how the lowering names a local value
    (``local_name(value, rank, micro-batch)``)."""

    def __init__(self, ctx: LoweringContext, split_axes: Dict[Value, int],
                 local_name: Callable[[Value, int, int], str]) -> None:
        self.ctx = ctx
        self.split_axes = split_axes
        self.local_name = local_name
        #: pieces received, not yet gathered (per rank and micro-batch)
        self.arriving: Dict[Tuple[int, int], Dict[Value, Value]] = {}
        #: per task (kind, micro-batch, chunk): the values it gathers as it starts
        self.gather_at: Dict[Tuple[str, int, int], List[Value]] = {}
        self._outputs: Dict[int, tuple] = {}

    @property
    def pending(self) -> bool:
        """Whether some task still has pieces to gather."""
        return bool(self.gather_at)

    def _crossing_outputs(self, ops: Sequence[Op]) -> List[Tuple[Op, Value, List[int]]]:
        """(op, output, chunks reading it) for the outputs of a task's ops
        that other chunks read, in order (once per task)."""
        found = self._outputs.get(id(ops))
        if found is None:
            crossing = self.ctx.tasks.crossing
            found = self._outputs[id(ops)] = (ops, [(op, v, sorted(crossing[v]))
                                                    for op in ops for v in op.outputs
                                                    if v in crossing])
        return found[1]                       # ops kept above: the id stays theirs

    def send_all(self, items: Sequence[Sent]) -> None:
        """The sends of the tasks the schedule places here: every rank's
        piece of each split value sliced first, then every transfer."""
        pieces: Dict[Tuple[int, int, Value], Value] = {}
        if self.split_axes:
            for stage, mb, c, ops in items:
                self._slice(stage, mb, c, ops, pieces)
        for stage, mb, c, ops in items:
            self._send(stage, mb, c, ops, pieces)

    def _slice(self, stage: int, mb: int, c: int, ops: Sequence[Op],
               pieces: Dict[Tuple[int, int, Value], Value]) -> None:
        ctx = self.ctx
        em = ctx.emitter
        for op, v, chunks in self._crossing_outputs(ops):
            axis = self.split_axes.get(v)
            if axis is None or all(ctx.stage_of_chunk(c2) == stage for c2 in chunks):
                continue
            n = v.type.shape[axis] // ctx.strategy.tp
            meta = {"stage": stage, "microbatch": mb, "chunk": c, "role": "pipeline"}
            if "phase" in op.meta:
                meta["phase"] = op.meta["phase"]
            for _, t, r in ctx.placement.group(stage):
                pieces[(r, mb, v)] = em.one(
                    "slice", [ctx.values[(r, mb)][v]],
                    {"axis": axis, "start": t * n, "stop": (t + 1) * n},
                    f"{self.local_name(v, r, mb)}_part", meta)

    def _send(self, stage: int, mb: int, c: int, ops: Sequence[Op],
              pieces: Dict[Tuple[int, int, Value], Value]) -> None:
        ctx = self.ctx
        S, em = ctx.strategy, ctx.emitter
        for op, v, chunks in self._crossing_outputs(ops):
            reader = "F" if "phase" not in op.meta else "B"
            meta = {"stage": stage, "microbatch": mb, "chunk": c, "role": "pipeline",
                    "detail": "forward" if reader == "F" else "backward"}
            for c2 in chunks:
                dst_stage = ctx.stage_of_chunk(c2)
                if dst_stage == stage:
                    continue
                for d, t, r in ctx.placement.group(stage):
                    dst = S.rank(d, dst_stage, t)
                    env = ctx.env(dst, mb)
                    arriving = self.arriving.setdefault((dst, mb), {})
                    if v in env or v in arriving:
                        continue
                    piece = pieces.get((r, mb, v))
                    if piece is None:
                        (env[v],) = em.collective(
                            CollectiveType.SEND_RECV, [ctx.values[(r, mb)][v]], [r, dst],
                            [self.local_name(v, dst, mb)], meta)
                        continue
                    (arriving[v],) = em.collective(
                        CollectiveType.SEND_RECV, [piece], [r, dst],
                        [f"{self.local_name(v, dst, mb)}_part"], meta)
                    gathers = self.gather_at.setdefault((reader, mb, c2), [])
                    if v not in gathers:
                        gathers.append(v)

    def gather_arrived(self, stage: int, kind: str, mb: int, c: int) -> None:
        """All-gather, over each tensor-parallel group of ``stage``, the
        pieces of the split values that task (``kind``, ``mb``, ``c``) is
        the first to read, as it starts."""
        ctx = self.ctx
        for v in self.gather_at.pop((kind, mb, c), ()):
            axis = self.split_axes[v]
            meta = {"stage": stage, "microbatch": mb, "chunk": c, "role": "pipeline",
                    "detail": "forward" if kind == "F" else "backward"}
            for d in ctx.placement.dp_indices():
                ranks, here = ctx.placement.tp_team(d, stage)
                ins = [self.arriving[(r, mb)].pop(v) if present else None
                       for r, present in here]
                outs = ctx.emitter.collective(CollectiveType.ALL_GATHER, ins, ranks,
                                              [self.local_name(v, r, mb) if present else None
                                               for r, present in here], meta, dim=axis)
                for r, o in zip(ranks, outs):
                    if o is not None:
                        ctx.env(r, mb)[v] = o
