"""Per-hop, per-query analysis of a run's pcaps (filled in by the packet-capture issue)."""

from __future__ import annotations

from pathlib import Path


def analyze_run(run_dir: Path) -> None:
    """Match each query's packets across capture points; write per-hop results into ``run_dir``."""
    raise NotImplementedError("packet analysis is not implemented yet")
