"""The parallel strategy of a run: how many ways each kind of parallelism
splits the step, and how the step is scheduled. One plain dataclass shared
by the API, the CLI, model families and sweeps.

Mesh: rank = ``(pp_rank * dp + dp_rank) * tp + tp_rank`` (Megatron-LM's
order, ``order="tp-dp-pp"``: the first axis varies fastest): tensor-parallel
ranks are adjacent, so that a TP group stays inside a node whenever ``tp``
divides the GPUs per node. ``order`` lays the mesh out otherwise (e.g.
``"dp-tp-pp"`` puts data-parallel peers side by side).

Context parallelism (``cp``) splits the ``dp`` axis: its ranks vary just
inside it (Megatron-LM's ``tp-cp-dp-pp``), so that data-parallel rank
``d`` and context-parallel rank ``c`` sit at position ``d * cp + c`` of an
axis of ``dp x cp`` ranks (:meth:`Strategy.flat_cp`). The weights'
gradients are synchronised over that whole axis, as Megatron does.

Expert parallelism (``ep``) is no axis of its own: as Megatron-LM's, it
splits each data-parallel team of ``dp`` ranks into ``dp / ep``
*expert-parallel groups* of ``ep`` consecutive data-parallel ranks, which
share out a mixture of experts' experts (each holds ``experts / ep``);
the ranks holding the same experts (data-parallel ranks ``e, e + ep, e +
2 ep, ...``) form the *expert-data-parallel* team that synchronises those
experts' gradients. With context parallelism the experts see the cp ranks
as data-parallel ones (Megatron-core's ``parallel_state``: its expert
rank generator has no cp axis, ``tp-ep-dp-pp`` over the ranks the dense
layers order ``tp-cp-dp-pp``): the groups are cut from the flat axis of
``dp x cp`` ranks, so ``ep`` must divide ``dp x cp`` and an
expert-parallel group takes a data-parallel rank's cp ranks first; each
rank routes its own tokens (its two chunks of every sequence).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields, replace
from typing import Any, Dict, Literal, Mapping, Optional, Tuple

from ..errors import ConfigError

SCHEDULES = ("1f1b", "gpipe", "interleaved", "zb-h1")
RECOMPUTE = ("none", "selective", "full")
OPTIMIZERS = ("adamw", "sgd")
PARTITIONS = ("even", "balanced")
#: ZeRO-3's unit of communication: each parameter alone, or a layer's together
ZERO3_UNITS = ("param", "layer")
#: mesh layouts: the axes from fastest to slowest varying in the rank number
ORDERS = ("tp-dp-pp", "tp-pp-dp", "dp-tp-pp", "dp-pp-tp", "pp-tp-dp", "pp-dp-tp")
#: which adjacent ops run as one kernel (:mod:`distsim.transforms.fusion`)
FUSIONS = ("megatron", "megatron-core", "pytorch-eager", "none")
#: how context-parallel attention reaches the other ranks' keys and values
CP_COMMS = ("allgather", "ring", "alltoall")


@dataclass(frozen=True)
class Strategy:
    """``dp``: data-parallel degree (None: every device the others leave);
    ``tp``, ``pp``: tensor- and pipeline-parallel degrees; ``sp``: sequence
    parallelism in the tensor-parallel regions; ``zero``: ZeRO stage 0-3
    (3 is FSDP-style: parameters sharded and all-gathered before use);
    ``recompute``: activation recomputation; ``microbatches``: micro-batches
    per step per data-parallel rank (None: global batch / (dp x micro
    batch)); ``schedule``: pipeline schedule; ``virtual_stages``: model
    chunks per pipeline rank (interleaved 1F1B; default 2 there);
    ``bucket_mb``: DDP gradient bucket size in MB (None: one all-reduce per
    gradient as soon as it is ready; 0: no overlap, every all-reduce after
    the backward pass); ``global_batch`` / ``micro_batch``: override the
    model's batch sizes (sequences); ``optimizer``: ``adamw`` or ``sgd``
    (both with fp32 master weights; SGD's momentum is the model's
    ``momentum``); ``partition``: pipeline stages ``even`` by layers or
    ``balanced`` by estimated cost (embedding and head included);
    ``prefetch``: ZeRO-3 all-gathers issued this many layers ahead of their
    use (0: each layer's gather when the layer starts); ``zero3_unit``:
    ZeRO-3's unit of communication, ``param`` (one all-gather and one
    reduce-scatter per parameter) or ``layer`` (one per transformer layer,
    as FSDP wrapping each block does); ``order``: mesh
    layout, axes from fastest to slowest varying (see the module docstring);
    ``plan``: how tensor parallelism places the parameters
    (:mod:`~distsim.transforms.plans`): ``megatron`` (the default) or the
    path of a plan file; ``fusion``: which adjacent ops the simulated
    framework runs as one kernel (:mod:`~distsim.transforms.fusion`):
    ``megatron``, ``pytorch-eager`` or ``none`` (None: the model family's
    default, :func:`fusion_for`: ``megatron`` for GPT models); ``cp``:
    context-parallel degree, every sequence split over ``cp`` ranks
    (:mod:`~distsim.transforms.context_parallel`);
    ``cp_comm``: how attention reaches the other ranks' keys and values,
    ``allgather`` (gathered over the group before attention, Llama 3's
    way), ``ring`` (blocks passed around the ring point to point, each
    step's transfer overlapped with the attention of the block at hand:
    Megatron-LM's ring attention) or ``alltoall`` (DeepSpeed-Ulysses:
    sequence exchanged for heads before attention and back after it);
    ``ep``: expert-parallel degree, the
    ranks of each data-parallel team (of dp x cp ranks with context
    parallelism) a mixture of experts' experts are
    shared out over (see the module docstring; 1: every rank holds every
    expert); ``tp_overlap``: the backward's tensor-parallel all-reduce (or
    reduce-scatter) of a layer's input gradient issued before the
    weight-gradient GEMM, to overlap it, as Megatron-LM's async
    all-reduce does (True), or after it, where autodiff puts it, as
    Megatron-LM v2 (2021) did (False, the default while the estimator
    models that order only; :mod:`~distsim.transforms.tp_order`). The
    order shows in time under ``comm_order: stream``, where a collective
    waits for the compute issued before it, and otherwise in which
    collective queues first on a shared communication stream.
    ``fp32_grads``: the gradient buffers in fp32 (False: in the parameters'
    dtype): each micro-batch's gradient cast to fp32 and added into its
    buffer, the data-parallel reduction and the optimizer on the fp32
    buffer, as DeepSpeed's BF16_Optimizer does (``update_hp_grads`` after
    every micro-batch's backward; Megatron-LM's
    ``--accumulate-allreduce-grads-in-fp32`` keeps the same buffers).
    ``p2p_scatter``: a pipeline transfer of a value every tensor-parallel
    rank holds whole sent as ``1/tp`` from each rank and all-gathered over
    the receiving stage's tensor-parallel group, as Megatron-LM's
    ``--scatter-gather-tensors-in-pipeline`` (on by default there) and
    DeepSpeed's pipeline engine do (False, the default: every rank sends
    the whole value, as Megatron-core does; no effect with ``tp`` 1 or on
    sequence parallelism's shards; :mod:`~distsim.transforms.pipeline_split`)."""

    dp: Optional[int] = None
    tp: int = 1
    pp: int = 1
    sp: bool = False
    zero: int = 0
    recompute: Literal["none", "selective", "full"] = "none"
    microbatches: Optional[int] = None
    schedule: Literal["1f1b", "gpipe", "interleaved", "zb-h1"] = "1f1b"
    virtual_stages: Optional[int] = None
    bucket_mb: Optional[float] = None
    global_batch: Optional[int] = None
    micro_batch: Optional[int] = None
    symmetry: bool = False
    coarsen: bool = False
    optimizer: Literal["adamw", "sgd"] = "adamw"
    partition: Literal["even", "balanced"] = "even"
    prefetch: int = 1
    zero3_unit: Literal["param", "layer"] = "param"
    order: str = "tp-dp-pp"
    plan: Optional[str] = None
    fusion: Optional[str] = None
    cp: int = 1
    cp_comm: Literal["allgather", "ring", "alltoall"] = "allgather"
    ep: int = 1
    tp_overlap: bool = False
    fp32_grads: bool = False
    p2p_scatter: bool = False

    def __post_init__(self) -> None:
        for name in _CHECK_ORDER:
            check_field(name, getattr(self, name))
        if self.sp and self.tp == 1:
            raise ConfigError("--sp: sequence parallelism needs tensor parallelism (--tp > 1)")
        if self.schedule != "interleaved" and (self.virtual_stages or 1) > 1:
            raise ConfigError("--virtual-stages: only the interleaved schedule has virtual stages")
        if self.schedule == "interleaved" and self.pp == 1:
            raise ConfigError("--schedule interleaved: needs pipeline parallelism (--pp > 1)")
        if self.cp_comm != "allgather" and self.cp == 1:
            raise ConfigError(f"--cp-comm {self.cp_comm}: needs context parallelism (--cp > 1)")
        if self.dp is not None and self.dp * self.cp % self.ep:
            if self.cp == 1:
                raise ConfigError(f"--ep {self.ep} does not divide --dp {self.dp} "
                                  "(expert-parallel groups are made of data-parallel ranks)")
            raise ConfigError(f"--ep {self.ep} does not divide dp x cp = {self.dp} x {self.cp} "
                              f"= {self.dp * self.cp} (expert-parallel groups are made of "
                              "data- and context-parallel ranks)")

    def resolved(self, num_devices: int) -> "Strategy":
        """With ``dp`` filled in from the device count."""
        if self.dp is not None:
            return self
        other = self.tp * self.pp * self.cp
        if num_devices % other:
            what = "tp x pp x cp" if self.cp > 1 else "tp x pp"
            raise ConfigError(f"{what} = {other} does not divide the {num_devices} devices")
        return replace(self, dp=num_devices // other)

    @property
    def chunks(self) -> int:
        """Model chunks per pipeline rank (virtual stages)."""
        if self.schedule == "interleaved":
            return self.virtual_stages or 2
        return 1

    @property
    def num_devices(self) -> int:
        return (self.dp or 1) * self.cp * self.tp * self.pp

    def flat_cp(self) -> "Strategy":
        """The same mesh with the context-parallel ranks folded into the
        data-parallel axis (``dp x cp`` ranks, ``cp`` 1): how the lowering
        sees it, since the weights are replicated, and their gradients
        synchronised, over both (see the module docstring)."""
        if self.cp == 1:
            return self
        return replace(self, dp=(self.dp or 1) * self.cp, cp=1, cp_comm="allgather")

    def rank(self, dp_rank: int, pp_rank: int, tp_rank: int) -> int:
        """The global rank of mesh coordinate (dp, pp, tp) under ``order``;
        with context parallelism ``dp_rank`` is the position on the axis of
        ``dp x cp`` ranks, ``d * cp + c`` (see the module docstring)."""
        dp = (self.dp or 1) * self.cp
        if self.order == "tp-dp-pp":  # the default, first
            return (pp_rank * dp + dp_rank) * self.tp + tp_rank
        coord = {"dp": dp_rank, "pp": pp_rank, "tp": tp_rank}
        size = {"dp": dp, "pp": self.pp, "tp": self.tp}
        rank, stride = 0, 1
        for axis in self.order.split("-"):
            rank += coord[axis] * stride
            stride *= size[axis]
        return rank

    def ep_team(self, dp_rank: int) -> Tuple[int, ...]:
        """The data-parallel ranks of ``dp_rank``'s expert-parallel group
        (``ep`` consecutive ones, which share out the experts; on the axis
        of ``dp x cp`` ranks of :meth:`flat_cp` with context parallelism)."""
        first = dp_rank - dp_rank % self.ep
        return tuple(range(first, first + self.ep))

    def edp_team(self, dp_rank: int) -> Tuple[int, ...]:
        """The data-parallel ranks holding the same experts as ``dp_rank``
        (its expert-data-parallel team, ``dp / ep`` of them)."""
        return tuple(range(dp_rank % self.ep, self.dp or 1, self.ep))

    def tp_groups(self) -> Tuple[Tuple[int, ...], ...]:
        """Every tensor-parallel group's ranks (one per dp x cp x pp coordinate)."""
        return tuple(tuple(self.rank(d, p, t) for t in range(self.tp))
                     for p in range(self.pp) for d in range((self.dp or 1) * self.cp))

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> "Strategy":
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names and v is not None})


