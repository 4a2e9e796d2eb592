"""Parametric sweeps and strategy search.

``distsim.sweep`` is this package, and it can be called: ``distsim.sweep(
base_config, grid, ...)`` is :func:`sweep` (below), so both the README's
``df = distsim.sweep({...}, grid={...})`` and ``import distsim.sweep.spec``
work.

* :func:`sweep`: every point of a grid of ``distsim simulate`` options, on
  local processes or Dask, as a DataFrame;
* :class:`SweepSpec` / :func:`load_spec`: grids from Python or YAML (a
  path, or the name of an example in ``reports/sweeps/``);
* :func:`simulate_parameters`: the option names a sweep may vary;
* :func:`search`: the best parallel strategy for a model on N GPUs.
"""
import inspect
import sys
import types

from .driver import sweep
from .params import Param, simulate_parameters
from .search import SearchResult, search
from .point import METRICS, run_point
from .spec import SweepPoint, SweepSpec, config_key, load_spec

__all__ = ["METRICS", "Param", "SweepPoint", "SweepSpec", "config_key", "load_spec",
           "SearchResult", "run_point", "search", "simulate_parameters", "sweep"]


class _CallablePackage(types.ModuleType):
    """The package ``distsim.sweep``, which, called, runs :func:`sweep`."""

    def __call__(self, *args, **kwargs):
        return sweep(*args, **kwargs)

    @property
    def __signature__(self) -> inspect.Signature:   # inspect.signature(distsim.sweep)
        return inspect.signature(sweep)


sys.modules[__name__].__class__ = _CallablePackage
