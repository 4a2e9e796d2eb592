"""Annotating values with placements (what a user writes)."""
from __future__ import annotations

from typing import Sequence, Union

from ...errors import VerifyError
from ...ir.core import Value
from ...ir.mesh import DeviceMesh, DTensorType, Placement, dtensor
from ...ir.types import TensorType


def annotate_sharding(value: Value, mesh: DeviceMesh,
                      placements: Sequence[Union[Placement, str]]) -> Value:
    """Give ``value`` (a function input or an op result, before
    propagation) the type ``DTensorType(shape, dtype, mesh, placements)``;
    placements may be text (``"S(0)"``, ``"R"``, ``"P(sum)"``). Returns the
    value. VerifyError naming the value for placements that cannot apply."""
    t = value.type
    if not isinstance(t, TensorType):
        raise VerifyError(f"value %{value.name}: only tensors can be sharded, not {t}")
    if t.device is not None:
        raise VerifyError(f"value %{value.name}: already placed on device {t.device}; "
                          "a sharded value is placed by its mesh")
    value.type = dtensor(t.shape, t.dtype, mesh, placements, f"value %{value.name}")
    return value


def placements_of(value: Value):
    t = value.type
    return t.placements if isinstance(t, DTensorType) else None