#: each model family's fusion where the strategy leaves it unset (others: ``none``)
FAMILY_FUSION = {"gpt": "megatron"}


def fusion_for(strategy: "Strategy", family: Optional[str] = None) -> str:
    """The fusion setting a step runs under: the strategy's, or else the
    model ``family``'s default (:data:`FAMILY_FUSION`): ``megatron`` for
    the ``gpt`` family, what Megatron-LM runs, ``none`` (every op its own
    kernel) for the others. On the published runs (reports/validation/)
    Megatron's fused kernels are right together with stream-ordered
    collectives (``comm_order: stream``, the simulator's default too;
    the table's headline is that pair's), while fused kernels with
    collectives ordered by their inputs come out too fast."""
    if strategy.fusion is not None:
        return strategy.fusion
    return FAMILY_FUSION.get(family or "", "none")


def writes_megatron_loss(fusion: str) -> bool:
    """Whether a step under ``fusion`` writes a float32 loss at ``tp`` 1 as
    Megatron-LM's vocabulary-parallel steps
    (:func:`~distsim.transforms.parallelize.differentiated_template`): under
    ``megatron``; Megatron-core (``megatron-core``) fuses its loss into one
    kernel, and the other settings keep the one op."""
    return fusion == "megatron"


def _flag(name: str) -> str:
    return name.replace("_", "-")


