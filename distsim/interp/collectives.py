"""numpy semantics of every collective, all ranks in one process.

``run_collective(kind, attrs, arrays)`` takes the inputs in team order (see
:func:`distsim.ir.comm.io_ranks`) and returns the outputs in team order.
Uneven splits follow ``numpy.array_split``.
"""
from __future__ import annotations

from functools import reduce as _fold
from typing import List, Mapping, Sequence

import numpy as np

from ..errors import ExecutionError
from ..ir.comm import CollectiveType

_REDUCERS = {"sum": np.add, "avg": np.add, "max": np.maximum, "min": np.minimum,
             "prod": np.multiply}


def reduce_arrays(arrays: Sequence[np.ndarray], reduce_op: str) -> np.ndarray:
    if reduce_op not in _REDUCERS:
        raise ExecutionError(f"unknown reduce_op '{reduce_op}'")
    out = _fold(_REDUCERS[reduce_op], arrays)
    if reduce_op == "avg":
        out = out / len(arrays)
    return np.asarray(out, dtype=arrays[0].dtype)


def run_collective(kind: CollectiveType, attrs: Mapping[str, object],
                   arrays: Sequence[np.ndarray]) -> List[np.ndarray]:
    n = len(attrs["ranks"])
    op = str(attrs.get("reduce_op", "sum"))
    if kind is CollectiveType.ALL_REDUCE:
        out = reduce_arrays(arrays, op)
        return [out.copy() for _ in range(n)]
    if kind is CollectiveType.REDUCE:
        return [reduce_arrays(arrays, op)]
    if kind is CollectiveType.BROADCAST:
        return [arrays[0].copy() for _ in range(n)]
    if kind is CollectiveType.SEND_RECV:
        return [arrays[0].copy()]
    if kind in (CollectiveType.ALL_GATHER, CollectiveType.GATHER):
        out = np.concatenate(arrays, axis=int(attrs["dim"]))
        count = n if kind is CollectiveType.ALL_GATHER else 1
        return [out.copy() for _ in range(count)]
    if kind is CollectiveType.REDUCE_SCATTER:
        total = reduce_arrays(arrays, op)
        return [p.copy() for p in np.array_split(total, n, axis=int(attrs["dim"]))]
    if kind is CollectiveType.SCATTER:
        return [p.copy() for p in np.array_split(arrays[0], n, axis=int(attrs["dim"]))]
    if kind is CollectiveType.ALL_TO_ALL:
        sdim, cdim = int(attrs["split_dim"]), int(attrs["concat_dim"])
        pieces = [np.split(a, n, axis=sdim) for a in arrays]
        return [np.concatenate([pieces[src][dst] for src in range(n)], axis=cdim)
                for dst in range(n)]
    raise ExecutionError(f"no numpy semantics for collective {kind.value}")
