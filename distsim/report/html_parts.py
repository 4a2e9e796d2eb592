"""Pieces of the self-contained HTML pages: the page, tables, inlined
images and number formats.

Numbers in a table column share one format
(:func:`~distsim.report.numbers.column_formatter`).
"""
from __future__ import annotations

import base64
import html
import io
from pathlib import Path
from typing import Any, Callable, Dict, Mapping, Optional, Sequence, Union

from matplotlib.figure import Figure

from distsim.report.figures import DPI
from distsim.report.numbers import column_formatter, is_missing, is_number  # noqa: F401

ImageLike = Union[Figure, bytes, str, Path]

CSS = """
body { font-family: -apple-system, 'Segoe UI', Helvetica, Arial, sans-serif; margin: 2em auto;
       max-width: 1400px; color: #222; padding: 0 1em; line-height: 1.4; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 2em; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; font-size: 0.85em; margin: 0.5em 0; }
th, td { border: 1px solid #ddd; padding: 3px 8px; text-align: right; }
th { background: #f3f3f3; } td.text, th.text { text-align: left; }
caption { caption-side: top; text-align: left; color: #555; padding: 0.2em 0; }
img { max-width: 100%; border: 1px solid #eee; margin: 0.5em 0; }
pre, code { background: #f7f7f7; font-size: 0.9em; }
.muted { color: #777; } .oom { color: #c0392b; font-weight: bold; }
.cards { display: flex; flex-wrap: wrap; gap: 0.6em; margin: 1em 0; }
.card { border: 1px solid #ddd; border-radius: 6px; padding: 0.5em 0.9em; min-width: 9em; }
.card b { display: block; font-size: 1.3em; } .card span { color: #666; font-size: 0.85em; }
.columns { display: flex; flex-wrap: wrap; gap: 2em; align-items: flex-start; }
"""


def png_bytes(image: ImageLike) -> bytes:
    """PNG bytes of a Figure, of PNG bytes, or of a PNG file."""
    if isinstance(image, Figure):
        buf = io.BytesIO()
        image.savefig(buf, format="png", dpi=DPI)
        return buf.getvalue()
    if isinstance(image, bytes):
        return image
    return Path(image).read_bytes()


def img_tag(image: ImageLike, alt: str) -> str:
    data = base64.b64encode(png_bytes(image)).decode("ascii")
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'


def page(title: str, body: str) -> str:
    return ("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            f"<title>{html.escape(title)}</title>\n<style>{CSS}</style>\n</head>\n<body>\n"
            f"<h1>{html.escape(title)}</h1>\n{body}\n</body>\n</html>\n")


def fixed_formatter(decimals: int) -> Callable[[Any], str]:
    """Numbers with ``decimals`` decimals and thousands separated."""
    return lambda v: "" if is_missing(v) else (f"{float(v):,.{decimals}f}" if is_number(v)
                                             else str(v))


def table_html(rows: Sequence[Mapping[str, Any]], columns: Sequence[str],
               text_columns: Sequence[str] = (), caption: str = "",
               formats: Optional[Dict[str, Callable[[Any], str]]] = None) -> str:
    """A plain HTML table; every cell escaped; numbers formatted per column
    (:func:`column_formatter`, or ``formats[column]``)."""
    formats = dict(formats or {})
    for c in columns:
        if c not in formats and c not in text_columns:
            formats[c] = column_formatter([row.get(c) for row in rows])

    def cls(c: str) -> str:
        return ' class="text"' if c in text_columns else ""
    head = "".join(f"<th{cls(c)}>{html.escape(c)}</th>" for c in columns)
    body = []
    for row in rows:
        cells = "".join(
            f"<td{cls(c)}>"
            f"{html.escape(formats[c](row.get(c)) if c in formats else _text(row.get(c)))}"
            "</td>" for c in columns)
        body.append(f"<tr>{cells}</tr>")
    cap = f"<caption>{html.escape(caption)}</caption>" if caption else ""
    return f"<table>{cap}<thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _text(v: Any) -> str:
    return "" if is_missing(v) else str(v)


def key_value_table(items: Sequence[tuple], caption: str = "") -> str:
    """A two-column table of (name, value) pairs, values as given (text)."""
    rows = "".join(f'<tr><th class="text">{html.escape(str(k))}</th>'
                   f'<td class="text">{html.escape(str(v))}</td></tr>' for k, v in items)
    cap = f"<caption>{html.escape(caption)}</caption>" if caption else ""
    return f"<table>{cap}<tbody>{rows}</tbody></table>"


def cards(items: Sequence[tuple]) -> str:
    """Headline figures: (label, value text) boxes."""
    return '<div class="cards">' + "".join(
        f'<div class="card"><b>{html.escape(v)}</b><span>{html.escape(k)}</span></div>'
        for k, v in items) + "</div>"
