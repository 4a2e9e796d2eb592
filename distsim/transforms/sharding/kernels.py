"""numpy kernels of the sharding ops (registered with the executor's table)."""
from __future__ import annotations

import numpy as np

from ...interp.kernels import KERNELS, kernel

if "shard_slice" not in KERNELS:
    @kernel("shard_slice")
    def _shard_slice(attrs, x):
        return np.array_split(x, int(attrs["parts"]), axis=int(attrs["dim"]))[int(attrs["index"])].copy()

    @kernel("redistribute")
    def _redistribute(attrs, x):
        return x.copy()
