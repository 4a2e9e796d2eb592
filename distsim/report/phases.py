"""What each op record of a trace was doing: its phase, its kind of
communication, its micro-batch and pipeline stage.

The builders write it on the program's ops (``meta``): ``phase``
(``backward``, ``recompute``, ``optimizer``; none: forward), ``task: W``
on the weight-gradient part of a split backward (the zero-bubble
schedules: key ``weight gradients``), ``role`` of a
collective (``grad_sync``: gradient synchronisation, ``zero_gather``: ZeRO-3
parameter gathers, ``pipeline``: send/recv between stages; none: a
tensor-parallel collective), ``microbatch`` and ``stage``. A trace's records
name their op (the op's first result), so :func:`record_phases` reads these
through the program. Without the program only what the records say is
known: send/recv is pipeline p2p, ``detail: recompute`` is recomputation,
``detail: weight gradient`` a split backward's weight-gradient part, an
optimizer op type is the optimizer, the rest is compute or
communication.

Each record gets one **key**: a compute phase (:data:`COMPUTE_KEYS`) or a
communication kind (:data:`COMM_KEYS`), the colour it is drawn in.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Mapping, Tuple

import numpy as np

from distsim.sim.trace import Trace
from distsim.transforms.backward_split import WEIGHT_DETAIL

#: compute phases, in legend order ("compute": a compute op of no known phase)
COMPUTE_KEYS: Tuple[str, ...] = ("forward", "backward", "weight gradients", "recompute",
                                  "optimizer", "compute")
#: communication kinds, in legend order ("communication": none of the others)
COMM_KEYS: Tuple[str, ...] = ("TP", "SP", "DP", "ZeRO", "pipeline p2p", "communication")
KEYS: Tuple[str, ...] = COMPUTE_KEYS + COMM_KEYS

#: colour per key (Tableau 10: told apart by most colour-blind readers)
KEY_COLOURS: Dict[str, str] = {
    "forward": "#4e79a7", "backward": "#59a14f", "weight gradients": "#8cd17d",
    "recompute": "#edc948",
    "optimizer": "#b07aa1", "compute": "#9c9c9c",
    "TP": "#f28e2b", "SP": "#ff9da7", "DP": "#e15759", "ZeRO": "#9c755f",
    "pipeline p2p": "#17becf", "communication": "#79706e",
}
#: what each communication kind stands for (legend and report)
COMM_MEANING: Dict[str, str] = {
    "TP": "tensor-parallel all-reduce",
    "SP": "sequence-parallel all-gather / reduce-scatter",
    "DP": "data-parallel gradient all-reduce",
    "ZeRO": "ZeRO gradient reduce-scatter and parameter all-gather",
    "pipeline p2p": "send/recv between pipeline stages",
    "communication": "other communication",
}

_OPTIMIZER_TYPES = frozenset({"adamw", "sgd", "adam"})


@dataclass
class RecordPhases:
    """Per label of the trace's op columns (``trace.op_columns.label``
    indexes these): ``key`` (index into :data:`KEYS`), ``microbatch`` (-1:
    none) and ``stage`` (-1: unknown); ``known``: whether the program was read."""

    key: np.ndarray
    microbatch: np.ndarray
    stage: np.ndarray
    known: bool

    def of_records(self, labels: np.ndarray) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(key, microbatch, stage) of the records with these labels."""
        return self.key[labels], self.microbatch[labels], self.stage[labels]


def comm_key(op_type: str, meta: Mapping[str, Any], sp: bool) -> str:
    """The communication kind of a collective with this type and ``meta``."""
    role = meta.get("role")
    if role == "pipeline" or op_type == "comm.sendrecv":
        return "pipeline p2p"
    if role == "zero_gather":
        return "ZeRO"
    if role == "grad_sync":
        return "DP" if op_type == "comm.allreduce" else "ZeRO"
    if role is None:
        if op_type == "comm.allreduce":
            return "TP"
        if op_type in ("comm.allgather", "comm.reducescatter"):
            return "SP" if sp else "TP"
    return "communication"


