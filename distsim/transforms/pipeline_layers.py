"""Pipeline layers of any program: which ``meta["layer"]`` each op has.

:class:`~distsim.transforms.spmd.LowerSPMD` cuts a step into pipeline
stages along its layers (ops tagged ``meta["layer"]``, ``0 .. layers-1``;
an op without one follows its inputs). A built-in builder tags its ops;
for any other program the layers come from

- explicit cut points (:func:`layers_from_cuts`): the ops, by result name,
  at which a new layer starts (a plan's ``cuts``);
- an import's node scopes (:func:`layers_from_scopes`): the module path of
  each node, such as ``inner.model.layers.3.mlp``, the number in it being
  the layer.

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


#: the first path component that is a number: ``layers.3.`` or ``/h.3/``
_LAYER = re.compile(r"(?:^|[./])(\d+)(?=$|[./])")


def layers_from_scopes(f: Function) -> Optional[int]:
    """Tag ``f``'s ops with the layer their ``meta["scope"]`` names (the
    first number in the dotted or slashed path: ``inner.model.layers.3.mlp``
    or ``/transformer/h.3/attn/MatMul`` -> layer 3, as an importer records
    it). Before the first numbered op, ops are layer -1 (the embedding),
    after the last ``layers`` (the head); between, an op without a number
    takes the latest layer of its inputs' producers, or, reading inputs
    only, the earliest of its readers'. Returns the number of layers, or
    None when no op is numbered (then nothing is tagged)."""
    found: Dict[int, int] = {}
    for i, op in enumerate(f.ops):
        m = _LAYER.search(str(op.meta.get("scope", "")))
        if m:
            found[i] = int(m.group(1))
    if not found:
        return None
    layers = max(found.values()) + 1
    first, last = min(found), max(found)
    producer = f.producers()
    pending = []
    for i, op in enumerate(f.ops):
        if i in found:
            op.meta["layer"] = found[i]
        elif i < first:
            op.meta["layer"] = -1
        elif i > last:
            op.meta["layer"] = layers
        else:
            before = [producer[v].meta["layer"] for v in op.inputs if v in producer]
            if before:
                op.meta["layer"] = max(before)
            else:
                pending.append(op)
    users = f.users()
    for op in reversed(pending):
        after = [u.meta["layer"] for v in op.outputs for u in users.get(v, [])
                 if "layer" in u.meta]
        op.meta["layer"] = min(after) if after else layers
    return layers


def check_stages(layers: int, pp: int, chunks: int, where: str) -> None:
    """Every pipeline stage (``pp x chunks`` model chunks) gets a layer."""
    stages = pp * chunks
    if stages > layers:
        what = f"pp x virtual stages = {pp} x {chunks}" if chunks > 1 else f"--pp {pp}"
        raise ConfigError(f"{what}: {stages} pipeline stages but {where} has only {layers} "
                          f"layer{'s' if layers != 1 else ''} (stage {layers} would be empty)")
