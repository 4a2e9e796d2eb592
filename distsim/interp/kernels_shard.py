"""numpy kernels of the sharding layer's ops (:mod:`distsim.ir.ops_shard`):
``shard_slice`` (a device keeping its piece) and ``redistribute`` (the
global view's identity). ``chunk_cat`` / ``chunk_split`` are with the nn
kernels."""
from __future__ import annotations

import numpy as np

from .kernels import kernel


@kernel("shard_slice")
def _shard_slice(attrs, x):
    pieces = np.array_split(x, int(attrs["parts"]), axis=int(attrs["dim"]))
    return pieces[int(attrs["index"])].copy()


@kernel("redistribute")
def _redistribute(attrs, x):
    return x.copy()
