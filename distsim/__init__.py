"""distsim: a discrete-event cluster simulator for distributed deep-learning
training. See README.md; the public API is :func:`simulate`,
:func:`build_program`, :class:`SimulationResult` (:mod:`distsim.api`),
:func:`sweep` (the package :mod:`distsim.sweep`, which can be called),
:func:`compare` (runs side by side) and :func:`calibrate` (device figures
from microbenchmarks, :mod:`distsim.calibration`)."""

__version__ = "0.1.0"

from . import sweep  # noqa: E402  (the package; distsim.sweep(...) runs a sweep)
from .api import SimulationResult, build_program, simulate  # noqa: E402
from .calibration import calibrate  # noqa: E402
from .errors import DistsimError  # noqa: E402
from .report.compare import compare  # noqa: E402

__all__ = ["DistsimError", "SimulationResult", "build_program", "calibrate", "compare", "simulate",
           "sweep", "__version__"]
