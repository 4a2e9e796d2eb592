"""The names a sweep may vary: exactly the options of ``distsim simulate``.

They are derived, never listed by hand, from three places that define them:

* the keyword parameters of :func:`distsim.api.simulate` that are not
  the model's or the strategy's (``model``, ``topology``,
  ``network_mode``, ``collective_algo``, ``max_wall_s``, ...);
* the fields of :class:`distsim.transforms.strategy.Strategy` (``dp``,
  ``tp``, ``pp``, and whatever the strategy grows: ``microbatches``,
  ``schedule``, ``zero``, ...), typed by their annotations;
* the model overrides :func:`distsim.api.build_program` accepts
  (``layers``, ``hidden``, ``batch``, ``dtype``, ...), typed by the value
  each model family's default config gives them;

plus ``fidelity`` (``simulate`` or ``estimate``), how a point is run.

So a new strategy field or model override becomes sweepable the moment it
exists, and a typo in a spec is caught before any simulation runs.
"""
from __future__ import annotations

import inspect
import typing
from dataclasses import MISSING, dataclass, fields
from typing import Any, Dict, Mapping, Optional, Tuple

from .. import api
from ..errors import ConfigError
from ..keywords import unknown_name
from ..transforms.strategy import Strategy, check_field
from .point import FIDELITIES

#: Values every parameter of this kind accepts, by kind name.
_KIND_TYPES: Dict[str, Tuple[type, ...]] = {
    "int": (int,), "float": (int, float), "str": (str,), "bool": (bool,),
    "model": (str, Mapping), "topology": (str,), "any": (object,),
}


@dataclass(frozen=True)
class Param:
    """One sweepable option: its ``kind`` (int, float, str, bool, model,
    topology, any), whether None is allowed, the allowed ``choices`` when
    the code defines them, its ``group`` (run, strategy, model) and its
    default."""

    name: str
    kind: str
    group: str
    optional: bool = False
    choices: Optional[Tuple[Any, ...]] = None
    default: Any = None

    def check(self, value: Any, where: str) -> None:
        """Raise :class:`ConfigError` naming ``where`` if ``value`` is not
        of this parameter's type (or not one of its choices)."""
        if value is None:
            if self.optional:
                return
            raise ConfigError(f"{where}: {self.name} must not be null")
        types = _KIND_TYPES.get(self.kind, (object,))
        ok = isinstance(value, types)
        if self.kind in ("int", "float") and isinstance(value, bool):
            ok = False
        if not ok:
            raise ConfigError(f"{where}: {self.name} must be {_kind_text(self.kind)}, "
                              f"got {value!r} ({type(value).__name__})")
        if self.choices is not None and value not in self.choices:
            raise ConfigError(f"{where}: {self.name} must be one of "
                              f"{', '.join(map(str, self.choices))}; got {value!r}")
        if self.group == "strategy":
            # the values the strategy allows (ZeRO 0-3, positive degrees, ...),
            # checked by the strategy's own rule, before any point runs
            check_field(self.name, value, where)


def _kind_text(kind: str) -> str:
    return {"int": "an integer", "float": "a number", "str": "a string", "bool": "true or false",
            "model": "a model name, a path to a model .yaml or a mapping",
            "topology": "a topology name or a path to a topology .yaml"}.get(kind, kind)


def _kind_of_annotation(annotation: Any) -> Tuple[str, bool]:
    """(kind, optional) of a type annotation such as ``Optional[int]``."""
    optional = False
    origin = typing.get_origin(annotation)
    if origin is typing.Union or str(origin) == "types.UnionType":
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        optional = len(args) < len(typing.get_args(annotation))
        annotation = args[0] if len(args) == 1 else Any
        origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return "any", optional
    for kind, t in (("bool", bool), ("int", int), ("float", float), ("str", str)):
        if annotation is t:
            return kind, optional
    return "any", optional


