"""The clusters' speeds of a run, for the simulator (placeholder: the calibration's own module
replaces this file; these stubs keep the interface it exposes, so that callers are written once).

:func:`read_speeds` reads a run folder's speeds (None: none recorded, the clusters ran at their
profile's speed); :func:`apply_speeds` returns the plan with its service times at those speeds.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel

from testbed.plan.resolved import Plan


class Speeds(BaseModel):
    mode: str = "profile"


def read_speeds(run_dir: Path) -> Speeds | None:
    """The speeds recorded in ``run_dir`` (None: none; the stub records none)."""
    return None


def apply_speeds(plan: Plan, speeds: Speeds) -> Plan:
    """``plan`` with its service times at ``speeds`` (the stub returns ``plan`` unchanged)."""
    return plan


__all__ = ["Speeds", "apply_speeds", "read_speeds"]
