"""Labels of sweep configurations on a chart.

A chart of a few configurations names each by the options that tell the
shown ones apart, as aligned columns of values under one header of option
names (each name said once, not per bar); the options every shown point
shares are said once beside the chart. When two shown points agree on
every option, a column of their sweep index keeps the labels distinct.
"""
from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass
from typing import List, Sequence, Tuple

import pandas as pd

#: Header of the column that tells apart points equal on every option.
INDEX_COLUMN = "#"
#: Between two columns of a label.
SEPARATOR = "  "


def value_text(v) -> str:
    """An option's value as the spec gave it (an integer read as a float: as
    an integer; unset: ``-``)."""
    if v is None or v is pd.NA or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return str(v)


def split_options(rows: pd.DataFrame, params: Sequence[str]) -> Tuple[List[str], List[str]]:
    """(differing, shared): the options of ``params`` that take more than one
    value over ``rows``, and those that take exactly one."""
    differing = [p for p in params if rows[p].map(value_text).nunique() > 1]
    return differing, [p for p in params if p not in differing]


@dataclass(frozen=True)
class ConfigLabels:
    """``header`` (option names) over ``labels`` (one row of values per
    point, in ``rows``' order), all right-aligned to one width, for a
    monospace font; ``shared``: ``name=value`` of the options every point
    has in common (options unset everywhere left out)."""

    header: str
    labels: List[str]
    shared: List[str]

    def shared_text(self, width: int = 110) -> str:
        """The shared options as lines of at most ``width`` characters."""
        return textwrap.fill(", ".join(self.shared), width=width, break_long_words=False)


def config_labels(rows: pd.DataFrame, params: Sequence[str]) -> ConfigLabels:
    """Labels of ``rows`` (points of a sweep frame with an ``index`` column)
    by the options of ``params`` that differ among them."""
    differing, shared = split_options(rows, params)
    columns = {p: [value_text(v) for v in rows[p]] for p in differing}
    if not columns or len(set(zip(*columns.values()))) < len(rows):
        columns[INDEX_COLUMN] = [value_text(v) for v in rows["index"]]
    widths = {name: max([len(name), *map(len, values)]) for name, values in columns.items()}
    header = SEPARATOR.join(name.rjust(widths[name]) for name in columns)
    labels = [SEPARATOR.join(values[i].rjust(widths[name]) for name, values in columns.items())
              for i in range(len(rows))]
    common = [f"{p}={value_text(rows[p].iloc[0])}" for p in shared
              if len(rows) and not rows[p].isna().all()]
    return ConfigLabels(header, labels, common)