def _strategy_params() -> Dict[str, Param]:
    hints = typing.get_type_hints(Strategy)
    out: Dict[str, Param] = {}
    for f in fields(Strategy):
        kind, optional = _kind_of_annotation(hints.get(f.name, Any))
        default = f.default if f.default is not MISSING else None
        choices = None
        origin_choices = _literal_choices(hints.get(f.name))
        if origin_choices:
            choices = origin_choices + ((None,) if optional else ())
        out[f.name] = Param(f.name, kind, "strategy", optional or default is None,
                            choices, default)
    return out


def _literal_choices(annotation: Any) -> Optional[Tuple[Any, ...]]:
    if annotation is None:
        return None
    for a in (annotation, *typing.get_args(annotation)):
        if typing.get_origin(a) is typing.Literal:
            return tuple(typing.get_args(a))
    return None


def model_override_names() -> Tuple[str, ...]:
    """The model fields ``build_program`` lets options override."""
    return tuple(api.MODEL_FIELDS)


def _model_override_kind(name: str) -> str:
    """The kind of a model override, from the default configs of the model
    families that have the field (all agreeing), else ``any``."""
    from ..models.registry import FAMILIES
    kinds = set()
    for family in FAMILIES.values():
        if name in family.defaults and family.defaults[name] is not None:
            value = family.defaults[name]
            kinds.add("bool" if isinstance(value, bool) else
                      "int" if isinstance(value, int) else
                      "float" if isinstance(value, float) else
                      "str" if isinstance(value, str) else "any")
    if kinds == {"int", "float"}:
        return "float"
    return kinds.pop() if len(kinds) == 1 else "any"


def _run_params() -> Dict[str, Param]:
    out: Dict[str, Param] = {}
    for p in inspect.signature(api.simulate).parameters.values():
        if p.kind is not inspect.Parameter.POSITIONAL_OR_KEYWORD and \
                p.kind is not inspect.Parameter.KEYWORD_ONLY:
            continue
        if p.name in api.PROGRAM_OPTIONS:     # the model's and the strategy's: typed below
            continue
        default = None if p.default is inspect.Parameter.empty else p.default
        kind = p.name if p.name in ("model", "topology") else \
            ("str" if isinstance(default, str) else "any")
        out[p.name] = Param(p.name, kind, "run", False, _run_choices(p.name), default)
    return out


def _run_choices(name: str) -> Optional[Tuple[Any, ...]]:
    if name == "network_mode":
        from ..sim.network import MODES
        return tuple(MODES)
    if name == "comm_streams":
        from ..sim.comm_queues import COMM_STREAM_MODES
        return COMM_STREAM_MODES
    if name == "launch":
        from ..sim.launch_queue import LAUNCH_MODES
        return LAUNCH_MODES
    if name == "comm_order":
        from ..sim.launch_queue import COMM_ORDERS
        return COMM_ORDERS
    if name == "p2p":
        from ..sim.launch_queue import P2P_MODES
        return P2P_MODES
    if name == "collective_algo":
        try:
            from ..sim.collective_algos import ALGORITHMS
        except ImportError:  # pragma: no cover - older simulator
            return None
        names = {"auto"}
        for table in ALGORITHMS.values():
            names.update(table)
        return tuple(sorted(names))
    return None


def simulate_parameters() -> Dict[str, Param]:
    """Every option of ``distsim simulate`` a sweep may set, by name (the
    Python keyword; on the command line ``_`` reads ``-``), and
    ``fidelity``: how a point is run (``simulate``, the default, or
    ``estimate``: :func:`distsim.estimate.estimate`)."""
    out = _run_params()
    out["fidelity"] = Param("fidelity", "str", "sweep", False, FIDELITIES, "simulate")
    for name in model_override_names():
        out[name] = Param(name, _model_override_kind(name), "model", True)
    for name, param in _strategy_params().items():
        out.setdefault(name, param)
    return out


def check_value(params: Mapping[str, Param], name: str, value: Any, where: str) -> None:
    """Raise one clear :class:`ConfigError` if ``name`` is not an option or
    ``value`` does not fit it."""
    if name not in params:
        raise unknown_name(where, name, params, "parameter")
    params[name].check(value, where)
