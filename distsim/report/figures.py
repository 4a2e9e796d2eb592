"""Shared plumbing of the PNG reports: colours, unit scales, atomic saving.

Figures are built on :class:`matplotlib.figure.Figure` directly (no pyplot),
so no global matplotlib state is touched and no GUI backend is needed: a
bare ``Figure`` renders with the Agg canvas when saved.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from distsim.fileio import PathLike, atomic_path

if TYPE_CHECKING:     # matplotlib is imported by whoever draws a figure
    from matplotlib.figure import Figure

#: Colour per op category (colour-blind safe pair from the Tableau palette).
CATEGORY_COLOURS = {"compute": "#4e79a7", "communication": "#f28e2b"}
OTHER_COLOUR = "#9c9c9c"
DPI = 100


class Chart:
    """A drawn chart that a notebook shows inline (as PNG) and that can be
    saved: ``chart.figure`` is the matplotlib ``Figure``."""

    def __init__(self, figure: "Figure") -> None:
        self.figure = figure

    def png(self) -> bytes:
        import io
        buf = io.BytesIO()
        self.figure.savefig(buf, format="png", dpi=DPI)
        return buf.getvalue()

    def _repr_png_(self) -> bytes:
        return self.png()

    def save(self, path: PathLike) -> None:
        """Write the PNG to ``path`` (atomically)."""
        save_png(self.figure, path)


def save_png(fig: Figure, path: PathLike) -> None:
    """Render ``fig`` as PNG into ``path`` atomically (a failed render leaves
    no file, and an existing file untouched)."""
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=DPI)
