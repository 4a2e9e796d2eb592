"""Turn arbitrary metadata into values :func:`json.dumps` writes as strict JSON.

``Trace.meta`` is filled by whoever ran the simulation (configuration
dicts, numpy scalars, enums, paths...). Reports must never fail on it and
must never write ``NaN``/``Infinity`` (not JSON), so everything is mapped to
dict/list/str/int/float/bool/None, with keys as strings and a stable order.
"""
from __future__ import annotations

import enum
import math
from typing import Any, Mapping


def json_safe(value: Any, sort_keys: bool = True) -> Any:
    """A JSON-ready copy of ``value``.

    Mappings become dicts with ``str`` keys, sorted (with ``sort_keys``
    False: in their order); tuples, lists and sets become lists (sets
    sorted by their text); numpy scalars and arrays become Python numbers
    and lists; enums their value; non-finite floats ``None``; anything else
    its ``str``.
    """
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, enum.Enum):
        return json_safe(value.value, sort_keys)
    if isinstance(value, Mapping):
        items = value.items()
        if sort_keys:
            items = sorted(items, key=lambda kv: str(kv[0]))
        return {str(k): json_safe(v, sort_keys) for k, v in items}
    if isinstance(value, (list, tuple)):
        return [json_safe(v, sort_keys) for v in value]
    if isinstance(value, (set, frozenset)):
        return [json_safe(v, sort_keys) for v in sorted(value, key=str)]
    tolist = getattr(value, "tolist", None)  # numpy scalars and arrays
    if callable(tolist):
        return json_safe(tolist(), sort_keys)
    return str(value)
