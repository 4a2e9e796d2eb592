"""The decisions of a step's gradient synchronisation and optimizer,
written once for both places that carry them out: the lowering, which
emits DistIR ops (:class:`~distsim.transforms.zero.GradientSync`), and the
fast tier, which advances a timeline from measured block costs
(:class:`distsim.estimate.sync.StepSync`). Each is a :class:`SyncSink`;
:class:`SyncPolicy` decides what happens when, and the sink makes it
happen (ops, or times).

The decisions (see :mod:`.zero` for the protocol they implement):

- whether ZeRO 2/3 reduce-scatter every micro-batch's gradient as it is
  made (:func:`scatters_each_microbatch`), and how the gradients of the
  micro-batches are accumulated (:func:`accumulation_ops`);
- how a parameter's final gradient is synchronised over the
  data-parallel team (:func:`sync_route`): not at all, on its own at once
  (an all-reduce, or ZeRO 2/3's reduce-scatter), in a bucket flushed when
  it holds ``bucket_mb`` (PyTorch DDP), or after the backward pass;
- ZeRO-3 by layer: a layer's gradients reduce-scattered together once
  all are made, the stage's previous unit settled first
  (:meth:`SyncPolicy.unit_gradient`);
- the end of the step, in order (:meth:`SyncPolicy.finish`): per stage
  its unsettled units, its deferred syncs, its last bucket; the buckets
  unpacked; tied parameters on two stages all-reduced between them; every
  parameter updated (:func:`update_plan`: what the update of one
  parameter consists of under a ZeRO stage);
- ZeRO-3's gathers: which layers' parameters a task gathers as it enters
  a layer (:func:`prefetch_window`), and in which groups, each over
  which team (:func:`layer_gathers`, :func:`sync_team`).

Parameters are whatever the sink names them by (template values in the
lowering, (block, layer, index) keys in the fast tier).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import (Callable, Dict, Generic, Hashable, Iterable, List, Optional, Protocol,
                    Sequence, Set, Tuple, TypeVar)

from ..ir.comm import CollectiveType
from ..ir.types import DType
from .strategy import Strategy

MB = 1 << 20

P = TypeVar("P", bound=Hashable)


def bucket_bytes_of(bucket_mb: Optional[float]) -> Optional[float]:
    """``Strategy.bucket_mb`` in bytes (None: no buckets)."""
    return None if bucket_mb is None else float(bucket_mb) * MB


def scatters_each_microbatch(zero: int, dp: int, bucket_bytes: Optional[float]) -> bool:
    """ZeRO 2/3 reduce-scatter every micro-batch's gradients as they are
    produced (bucket 0: once, after the backward pass, from a whole local
    accumulation)."""
    return zero >= 2 and dp > 1 and bucket_bytes != 0


def sync_route(zero: int, dp: int, bucket_bytes: Optional[float]) -> str:
    """How a parameter's last gradient is synchronised once ready:
    ``"local"`` (no data parallelism), ``"deferred"`` (bucket 0: after the
    backward pass), ``"each"`` (on its own: ZeRO 2/3 or no buckets) or
    ``"bucket"`` (into the stage's pending bucket, flushed when it holds
    ``bucket_bytes``)."""
    if dp == 1:
        return "local"
    if bucket_bytes == 0:
        return "deferred"
    if zero >= 2 or bucket_bytes is None:
        return "each"
    return "bucket"


def sync_kind(zero: int) -> CollectiveType:
    """The collective that synchronises one gradient on its own: ZeRO 2/3
    reduce-scatter it (each rank keeps its shard), the others all-reduce it."""
    return CollectiveType.REDUCE_SCATTER if zero >= 2 else CollectiveType.ALL_REDUCE


def accumulation_ops(microbatch: int, microbatches: int, share: int = 1,
                     cast: bool = False) -> Tuple[str, ...]:
    """The ops that put micro-batch ``microbatch``'s gradient into its
    buffer: the first is written into the buffer itself (no op), the later
    ones are added to it (``add``), and the last is divided by the number
    of micro-batches (``scale``, when there are several) times ``share``
    (an expert's weights under expert parallelism: each rank's gradient
    sums the tokens of ``ep`` data-parallel ranks, :func:`gradient_share`).
    With ``cast`` (a buffer of another dtype: :func:`grad_buffer_dtype`)
    every gradient is first cast to the buffer's dtype (``cast``), as
    DeepSpeed's BF16_Optimizer casts each gradient to fp32 before adding
    it (``update_hp_grads``: ``hp_grad.add_(lp.grad.to(hp_grad.dtype))``)."""
    casts = ("cast",) if cast else ()
    adds = ("add",) if microbatch > 0 else ()
    if microbatches * share > 1 and microbatch == microbatches - 1:
        return casts + adds + ("scale",)
    return casts + adds


def grad_buffer_dtype(strategy: Strategy, dtype: DType) -> DType:
    """The dtype of a gradient buffer of a parameter in ``dtype``: under
    ``Strategy.fp32_grads`` fp32 for a parameter in a narrower float (bf16,
    fp16), else the parameter's own (fp32_grads never narrows a buffer)."""
    if strategy.fp32_grads and dtype.itemsize < DType.F32.itemsize:
        return DType.F32
    return dtype


