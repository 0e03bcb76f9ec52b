"""What an emulation's steps hand on (:class:`RunContext`) and what the run yields when it ends
(:class:`EmulationOutcome`); :mod:`testbed.emu.lifecycle` runs the steps, :mod:`testbed.emu.load` the load.
"""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console

from testbed.emu.bringup import Live
from testbed.emu.event_runner import EventRunner
from testbed.emu.health import HealthWatch, RunRecord
from testbed.emu.servers import ClusterServers
from testbed.emu.storage import Storage
from testbed.plan.build import Plan


@dataclass
class RunContext:
    """One emulation run, as its steps hand it on: what was asked (``plan``, ``duration_s`` in s,
    ``link_emulator``), where it goes (``run_id``, ``run_dir``, ``console``), what it records
    (``record``: ``run.json``; ``storage``: the disk reserve; ``timings``: seconds per step), and
    what is up once the steps bring it up (``live``: the network; ``stack``: what stops with it;
    ``watch``: the health watch; ``servers``; ``events``: the event runner once the load starts;
    ``load_started``: the sources were started).
    ``t0``: ``time.monotonic()`` when the bring-up began."""

    plan: Plan
    run_id: str
    run_dir: Path
    duration_s: float
    link_emulator: str | None
    console: Console
    record: RunRecord
    storage: Storage
    warm_paths: bool = True  # step 5 (False: auto dilation's warm-ups)
    timings: dict[str, float] = field(default_factory=dict)
    t0: float = 0.0
    live: Live | None = None
    stack: ExitStack | None = None
    watch: HealthWatch | None = None
    servers: ClusterServers | None = None
    events: list[EventRunner] = field(default_factory=list)
    load_started: bool = False  # the sources were started (step 6)


@dataclass
class EmulationOutcome:
    """What an emulation measured and how it ended: ``status`` (exit code, :mod:`testbed.core.errors`)
    and ``message`` (``"ok"``, or what stopped it), ``run_dir`` (None when a check before the
    bring-up refused the run: nothing was made), ``duration_s`` (the configured load, s),
    ``timings`` (s per step, wall clock), ``capture`` (the experiment captured packets), ``record``
    (its ``run.json``, None when nothing was made). The caller that summarises the run may change
    ``status`` and ``message`` before the outcome is recorded, and records its verdict in
    ``record`` before it summarises."""

    status: int
    message: str
    run_dir: Path | None = None
    duration_s: float = 0.0
    timings: dict[str, float] = field(default_factory=dict)
    capture: bool = False
    record: RunRecord | None = None
