"""Parametric sweeps and strategy search.

* :func:`sweep` (also ``distsim.sweep``): every point of a grid of
  ``distsim simulate`` options, on local processes or Dask, as a DataFrame;
* :class:`SweepSpec` / :func:`load_spec`: grids from Python or YAML;
* :func:`simulate_parameters`: the option names a sweep may vary;
* :func:`search`: the best parallel strategy for a model on N GPUs.
"""
from .driver import sweep
from .params import Param, simulate_parameters
from .search import SearchResult, search
from .point import METRICS, run_point
from .spec import SweepPoint, SweepSpec, config_key, load_spec

__all__ = ["METRICS", "Param", "SweepPoint", "SweepSpec", "config_key", "load_spec",
           "SearchResult", "run_point", "search", "simulate_parameters", "sweep"]
