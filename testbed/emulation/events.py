"""Scenario events in the emulation: each step of ``plan.changes`` applied for real, at its time.

The timeline and its meaning are the model's (:mod:`testbed.model.events`); this module applies
each step to the running emulation and records it in ``events.csv``: planned time, applied time,
kind, target, the value asked and, where it can be read back, the value measured.

Applied here: ``cluster_down`` / ``cluster_up`` (``kill``: SIGKILL, then a restart that waits until
the server is warm again; ``stop``: SIGSTOP / SIGCONT). Kinds this module cannot apply are
refused before the load starts (:func:`unsupported`), never skipped: a configured event that
did not happen would make the run's numbers lie.
"""

from __future__ import annotations

import csv
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from testbed.errors import RunFailure
from testbed.model.events import Change

#: Kinds the emulation applies today.
APPLIED_KINDS = frozenset({"cluster_down", "cluster_up"})
EVENTS_FIELDS = ["event", "step", "kind", "target", "planned_s", "applied_s", "lag_ms", "value_asked",
                 "value_measured", "note"]


def unsupported(changes: Sequence[Change]) -> list[str]:
    """Descriptions of the changes the emulation cannot apply (empty: all can be)."""
    return [f"events.{c.event} ({c.kind})" for c in changes if c.kind not in APPLIED_KINDS]


class EventRunner(threading.Thread):
    """Applies ``changes`` during the load (started before it, stopped with :meth:`stop`).

    Args:
        live: the running emulation (:class:`testbed.emulation.bringup.Live`).
        servers: the clusters' servers (:class:`testbed.emulation.servers.ClusterServers`).
        changes: the plan's timeline.
        t0_s: when the load starts (epoch s): change ``t_s`` is applied at ``t0_s + t_s``.
        on_event: called with each ``events.csv`` row once applied (the console's progress).

    A change that fails stops the runner and is kept in :attr:`error`; the run checks it.
    """

    def __init__(self, live, servers, changes: Sequence[Change], t0_s: float,
                 on_event: Callable[[dict], None] | None = None):
        super().__init__(daemon=True, name="events")
        self.live, self.servers, self.changes, self.t0_s = live, servers, list(changes), t0_s
        self.on_event = on_event
        self.stop_event = threading.Event()
        self.path: Path = live.run_dir / "events.csv"
        self.rows: list[dict] = []
        self.error: RunFailure | None = None

    def run(self) -> None:
        with open(self.path, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=EVENTS_FIELDS)
            w.writeheader()
            f.flush()
            for ch in self.changes:
                if self.stop_event.wait(max(0.0, self.t0_s + ch.t_s - time.time())):
                    return
                try:
                    row = self.apply(ch)
                except Exception as exc:  # noqa: BLE001 - reported by the run, which then stops
                    self.error = RunFailure(f"events.{ch.event} ({ch.kind}) at {ch.t_s:g} s failed: {exc}")
                    return
                self.rows.append(row)
                w.writerow(row)
                f.flush()
                if self.on_event is not None:
                    self.on_event(row)

    def apply(self, ch: Change) -> dict:
        """Apply one change now; its ``events.csv`` row."""
        t_applied = time.time()
        note, measured = "", ""
        if ch.kind == "cluster_down":
            self.servers.down(ch.cluster, ch.mode)
            note = f"server {'stopped (SIGSTOP)' if ch.mode == 'stop' else 'killed (SIGKILL)'}"
        elif ch.kind == "cluster_up":
            ready_s = self.servers.up(ch.cluster)
            measured, note = round(ready_s, 3), "seconds until the server answered again"
        else:  # refused before the load starts (unsupported)
            raise RunFailure(f"{ch.kind} is not applied by the emulation")
        target = ch.cluster if ch.cluster is not None else "-".join(ch.link or ())
        applied = t_applied - self.t0_s
        return {"event": ch.event, "step": ch.step, "kind": ch.kind, "target": target,
                "planned_s": round(ch.t_s, 6), "applied_s": round(applied, 6),
                "lag_ms": round((applied - ch.t_s) * 1e3, 3), "value_asked": "" if ch.value is None else ch.value,
                "value_measured": measured, "note": note}

    def stop(self) -> None:
        """Stop applying (the load ended or the run is interrupted)."""
        self.stop_event.set()


__all__ = ["APPLIED_KINDS", "EVENTS_FIELDS", "EventRunner", "unsupported"]
