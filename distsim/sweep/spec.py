"""Sweep specs: a base configuration, a grid of values, constraints.

Python::

    spec = SweepSpec.create({"model": "mlp", "network_mode": "analytical"},
                            {"dp": [1, 2, 4, 8], "hidden": [1024, 4096]},
                            constraints=["dp <= devices"])
    points = spec.points()          # every grid point, in grid order

A grid may expand to at most ``max_points`` points (default
:data:`DEFAULT_MAX_POINTS`, 0: no limit): ``SweepSpec.create(...,
max_points=)``, ``load_spec(path, max_points=)``, ``distsim sweep --max-points``.

YAML (``distsim sweep SPEC.yaml``)::

    name: mlp-scaling              # optional, titles the report
    base:                          # options every point shares
      model: mlp
      network_mode: analytical
    grid:                          # option -> list of values (cartesian product)
      dp: [1, 2, 4, 8]
      hidden: [1024, 4096]
    constraints:                   # optional; points failing one are skipped
      - "dp <= devices"
    charts:                        # optional; what the charts put on their axes
      heatmap: [dp, hidden]
    check: 3                       # optional; with fidelity: estimate, simulate the
                                   # 3 best estimates in full afterwards

Every name is a ``distsim simulate`` option (:mod:`.params`). A spec is
checked whole before any work starts: unknown names, values of the wrong
type, empty grids, unknown models or topologies and malformed constraints
raise one :class:`~distsim.errors.ConfigError` naming the field.
"""
from __future__ import annotations

import hashlib
import itertools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence

from ..errors import ConfigError, DistsimError
from ..keywords import plain
from ..paths import not_found_hint, resolve
from ..yamlio import load_yaml_file
from .constraints import Constraint, ConstraintLike, make_constraints
from .unset import Resolver
from .params import Param, check_value, simulate_parameters

SPEC_KEYS = ("name", "description", "base", "grid", "constraints", "charts", "check")

#: The most points a grid may expand to (``max_points`` / ``--max-points``;
#: 0: no limit). A grid is a cartesian product, so a few long lists reach
#: millions of points (each a simulation, a journal line and a table row);
#: past this a spec is refused before any work starts.
DEFAULT_MAX_POINTS = 100_000


def check_max_points(value: Any) -> int:
    """``max_points`` as an int >= 0 (0: no limit); None is the default."""
    if value is None:
        return DEFAULT_MAX_POINTS
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"--max-points: must be an integer >= 0 (0: no limit), got {value!r}")
    return value


def check_grid_size(sizes: Sequence[int], max_points: Any, where: str) -> int:
    """The number of points of a grid with lists of ``sizes``; a ConfigError
    past ``max_points`` (None: :data:`DEFAULT_MAX_POINTS`, 0: no limit)."""
    limit = check_max_points(max_points)
    total = 1
    for n in sizes:
        total *= n
    if limit and total > limit:
        raise ConfigError(f"{where}: grid: expands to {total:,} points "
                          f"({' x '.join(str(n) for n in sizes)}), more than max_points "
                          f"{limit:,} (raise --max-points, 0: no limit)")
    return total


def check_count(check: Any, base: Mapping[str, Any], grid: Mapping[str, List[Any]],
                where: str) -> int:
    """``check`` as an int >= 0; a check needs estimated points."""
    if check is None:
        return 0
    if isinstance(check, bool) or not isinstance(check, int) or check < 0:
        raise ConfigError(f"{where}: check: must be an integer >= 0 (how many of the best "
                          f"estimates to simulate in full), got {check!r}")
    fidelities = grid.get("fidelity", [base.get("fidelity", "simulate")])
    if check and "estimate" not in fidelities:
        raise ConfigError(f"{where}: check: {check} needs estimated points "
                          "(fidelity: estimate): simulated points are checked already")
    return check


