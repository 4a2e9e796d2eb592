"""Number formats shared by the tables (HTML pages, ``distsim compare``).

The numbers of one column (or row) share one format
(:func:`column_formatter`): thousands separated, and as many decimals as
three significant digits of the largest value need, so that ``9,355``
sits above ``10,270`` and not above ``1.027e+04``. A column whose largest
value is below ``10 ** -MAX_DECIMALS`` (a toy model's few bytes counted in
GB) would need a row of zeros before its digits: its numbers are written
with ``digits`` significant digits in exponent form instead (``4e-09``).
"""
from __future__ import annotations

import math
from typing import Any, Callable, Sequence

#: the most decimals a column gets before it switches to exponent form
MAX_DECIMALS = 6


def is_missing(v: Any) -> bool:
    """None, NaN or pandas' NA (told by its type, so pandas is not imported)."""
    return v is None or (isinstance(v, float) and math.isnan(v)) \
        or type(v).__name__ == "NAType"


def is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and not is_missing(v)


def column_formatter(values: Sequence[Any], digits: int = 3) -> Callable[[Any], str]:
    """One format for the numbers of a column (see the module docstring:
    ``digits`` significant digits of the largest); text stays text, a
    missing value is empty."""
    numbers = [abs(float(v)) for v in values if is_number(v) and math.isfinite(float(v))]
    spec = None
    if numbers and all(float(v).is_integer() for v in values if is_number(v)):
        decimals = 0
    else:
        top = max(numbers, default=0.0)
        whole = int(math.floor(math.log10(top))) + 1 if top > 0 else 1
        decimals = max(0, digits - whole)
        if decimals > MAX_DECIMALS:
            spec = f".{digits}g"

    def fmt(v: Any) -> str:
        if is_missing(v):
            return ""
        if is_number(v):
            if not math.isfinite(float(v)):
                return str(v)
            if spec is not None:
                return format(float(v), spec)
            return f"{float(v):,.{decimals}f}"
        return str(v)
    return fmt
