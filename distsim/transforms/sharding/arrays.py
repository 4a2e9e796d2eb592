"""Between global arrays and their per-device shards (numpy), under the
placement conventions of :mod:`distsim.ir.mesh`."""
from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

import numpy as np

from ...interp.collectives import reduce_arrays
from ...ir.mesh import DTensorType, Partial, Shard

Coords = Tuple[int, ...]


def distribute(array: np.ndarray, t: DTensorType) -> Dict[Coords, np.ndarray]:
    """The shard of ``array`` on each device (row-major coords). A partial
    axis holds the value on coordinate 0 and the reduction's identity
    elsewhere (zeros for sum; the value itself for max/min/avg)."""
    out = {}
    for c in t.mesh.all_coords():
        piece = np.asarray(array)
        for axis, p in enumerate(t.placements):
            n = t.mesh.shape[axis]
            if isinstance(p, Shard):
                piece = np.array_split(piece, n, axis=p.dim)[c[axis]]
            elif isinstance(p, Partial) and c[axis] != 0:
                if p.op == "sum":
                    piece = np.zeros_like(piece)
                elif p.op == "prod":
                    piece = np.ones_like(piece)
        out[c] = np.ascontiguousarray(piece)
    return out


def assemble(pieces: Dict[Coords, np.ndarray], t: DTensorType) -> np.ndarray:
    """The global array from the shards: the innermost axis first, shards
    concatenated, partials reduced, replicas taken from coordinate 0."""
    current: Dict[Coords, np.ndarray] = dict(pieces)
    for axis in reversed(range(t.mesh.ndim)):
        p = t.placements[axis]
        groups: Dict[Coords, List[np.ndarray]] = {}
        for c in sorted(current):
            groups.setdefault(c[:axis], []).append(current[c])
        merged = {}
        for key, arrays in groups.items():
            if isinstance(p, Shard):
                merged[key] = np.concatenate(arrays, axis=p.dim)
            elif isinstance(p, Partial):
                merged[key] = reduce_arrays(arrays, p.op)
            else:
                merged[key] = arrays[0]
        current = merged
    return current[()]


def local_inputs(function_inputs: Sequence, record: Dict[str, tuple],
                 global_inputs: Dict[str, np.ndarray]) -> List[np.ndarray]:
    """The local program's input arrays from the global ones."""
    by_name = {}
    for name, array in global_inputs.items():
        t, names = record[name]
        for local, piece in zip(names, distribute(array, t).values()):
            by_name[local] = piece
    return [by_name[v.name] for v in function_inputs]

