"""What the estimator's :class:`~.timeline.Builder` keeps beyond
one walk: :class:`Memo` (what the builders of one configuration work out
once and share, and what the walks note for the memory estimate),
:class:`ScatterTerms`, and :class:`Walk` (where a builder is in its program
order) with :func:`shared_prefix` (how much of two walks is the same).
"""
from __future__ import annotations

from typing import Any, Dict, List, NamedTuple, Optional, Tuple

from ..ir.comm import CollectiveType


class ScatterTerms:
    """One block's per-parameter terms of ZeRO 2/3's reduce-scatter per
    micro-batch (:meth:`.context.StepContext.block_scatter`), each list in parameter
    order: ``flat`` flattening the gradient, ``whole`` / ``on_shard`` the
    accumulate / average ops on the whole gradient and on the shard
    (``shard_flops``: the FLOPs of the latter), ``flops`` what the lowering
    adds, ``rs`` the reduce-scatters."""

    __slots__ = ("flat", "whole", "on_shard", "shard_flops", "flops", "rs")

    def __init__(self) -> None:
        self.flat: List[float] = []
        self.whole: List[float] = []
        self.on_shard: List[float] = []
        self.shard_flops: List[float] = []
        self.flops: List[float] = []
        self.rs: List[float] = []


class Memo:
    """What a :class:`Builder` works out once (the dp team's collective
    times, chunk blocks, task plans, ZeRO-3 gathers, reduce-scatter terms,
    last-backward plans, parameter costs), kept apart so that the builders
    of one configuration that differ only in the number of micro-batches
    (:func:`~distsim.estimate.timeline_figures`) share it: none of it
    depends on that number beyond the classes its keys name."""

    def __init__(self) -> None:
        self.dp_times: Dict[Tuple[CollectiveType, float], float] = {}
        #: ZeRO 2/3's accumulating backwards, blocks recorded to be replayed:
        #: (block, last micro-batch, the blocks whose gathers it issues) ->
        #: record (:meth:`.replay.ReplayedBackward._block_record`)
        self.block_records: Dict[tuple, tuple] = {}
        self.blocks: Dict[Tuple[str, int], List[Tuple[str, Optional[int]]]] = {}
        self.plans: Dict[tuple, Any] = {}
        self.gathers: Dict[Tuple[str, str], List[Tuple[float, float, int]]] = {}
        #: ZeRO-3: per (task kind, block), its gathers as issued
        #: (:class:`.gates.GatherPlan`)
        self.gather_plans: Dict[Tuple[str, str], Any] = {}
        self.scatter_terms: Dict[tuple, ScatterTerms] = {}
        #: ZeRO 2/3's backward past the first micro-batch: per accumulation
        #: ops of its micro-batch, each parameter's (time, FLOPs) of its
        #: shard's ops
        self.shard_ops: Dict[Tuple[str, ...], Dict[Tuple[str, int], Tuple[float, float]]] = {}
        #: ZeRO-3's op-by-op backward: per (block, first micro-batch's plan
        #: or not), its gathers grouped (:meth:`.backward.OpByOpBackward._gather_groups`)
        self.gather_groups: Dict[Tuple[str, bool], List[Tuple[float, int]]] = {}
        self.segments: Dict[Tuple[str, bool, str], list] = {}
        #: per group, ZeRO-3 with tensor parallelism: per (task kind, block,
        #: a backward past the first micro-batch), its block-level task
        #: entry by entry (:func:`.gates.entry_plan`)
        self.entry_plans: Dict[Tuple[str, str, bool], list] = {}
        #: per block, whether its first micro-batch's op-by-op plan opens
        #: with a leading recomputation, and with compute
        #: (:meth:`.replay.ReplayedBackward._opens`)
        self.opens: Dict[Tuple[str, str], Tuple[bool, bool]] = {}
        #: ZeRO-3 by layer: per block, the parameters whose gradients are
        #: reduce-scattered as one (None: none) and their bytes
        self.grad_units: Dict[str, Tuple[Tuple[int, ...], ...]] = {}
        #: ZeRO-3 by layer: per block, its backward's memory with the
        #: unit's gradients held (:func:`.units.unit_backward_excess`)
        self.unit_excess: Dict[str, Tuple[float, Dict[int, float]]] = {}
        self.param_costs: Dict[Tuple[str, int], Any] = {}
        #: per stage, the bytes of each bucket of several gradients the
        #: walk all-reduced as one flat copy (:meth:`.StepSync.flush`): the
        #: memory estimate adds those copies (the same in every walk of a
        #: configuration)
        self.buckets: Dict[int, Tuple[int, ...]] = {}
        #: per stage, the bytes of each gradient all-reduced in one of those
        #: buckets, by its parameter key: unpacked after the backward pass
        #: into a copy that lives until the parameter's update
        self.bucketed: Dict[int, Dict[tuple, int]] = {}
        #: per stage, the most its buckets hold as one is unpacked: those
        #: flushed so far and one more (the bucket split into its pieces);
        #: the largest of all with one unpacking, the experts' and those
        #: flushed before it first under expert parallelism
        self.bucket_peak: Dict[int, int] = {}
        #: ZeRO 2/3 with a reduce-scatter per micro-batch: the bytes of
        #: flat gradient copies of a chunk's first backward (emitted op by
        #: op) still waiting for their reduce-scatters, each live until its
        #: reduce-scatter ends (that backward accumulates nothing, so the
        #: compute does not wait for them): in each later task of the
        #: stage, keyed ``(stage, kind, micro-batch, chunk)``,
        #: and at that backward's end, keyed ``(stage, "end", 0, chunk)``
        #: (the most over the walks; the memory estimate adds them); a
        #: task's per block (its position in the task's order), as
        #: each block of a backward starts and where each of a forward's
        #: peaks; and ZeRO 0/1's buckets of several gradients
        #: flushed before each block of a chunk's last backward (keyed
        #: ``(stage, "last", 0, chunk)``, per block: they live until they
        #: are unpacked after the backward pass)
        self.flat_pending: Dict[Tuple[int, str, int, int], Any] = {}
        #: those buckets where a gradient's sync flushes one inside its
        #: block, per (block position, the gradient's index), keyed as
        #: flat_pending (the block's excess after that gradient is on top)
        self.bucket_inside: Dict[Tuple[int, str, int, int], Dict[Tuple[int, int], int]] = {}
        #: the same copies inside that first backward: per (stage, chunk,
        #: "B", or a split backward's "W"),
        #: per gradient (its block's position in the backward's order, its
        #: index in the block), the bytes of the task's earlier copies
        #: still waiting when it is made (its flat copy made), and keyed
        #: (position, index, True) as the op making it starts (the most
        #: over the walks)
        self.flat_inside: Dict[Tuple[int, int, str], Dict[tuple, int]] = {}
        #: and in a later backward of the stage (op by op): per (stage,
        #: micro-batch, chunk, "B" or "W"), per gradient, the bytes of those copies
        #: still waiting when it is made (:meth:`.notes.MemoryNotes.later`;
        #: the flat_pending of its blocks bound the rest of each block)
        self.flat_later: Dict[Tuple[int, int, int, str], Dict[Tuple[int, int], int]] = {}
        #: ZeRO-3 by parameter: per (task kind, chunk shape, first backward
        #: or not), per block position, the most bytes above the block's
        #: baseline with its gathered parameters placed in time, and per
        #: gradient of the block the same at the op making it (the most
        #: over the walks: :func:`.gathered.block_peak`)
        self.gather_peaks: Dict[tuple, Dict[int, Tuple[float, Dict[int, float]]]] = {}
        #: pipelines: per (stage, task kind, chunk, first backward or not),
        #: the most bytes received from another stage for a later task
        #: (or, a forward's input, for the task itself) while a task runs:
        #: a received value lives from its transfer's start
        #: (:meth:`.notes.MemoryNotes.received`)
        self.recv_ahead: Dict[Tuple[int, str, int, bool], int] = {}
        #: ZeRO-3 by layer: per (stage, task kind, micro-batch, chunk), the
        #: bytes a task's first copy-in adds where the stage's compute so
        #: far ends (its concatenated shards) with the flat gradient copies
        #: still waiting there for their reduce-scatters (the most over the
        #: walks; :meth:`.notes.MemoryNotes.copy_in`)
        self.copy_ins: Dict[Tuple[int, str, int, int], int] = {}
        #: ZeRO-3: per (task kind, block), its gathered parameters' shard and
        #: whole bytes (:func:`.gathered_walk.param_bytes`)
        self.gathered_bytes: Dict[Tuple[str, str], List[Tuple[int, int]]] = {}
        #: ZeRO-3 by layer: per (task kind, block, curve), the unit's split
        #: in the template's offsets (:func:`.gathered_walk.unit_shape`), and per
        #: block the first backward's curve with its unit's gradients held
        #: (:func:`.units.unit_curve`)
        self.unit_shapes: Dict[tuple, Any] = {}
        #: ZeRO-3's op-by-op backward: per (block, first micro-batch's
        #: entries or not, curve), each compute run's position, offset on
        #: the curve and time (:func:`.gathered_walk.run_offsets`)
        self.run_offsets: Dict[tuple, list] = {}
        #: per (block, curve), how long each point's bytes stay once its op
        #: ends (:func:`.gathered_walk.point_spans`)
        self.point_spans: Dict[tuple, Any] = {}
        self.unit_curves: Dict[str, Any] = {}
        #: :func:`.gathered.block_peak` by the block's curve and its
        #: gathers' times from its start (the same place, the same result)
        self.block_peaks: Dict[tuple, tuple] = {}
        #: ZeRO 2/3 with ``bucket_mb 0``: per stage, the most bytes of flat
        #: gradient copies and reduce-scatter outputs held after the
        #: backward pass (:func:`.sync.queued_peak`; the most over
        #: the walks)
        self.flat_queued: Dict[int, int] = {}
        #: ZeRO 0/1: each stage's last backward of a chunk (op by op, with
        #: its gradient syncs) recorded relative to its start by the first
        #: timeline that emits it cleanly, replayed by the next
        #: (:meth:`.replay.ReplayedBackward.last_backward`): the
        #: two timelines of :func:`~distsim.estimate.timeline_figures`
        #: end with the same last backwards, later
        self.last_backwards: Dict[tuple, tuple] = {}
        #: whether a later timeline will replay those records (an estimate
        #: of a short schedule walks one timeline: nothing to record for)
        self.record_last_backwards = False
        #: the optimizer step's parameters in the order it updates them, as
        #: :meth:`.sync.StepSync.optimizer_steps` groups them
        self.optimizer_steps: Optional[List[tuple]] = None


