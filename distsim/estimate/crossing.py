"""The values a pipeline stage boundary of the estimator's template
(:mod:`.profile`) carries: what LowerSPMD sends between two stages that
split the template between its layers."""
from __future__ import annotations

from typing import List, Tuple

from ..ir.core import Function
from ..transforms.recompute import is_forward
from ..transforms.spmd import LowerSPMD
from ..transforms.strategy import Strategy


def stage_crossing(step: Function, tp: int, sp: bool, recompute: str, cp: int = 1,
              cp_comm: str = "allgather") -> Tuple[List[int], List[int], int, Tuple[str, ...]]:
    """Bytes of the values LowerSPMD sends between two pipeline stages that
    split the template between its layers (forward, backward), the
    bytes of the forward ones that a backward op reads (the receiving
    stage holds its copy of those until its backward: the residual stream
    a layer's first layernorm backward reads, while the sender's, counted
    in the saved activations of the layer that made it, is freed once
    sent), and the names of the backward ones (a layer's input gradient,
    which its backward makes before its last ops: sent from there)."""
    probe = LowerSPMD(Strategy(dp=1, tp=tp, pp=2, sp=sp, recompute=recompute, cp=cp,
                               cp_comm=cp_comm), 2)
    probe._analyse(step)
    fwd, bwd = [], []
    kept = 0
    names = []
    for v, chunks in probe.crossing.items():
        src = probe.value_chunk[v]
        for c in chunks:
            if src == 0 and c == 1:
                fwd.append(v.type.size_bytes)
                if any(not is_forward(op) for op in probe.consumers.get(v, ())):
                    kept += v.type.size_bytes
            elif src == 1 and c == 0:
                bwd.append(v.type.size_bytes)
                names.append(v.name)
    return sorted(fwd), sorted(bwd), kept, tuple(sorted(names))
