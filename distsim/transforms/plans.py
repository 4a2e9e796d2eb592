"""Parallelization plans: how a model's parameters lie on the
tensor-parallel axis, as data.

A plan maps parameter-name patterns (``fnmatch``, the first matching
entry wins) to a placement *style*:

- ``colwise``: a linear layer's weight split along its output features
  (its result is a shard of the features; the layer's input is wanted
  replicated);
- ``fused_colwise``: a fused weight (several layers' weights side by
  side, the product split into them after it: query, key and value;
  gate and up) split along its output features block by block: each rank
  holds its part of every block, so the split stays local (Megatron's
  layout);
- ``rowwise``: split along its input features (each rank computes a
  partial sum of the result, which is all-reduced; with sequence
  parallelism reduce-scattered over the sequence);
- ``vocab``: an embedding table split along its rows, the vocabulary
  (each rank looks up the ids in its rows, the partial lookups are
  summed as for ``rowwise``); a head that multiplies by the table is then
  vocabulary-parallel too;
- ``replicate``: every rank holds the whole tensor.

A parameter no entry names is replicated, unless it is read together with
a planned layer's product (a bias): then it takes the placement that
propagation derives (a column-wise layer's bias comes out split like the
layer's output). Optional ``cuts``: the ops (by result name) at which a
new pipeline layer starts, for programs whose ops carry no layer.

A plan file (``--plan FILE``)::

    name: my-mlp                 # optional
    parameters:
      "w[02468]": colwise
      "w[13579]": rowwise
    cuts: [h4, h8, h12]          # optional

``--plan megatron`` is the built-in plan that finds the structure itself
(:mod:`.megatron_plan`).
"""
from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any, Dict, Mapping, Sequence, Tuple

from ..errors import ConfigError
from ..yamlio import load_yaml_file

#: the placement styles, and what each means
STYLES: Dict[str, str] = {
    "colwise": "a weight split along its output features",
    "fused_colwise": "a fused weight split along its output features block by block",
    "rowwise": "a weight split along its input features; partial results summed",
    "vocab": "an embedding table split along its rows (the vocabulary)",
    "replicate": "the whole tensor on every rank",
}
#: the built-in plans, by name
BUILTIN = ("megatron",)
PLAN_KEYS = ("name", "description", "parameters", "cuts")


@dataclass(frozen=True)
class PlanEntry:
    """One line of a plan: parameters matching ``pattern`` take ``style``;
    ``where`` names the line in messages."""

    pattern: str
    style: str
    where: str


#: the characters that make a pattern more than a name (:func:`fnmatch.fnmatchcase`)
_GLOB = frozenset("*?[")


@dataclass(frozen=True)
class Plan:
    """A plan: its entries in order, pipeline cuts (op names), and where
    it came from (a file, or a built-in plan's name)."""

    name: str
    entries: Tuple[PlanEntry, ...]
    cuts: Tuple[str, ...] = ()
    source: str = "plan"

    def styles(self, params: Sequence[str], model: str = "the model"
               ) -> Dict[str, PlanEntry]:
        """Each parameter the plan names -> its entry (the first that
        matches). An entry that matches no parameter is a ConfigError
        naming it."""
        out: Dict[str, PlanEntry] = {}
        names = set(params)
        for entry in self.entries:
            if not _GLOB.intersection(entry.pattern):     # a plain name: itself or nothing
                matched = [entry.pattern] if entry.pattern in names else []
            else:
                matched = [p for p in params if fnmatchcase(p, entry.pattern)]
            if not matched:
                shown = ", ".join(params[:8]) + (f", ... ({len(params)})" if len(params) > 8
                                                 else "")
                raise ConfigError(f"{entry.where}: names no parameter of {model} (its "
                                  f"parameters: {shown or 'none'})")
            for p in matched:
                out.setdefault(p, entry)
        return out


def check_style(style: Any, where: str) -> str:
    if not isinstance(style, str) or style not in STYLES:
        raise ConfigError(f"{where}: style must be one of {', '.join(STYLES)}, got {style!r}")
    return style


def plan_from_mapping(data: Any, source: str) -> Plan:
    """A plan from its YAML mapping (see the module docstring); errors
    name ``source`` and the field."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{source}: a plan must be a mapping with 'parameters'")
    for key in data:
        if key not in PLAN_KEYS:
            raise ConfigError(f"{source}: unknown field {key!r} (allowed: "
                              f"{', '.join(PLAN_KEYS)})")
    params = data.get("parameters")
    if not isinstance(params, Mapping) or not params:
        raise ConfigError(f"{source}: parameters: must map parameter-name patterns to styles "
                          f"({', '.join(STYLES)})")
    entries = []
    for pattern, style in params.items():
        where = f"{source}: parameters: {pattern!r}"
        if not isinstance(pattern, str) or not pattern:
            raise ConfigError(f"{where}: a pattern must be non-empty text")
        entries.append(PlanEntry(pattern, check_style(style, where), where))
    cuts = data.get("cuts", ())
    if cuts is None:
        cuts = ()
    if not isinstance(cuts, (list, tuple)) or not all(isinstance(c, str) and c for c in cuts):
        raise ConfigError(f"{source}: cuts: must be a list of op names (the results at which "
                          "a pipeline layer starts)")
    name = data.get("name", Path(source).stem)
    if not isinstance(name, str):
        raise ConfigError(f"{source}: name: must be text, got {name!r}")
    return Plan(name, tuple(entries), tuple(cuts), source)


def load_plan_file(path: str) -> Plan:
    return plan_from_mapping(load_yaml_file(Path(path), "plan file",
                                            f" (--plan takes {' or '.join(BUILTIN)} or a "
                                            "YAML file)"), str(path))

