"""distsim: a discrete-event cluster simulator for distributed deep-learning
training. See README.md; the public API is :func:`simulate` and
:class:`SimulationResult` (:mod:`distsim.api`)."""
from .api import SimulationResult, build_program, simulate
from .errors import DistsimError

__version__ = "0.1.0"

__all__ = ["DistsimError", "SimulationResult", "build_program", "simulate", "__version__"]
