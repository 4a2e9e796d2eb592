"""The ``fused`` op: a run of compute ops simulated as one op (coarsening).

    %a, %b = fused(%x, %w) {segment = "F3.seg2", ops = 7} : ...

The op holds its *segment* as its single sub-function: device-free types,
the run's ops, the values the run reads from outside as inputs and the
values read after it as outputs. One segment function is shared by every
micro-batch and rank that runs the same run, so costing it once serves them
all. Its time is the sum of its ops' times (exact where no communication
interleaves with the run); its memory is its ops', each value allocated
and freed at its own op's offset into the run (the simulator's
``distsim.sim.segment_bodies``). The numpy executor runs the segment, so
a coarsened program still computes the same numbers.

With ``kernel`` (e.g. ``kernel = "scale+mask+softmax"``) the op is one
kernel the framework fuses (:mod:`distsim.transforms.fusion`): costed as
one launch and one memory pass over its inputs and outputs, not as the sum
of its ops.
"""
from __future__ import annotations

from typing import List, Sequence

from .core import Op
from .registry import REQUIRED, OpSpec, ShapeError, register
from .types import TensorType, Type

FUSED = "fused"


def _fused_rule(types, attrs):
    raise ShapeError(f"the result types of fused segment '{attrs['segment']}' come from the "
                     "segment it holds (see distsim.ir.ops_fused.fused_result_types)")


register(OpSpec(FUSED, None, _fused_rule, {"segment": REQUIRED, "ops": REQUIRED, "kernel": ""},
                doc="a run of compute ops held as a sub-function, costed as their sum (with "
                    "kernel: one fused kernel, see distsim.transforms.fusion)"))


def fused_result_types(op: Op, input_types: Sequence[Type]) -> List[Type]:
    """The segment's result types on the device of the op's inputs."""
    if len(op.subfunctions) != 1:
        raise ShapeError("a fused op holds exactly one segment function")
    segment = op.subfunctions[0]
    if len(input_types) != len(segment.inputs):
        raise ShapeError(f"segment '{segment.name}' takes {len(segment.inputs)} inputs, "
                         f"got {len(input_types)}")
    devices = {getattr(t, "device", None) for t in input_types}
    if len(devices) > 1:
        raise ShapeError(f"inputs on different devices {sorted(devices, key=str)}")
    device = devices.pop() if devices else None
    for i, (t, p) in enumerate(zip(input_types, segment.inputs)):
        if (t.shape, t.dtype) != (p.type.shape, p.type.dtype):
            raise ShapeError(f"input {i} is {t}, segment '{segment.name}' takes {p.type}")
    return [TensorType(v.type.shape, v.type.dtype, device) for v in segment.outputs]
