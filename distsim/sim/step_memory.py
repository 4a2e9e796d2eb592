"""A simulated run's memory from its op times: each value's allocation and
free (:mod:`.value_lifetimes`; inside fused ops where the full program has
them, :mod:`.segment_bodies`), then each device's curve and peaks
(:mod:`.memory`); under symmetry, the followers take their representative's."""
from __future__ import annotations

from typing import Dict, Mapping, Tuple

import numpy as np

from ..cost.model import CostModel
from .memory import MemoryAccounting, copy_to_followers, memory_accounting
from .program_index import ProgramIndex
from .segment_bodies import segment_table
from .value_lifetimes import value_lifetimes

__all__ = ["run_memory", "memory_to_followers"]


def run_memory(ix: ProgramIndex, cost: CostModel, start_s: np.ndarray, end_s: np.ndarray,
               coll_start: np.ndarray, coll_end: np.ndarray, rep: Mapping[int, int],
               record_memory: bool) -> MemoryAccounting:
    """The memory of the simulated devices (``rep``: each device's
    representative under symmetry, empty without it) given every compute
    op's and collective's start and end."""
    life = value_lifetimes(ix, start_s, end_s, coll_start, coll_end, segment_table(ix, cost))
    device = life.device
    keep = ~np.isnan(life.alloc)
    if rep:
        keep &= np.isin(device, [r for r in ix.used_devices if rep.get(r, r) == r])
    return memory_accounting(device[keep], life.size[keep], life.category[keep],
                             life.alloc[keep], life.free[keep], life.categories, record_memory)


def memory_to_followers(memory: MemoryAccounting, members: Dict[int, Tuple[int, ...]]
                        ) -> MemoryAccounting:
    """Give every follower (``members``: each representative's class, the
    representative first) its representative's peaks and curve."""
    for head, group in members.items():
        for m in group[1:]:
            if head in memory.peak:
                memory.peak[m] = memory.peak[head]
                memory.peak_by_category[m] = dict(memory.peak_by_category[head])
    if len(memory.samples):
        memory.samples = copy_to_followers(memory.samples, members)
    return memory