def compute_key(op_type: str, meta: Mapping[str, Any]) -> str:
    """The phase of a compute op with this type and ``meta``."""
    phase = meta.get("phase")
    if meta.get("task") == "W" or meta.get("detail") == WEIGHT_DETAIL:
        return "weight gradients"   # a split backward's weight-gradient part
    if phase in ("backward", "recompute", "optimizer"):
        return str(phase)
    if meta.get("detail") == "recompute":
        return "recompute"
    if op_type in _OPTIMIZER_TYPES:
        return "optimizer"
    return "forward"


def _key_without_program(op_type: str, detail: str, category: str) -> str:
    if op_type == "comm.sendrecv":
        return "pipeline p2p"
    if category == "communication":
        return "communication"
    if detail == "recompute":
        return "recompute"
    if detail == WEIGHT_DETAIL:
        return "weight gradients"
    if op_type in _OPTIMIZER_TYPES:
        return "optimizer"
    return "compute"


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else -1


def record_phases(trace: Trace, program: Any = None) -> RecordPhases:
    """The key, micro-batch and stage of every label of ``trace``'s op
    columns; read from ``program``'s op metadata when given (a
    :class:`~distsim.ir.core.Function`), else from the records alone."""
    columns = trace.op_columns
    names, op_types, details = columns.labels.lists()
    n = len(names)
    index = {k: i for i, k in enumerate(KEYS)}
    key = np.empty(n, np.int64)
    microbatch = np.full(n, -1, np.int64)
    stage = np.full(n, -1, np.int64)
    # a label's category: that of any of its records (all of a label's records share it)
    category = np.zeros(n, np.int64)
    category[columns.label] = columns.category
    is_comm = [columns.categories[c] == "communication" for c in category.tolist()]
    metas: Dict[str, Mapping[str, Any]] = {}
    sp = False
    if program is not None:
        for op in program.ops:
            metas[op.outputs[0].name if op.outputs else op.name] = op.meta
        strategy = program.meta.get("strategy") or {}
        sp = bool(strategy.get("sp")) if isinstance(strategy, Mapping) else False
    # the key depends on a few fields only: computed once per distinct combination
    keys: Dict[tuple, int] = {}
    for i, (name, op_type, detail) in enumerate(zip(names, op_types, details)):
        meta = metas.get(name)
        if meta is None:
            combo: tuple = (op_type, detail, is_comm[i])
            k = keys.get(combo)
            if k is None:
                k = keys[combo] = index[_key_without_program(
                    op_type, detail, "communication" if is_comm[i] else "compute")]
        else:
            combo = (op_type, is_comm[i], meta.get("phase"), meta.get("role"),
                     meta.get("detail"), meta.get("task"))
            k = keys.get(combo)
            if k is None:
                k = keys[combo] = index[comm_key(op_type, meta, sp) if is_comm[i]
                                        else compute_key(op_type, meta)]
            mb = meta.get("microbatch")
            if mb is not None:
                microbatch[i] = _int(mb)
            st = meta.get("stage")
            if st is not None:
                stage[i] = _int(st)
        key[i] = k
    return RecordPhases(key, microbatch, stage, known=bool(metas))


def rank_stages(trace: Trace, phases: RecordPhases) -> Dict[int, int]:
    """Each rank's pipeline stage: the stage most of its compute records
    belong to (ranks with none known are left out)."""
    columns = trace.op_columns
    stage = phases.stage[columns.label]
    compute = np.asarray([c == "compute" for c in columns.categories])[columns.category]
    keep = compute & (stage >= 0)
    out: Dict[int, int] = {}
    if not keep.any():
        return out
    width = int(stage[keep].max()) + 1
    codes, counts = np.unique(columns.rank[keep] * width + stage[keep], return_counts=True)
    best: Dict[int, Tuple[int, int]] = {}
    for code, c in zip(codes.tolist(), counts.tolist()):
        rank, s = divmod(code, width)
        if rank not in best or c > best[rank][0]:
            best[rank] = (c, s)
    out = {rank: s for rank, (_, s) in best.items()}
    return out
