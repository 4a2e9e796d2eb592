"""The values a pipeline stage boundary of the estimator's template
(:mod:`.profile`) carries: what LowerSPMD sends between two stages that
split the template between its layers."""
from __future__ import annotations

from typing import List, Optional, Tuple

from ..ir.core import Function
from ..transforms.pipeline_split import splits
from ..transforms.recompute import is_forward
from ..transforms.spmd import LowerSPMD
from ..transforms.strategy import Strategy


def stage_crossing(step: Function, tp: int, sp: bool, recompute: str, cp: int = 1,
                   cp_comm: str = "allgather"
                   ) -> Tuple[List[int], List[int], int, Tuple[str, ...],
                              Tuple[Optional[str], ...], Tuple[Optional[str], ...]]:
    """Bytes of the values LowerSPMD sends between two pipeline stages that
    split the template between its layers (forward, backward), the
    bytes of the forward ones that a backward op reads (the receiving
    stage holds its copy of those until its backward: the residual stream
    a layer's first layernorm backward reads, while the sender's, counted
    in the saved activations of the layer that made it, is freed once
    sent), the names of the backward ones (a layer's input gradient,
    which its backward makes before its last ops: sent from there), and
    beside each forward and backward one its dtype's name where
    ``p2p_scatter`` would split it over the ``tp`` ranks, else None
    (:func:`~distsim.transforms.pipeline_split.splits`)."""
    probe = LowerSPMD(Strategy(dp=1, tp=tp, pp=2, sp=sp, recompute=recompute, cp=cp,
                               cp_comm=cp_comm), 2)
    probe._analyse(step)
    split = splits(step, probe.crossing, tp)
    fwd, bwd = [], []
    kept = 0
    names = []
    for v, chunks in probe.crossing.items():
        src = probe.value_chunk[v]
        how = v.type.dtype.value if v in split else None
        for c in chunks:
            if src == 0 and c == 1:
                fwd.append((v.type.size_bytes, how))
                if any(not is_forward(op) for op in probe.consumers.get(v, ())):
                    kept += v.type.size_bytes
            elif src == 1 and c == 0:
                bwd.append((v.type.size_bytes, how))
                names.append(v.name)
    fwd.sort(key=lambda sent: sent[0])
    bwd.sort(key=lambda sent: sent[0])
    return ([n for n, _ in fwd], [n for n, _ in bwd], kept, tuple(sorted(names)),
            tuple(h for _, h in fwd), tuple(h for _, h in bwd))
