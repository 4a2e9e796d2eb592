"""Small memory pages for the arrays of one large simulation.

numpy asks Linux for transparent huge pages (``madvise(MADV_HUGEPAGE)``)
for the data of every array of 4 MB or more. A simulation of a million ops
makes hundreds of such arrays, each read a few times and freed. With THP
in ``madvise`` mode (the common default), the first touch of each 2 MB page
may compact memory synchronously, and on a VM whose host takes freed
memory back, fetch and zero 2 MB from the host at once. Measured on the
2-core development VM (kernel 6.18, THP enabled=madvise, defrag=madvise)
over GPT-3 175B on 1024 GPUs: system time 0.56-0.63 s with huge pages vs
0.44-0.50 s without at 96 layers, 1.38-1.45 s vs 0.97-1.04 s at 192 layers
(three runs each, fresh processes). The cost grows faster than the program
because at twice the layers more arrays cross numpy's 4 MB threshold; the
arrays are too short-lived for fewer TLB misses to pay it back.

:func:`small_pages` turns numpy's request off for the duration of a block
and restores the previous setting. The setting is process-wide: arrays
another thread allocates meanwhile get small pages too, which only affects
their speed.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator, Optional

import numpy as np


def _hugepage_setter() -> Optional[Callable[[bool], bool]]:
    # numpy's own switch (what NUMPY_MADVISE_HUGEPAGE sets at import): in
    # numpy._core from 2.0, numpy.core before; absent on builds without it
    for module in ("_core", "core"):
        multiarray = getattr(getattr(np, module, None), "multiarray", None)
        setter = getattr(multiarray, "_set_madvise_hugepage", None)
        if callable(setter):
            return setter
    return None


@contextmanager
def small_pages() -> Iterator[None]:
    """numpy allocates without asking for huge pages inside the block (a
    no-op where numpy has no such switch). Nesting is fine."""
    setter = _hugepage_setter()
    if setter is None:
        yield
        return
    was = setter(False)
    try:
        yield
    finally:
        setter(was)
