"""Where the estimator's pipeline tasks send their outputs, and what each
exchange costs: the walk's view of the lowering's stage sends
(:mod:`distsim.transforms.stage_sends`), from the values the template's
stage boundary carries (:func:`.crossing.stage_crossing`).

Under ``p2p_scatter`` a value every tensor-parallel rank holds whole
travels as ``1/tp`` from each rank: its pieces sliced on the sending
stage (compute), their bytes on the wire, and the reading stage's
all-gather over its tensor-parallel group as the reading task starts
(:mod:`~distsim.transforms.pipeline_split`).
"""
from __future__ import annotations

from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

from ..ir.comm import CollectiveType
from ..ir.types import DType
from .context import StepContext


class Route(NamedTuple):
    """The sends of a task of one kind and chunk."""

    #: the chunk that reads them
    reader: int
    #: (the sending stage, the reading stage)
    stages: Tuple[int, int]
    #: each transfer's time, alone on its link
    times: List[float]
    #: each transfer's bytes on the wire
    sizes: Tuple[int, ...]
    #: slicing the split values' pieces on the sending stage (0: none)
    slice_s: float
    #: gathering them on the reading stage (0: none)
    gather_s: float


def route(ctx: StepContext, kind: str, c: int) -> Optional[Route]:
    """The sends of a ``kind`` task of chunk ``c``, or None (the first /
    last chunk, a weight-gradient task, or the reader on the same stage)."""
    prof = ctx.profile
    if kind == "F" and c < ctx.chunks - 1:
        dst_c, sizes, split = c + 1, prof.forward_crossing, prof.forward_split
    elif kind == "B" and c > 0:
        dst_c, sizes, split = c - 1, prof.backward_crossing, prof.backward_split
    else:
        return None
    src, dst = ctx.stage_of(c), ctx.stage_of(dst_c)
    if dst == src:
        return None
    S = ctx.strategy
    cut = gather = 0.0
    if S.p2p_scatter and S.tp > 1 and any(split):
        wire = []
        team = tuple(S.rank(0, dst, t) for t in range(S.tp))
        for nbytes, dtype in zip(sizes, split):
            if dtype is None:
                wire.append(nbytes)
                continue
            d = DType.parse(dtype)
            n = nbytes // d.itemsize
            cut += ctx.costs.cost("slice", [(n, d)], [(n // S.tp, d)])[0]
            gather += ctx.colls.time(CollectiveType.ALL_GATHER, team, nbytes)
            wire.append(nbytes // S.tp)
        sizes = wire
    pair = (ctx.rank0(src), ctx.rank0(dst))
    return Route(dst_c, (src, dst),
                 [ctx.colls.time(CollectiveType.SEND_RECV, pair, nbytes) for nbytes in sizes],
                 tuple(sizes), cut, gather)


def gather_times(routes: Dict[str, Sequence[Optional[Route]]], chunks: int
                 ) -> Optional[Dict[str, List[float]]]:
    """Per task kind and chunk, the time of gathering what the task
    receives split, or None when no route splits anything."""
    if not any(r is not None and r.gather_s for rs in routes.values() for r in rs):
        return None
    out = {k: [0.0] * chunks for k in routes}
    for k, rs in routes.items():
        for r in rs:
            if r is not None:
                out[k][r.reader] += r.gather_s
    return out
