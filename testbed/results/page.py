"""One page, two renderings: a report as a list of blocks, written as self-contained HTML (figures
embedded as base64 PNGs, text escaped) and as Markdown (figures linked, tables as GitHub tables).

``testbed report`` (:mod:`testbed.results.html_report`) and ``testbed compare``
(:mod:`testbed.results.twin_comparison`) build their pages from these blocks, so both look alike and
neither writes HTML of its own. Every text is data: it is escaped in HTML, and written as it is in
Markdown (table cells through :func:`testbed.core.util.markdown_table`).
"""

from __future__ import annotations

import base64
import html
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import pandas as pd

from testbed.core.util import markdown_table

#: The page's style: a column of at most 1,200 px; tables in 13 px type, cells that may wrap, in a box
#: that scrolls sideways only if its cells cannot wrap to the page's width.
STYLE = ("body{font-family:sans-serif;max-width:1200px;margin:2em auto;color:#222}"
         "table{border-collapse:collapse;font-size:13px;margin:0 0 1em 0;max-width:100%}"
         "td,th{border:1px solid #ccc;padding:3px 7px;text-align:right;overflow-wrap:break-word}"
         "th{background:#f2f2f2}img{max-width:100%;border:1px solid #eee}.wide{overflow-x:auto;max-width:100%}")
#: Data columns per HTML table: a wider table is split into several, each repeating the key column,
#: so that every one fits a page of about 1,200 pixels (13 px text) without scrolling sideways.
HTML_COLUMNS_PER_TABLE = 8


def column_groups(table: pd.DataFrame, per_table: int = HTML_COLUMNS_PER_TABLE) -> list[pd.DataFrame]:
    """``table`` split by columns into tables of at most ``per_table`` data columns, each led by
    the first (key) column; one table when it fits."""
    key, rest = list(table.columns[:1]), list(table.columns[1:])
    if len(rest) <= per_table:
        return [table]
    return [table[key + rest[i:i + per_table]] for i in range(0, len(rest), per_table)]


def html_table(table: pd.DataFrame) -> str:
    """``table`` as HTML (text escaped; missing cells '-'; headers may wrap after an underscore),
    split by :func:`column_groups`, each part in a box of the page's width."""
    out = []
    for part in column_groups(table):
        shown = part.astype(object).where(part.notna(), None)
        body = shown.to_html(index=False, na_rep="-", escape=True).replace("<td>None</td>", "<td>-</td>")
        out.append(f"<div class='wide'>{body.replace('_', '_<wbr>')}</div>")
    return "\n".join(out)

Kind = Literal["h1", "h2", "h3", "p", "warning", "list", "table", "figure"]


@dataclass(frozen=True)
class Block:
    """One piece of a page. ``kind``: a heading (``h1`` .. ``h3``, ``text`` its title), a paragraph
    (``p``), a warning paragraph (``warning``: red and bold in HTML, bold in Markdown), a bulleted
    ``list`` (``items``), a ``table`` (``table``, a DataFrame) or a ``figure`` (``path`` a PNG,
    ``text`` its alt name)."""

    kind: Kind
    text: str = ""
    items: tuple[str, ...] = ()
    table: pd.DataFrame | None = None
    path: Path | None = None


def _html_block(b: Block) -> str:
    if b.kind in ("h1", "h2", "h3"):
        return f"<{b.kind}>{html.escape(b.text)}</{b.kind}>"
    if b.kind == "p":
        return f"<p>{html.escape(b.text)}</p>"
    if b.kind == "warning":
        return f"<p style='color:#b00020;font-weight:bold'>{html.escape(b.text)}</p>"
    if b.kind == "list":
        return "<ul>" + "".join(f"<li>{html.escape(x)}</li>" for x in b.items) + "</ul>"
    if b.kind == "table":
        return html_table(b.table)
    b64 = base64.b64encode(Path(b.path).read_bytes()).decode()
    return f"<img alt='{html.escape(b.text)}' src='data:image/png;base64,{b64}'>"


def _md_block(b: Block, base: Path) -> list[str]:
    if b.kind in ("h1", "h2", "h3"):
        return ["#" * int(b.kind[1]) + " " + b.text, ""]
    if b.kind == "p":
        return [b.text, ""]
    if b.kind == "warning":
        return [f"**{b.text}**", ""]
    if b.kind == "list":
        return [*[f"- {x}" for x in b.items], ""]
    if b.kind == "table":
        return [markdown_table(b.table), ""]
    return [f"![{b.text}]({Path(b.path).relative_to(base)})", ""]


def write_html(path: Path, title: str, blocks: list[Block]) -> None:
    """``blocks`` as one self-contained HTML page at ``path``, titled ``title``.

    Raises:
        OSError: the page cannot be written, or a figure read."""
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title><style>{STYLE}"
             f"</style></head><body>", *[_html_block(b) for b in blocks], "</body></html>"]
    Path(path).write_text("\n".join(parts))


def write_markdown(path: Path, blocks: list[Block]) -> None:
    """``blocks`` as Markdown at ``path``; figures are linked relative to its folder.

    Raises:
        OSError: the page cannot be written."""
    lines = [line for b in blocks for line in _md_block(b, Path(path).parent)]
    Path(path).write_text("\n".join(lines))


__all__ = ["STYLE", "Block", "write_html", "write_markdown"]
