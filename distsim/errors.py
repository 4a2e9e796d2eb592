"""The whole exception hierarchy of distsim.

Every error a user can provoke with bad input is a :class:`DistsimError`
subclass whose message is one line naming the file, field, op or value at
fault. The CLI turns these into exit status 2; anything else is a bug
(exit status 3).
"""
from __future__ import annotations


def quoted_short(text: str, limit: int = 40) -> str:
    """``text`` quoted for an error message, cut to ``limit`` characters
    (a long value from the user's input keeps the message one short line)."""
    return repr(text if len(text) <= limit else text[:limit] + "...")


#: The longest message an error shows: a value from the user's input
#: quoted in it (a huge YAML list, a long name) is cut in the middle.
MAX_MESSAGE = 800


def _cut(text: str, limit: int) -> str:
    """``text``, or its start and end with the middle cut out: at most ``limit`` characters."""
    if len(text) <= limit:
        return text
    mark = f" ... ({len(text):,} characters, the middle cut) ... "
    head = (limit - len(mark)) * 2 // 3
    tail = limit - len(mark) - head
    return f"{text[:head]}{mark}{text[len(text) - tail:]}"


class DistsimError(Exception):
    """Base class of every error distsim raises on purpose.

    Its text is always one line: a name taken from the user's file (an ONNX
    node, a YAML key) may hold a newline or other control characters, which
    are shown escaped (``\\n``) so that the CLI prints exactly one line.
    It is at most :data:`MAX_MESSAGE` characters (``max_message``; None: no
    bound), cut in the middle."""

    max_message: "int | None" = MAX_MESSAGE

    def __str__(self) -> str:
        text = super().__str__()
        limit = self.max_message
        if limit is not None:
            text = _cut(text, limit)
        if not text.isprintable():
            text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
            if limit is not None:
                text = _cut(text, limit)
        return text


class ParseError(DistsimError):
    """Text (DistIR text format, YAML) that does not follow its grammar.

    Carries the source name, line and column so that the message points at
    the offending character.
    """

    def __init__(self, message: str, source: str = "<string>", line: int | None = None,
                 column: int | None = None) -> None:
        self.source = source
        self.line = line
        self.column = column
        where = source
        if line is not None:
            where += f":{line}"
            if column is not None:
                where += f":{column}"
        super().__init__(f"{where}: {message}")
        self.bare_message = message


class VerifyError(DistsimError):
    """A program that breaks an IR invariant (SSA, order, types, devices)."""


class UnsupportedOpError(DistsimError):
    """An op type that the registry, an importer or an executor does not know."""


class PassPreconditionError(DistsimError):
    """A transform asked to do something its input does not allow
    (e.g. a data-parallel degree that does not divide the batch)."""


class ConfigError(DistsimError):
    """A bad configuration value: a model or topology file field, a CLI
    option, a sweep spec entry."""


class NotModelledError(ConfigError):
    """Valid options that the fast estimator does not model (the simulator
    does): a sweep records such a point as ``skipped`` with this message."""


class ExecutionError(DistsimError):
    """The numpy reference executor could not run an op on its inputs."""


class TopologyError(DistsimError):
    """A hardware description that is malformed or cannot carry the traffic
    asked of it (unreachable devices, non-positive bandwidth, ...)."""


class SimulationError(DistsimError):
    """A simulation that cannot finish: a deadlock, a collective some member
    never reaches, a receive with no send. The message names every blocked
    op (as long as the program makes it: not cut)."""

    max_message = None
