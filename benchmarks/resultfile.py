"""The one writer of a measured figure's source file: ``benchmarks/results/<name>.json``.

Every figure the project publishes (docs/results.md) is rendered from one of these files by
``benchmarks/results.py``; a benchmark that measures something calls :func:`write_result` at its
end, so re-running the benchmark's command re-measures the figure and the page is rebuilt from it.
Nothing on the page is typed by hand.

A source file holds::

    {"name": "...", "title": "...", "command": "the command that measured it",
     "commit": "abc1234" (+ "-dirty" when the tree had uncommitted changes), "measured_at": ISO 8601 UTC,
     "machine": "cores, memory, load average before",
     "summary": "one sentence: what the figures say",
     "tables": [{"caption": "...", "columns": ["..."], "rows": [[...], ...]}],
     "notes": ["..."]}

A benchmark that measures one row at a time (``scale_bench.py big``: one network at one time
dilation per run) merges its rows into the file's table instead (:func:`merge_rows`): the table then
also holds, per row, when, on which commit and machine and by which command it was measured
(``row_measured``, beside ``rows``; shown in the column :data:`MEASURED_COLUMN`).
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
#: Where the source files live (one per figure set).
RESULTS_DIR = REPO / "benchmarks" / "results"


def commit_of(repo: Path = REPO) -> str:
    """The checkout's short commit, with ``-dirty`` when tracked files differ from it; ``unknown``
    outside a git checkout."""
    try:
        head = subprocess.run(["git", "-C", str(repo), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("-dirty" if dirty else "")


def machine() -> str:
    """This machine in a few words: CPUs, memory (GiB), the 1-minute load average before the run."""
    mem_kib = 0
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_kib = int(line.split()[1])
    except OSError:
        pass
    return f"{os.cpu_count()} CPUs, {mem_kib / 2**20:.0f} GiB, load average {os.getloadavg()[0]:.2f}"


def write_result(name: str, title: str, command: str, tables: list[dict[str, Any]], summary: str = "",
                 notes: list[str] | None = None, out_dir: Path = RESULTS_DIR) -> Path:
    """Write ``out_dir/<name>.json`` (module docstring) and return its path.

    Args:
        name: file stem, letters, digits, ``-`` and ``_`` only (it names the page's section).
        title: the section's title.
        command: the exact command that measured the figures (run from the checkout).
        tables: each ``{"caption": str, "columns": [str], "rows": [[value, ...]]}``; every row as long as
            ``columns``.
        summary: one sentence saying what the figures show (stated targets: met or missed).
        notes: further lines (conditions, what was not measured).

    Raises:
        ValueError: a bad name, or a row whose length differs from its table's columns.
    """
    if not name or not all(c.isalnum() or c in "-_" for c in name):
        raise ValueError(f"result name {name!r}: use letters, digits, '-' and '_'")
    for t in tables:
        bad = [i for i, r in enumerate(t["rows"]) if len(r) != len(t["columns"])]
        if bad:
            raise ValueError(f"result {name!r}, table {t.get('caption', '')!r}: row {bad[0]} has "
                             f"{len(t['rows'][bad[0]])} values for {len(t['columns'])} columns")
    doc = {"name": name, "title": title, **provenance(command), "summary": summary, "tables": tables,
           "notes": list(notes or [])}
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=1, default=str) + "\n")
    os.replace(tmp, path)
    return path


#: The column of a merged table that says when each row was measured (:func:`merge_rows`).
MEASURED_COLUMN = "measured (UTC, commit)"


def provenance(command: str) -> dict[str, str]:
    """When, where and how a row is measured now: ``command``, ``commit``, ``measured_at`` (ISO 8601
    UTC) and ``machine``, as :func:`write_result` writes them for a whole file."""
    return {"command": command, "commit": commit_of(), "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "machine": machine()}


def read_result(name: str, out_dir: Path = RESULTS_DIR) -> dict[str, Any] | None:
    """The source file ``out_dir/<name>.json`` as written, or None when there is none.

    Raises:
        ValueError: the file is not JSON.
    """
    path = out_dir / f"{name}.json"
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not a result file ({exc})") from None


def _key_value(v: Any) -> str:
    """A key cell compared by value: 6.5, '6.5' and 6.50 are one key; other values as text."""
    try:
        return repr(float(v))
    except (TypeError, ValueError):
        return str(v)


def merge_rows(old: dict[str, Any] | None, new: dict[str, Any], key: Sequence[str],
               old_measured: dict[str, str] | None = None) -> dict[str, Any]:
    """The table ``new`` merged into ``old`` (both ``{"caption", "columns", "rows"}``; ``new`` with
    ``row_measured``: per row its :func:`provenance`): a row of ``new`` replaces the row of ``old``
    whose ``key`` columns hold the same values (numbers compared by value), in its place; old's other
    rows stay, before new keys, with their ``row_measured`` (``old_measured``, e.g. the old file's
    command, commit, date and machine, for an old table without one). The result has ``new``'s
    caption and columns (old rows moved by column name; a column they lack is None) and
    :data:`MEASURED_COLUMN` last, from ``row_measured``.

    Raises:
        ValueError: a key column missing from ``new``, or ``new``'s ``row_measured`` not one per row.
    """
    cols = [c for c in new["columns"] if c != MEASURED_COLUMN]
    if missing := [c for c in key if c not in cols]:
        raise ValueError(f"key column(s) {missing} not in the table's columns {cols}")
    if len(new.get("row_measured", [])) != len(new["rows"]):
        raise ValueError(f"row_measured: {len(new.get('row_measured', []))} for {len(new['rows'])} rows")
    merged: dict[tuple[str, ...], tuple[list[Any], dict[str, str]]] = {}
    for table, default in ((old, old_measured), (new, None)):
        if not table:
            continue
        names = list(table["columns"])
        measured = table.get("row_measured") or [default or {}] * len(table["rows"])
        for row, prov in zip(table["rows"], measured, strict=True):
            cells = dict(zip(names, row, strict=True))
            k = tuple(_key_value(cells.get(c)) for c in key)
            merged[k] = ([cells.get(c) for c in cols], dict(prov))
    rows = [cells + [_measured_cell(prov)] for cells, prov in merged.values()]
    return {"caption": new.get("caption", ""), "columns": [*cols, MEASURED_COLUMN], "rows": rows,
            "row_measured": [prov for _, prov in merged.values()]}


def previous_table(name: str, key: Sequence[str], out_dir: Path = RESULTS_DIR) -> dict[str, Any] | None:
    """The first table of ``out_dir/<name>.json`` as :func:`merge_rows` takes it for ``old``: every row
    with its ``row_measured`` (a file written before rows carried their own: the file's command,
    commit, date and machine for each), or None when there is no such file or table.

    Raises:
        ValueError: the file is not JSON, or a key column is not in its table.
    """
    doc = read_result(name, out_dir)
    if not doc or not doc.get("tables"):
        return None
    old = doc["tables"][0]
    file_measured = {f: doc[f] for f in ("command", "commit", "measured_at", "machine") if f in doc}
    return merge_rows(None, {**old, "row_measured": old.get("row_measured") or [file_measured] * len(old["rows"])},
                      key)


def _measured_cell(prov: dict[str, str]) -> str:
    """A row's :data:`MEASURED_COLUMN` cell: its date and commit ('not recorded' when unknown)."""
    if not prov.get("measured_at"):
        return "not recorded"
    return f"{prov['measured_at']} ({prov.get('commit') or 'commit not recorded'})"

