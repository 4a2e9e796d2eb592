"""Pipeline layers of any program: which ``meta["layer"]`` each op has.

:class:`~distsim.transforms.spmd.LowerSPMD` cuts a step into pipeline
stages along its layers (ops tagged ``meta["layer"]``, ``0 .. layers-1``;
an op without one follows its inputs). A built-in builder tags its ops;
for any other program the layers come from

- explicit cut points (:func:`layers_from_cuts`): the ops, by result name,
  at which a new layer starts (a plan's ``cuts``);
- node-name prefixes (:func:`layers_from_prefixes`): an import's node names
  such as ``/h.3/attn/...``, the number after a prefix being the layer.

:func:`check_stages` refuses a pipeline with a stage that would be empty.
"""
from __future__ import annotations

import re
from typing import Dict, Optional, Sequence

from ..errors import ConfigError
from ..ir.core import Function


def layers_from_cuts(f: Function, cuts: Sequence[str], where: str) -> int:
    """Tag ``f``'s ops (in place) with layers cut at ``cuts`` (result names,
    in program order): ops before the first cut are layer 0, from cut ``k``
    on layer ``k + 1``. Returns the number of layers. A cut that names no
    op, repeats or goes backwards, or leaves a layer without ops is a
    ConfigError naming it."""
    position: Dict[str, int] = {}
    for i, op in enumerate(f.ops):
        for v in op.outputs:
            position.setdefault(v.name, i)
    at = []
    for k, cut in enumerate(cuts):
        if cut not in position:
            raise ConfigError(f"{where}: cuts[{k}]: no op of '{f.name}' computes %{cut}")
        at.append(position[cut])
    previous = 0
    for k, (cut, i) in enumerate(zip(cuts, at)):
        if i <= previous:
            raise ConfigError(f"{where}: cuts[{k}] %{cut} leaves pipeline layer {k} empty "
                              "(cuts must follow the program order, after its first op)")
        previous = i
    layer = 0
    starts = set(at)
    for i, op in enumerate(f.ops):
        if i in starts:
            layer += 1
        op.meta["layer"] = layer
    return len(cuts) + 1


_NUMBER = re.compile(r"(\d+)")


def layers_from_prefixes(f: Function, prefix: str) -> Optional[int]:
    """Tag ``f``'s ops with the number that follows ``prefix`` in their
    result names (``/h.3/attn/MatMul`` with ``prefix="/h."`` -> layer 3);
    ops without it follow their inputs (before the first numbered op:
    layer -1, the embedding; after the last: ``layers``, the head).
    Returns the number of layers, or None when no op is numbered."""
    found: Dict[int, int] = {}
    for i, op in enumerate(f.ops):
        for v in op.outputs:
            k = v.name.find(prefix)
            if k >= 0:
                m = _NUMBER.match(v.name, k + len(prefix))
                if m:
                    found[i] = int(m.group(1))
                    break
    if not found:
        return None
    layers = max(found.values()) + 1
    first, last = min(found), max(found)
    for i, op in enumerate(f.ops):
        if i in found:
            op.meta["layer"] = found[i]
        elif i < first:
            op.meta["layer"] = -1
        elif i > last:
            op.meta["layer"] = layers
    return layers


def check_stages(layers: int, pp: int, chunks: int, where: str) -> None:
    """Every pipeline stage (``pp x chunks`` model chunks) gets a layer."""
    stages = pp * chunks
    if stages > layers:
        what = f"pp x virtual stages = {pp} x {chunks}" if chunks > 1 else f"--pp {pp}"
        raise ConfigError(f"{what}: {stages} pipeline stages but {where} has only {layers} "
                          f"layer{'s' if layers != 1 else ''} (stage {layers} would be empty)")
