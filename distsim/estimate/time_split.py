"""The estimator's time split: a timeline's step time and, per device as
the simulator's summary counts them, its compute, communication, exposed
communication and idle time (:func:`figures`), from each stage's spans
(:func:`stage_breakdown`)."""
from __future__ import annotations

from typing import Dict, Optional, Sequence, Tuple

import numpy as np

from .engine import Timeline
from .overlap import span_overlap
from .spans import shifted, spans, union
from .timeline import Builder


PARTS = ("compute_s", "communication_s", "exposed_communication_s", "idle_s")


def figures(builder: Builder, tl: Timeline) -> Dict[str, float]:
    """Step time, the per-device means of the time split, and FLOPs per
    step of every device, from ``builder``'s timeline ``tl``."""
    b = builder.ctx
    step = tl.run()
    S = b.strategy
    # each stage's communication spans, made once for both uses below
    comm = [comm_spans(tl, s) for s in range(S.pp)]
    parts = [stage_breakdown(tl, s, step, comm[s]) for s in range(S.pp)]
    # communication counts each tensor-parallel collective's whole time, as
    # the simulator's summary does, not only the wait it causes inside its
    # compute item (the part under compute, e.g. the input gradient's
    # all-reduce under the weight gradient's GEMM, is hidden, not absent);
    # those of the op-by-op backward are communication items already
    kinds = ("F", "B", "W") if b.profile.weight else ("F", "B")
    for stage, part in enumerate(parts):
        tp_s = b.microbatches * sum(
            b.part(kind)[name].tp_comm_f if kind == "F" else b.part(kind)[name].tp_comm_b
            for c in range(stage, b.chunks, S.pp) for kind in kinds
            for name, _ in b.blocks_of(kind, c))
        part["communication_s"] += (max(0.0, tp_s - tl.tp_items[stage])
                                    - (tl.waits[stage] - tl.sync_waits[stage])
                                    - tp_under_transfers(tl, stage, b.tp_at.get(stage),
                                                          comm[stage]))
    out = {k: sum(p[k] for p in parts) / len(parts) for k in PARTS}
    out["step_time_s"] = step
    out["total_flops"] = float(sum(b.flops) * S.dp * S.tp)
    return out


def tp_under_transfers(tl: Timeline, stage: int, placed: Optional[dict],
                        comm: Tuple[Sequence[float], Sequence[float]]) -> float:
    """How long the tensor-parallel collectives placed on ``stage``
    (``placed``: :attr:`.context.StepContext.tp_at`) overlap its pipeline
    transfers where no communication item does: counted in both, once in
    the simulator's union of a rank's communication ops. The overlap
    ``|T & (P - C)|`` of the collectives T, the transfers P and the items C
    (``comm``: their spans, :func:`comm_spans`) is
    ``|T | C| + |P | C| - |T | P | C| - |C|``."""
    if not placed or not tl.p2p_starts[stage]:
        return 0.0
    # the tasks of one plan share its spans: one numpy call per plan
    t = np.concatenate([(spans[None, :, :] + np.asarray(starts)[:, None, None]).reshape(-1, 2)
                        for spans, starts in placed.values()])
    c_s, c_e = comm
    p_s, p_e = union(tl.p2p_starts[stage], tl.p2p_ends[stage])

    def near(s: np.ndarray, e: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        # the spans that meet a transfer (the others add nothing to the overlap)
        i = np.searchsorted(p_e, s, side="right")
        hit = (i < len(p_s)) & (p_s[np.minimum(i, len(p_s) - 1)] < e)
        return s[hit], e[hit]

    t = near(t[:, 0], t[:, 1])
    c_s, c_e = near(np.asarray(c_s, dtype=float), np.asarray(c_e, dtype=float))
    if not len(t[0]):
        return 0.0

    def length(*parts: Tuple[np.ndarray, np.ndarray]) -> float:
        starts, ends = union(np.concatenate([s for s, _ in parts]),
                             np.concatenate([e for _, e in parts]))
        return float((ends - starts).sum())

    cs, ts, ps = (c_s, c_e), t, (p_s, p_e)
    return max(0.0, length(ts, cs) + length(ps, cs) - length(ts, ps, cs)
               - (length(cs) if len(c_s) else 0.0))


def comm_spans(tl: Timeline, stage: int) -> Tuple[Sequence[float], Sequence[float]]:
    """The spans of ``stage``'s communication stream in order (its
    lists with its replayed runs in place: :func:`.spans.spans`)."""
    return spans(tl.comm_runs[stage], tl.comm_starts[stage], tl.comm_ends[stage])

def stage_breakdown(tl: Timeline, stage: int, step_s: float,
                    comm: Optional[Tuple[Sequence[float], Sequence[float]]] = None
                    ) -> Dict[str, float]:
    """Per rank of ``stage``, as the simulator's summary counts it:
    compute (the busy part of its compute items), communication (its
    communication-only items and the tensor-parallel waits inside
    compute items), exposed communication (communication while nothing
    computes), idle (the rest of the step). Items on one stream are
    disjoint and in time order, so this is a linear sweep. ``comm``: the
    stream's :func:`comm_spans`, where the caller has them already."""
    waits = tl.waits[stage]
    busy = tl.busy[stage]
    comm_s = tl.comm_s[stage]
    starts, ends = comm if comm is not None else comm_spans(tl, stage)
    runs_g = tl.group_runs[stage]
    if tl.p2p_starts[stage] or tl.group_starts[stage] or runs_g:
        # the union of the collectives' and the transfers' spans, as the
        # simulator's summary counts communication (the data-parallel
        # stream's in any order)
        parts_s = [starts, tl.p2p_starts[stage], tl.group_starts[stage]]
        parts_e = [ends, tl.p2p_ends[stage], tl.group_ends[stage]]
        if runs_g:
            parts_s.append(shifted(runs_g, 0))
            parts_e.append(shifted(runs_g, 1))
        starts, ends = union(np.concatenate(parts_s), np.concatenate(parts_e))
        # in order, as a loop adds them (numpy's cumsum adds one after
        # the other; its sum would add pairwise)
        comm_s = float((ends - starts).cumsum()[-1]) if len(starts) else 0.0
    hidden = span_overlap(*spans(tl.compute_runs[stage], tl.compute_starts[stage],
                                  tl.compute_ends[stage]), starts, ends, ordered=True)
    exposed = waits + comm_s - hidden
    return {"compute_s": busy, "communication_s": comm_s + waits,
            "exposed_communication_s": exposed,
            "idle_s": max(0.0, step_s - busy - exposed)}
