"""What the estimator reads from a template (:mod:`.profile`) and works
from: the blocks of a step (the embedding, one transformer layer, the
head) with their times, memory and op-level backward, the parameters of
each block, and the whole profile."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple


#: Block names: the embedding, one transformer layer, the head (final norm,
#: output layer and loss); a model that mixes dense and mixture-of-experts
#: layers has both a dense layer (LAYER) and a MoE layer (MOE:
#: :mod:`.layer_kinds`).
EMB, LAYER, HEAD, MOE = "emb", "layer", "head", "moe"
#: The template's last micro-batch (0: the first, 1: a middle one).
LAST_MB = 2
@dataclass
class Segment:
    """One entry of a block's op-level last backward: ``kind`` "c" (a run
    of compute ops: ``time_s``), "t" (a tensor-parallel collective:
    ``time_s``), "g" (the gradient of ``param`` is final here) or "o" (the
    block's input gradient, sent to the stage before, is made). ``deps``:
    indices of earlier entries of the same block it waits for (a compute
    run on collectives, a collective on the run producing its input); None
    in ``deps`` means "an input from before the block" (a collective with
    no deps reads only what the forward kept)."""

    kind: str
    time_s: float = 0.0
    deps: Tuple[Optional[int], ...] = ()
    param: str = ""
    #: part of the recomputation the block's backward starts with (reads
    #: only what the forward kept: it need not wait for the task's input)
    lead: bool = False
    #: ZeRO-3: the position (in the block's ``b_gather``) of the last
    #: gathered parameter read at or before this entry (the reshape of the
    #: gathered value): it waits for the block's gathers up to that one,
    #: which run in that order; -1 before the first read (no wait), None
    #: when the reads are not known (all of the block's gathers)
    gate: Optional[int] = None
    #: where its first op started on the template's timeline (a mark:
    #: where it ended)
    at: float = 0.0
    #: a mark "g": the time of the op making the gradient (the last of the
    #: run it marks; what is live from that op's start counts with it)
    op_s: float = 0.0
    #: a "t" that is a ring attention step (a send or receive on its own
    #: point-to-point queue, not the communication stream): that queue
    #: (:func:`.segments.ring_peer`); 0 otherwise
    p2p: int = 0


@dataclass
class Block:
    """Times of one block (seconds). ``f``: forward; ``b_first``,
    ``b_mid``, ``b_last``: backward of the first, a middle and the last
    micro-batch; ``*_busy``: the part spent computing (the rest waits on
    tensor-parallel collectives); ``f_flops`` / ``b_flops``: FLOPs executed
    per micro-batch (recomputation included); ``last`` / ``only``: the op
    level backward of the last micro-batch when there are several / one."""

    f: float = 0.0
    f_busy: float = 0.0
    f_flops: float = 0.0
    b_first: float = 0.0
    b_mid: float = 0.0
    b_last: float = 0.0
    b_first_busy: float = 0.0
    b_mid_busy: float = 0.0
    b_last_busy: float = 0.0
    b_flops: float = 0.0
    step_f_flops: float = 0.0       # FLOPs LowerSPMD's task ordering counts
    step_b_flops: float = 0.0
    last: List[Segment] = field(default_factory=list)
    only: List[Segment] = field(default_factory=list)
    #: a middle micro-batch's backward op by op (its gradients' marks
    #: left out): ZeRO-3's block-level backward per group
    #: (:func:`.gates.entry_plan`)
    mid: List[Segment] = field(default_factory=list)
    #: ZeRO-3: the forward op by op, as ``only`` is the backward's (its
    #: reads of gathered parameters in :attr:`Segment.gate`): by layer,
    #: what taking the reshapes out and the unit's split in changes
    #: (:func:`.gates.gather_plan`)
    f_segs: List[Segment] = field(default_factory=list)
    saved_bytes: int = 0            # activations kept from forward to backward
    tp_comm_f: float = 0.0          # tensor-parallel collective time, forward
    tp_comm_b: float = 0.0          # ... backward (its recomputation's included)
    #: the tensor-parallel collectives' spans on the template, from the
    #: block's start (forward; backward of the first, a middle and the
    #: last micro-batch): where a task's collectives fall, to take their
    #: union with the stage's pipeline transfers in ``communication_s``
    f_tp_spans: Tuple[Tuple[float, float], ...] = ()
    b_tp_spans: Tuple[Tuple[Tuple[float, float], ...], ...] = ((), (), ())
    # compute before the first / after the last tensor-parallel collective
    # (forward, backward); None: the block has none
    f_pre: Optional[float] = None
    f_post: Optional[float] = None
    b_pre: Optional[float] = None
    b_post: Optional[float] = None
    # activation recomputation: the recompute ops the backward starts with
    # (they read what the forward kept, not the incoming gradient, so they
    # run before it arrives): their time as the compute stream sees them,
    # busy part, whether they include tensor-parallel collectives (and the
    # compute before the first of them, which no collective holds up), and
    # the compute of the rest of the backward before its first collective
    b_lead: float = 0.0
    b_lead_busy: float = 0.0
    b_lead_comm: bool = False
    b_lead_pre: float = 0.0
    b_rest_pre: Optional[float] = None
    # memory above the steady baseline while the block runs (bytes): the
    # forward over weights, optimizer state and the saved activations of
    # the blocks before it; the backward (a later micro-batch) over those,
    # the gradient buffers and the saved activations up to this block
    f_excess: float = 0.0
    #: the forward: how long after its start the block first reaches that
    #: peak (the fp32 logits' cast before the loss, not the loss's end):
    #: the flat copies still waiting then add to it
    f_peak_s: float = 0.0
    b_excess: float = 0.0
    b0_excess: float = 0.0          # the backward of a single micro-batch (no buffers before)
    #: how long after the backward's start it first reaches ``b_excess`` /
    #: ``b0_excess`` (the float32 loss's last passes, not its start): the
    #: flat copies still waiting then add to it
    b_peak_s: float = 0.0
    b0_peak_s: float = 0.0
    #: a backward of ZeRO 2/3 with a reduce-scatter per micro-batch: each
    #: gradient a value of its own (not added into a whole buffer), and
    #: flattened for its reduce-scatter right after the op that makes it
    #: (:func:`_scatter_excess`)
    bs_excess: float = 0.0
    #: the same at each gradient of the block: its parameter's index in
    #: the block -> bytes (what copies still waiting add to)
    bs_grads: Dict[int, float] = field(default_factory=dict)
    #: of those, the bytes while the op making the gradient runs (copies
    #: waiting as it starts add to it: one may end before its flat copy)
    bs_ops: Dict[int, float] = field(default_factory=dict)
    #: the same backward's ops that make final gradients, in order: (the
    #: indices of the parameters, the bytes above the baseline while the op
    #: runs and once it has ended, the gradients' bytes)
    bs_made: List[Tuple[Tuple[int, ...], float, float, int]] = field(default_factory=list)
    # ZeRO-3: the parameters gathered in this block's forward / backward (the
    # first reader of each), as (owner block, index in its parameter list)
    f_gather: List[Tuple[str, int]] = field(default_factory=list)
    b_gather: List[Tuple[str, int]] = field(default_factory=list)
    #: ZeRO-3: where the forward / backward (first micro-batch) first reads
    #: each gathered parameter, as (compute time of the block before that
    #: read, the parameter's position in ``f_gather`` / ``b_gather``), in
    #: program order: the compute before a read waits for no later gather
    f_gates: List[Tuple[float, int]] = field(default_factory=list)
    b_gates: List[Tuple[float, int]] = field(default_factory=list)
    #: ZeRO-3: per parameter first read in the forward / backward, the
    #: bytes above the block's baseline (as ``f_excess`` / ``b0_excess``)
    #: while the reshape of its gathered value runs
    f_reads: Dict[str, float] = field(default_factory=dict)
    b_reads: Dict[str, float] = field(default_factory=dict)
    #: ZeRO-3: the memory curves of the forward, the first micro-batch's
    #: backward and a later one's, their gathered parameters taken out
    #: (:class:`.gathered.GatherCurve`): placed in time by the estimate
    f_curve: Any = None
    b_curve: Any = None
    b_curve_later: Any = None
    #: a layer's backward (the first micro-batch's, a middle one's): the
    #: compute after it makes its input gradient, which the stage before
    #: receives from then on (sent before the task ends)
    out_tail_first: float = 0.0
    out_tail_mid: float = 0.0
    #: a backward (the first micro-batch's, a middle one's): how long its
    #: last tensor-parallel collectives outlast its compute (with sp, a
    #: layer's layernorm weight gradients' all-reduces), which the next
    #: task's collectives queue behind on the communication stream
    comm_tail_first: float = 0.0
    comm_tail_mid: float = 0.0
    #: a backward (the first micro-batch's, a middle one's): how long its
    #: first collective after the early ones (:attr:`b_early`) waited on
    #: the template's communication stream past its input (the block
    #: before's last collectives, then its early all-gathers), which a task
    #: starting with this block does not (its early gathers ran in the task
    #: before)
    b_wait_first: float = 0.0
    b_wait_mid: float = 0.0
    #: the parameter (its index in the block) whose final gradient is the
    #: first result of the block's last backward op (the embedding's),
    #: or None: where the block ends a backward task, ZeRO-3 gates the
    #: next task's gathers on that result, which holds the gradient
    #: through its sync
    b_held: Optional[int] = None
    #: the backward's leading tensor-parallel collectives that read only
    #: what the forward made (with sp, the re-gathered layernorm outputs):
    #: the bytes they make, which the simulator's communication stream
    #: makes as soon as it is free, during the task before
    b_early: int = 0
    #: the backward's excess (as ``b_excess`` / ``b0_excess``) once its
    #: last collective has ended (None: it has none)
    b_tail: Optional[float] = None
    b0_tail: Optional[float] = None
    #: per parameter (its index) whose gradient the last backward
    #: (``b_after``) / the first (``b0_after``) makes final: the excess
    #: (as ``b_excess`` / ``b0_excess``) from there to the block's end,
    #: where a bucket that gradient's sync flushes is live
    b_after: Dict[int, float] = field(default_factory=dict)
    b0_after: Dict[int, float] = field(default_factory=dict)
    #: a weight-gradient part (:attr:`LayerProfile.weight`): whether it
    #: reads the step's data inputs (the embedding's gradient, the token
    #: ids), which then live until it
    reads_data: bool = False


@dataclass
class Param:
    """A parameter of a block as one tensor-parallel rank holds it, and
    its optimizer ops on the template (one rank, no sharding): ``opt_pre``
    (flattening the gradient, ZeRO >= 1), ``opt_update`` (the update ops
    on the master weights: they shrink with the ZeRO shard; (time, flops)
    each), ``opt_post`` (reshaping the new parameter, ZeRO 1/2), and the
    memory of the update ops (``opt_with``, ``opt_after``, ``opt_flat``:
    :func:`_optimizer_memory`)."""

    name: str
    block: str
    numel: int
    shape: Tuple[int, ...]
    dtype: Any                      # the IR DType
    opt_pre: float = 0.0
    opt_update: List[Tuple[float, float]] = field(default_factory=list)
    opt_post: float = 0.0
    #: memory of its update ops on the template (bytes above weights,
    #: optimizer state and gradient buffers; every value they make is the
    #: size of the parameter, or a scalar, so they scale with a ZeRO
    #: shard): the most while the template's flat copy of the gradient
    #: (ZeRO >= 1, ``opt_flat`` bytes) is still live, less that copy,
    #: and the most after it is freed (ZeRO 0: everything)
    opt_with: float = 0.0
    opt_after: float = 0.0
    opt_flat: int = 0
    #: an expert's weights (expert parallelism): synchronised and
    #: ZeRO-sharded over the expert-data-parallel team of dp / ep ranks
    expert: bool = False


@dataclass
class LayerProfile:
    blocks: Dict[str, Block]
    params: Dict[str, List[Param]]          # block -> its parameters, in step order
    param_order: List[Tuple[str, int]]      # (block, index) in the step's parameter order
    forward_crossing: List[int]             # bytes of each value sent forward between stages
    backward_crossing: List[int]
    tied: bool                              # the head reuses the embedding weight (pp > 1: a copy)
    master_dtype: Any
    # each block's cost as LowerSPMD's balanced partition estimates it
    partition_costs: Dict[str, float] = field(default_factory=dict)
    wall_s: float = 0.0
    #: of ``forward_crossing``, the bytes a backward op reads (see _crossing)
    forward_crossing_saved: int = 0
    #: a micro-batch's data inputs (token ids, labels): live from the
    #: step's start until the embedding's / the loss's backward reads them
    data_emb: int = 0
    data_head: int = 0
    #: a split backward (ZB-H1): each block's weight-gradient part, its
    #: backward fields W's (``blocks`` then hold the input-gradient part);
    #: empty otherwise
    weight: Dict[str, Block] = field(default_factory=dict)
    #: each model layer's block where the model mixes dense and MoE layers
    #: (:func:`.layer_kinds.merge_kinds`); empty: every layer is LAYER
    layer_blocks: Tuple[str, ...] = ()
    #: beside each of ``forward_crossing`` / ``backward_crossing``: its
    #: dtype's name where ``p2p_scatter`` splits it over the tensor-parallel
    #: ranks, else None (:func:`.crossing.stage_crossing`)
    forward_split: Tuple[Optional[str], ...] = ()
    backward_split: Tuple[Optional[str], ...] = ()