def config_key(params: Mapping[str, Any]) -> str:
    """Stable hash of one point's options (order-independent): the key by
    which a resumed sweep recognises the points it has done."""
    text = json.dumps(params, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


@dataclass(frozen=True)
class SweepPoint:
    """One configuration of a sweep: its position in the grid, its options
    (base and grid values), their hash, and why it is skipped (or None)."""

    index: int
    params: Dict[str, Any]
    key: str
    skip_reason: Optional[str] = None


@dataclass
class SweepSpec:
    base: Dict[str, Any]
    grid: Dict[str, List[Any]]
    constraints: List[Constraint] = field(default_factory=list)
    name: str = "sweep"
    description: str = ""
    charts: Dict[str, Any] = field(default_factory=dict)
    source: str = "sweep"
    #: how many of the best estimated points to simulate in full afterwards
    check: int = 0

    @classmethod
    def create(cls, base: Optional[Mapping[str, Any]], grid: Any,
               constraints: Optional[Iterable[ConstraintLike]] = None, *, name: Any = "sweep",
               description: Any = "", charts: Optional[Mapping[str, Any]] = None,
               source: str = "sweep", max_points: Optional[int] = None,
               check: Any = 0) -> "SweepSpec":
        """Validate and build a spec (see the module docstring); a grid of
        more than ``max_points`` points (None: :data:`DEFAULT_MAX_POINTS`,
        0: no limit) is a ConfigError."""
        check_max_points(max_points)
        params = simulate_parameters()
        base, grid = plain(base), plain(grid)     # numpy numbers as Python's
        if base is None:
            base = {}
        if not isinstance(base, Mapping):
            raise ConfigError(f"{source}: base: must be a mapping of options, got "
                              f"{type(base).__name__}")
        base = dict(base)
        for k, v in base.items():
            check_value(params, str(k), v, f"{source}: base.{k}")
        if not isinstance(grid, Mapping):
            raise ConfigError(f"{source}: grid: must be a mapping of option -> list of values, "
                              f"got {type(grid).__name__}")
        if not grid:
            raise ConfigError(f"{source}: grid: is empty (give at least one option and a "
                              "list of values)")
        clean: Dict[str, List[Any]] = {}
        for k, values in grid.items():
            here = f"{source}: grid.{k}"
            if k not in params:
                check_value(params, str(k), None, here)  # raises 'unknown parameter'
            if k in base:
                raise ConfigError(f"{here}: is also set in base (set it in one place)")
            if isinstance(values, (str, bytes, Mapping)) or not isinstance(values, Sequence):
                raise ConfigError(f"{here}: must be a list of values, got {values!r} "
                                  "(fixed options go under base:)")
            if not values:
                raise ConfigError(f"{here}: is an empty list")
            seen: List[Any] = []
            for i, v in enumerate(values):
                check_value(params, k, v, f"{here}[{i}]")
                if any(v == s and type(v) is type(s) for s in seen):
                    raise ConfigError(f"{here}: value {v!r} is listed twice")
                seen.append(v)
            clean[str(k)] = list(values)
        check_grid_size([len(v) for v in clean.values()], max_points, source)
        cons = make_constraints(constraints, params, where=f"{source}: constraints")
        if charts is not None and not isinstance(charts, Mapping):
            raise ConfigError(f"{source}: charts: must be a mapping")
        for key, text in (("name", name), ("description", description)):
            if text is not None and not isinstance(text, (str, int, float)):
                raise ConfigError(f"{source}: {key}: must be a string, got {text!r}")
        spec = cls(base, clean, cons, str(name), str(description or ""), dict(charts or {}),
                   source, check_count(check, base, clean, source))
        spec._check_charts(params)
        spec._preflight()
        return spec

    # -- checks before work ------------------------------------------------------------
    def _check_charts(self, params: Mapping[str, Param]) -> None:
        heat = self.charts.get("heatmap")
        if heat is not None:
            if (not isinstance(heat, Sequence) or isinstance(heat, str) or len(heat) != 2
                    or not all(isinstance(h, str) for h in heat)):
                raise ConfigError(f"{self.source}: charts.heatmap: must be a list of two "
                                  f"option names, got {heat!r}")
            for h in heat:
                if h not in self.grid:
                    raise ConfigError(f"{self.source}: charts.heatmap: {h!r} is not a grid "
                                      f"option (grid: {', '.join(self.grid)})")
        unknown = set(self.charts) - {"heatmap", "hue"}
        if unknown:
            raise ConfigError(f"{self.source}: charts: unknown key(s) "
                              f"{', '.join(sorted(map(str, unknown)))} (known: heatmap, hue)")
        hue = self.charts.get("hue")
        # one line per value of a grid option: a misspelt or base option would
        # otherwise be ignored silently (or, not a name, crash the chart)
        if hue is not None and (not isinstance(hue, str) or hue not in self.grid):
            raise ConfigError(f"{self.source}: charts.hue: must be the name of a grid option "
                              f"(grid: {', '.join(self.grid)}), got {hue!r}")

    def _preflight(self) -> None:
        """Resolve every model and topology the grid names, once, so that a
        typo fails now and not on every point."""
        from ..models import load_model_config
        from ..topology import load_topology
        for name, loader in (("model", load_model_config), ("topology", load_topology)):
            values = self.grid.get(name, [self.base[name]] if name in self.base else [])
            for v in values:
                try:
                    loader(v)
                except DistsimError as e:
                    raise ConfigError(f"{self.source}: {name} {v!r}: {e}") from None

    # -- expansion -----------------------------------------------------------------------
    @property
    def size(self) -> int:
        n = 1
        for values in self.grid.values():
            n *= len(values)
        return n

    def points(self) -> List[SweepPoint]:
        """Every grid point in grid order (the last option varies fastest),
        with the constraints evaluated."""
        params = simulate_parameters()
        resolver = Resolver({k: p.default for k, p in params.items()})
        names = list(self.grid)
        out: List[SweepPoint] = []
        for index, combo in enumerate(itertools.product(*(self.grid[n] for n in names))):
            point = {**self.base, **dict(zip(names, combo))}
            reason = None
            if self.constraints:
                env = resolver.values(point)   # unset options as the run will have them
                for c in self.constraints:
                    if not c(env):
                        reason = c.reason
                        break
            out.append(SweepPoint(index, point, config_key(point), reason))
        return out



def load_spec(path: str | Path, max_points: Optional[int] = None) -> SweepSpec:
    """Read and validate a YAML sweep spec: ``path`` is a file, or the name
    of an example in ``reports/sweeps/`` (``"mlp-scaling"``); at most
    ``max_points`` grid points (None: :data:`DEFAULT_MAX_POINTS`, 0: no limit)."""
    p = resolve("sweeps", str(path), ".yaml")    # a path, or an example's name
    data = load_yaml_file(p, "sweep spec", not_found_hint("sweeps", str(path), ".yaml"))
    if not isinstance(data, Mapping):
        raise ConfigError(f"{p}: a sweep spec must be a mapping with base: and grid:")
    unknown = set(data) - set(SPEC_KEYS)
    if unknown:
        raise ConfigError(f"{p}: unknown key(s) {', '.join(sorted(map(str, unknown)))} "
                          f"(known: {', '.join(SPEC_KEYS)})")
    if "grid" not in data:
        raise ConfigError(f"{p}: grid: missing (option -> list of values)")
    return SweepSpec.create(data.get("base"), data.get("grid"), data.get("constraints"),
                            name=data.get("name") or p.stem,
                            description=data.get("description") or "",
                            charts=data.get("charts"), source=str(p), max_points=max_points,
                            check=data.get("check", 0))
