"""Between global arrays and their per-device pieces (numpy), under the
placement conventions of :mod:`distsim.ir.mesh`.

- :func:`distribute`: the piece of a global array on every device; a
  partial axis holds terms whose reduction is the value (random terms on
  every device when given a generator).
- :func:`assemble`: the global array from the pieces.
- :func:`first_wrong_piece`: the first device whose piece disagrees with
  a global array: every replica is compared, partial terms are reduced.
"""
from __future__ import annotations

from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ...interp.collectives import reduce_arrays
from ...ir.mesh import BlockShard, DTensorType, Partial, Replicate, Shard

Coords = Tuple[int, ...]


def partial_terms(x: np.ndarray, op: str, n: int,
                  rng: Optional[np.random.Generator] = None) -> List[np.ndarray]:
    """``n`` terms whose reduction by ``op`` is ``x``. Without ``rng``: ``x``
    first, the reduction's identity after it (zeros for sum, ones for
    prod, ``x`` itself for max/min/avg). With ``rng``: random terms on
    every device -- sum/avg: random terms and one that completes them;
    max (min): ``x`` minus (plus) a random amount, with ``x`` itself on one
    random device per element; prod: random factors in +-[0.5, 2) and one
    that completes them (integer prod, and booleans, as without ``rng``)."""
    x = np.asarray(x)
    kind = x.dtype.kind
    if rng is None or kind not in "fiu" or (op == "prod" and kind != "f"):
        if op == "sum":
            rest = np.zeros_like(x)
        elif op == "prod":
            rest = np.ones_like(x)
        else:
            rest = x
        return [x] + [rest.copy() for _ in range(n - 1)]
    wide = np.float64 if kind == "f" else np.int64

    def draw(low, high):
        if kind == "f":
            return rng.uniform(low, high, size=x.shape).astype(x.dtype)
        return rng.integers(int(low), int(high), size=x.shape).astype(x.dtype)

    whole = x.astype(wide)
    if op in ("sum", "avg"):
        terms = [draw(-1, 1) for _ in range(n - 1)]
        total = whole * (n if op == "avg" else 1)
        last = total - sum((t.astype(wide) for t in terms), np.zeros_like(whole))
        return terms + [last.astype(x.dtype)]
    if op == "prod":
        terms = [(draw(0.5, 2) * np.where(rng.random(x.shape) < 0.5, -1, 1)).astype(x.dtype)
                 for _ in range(n - 1)]
        last = whole / np.prod([t.astype(wide) for t in terms], axis=0) if terms else whole
        return terms + [last.astype(x.dtype)]
    # max, min: every term on the far side of x, one of them x itself
    sign = -1 if op == "max" else 1
    high = 1 if kind == "f" else 4
    if kind == "u" and op == "max":   # (unsigned: keep the terms at or above zero)
        terms = [np.minimum(x, draw(0, high)) for _ in range(n)]
    else:
        terms = [(whole + sign * draw(0, high).astype(wide)).astype(x.dtype) for _ in range(n)]
    keep = rng.integers(0, n, size=x.shape)
    return [np.where(keep == i, x, t) for i, t in enumerate(terms)]


def _block_parts(piece: np.ndarray, p: BlockShard, n: int) -> List[np.ndarray]:
    """Device ``r``'s part of a blocked dim: the ``r``-th part of every block."""
    blocks = np.split(piece, np.cumsum(p.blocks)[:-1], axis=p.dim)
    return [np.concatenate([np.split(b, n, axis=p.dim)[r] for b in blocks], axis=p.dim)
            for r in range(n)]