#: A recorded run of a stage's items (:meth:`.engine.Timeline.since`),
#: replayed from another origin (:meth:`.engine.Timeline.replay`)
Items = tuple
#: A leading recomputation recorded on its own: its items and where its
#: streams end, relative to its origin (:meth:`.replay.ReplayedBackward._emit_from`)
Lead = Tuple[Items, float]


class TaskRecord(NamedTuple):
    """A block-level task (ZeRO-3) recorded relative to its start
    (:meth:`.timeline.Builder._emit_task`): its items, the FLOPs of its
    blocks in order, its end."""

    items: Items
    flops: Tuple[float, ...]
    last: float


class FirstBackwardRecord(NamedTuple):
    """A chunk's first backward with ZeRO 2/3, recorded relative to its
    start (:meth:`.replay.ReplayedBackward.first_backward`): its items,
    FLOPs, end, the flat copies' bytes at each gradient (``inside``), the
    copies it leaves waiting (bytes, end), its lead (or None), where it
    made its input gradient (None: not here)."""

    items: Items
    flops: float
    last: float
    inside: Dict[Tuple[int, int], int]
    flats: List[Tuple[int, float]]
    lead: Optional[Lead]
    out: Optional[float]


class LastBackwardRecord(NamedTuple):
    """A chunk's last backward (ZeRO 0/1) with its gradient syncs,
    recorded relative to its start (:meth:`.replay.ReplayedBackward.last_backward`):
    its items, FLOPs and end; the gradients made final and synchronised
    (by place in the chunk, times); what it left in the sync policy (the
    stage's pending bucket and its bytes, the gradients it deferred) and
    the sink (the buckets' bytes, those to unpack: bucket, all-reduce end,
    elements, dtype); its lead; where it made its input gradient."""

    items: Items
    flops: float
    last: float
    final: Any
    synced: Any
    pending: Tuple[Any, ...]
    pending_bytes: Optional[int]
    buckets: Tuple[int, ...]
    unpack: List[tuple]
    deferred: Tuple[Any, ...]
    lead: Optional[Lead]
    out: Optional[float]


