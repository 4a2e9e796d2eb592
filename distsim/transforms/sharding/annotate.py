"""Annotating values with placements (what a user writes).

:func:`annotate_sharding` lives in the builder (:mod:`distsim.ir.builder`,
also ``FunctionBuilder.annotate_sharding``) and is re-exported here.
"""
from __future__ import annotations

from ...ir.builder import annotate_sharding
from ...ir.core import Value
from ...ir.mesh import DTensorType

__all__ = ["annotate_sharding", "placements_of"]


def placements_of(value: Value):
    t = value.type
    return t.placements if isinstance(t, DTensorType) else None
