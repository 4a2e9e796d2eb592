"""distsim: a discrete-event cluster simulator for distributed deep-learning
training. See README.md; the public API is :func:`simulate` and
:class:`SimulationResult` (:mod:`distsim.api`); :func:`sweep` and :func:`compare`
(runs side by side)."""
from .api import SimulationResult, build_program, simulate
from .errors import DistsimError
from .report.compare import compare
from .sweep import sweep  # the function; its package stays importable as distsim.sweep

__version__ = "0.1.0"

__all__ = ["DistsimError", "SimulationResult", "build_program", "compare", "simulate", "sweep",
           "__version__"]