def _block_whole(arrays: List[np.ndarray], p: BlockShard) -> np.ndarray:
    """The blocked dim from every device's part (the inverse of :func:`_block_parts`)."""
    n = len(arrays)
    local = [b // n for b in p.blocks]
    cuts = np.cumsum(local)[:-1]
    parts = [np.split(a, cuts, axis=p.dim) for a in arrays]
    return np.concatenate([np.concatenate([parts[r][k] for r in range(n)], axis=p.dim)
                           for k in range(len(p.blocks))], axis=p.dim)


def distribute(array: np.ndarray, t: DTensorType,
               rng: Optional[np.random.Generator] = None) -> Dict[Coords, np.ndarray]:
    """The piece of ``array`` on each device (row-major coords), mesh axis
    by mesh axis: a shard axis splits the piece (``numpy.array_split``), a
    replicate axis copies it, a partial axis splits it into terms
    (:func:`partial_terms`, random with ``rng``)."""
    pieces: Dict[Coords, np.ndarray] = {(): np.asarray(array)}
    for axis, p in enumerate(t.placements):
        n = t.mesh.shape[axis]
        split: Dict[Coords, np.ndarray] = {}
        for prefix, piece in pieces.items():
            if isinstance(p, BlockShard):
                parts = _block_parts(piece, p, n)
            elif isinstance(p, Shard):
                parts = np.array_split(piece, n, axis=p.dim)
            elif isinstance(p, Partial):
                parts = partial_terms(piece, p.op, n, rng)
            else:
                parts = [piece] * n
            for i, part in enumerate(parts):
                split[prefix + (i,)] = part
        pieces = split
    return {c: np.ascontiguousarray(pieces[c]) for c in t.mesh.all_coords()}


def assemble(pieces: Dict[Coords, np.ndarray], t: DTensorType) -> np.ndarray:
    """The global array from the pieces: the innermost axis first, shards
    concatenated, partials reduced, replicas taken from coordinate 0
    (:func:`first_wrong_piece` compares them all)."""
    current: Dict[Coords, np.ndarray] = dict(pieces)
    for axis in reversed(range(t.mesh.ndim)):
        p = t.placements[axis]
        groups: Dict[Coords, List[np.ndarray]] = {}
        for c in sorted(current):
            groups.setdefault(c[:axis], []).append(current[c])
        merged = {}
        for key, arrays in groups.items():
            if isinstance(p, BlockShard):
                merged[key] = _block_whole(arrays, p)
            elif isinstance(p, Shard):
                merged[key] = np.concatenate(arrays, axis=p.dim)
            elif isinstance(p, Partial):
                merged[key] = reduce_arrays(arrays, p.op)
            else:
                merged[key] = arrays[0]
        current = merged
    return current[()]


def _reduced(pieces: Dict[Coords, np.ndarray], t: DTensorType, c: Coords,
             axes: Sequence[int]) -> np.ndarray:
    """What the devices that differ from ``c`` only on the partial ``axes``
    hold together: their terms reduced, the innermost axis first."""
    if not axes:
        return pieces[c]
    axis = axes[0]
    terms = [_reduced(pieces, t, c[:axis] + (k,) + c[axis + 1:], axes[1:])
             for k in range(t.mesh.shape[axis])]
    return reduce_arrays(terms, t.placements[axis].op)


Close = Callable[[np.ndarray, np.ndarray], bool]


def first_wrong_piece(pieces: Dict[Coords, np.ndarray], t: DTensorType, want: np.ndarray,
                      close: Close) -> Optional[Tuple[Coords, float]]:
    """The first device (row-major) whose piece is not ``want``'s, and the
    largest difference there (inf for a wrong shape); None when all agree.
    Every replica is compared; on a partial axis, the terms of a group of
    devices are reduced and compared with the piece they make together."""
    partial = [i for i, p in enumerate(t.placements) if isinstance(p, Partial)]
    placements = [Replicate() if isinstance(p, Partial) else p for p in t.placements]
    expected = distribute(want, t.with_placements(placements))
    seen: Dict[Coords, Optional[float]] = {}
    for c in t.mesh.all_coords():
        group = tuple(0 if i in partial else k for i, k in enumerate(c))
        if group not in seen:
            got, exp = _reduced(pieces, t, group, partial), expected[c]
            if got.shape != exp.shape:
                seen[group] = float("inf")
            elif not close(got, exp):
                seen[group] = float(np.max(np.abs(got.astype(np.float64) - exp)))
            else:
                seen[group] = None
        if seen[group] is not None:
            return c, seen[group]
    return None


def local_inputs(function_inputs: Sequence, record: Dict[str, tuple],
                 global_inputs: Dict[str, np.ndarray],
                 rng: Optional[np.random.Generator] = None) -> List[np.ndarray]:
    """The local program's input arrays from the global ones (partial
    inputs as random terms on every device with ``rng``)."""
    by_name = {}
    for name, array in global_inputs.items():
        t, names = record[name]
        for local, piece in zip(names, distribute(array, t, rng).values()):
            by_name[local] = piece
    return [by_name[v.name] for v in function_inputs]
