"""Load YAML files with errors that name the file (one line, no traceback)."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from .errors import ConfigError

_EXPONENT_NUMBER = re.compile(r"^[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)[eE][-+]?[0-9]+$")


def yaml_number(value: Any) -> Any:
    """``value`` as a float where it is a string in exponent notation that
    YAML 1.1 leaves as a string (``2.0e12``, ``1e9``: no sign in the
    exponent, or no dot); any other value unchanged (so that the field's
    own check reports it)."""
    if isinstance(value, str) and _EXPONENT_NUMBER.match(value.strip()):
        return float(value)
    return value


def load_yaml_file(path: Path | str, what: str = "file", missing_hint: str = "") -> Any:
    """The YAML document of ``path``; any problem is one ConfigError naming
    the file (``missing_hint`` ends the message of a file not found)."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{p}: {what} not found{missing_hint}") from None
    except IsADirectoryError:
        raise ConfigError(f"{p}: is a directory, expected a YAML {what}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{p}: cannot read {what}: {e}") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{p}:{mark.line + 1}:{mark.column + 1}" if mark else str(p)
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(f"{where}: malformed YAML: {problem}") from None
