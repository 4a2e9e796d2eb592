"""Load YAML files with errors that name the file (one line, no traceback).

YAML's anchors and aliases let a few lines stand for a huge document (an
"alias bomb": nine aliases of nine aliases of ... a list): every loader
walks what it reads, and an error message may quote it. So a document may
hold at most :data:`MAX_ALIAS_NODES` nodes more through its aliases than
it spells out, and no alias inside the node it names (a cycle); and it
may nest at most :data:`MAX_DEPTH` levels deep.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Dict

import yaml

from .errors import ConfigError

#: The most nodes a document's aliases may add to the ones it spells out.
MAX_ALIAS_NODES = 100_000
#: The deepest a document may nest lists and mappings.
MAX_DEPTH = 100

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
        loader = _BoundedLoader(text)
        try:
            return loader.get_single_data()
        finally:
            loader.dispose()
    except _Unreadable as e:
        raise ConfigError(f"{p}: {e}") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{p}:{mark.line + 1}:{mark.column + 1}" if mark else str(p)
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(f"{where}: malformed YAML: {problem}") from None


class _Unreadable(Exception):
    """A document nested too deeply, or whose aliases expand past the
    bound or into themselves."""


class _BoundedLoader(yaml.SafeLoader):
    """``yaml.safe_load``, refusing documents nested deeper than
    :data:`MAX_DEPTH` (the composer recurses per level) and documents whose
    aliases expand too far."""

    _depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise _Unreadable(f"nested deeper than {MAX_DEPTH} levels")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def get_single_data(self) -> Any:
        node = self.get_single_node()
        if node is None:
            return None
        _check_expansion(node)
        return self.construct_document(node)


def _check_expansion(root: yaml.Node) -> None:
    """Raise :class:`_Unreadable` when ``root`` holds more than
    :data:`MAX_ALIAS_NODES` nodes beyond its distinct ones once every alias
    is expanded, or a node that contains itself."""
    sizes: Dict[int, int] = {}       # node id -> its expanded size
    distinct: set = set()
    on_path: set = set()
    # an explicit stack (no recursion: deep documents are legal YAML)
    stack = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        if done:
            on_path.discard(key)
            children = _children(node)
            sizes[key] = 1 + sum(sizes[id(c)] for c in children)
            continue
        if key in sizes:
            continue
        if key in on_path:
            raise _Unreadable("an alias refers to a node that contains it (a cycle)")
        on_path.add(key)
        distinct.add(key)
        stack.append((node, True))
        stack.extend((c, False) for c in _children(node))
    # sizes are counted, not expanded: linear in the nodes the text spells out
    if sizes[id(root)] - len(distinct) > MAX_ALIAS_NODES:
        raise _Unreadable(f"its aliases expand to more than {MAX_ALIAS_NODES:,} nodes beyond "
                         "the document's own; write the values out")


def _children(node: yaml.Node) -> list:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return []