def sync_team(strategy: Strategy, expert: bool) -> int:
    """How many data-parallel ranks a parameter's gradient is synchronised
    over, its ZeRO shards split over and, under ZeRO 3, its weights
    gathered over: ``dp``, or for an expert's weights under expert
    parallelism their expert-data-parallel team of ``dp / ep`` (the ranks
    holding the same experts, :meth:`~.strategy.Strategy.edp_team`)."""
    return strategy.dp // strategy.ep if expert else strategy.dp


def gradient_share(strategy: Strategy, expert: bool) -> int:
    """By how many data-parallel ranks' tokens (besides the micro-batches)
    a rank's accumulated gradient is divided before its sync averages it
    over its team: ``ep`` for an expert's weights (the gradient a rank
    makes sums the tokens its expert-parallel group sent it, and its team
    of ``dp / ep`` averages; Megatron-LM divides by ``dp`` alike), else 1."""
    return strategy.ep if expert else 1


@dataclass(frozen=True)
class UpdatePlan:
    """What the optimizer step of one parameter consists of: ``flatten``
    its synchronised gradient (and ``slice`` this rank's 1/dp shard out of
    it) before the update; the update on the shard (``on_shard``) or the
    whole parameter; ``gather`` the new parameter's shards over the
    data-parallel team after it, and ``reshape`` it back to its shape."""

    flatten: bool
    slice: bool
    on_shard: bool
    gather: bool
    reshape: bool


def update_plan(zero: int, dp: int) -> UpdatePlan:
    """ZeRO 0 updates the whole parameter; ZeRO >= 1 the rank's flat shard
    (ZeRO 2/3 with data parallelism already hold it: their gradient is a
    reduce-scattered shard); ZeRO 1/2 then all-gather the new parameter
    (ZeRO 3 keeps only the shard: it gathers at use)."""
    flatten = zero >= 1 and not (zero >= 2 and dp > 1)
    return UpdatePlan(flatten=flatten, slice=flatten and dp > 1, on_shard=zero >= 1,
                      gather=zero in (1, 2) and dp > 1, reshape=zero in (1, 2))


@dataclass(frozen=True)
class ResidentLayout:
    """Which of a parameter's resident tensors each rank holds as its 1/dp
    flat shard rather than whole: the parameter itself (ZeRO 3: gathered
    at use), its gradient buffer (ZeRO 2/3 reduce-scattering every
    micro-batch's gradient), its fp32 master copy and optimizer state
    (ZeRO >= 1)."""

    param: bool
    grad: bool
    state: bool


def resident_layout(zero: int, dp: int, bucket_bytes: Optional[float]) -> ResidentLayout:
    """The :class:`ResidentLayout` of a ZeRO stage (what the lowering makes
    the step's inputs, and what the fast tier counts in memory)."""
    return ResidentLayout(param=zero == 3,
                          grad=scatters_each_microbatch(zero, dp, bucket_bytes),
                          state=zero >= 1)


