"""Context parallelism's layout of a sequence: which tokens each rank holds.

With ``cp`` context-parallel ranks the sequence is cut into ``2 x cp``
equal chunks and rank ``r`` holds chunks ``r`` and ``2 cp - 1 - r``
(:func:`balanced_chunks`): under the causal mask an early chunk attends to
few keys and a late one to many, so each rank gets one of each and every
rank does the same attention work (Megatron-LM's and Llama 3's layout).
Every activation of a rank is its chunks' tokens (positions, the causal
mask and the position rows are its own); only attention reads the other
ranks' keys and values, gathered over the ``cp`` group in rank order
(:func:`gathered_chunks`).

The attention ops say which global chunks their queries and keys are
(``q_chunks``, ``k_chunks`` attributes, :mod:`distsim.ir.ops_nn`): the
causal mask is then ``key position <= query position``.
"""
from __future__ import annotations

from typing import Tuple

import numpy as np

from ..errors import ConfigError


def balanced_chunks(rank: int, cp: int) -> Tuple[int, int]:
    """The two chunks (of ``2 x cp``) that context-parallel ``rank`` holds."""
    return rank, 2 * cp - 1 - rank


def gathered_chunks(cp: int) -> Tuple[int, ...]:
    """The chunks of a sequence gathered over the ``cp`` ranks, in the
    order of the gathered tensor (rank 0's two, rank 1's two, ...)."""
    return tuple(c for r in range(cp) for c in balanced_chunks(r, cp))


def check_context_parallel(seq: int, cp: int) -> None:
    """ConfigError naming ``--cp`` unless the sequence splits into ``2 x cp``
    equal chunks."""
    if cp > 1 and seq % (2 * cp):
        raise ConfigError(f"--cp {cp}: the sequence length {seq} is not a multiple of "
                          f"2 x cp = {2 * cp} (each rank holds two of 2 x cp equal chunks, "
                          "for causal load balance)")


def local_sequence(array: np.ndarray, rank: int, cp: int, axis: int = 1) -> np.ndarray:
    """Rank ``rank``'s tokens of a global ``array`` whose ``axis`` is the
    sequence (its chunks, :func:`balanced_chunks`, concatenated)."""
    if cp == 1:
        return array
    pieces = np.split(np.asarray(array), 2 * cp, axis=axis)
    return np.concatenate([pieces[c] for c in balanced_chunks(rank, cp)], axis=axis)

