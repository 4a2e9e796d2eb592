"""Small hand-built traces shared by the report tests."""
from __future__ import annotations

import pytest

from distsim.sim.trace import DeviceInfo, LinkSample, MemorySample, OpRecord, Trace

GiB = 2**30


def make_trace() -> Trace:
    """Two devices, step 10 s.

    gpu0: compute [0,4) and [3,6) (overlapping: union 6 s), comm [5,8)
          (overlapped by compute on [5,6): exposed 2 s), idle [8,10) = 2 s.
    gpu1: compute [1,2), comm [2,3) and [2.5,4) (union 2 s, all exposed),
          idle 10 - 3 = 7 s; its memory goes over capacity.
    """
    devices = [DeviceInfo(0, "gpu0", 10 * GiB), DeviceInfo(1, "gpu1", 4 * GiB)]
    ops = [
        OpRecord(1, "comm", "ar1", "AllReduce", "communication", 2.5, 4.0, 0.0, 300.0, "ring"),
        OpRecord(0, "compute", "mm0", "MatMul", "compute", 0.0, 4.0, 1e12, 1e6),
        OpRecord(0, "compute", "mm1", "MatMul", "compute", 3.0, 6.0, 2e12, 2e6),
        OpRecord(0, "comm", "ar0", "AllReduce", "communication", 5.0, 8.0, 0.0, 1e9, "ring"),
        OpRecord(1, "compute", "relu", "Relu", "compute", 1.0, 2.0, 5.0, 7.0),
        OpRecord(1, "comm", "ar2", "AllReduce", "communication", 2.0, 3.0, 0.0, 200.0, "ring"),
    ]
    memory = [
        MemorySample(0, 0.0, 1 * GiB), MemorySample(0, 2.0, 3 * GiB), MemorySample(0, 7.0, 2 * GiB),
        MemorySample(1, 1.0, 5 * GiB), MemorySample(1, 3.0, 1 * GiB),
    ]
    links = [LinkSample("gpu0", "nvswitch", 5.0, 0.5), LinkSample("gpu0", "nvswitch", 8.0, 0.0)]
    return Trace(devices=devices, ops=ops, memory=memory, link_samples=links, step_time_s=10.0,
                 meta={"model": "mlp", "dp": 2, "shape": (1, 2), "nan": float("nan")})


def make_many(n_devices: int, ops_per_device: int = 3) -> Trace:
    """``n_devices`` identical devices (same ops, same memory curve)."""
    devices = [DeviceInfo(r, f"gpu{r}", 80 * GiB) for r in range(n_devices)]
    ops, memory = [], []
    for r in range(n_devices):
        for i in range(ops_per_device):
            ops.append(OpRecord(r, "compute", f"op{i}", "MatMul", "compute", 2.0 * i,
                                2.0 * i + 1.0))
            ops.append(OpRecord(r, "comm", f"c{i}", "AllReduce", "communication", 2.0 * i + 0.5,
                                2.0 * i + 1.5))
        memory += [MemorySample(r, 0.0, (1 + r % 3) * GiB), MemorySample(r, 1.0, 2 * GiB)]
    return Trace(devices=devices, ops=ops, memory=memory, step_time_s=2.0 * ops_per_device)


@pytest.fixture
def trace() -> Trace:
    return make_trace()


@pytest.fixture
def many():
    """Factory: ``many(n_devices, ops_per_device=3)`` -> a trace of identical devices."""
    return make_many