def prefetch_window(position: int, count: int, prefetch: int) -> range:
    """ZeRO-3: the layers (positions among a task's ``count`` layers) whose
    parameters are gathered when the task enters layer ``position``: it
    and the next ``prefetch`` (those gathered already are not again)."""
    return range(position, min(count, position + 1 + prefetch))


def gather_groups(numels: Sequence[int], dp: int, by_layer: bool) -> List[Tuple[int, ...]]:
    """ZeRO-3: a layer's parameters (``numels``: their elements, in the
    order the layer first reads them) as the all-gathers that fetch them,
    in the order issued: by layer, the unit of those ``dp`` divides
    (:func:`~distsim.transforms.zero3.unit_indices`) first, as one; then
    each other parameter alone."""
    unit = unit_indices(numels, dp) if by_layer else ()
    rest = [(i,) for i in range(len(numels)) if i not in unit]
    return ([unit] if unit else []) + rest


def layer_gathers(numels: Sequence[int], experts: Sequence[bool], strategy: Strategy
                  ) -> List[Tuple[Tuple[int, ...], bool]]:
    """ZeRO-3: the all-gathers of a layer's parameters (``numels``: their
    elements, in the order the layer first reads them; ``experts``: which
    are an expert's weights), in the order issued, each (its parameters'
    positions, whether over the experts' team): each parameter over its
    own team (:func:`sync_team`), the others' gathers first, then the
    experts' (:func:`gather_groups` per team: by layer, a unit of each)."""
    out: List[Tuple[Tuple[int, ...], bool]] = []
    for expert in (False, True):
        own = [i for i, e in enumerate(experts) if e == expert]
        for group in gather_groups([numels[i] for i in own], sync_team(strategy, expert),
                                   strategy.zero3_unit == "layer"):
            out.append((tuple(own[j] for j in group), expert))
    return out


def unit_indices(numels: Sequence[int], dp: int) -> Tuple[int, ...]:
    """ZeRO-3 by layer: which of a layer's parameters (``numels``: their
    elements, in order) travel as one unit: those ``dp`` divides (their
    shards are equal, so the gathered buffer is a ``dp x m`` matrix whose
    column blocks are the parameters, as FSDP2 pads shards to equal size),
    when there are two or more; none without data parallelism."""
    if dp <= 1:
        return ()
    members = tuple(i for i, n in enumerate(numels) if n % dp == 0)
    return members if len(members) > 1 else ()


class SyncSink(Protocol[P]):
    """What :class:`SyncPolicy` asks of the step it is written into."""

    def keep_local(self, param: P, stage: int) -> None:
        """No data parallelism: the accumulated gradient is the synchronised one."""

    def sync_one(self, param: P, stage: int, kind: CollectiveType) -> None:
        """Synchronise one final gradient on its own (``kind``: all-reduce,
        or reduce-scatter of its flattened copy)."""

    def sync_bucket(self, params: List[P], stage: int) -> None:
        """All-reduce several final gradients as one flat buffer (each
        flattened, then concatenated), unpacked at :meth:`unpack_buckets`."""

    def unpack_buckets(self) -> None:
        """After the backward pass: the buckets' results back into the
        gradients."""

    def settle_units(self, stage: int) -> None:
        """ZeRO-3 by layer: the stage's reduce-scattered units split into
        their shards, which go into their buffers."""

    def reduce_scatter_unit(self, unit: Tuple[P, ...], stage: int, microbatch: int) -> None:
        """ZeRO-3 by layer: a micro-batch's gradients of a layer's unit,
        concatenated and reduce-scattered as one (settled later)."""

    def tie(self, first: P, last: P) -> None:
        """All-reduce the synchronised gradients of two tied parameters
        that live on different stages."""

    def update(self, params: Sequence[P]) -> None:
        """The optimizer step of every parameter, in order (each as
        :func:`update_plan` says)."""