class AccumulatingRecord(NamedTuple):
    """A ZeRO 2/3 backward past the first micro-batch, recorded relative
    to its start (:meth:`.replay.ReplayedBackward.accumulating_backward`):
    its items, FLOPs, end, the gradients it made final (last micro-batch),
    by layer the unit it leaves pending (its block's place, members,
    reduce-scatter end) or None, its lead, where it made its input gradient."""

    items: Items
    flops: float
    last: float
    final: List[Tuple[int, int, float]]
    leaves: Optional[Tuple[int, Tuple[int, ...], float]]
    lead: Optional[Lead]
    out: Optional[float]


class BlockRecord(NamedTuple):
    """One block of an accumulating backward recorded relative to its
    start (:meth:`.replay.ReplayedBackward._block_record`): its items,
    FLOPs, end, its gathers' ends (per block it issued, per last parameter
    position), its final gradients, its input gradient, and its ZeRO-3
    memory note (:func:`.gathered_walk.note_peak`)."""

    items: Items
    flops: float
    last: float
    ends: List[List[Tuple[Optional[int], float]]]
    final: List[Tuple[int, int, float]]
    out: Optional[float]
    got: Optional[tuple]


class Walk:
    """Where a :class:`Builder` is in its program order: the position, each
    task's end, where each backward task made what it sends to the stage
    before (its input gradient, before its last ops), the latest arrival
    of each task's inputs; the program order of tasks and the sends before
    each (:func:`~distsim.transforms.pipeline.program_order`, as the
    lowering emits them)."""

    __slots__ = ("order", "sends", "pos", "ends", "outs", "recv")

    def __init__(self, order: List[Tuple[int, Tuple[str, int, int], float, float]],
                 sends: List[Tuple[Tuple[str, int, int], ...]]) -> None:
        self.order = order
        self.sends = sends
        self.pos = 0
        self.ends: Dict[tuple, Optional[float]] = {}
        self.outs: Dict[tuple, Optional[float]] = {}
        self.recv: Dict[tuple, float] = {}


def shared_prefix(a: Walk, b: Walk, last_a: int) -> int:
    """How many tasks at the start of two walks of one configuration with
    different numbers of micro-batches (``a``'s last being ``last_a``) emit
    the same items: the same task at the same scheduled times after the
    same sends, and not a backward of ``a``'s last micro-batch (emitted op
    by op, with the gradient sync)."""
    n = 0
    for x, y, sx, sy in zip(a.order, b.order, a.sends, b.sends):
        if x != y or sx != sy or (x[1][0] == "B" and x[1][1] == last_a):
            break
        n += 1
    return n
