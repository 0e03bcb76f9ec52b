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
"""

from __future__ import annotations

import json
import os
import subprocess
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
    doc = {"name": name, "title": title, "command": command, "commit": commit_of(),
           "measured_at": datetime.now(UTC).isoformat(timespec="seconds"), "machine": machine(),
           "summary": summary, "tables": tables, "notes": list(notes or [])}
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=1, default=str) + "\n")
    os.replace(tmp, path)
    return path