class SyncPolicy(Generic[P]):
    """The gradient-sync decisions of one step (see the module
    docstring), carried out by ``sink``. ``nbytes(param)``: the bytes of a
    parameter's gradient (what fills a bucket)."""

    def __init__(self, strategy: Strategy, sink: SyncSink[P],
                 nbytes: Callable[[P], int]) -> None:
        self.sink = sink
        self.nbytes = nbytes
        self.zero, self.dp = strategy.zero, strategy.dp or 1
        self.bucket_bytes = bucket_bytes_of(strategy.bucket_mb)
        self.route = sync_route(self.zero, self.dp, self.bucket_bytes)
        self.scatter_each = scatters_each_microbatch(self.zero, self.dp, self.bucket_bytes)
        #: the collective of a gradient synchronised on its own
        self.kind = sync_kind(self.zero)
        #: per stage, the gradients waiting in its bucket, and their bytes
        self.pending: Dict[int, List[P]] = {}
        self.pending_bytes: Dict[int, int] = {}
        #: per stage, the gradients synchronised after the backward pass
        self.deferred: Dict[int, List[P]] = {}
        #: ZeRO-3 by layer: the members of a unit made so far, per (unit,
        #: stage, micro-batch)
        self._unit_made: Dict[Tuple[Tuple[P, ...], int, int], Set[P]] = {}

    def final(self, param: P, stage: int) -> None:
        """The gradient of ``param`` (on ``stage``) is final: every
        micro-batch's is in its buffer. Synchronise it as :func:`sync_route`
        says."""
        route = self.route
        if route == "each":
            self.sink.sync_one(param, stage, self.kind)
        elif route == "local":
            self.sink.keep_local(param, stage)
        elif route == "deferred":
            self.deferred.setdefault(stage, []).append(param)
        else:
            self.pending.setdefault(stage, []).append(param)
            held = self.pending_bytes.get(stage, 0) + self.nbytes(param)
            self.pending_bytes[stage] = held
            if held >= self.bucket_bytes:
                self.flush(stage)

    def flush(self, stage: int) -> None:
        """All-reduce the stage's pending bucket (one gradient: on its own)."""
        bucket = self.pending.pop(stage, [])
        self.pending_bytes.pop(stage, None)
        if not bucket:
            return
        if len(bucket) == 1:
            self.sink.sync_one(bucket[0], stage, self.kind)
        else:
            self.sink.sync_bucket(bucket, stage)

    def units_made_from(self, other: "SyncPolicy[P]") -> None:
        """Take ``other``'s units partly made (a split backward makes a
        unit's gradients in two tasks, B and W): a walk that continues
        another from mid-step completes them as that one would."""
        self._unit_made = {key: set(made) for key, made in other._unit_made.items()}

    def unit_gradient(self, unit: Tuple[P, ...], member: P, stage: int, microbatch: int) -> None:
        """ZeRO-3 by layer: micro-batch ``microbatch``'s gradient of
        ``member`` of ``unit`` is made. Once all of the unit's are, the
        stage's previous units are settled (FSDP2 waits for a unit's
        reduce-scatter at the next unit's) and the unit is reduce-scattered."""
        key = (unit, stage, microbatch)
        made = self._unit_made.setdefault(key, set())
        made.add(member)
        if len(made) == len(unit):
            del self._unit_made[key]
            self.sink.settle_units(stage)
            self.sink.reduce_scatter_unit(unit, stage, microbatch)

    def finish(self, stages: int, params: Sequence[P],
               tied: Iterable[Tuple[P, int, P, int]] = ()) -> None:
        """The end of the step: per stage, its units settled, its deferred
        gradients synchronised (ZeRO 2/3: each on its own; else into one
        bucket of all of them) and its last bucket flushed; the buckets
        unpacked; each tied pair ``(first, its stage, last, its stage)`` on
        two stages all-reduced between them; every parameter of ``params``
        updated, in order."""
        sink = self.sink
        for stage in range(stages):
            sink.settle_units(stage)
            for param in self.deferred.pop(stage, []):
                if self.zero >= 2:
                    sink.sync_one(param, stage, self.kind)
                else:
                    # bucket_mb 0: no overlap, all of the stage's gradients in
                    # one bucket, which fills only when the backward pass has ended
                    self.pending.setdefault(stage, []).append(param)
            self.flush(stage)
        sink.unpack_buckets()
        for first, first_stage, last, last_stage in tied:
            if first_stage != last_stage:
                sink.tie(first, last)
        sink.update(params)