#: Every field, in the order :meth:`Strategy.__post_init__` checks them.
_CHECK_ORDER = ("dp", "tp", "pp", "ep", "microbatches", "virtual_stages", "global_batch",
                "micro_batch", "prefetch", "symmetry", "coarsen", "sp", "zero", "recompute",
                "schedule", "bucket_mb", "optimizer", "partition", "zero3_unit", "order", "plan",
                "fusion", "cp", "cp_comm", "tp_overlap", "fp32_grads", "p2p_scatter")
_POSITIVE = ("dp", "tp", "pp", "ep", "microbatches", "virtual_stages", "global_batch",
             "micro_batch", "cp")
_BOOLS = ("symmetry", "coarsen", "sp", "tp_overlap", "fp32_grads", "p2p_scatter")
_CHOICES = {"recompute": RECOMPUTE, "schedule": SCHEDULES, "optimizer": OPTIMIZERS,
            "partition": PARTITIONS, "zero3_unit": ZERO3_UNITS, "order": ORDERS,
            "cp_comm": CP_COMMS}
ZERO_STAGES = (0, 1, 2, 3)


def check_field(name: str, value: Any, label: Optional[str] = None) -> None:
    """Raise :class:`ConfigError` if ``value`` is not allowed for the
    :class:`Strategy` field ``name`` on its own (the rules between fields,
    such as ``sp`` needing ``tp > 1``, are the strategy's). ``label`` names
    it in the message (default: the flag, ``--zero``). Sweeps and search
    check their values with this before running any point."""
    label = label or f"--{_flag(name)}"
    if name in _POSITIVE:
        if value is None and name not in ("tp", "pp", "ep", "cp"):
            return
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{label}: must be a positive integer, got {value!r}")
    elif name == "prefetch":
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ConfigError(f"{label}: must be a non-negative integer, got {value!r}")
    elif name in _BOOLS:
        if not isinstance(value, bool):
            raise ConfigError(f"{label}: must be true or false, got {value!r}")
    elif name == "zero":
        if isinstance(value, bool) or value not in ZERO_STAGES:
            raise ConfigError(f"{label}: must be 0, 1, 2 or 3, got {value!r}")
    elif name == "bucket_mb":
        if value is not None and (isinstance(value, bool) or
                                  not isinstance(value, (int, float)) or
                                  not math.isfinite(value) or value < 0):
            # NaN compares false with everything: checked by name, not by `< 0`
            raise ConfigError(f"{label}: must be a finite non-negative number, "
                              f"got {value!r}")
    elif name == "plan":
        if value is not None and (not isinstance(value, str) or not value.strip()):
            raise ConfigError(f"{label}: must be 'megatron' or the path of a plan file, "
                              f"got {value!r}")
    elif name == "fusion":
        if value is not None and value not in FUSIONS:
            raise ConfigError(f"{label}: must be one of {', '.join(FUSIONS)}, got {value!r}")
    elif name in _CHOICES:
        if value not in _CHOICES[name]:
            raise ConfigError(f"{label}: must be one of {', '.join(_CHOICES[name])}, "
                              f"got {value!r}")
