"""Checks of the options that say how a run is done rather than what it
computes (limits, the network model): :func:`distsim.simulate` and the
fast tier (:mod:`distsim.estimate`, which ignores them but refuses what
simulate refuses) read them from here."""
from __future__ import annotations

from typing import Any, Tuple

from .errors import ConfigError

#: Default bound on the timed records of trace.json (op slices + counter
#: samples): about 150 MB of JSON, which Perfetto's UI opens comfortably.
DEFAULT_MAX_TRACE_RECORDS = 1_000_000

#: The most ops :func:`distsim.api.build_program` builds (estimated
#: before building; ``max_ops=`` / ``--max-ops``, 0: no limit). A program of this size
#: already needs tens of GB; past it a typo such as ``--layers 10000000`` is
#: one clear error instead of minutes of building that exhaust memory.
DEFAULT_MAX_OPS = 50_000_000


def check_max_ops(value: Any) -> int:
    """``max_ops`` as an int >= 0 (0: no limit); None is the default."""
    if value is None:
        return DEFAULT_MAX_OPS
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"--max-ops: must be an integer >= 0 (0: no limit), got {value!r}")
    return value


def check_choice(flag: str, value: Any, choices: Tuple[str, ...]) -> str:
    """``value`` if it is one of ``choices``, else a ConfigError naming
    ``flag`` (``--launch``) and the choices, in one line."""
    if value not in choices:
        names = (" or ".join(map(repr, choices)) if len(choices) == 2
                 else "one of " + ", ".join(map(repr, choices)))
        raise ConfigError(f"{flag}: must be {names}, got {value!r}")
    return str(value)


#: ``network_mode`` when none is given (:func:`distsim.simulate`'s)
DEFAULT_NETWORK_MODE = "flow"


def check_network_mode(value: Any) -> None:
    """``network_mode`` (``--network-mode``): ``flow`` or ``analytical``."""
    check_choice("--network-mode", value, ("flow", "analytical"))


def check_max_trace_records(value: Any) -> int:
    """``max_trace_records`` as an int >= 0 (0 = no limit); None is the default."""
    if value is None:
        return DEFAULT_MAX_TRACE_RECORDS
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"--max-trace-records: must be an integer >= 0 (0: no limit), "
                          f"got {value!r}")
    return value
