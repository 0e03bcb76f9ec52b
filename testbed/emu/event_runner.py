"""Scenario events in the emulation: each step of ``plan.changes`` applied for real, at its time,
and read back by measurement.

The timeline and its meaning are the model's (:mod:`testbed.model.timeline`: each step's kind, a
registry entry, says how it is applied and measured); this module applies each step to the
running emulation and records it in ``events.csv`` (:data:`EVENTS_FIELDS`; in emulated time and
units under time dilation): planned time, the time the run fired it (``applied_s``, s since the
load started; ``lag_ms`` the difference; ``applied_unix_s`` the same instant, epoch s, wall clock),
``effect_ms`` (from firing to the first measurement showing it), the value asked and the value
measured (``unit``), the ``tolerance`` the measurement is judged with and whether it is within (``ok``), and a note.

* Link events (every ``link_*`` kind) go through :class:`testbed.emu.dynamics.Dynamics`:
  the source -> cluster pairs whose paths a change moves are looked up ahead of it, off the firing
  thread (:class:`_Lookahead`; a look-up asks the controller, which can take seconds on a busy
  1,000-switch network); the emulator or ``tc`` changes the link, the controller is told or
  reacts, and probes across the link (and along the source -> cluster paths it carried) measure
  the result over a window after the change (cut short by the next change); a reading still
  pending then (the controller has not rerouted yet) is taken again until the kind's ``watch_s``
  has passed, the next change is due or the runner stops.
* Cluster events (``cluster_down`` / ``cluster_up``) go to the clusters' servers (:class:`_Server`,
  the emulation's :class:`~testbed.model.timeline.ClusterControl`): ``kill``: SIGKILL, then a restart
  that waits until the server is warm again (measured: the seconds until it answered); ``stop``:
  SIGSTOP / SIGCONT. A restart
  runs beside the timeline (it can take longer than the gap to the next change, which must still
  fire on time); its row is written once the server answers, or when the runner stops with the
  note that it was not ready by then.

A change that cannot be applied, or whose measurement cannot be taken, stops the runner; the
error is kept in :attr:`EventRunner.error` and the run stops with it. So does a change that is
:data:`EVENT_LATE_S` late in emulated time (:meth:`EventRunner.check_on_time`, which the run calls as the load goes
and once it ends). A measurement outside its tolerance is recorded (``ok`` 0) and shown, not fatal.
"""

from __future__ import annotations

import csv
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from testbed.core.clock import EmulatedClock
from testbed.core.errors import EXIT_COMPONENT_DIED, RunFailure
from testbed.emu.dynamics import PREPARE_S
from testbed.model.timeline import CLUSTER_KINDS, EVENT_KINDS, LINK_KINDS, Change, Measured

#: Kinds the emulation applies: every registered kind (kept current with the registry).
APPLIED_KINDS = EVENT_KINDS.names_view()
EVENTS_FIELDS = ["event", "step", "kind", "target", "planned_s", "applied_s", "lag_ms", "effect_ms", "value_asked",
                 "value_measured", "unit", "tolerance", "ok", "note", "applied_unix_s"]
#: A measurement window ends this long (s) before the next change fires (its preparation first).
WINDOW_MARGIN_S = PREPARE_S + 0.02
#: The pairs a group of link changes moves (:meth:`testbed.emu.dynamics.Dynamics.affected`) are looked
#: up, in a thread of their own, once the group before has been applied and at least this long (s,
#: wall clock) before the group fires, or twice the slowest look-up of the run so far if longer.
LOOKUP_LEAD_S = 2.0
#: While a reading is pending (the change has not taken effect yet), it is taken again this often (s, wall clock).
WATCH_POLL_S = 0.25
#: After the runner is stopped, a restart still running gets this long (s) before its row is closed.
RESTART_JOIN_S = 1.0
#: A change that fires this long (emulated s: k x as long on the wall clock under dilation k) after
#: its planned time, or has not fired by then, stops the run (:meth:`EventRunner.check_on_time`):
#: the run would measure another scenario than the one planned.
#: Changes fire well within it here (events.csv ``lag_ms``; docs/network-dynamics.md).
EVENT_LATE_S = 1.0


def unsupported(changes: Sequence[Change]) -> list[str]:
    """Descriptions of the changes the emulation cannot apply (empty: all can be)."""
    return [f"events.{c.event} ({c.kind})" for c in changes if c.kind not in APPLIED_KINDS]


def target_of(ch: Change) -> str:
    """The cluster or the link (``a-b`` switch names) a change targets."""
    return ch.cluster if ch.cluster else "-".join(ch.link) if ch.link else ""


def _num(v: float | None, digits: int = 3) -> str:
    """A value for the CSV ('' for none; a string, so that 0 still shows)."""
    return "" if v is None else f"{round(v, digits):g}"


class EventRunner(threading.Thread):
    """Applies ``changes`` during the load (started before it, stopped with :meth:`stop`).

    Args:
        live: the running emulation (:class:`testbed.emu.bringup.Live`); its ``dynamics``
            applies link changes.
        servers: the clusters' servers (:class:`testbed.emu.servers.ClusterServers`).
        changes: the plan's timeline.
        t0_s: when the load starts (epoch s): change ``t_s`` is applied at ``t0_s + t_s``.
        on_event: called with each ``events.csv`` row as its change fires (``row["phase"]``
            ``fired``: nothing measured yet) and again once measured (``measured``), for the
            console's progress.

    A change that fails stops the runner and is kept in :attr:`error`; the run checks it.
    """

    def __init__(self, live, servers, changes: Sequence[Change], t0_s: float,
                 on_event: Callable[[dict], None] | None = None):
        super().__init__(daemon=True, name="events")
        self.live, self.servers, self.changes, self.t0_s = live, servers, list(changes), t0_s
        # the changes are on the wall clock; events.csv is in emulated time
        self.clock = EmulatedClock(live.plan.time_dilation)
        self.on_event = on_event
        self.stop_event = threading.Event()
        self.path: Path = live.run_dir / "events.csv"
        self.rows: list[dict] = []
        self.error: RunFailure | None = None
        self._write_lock = threading.Lock()
        self._restarts: list[tuple[threading.Thread, dict]] = []
        self.busy = ""  # what the runner is doing now, for a message when a change is late

    def _groups(self) -> list[list[Change]]:
        groups: list[list[Change]] = []
        for ch in self.changes:
            if groups and groups[-1][0].t_s == ch.t_s:
                groups[-1].append(ch)
            else:
                groups.append([ch])
        return groups

    def run(self) -> None:
        with open(self.path, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=EVENTS_FIELDS, extrasaction="ignore")
            w.writeheader()
            f.flush()

            def done(row: dict) -> None:
                with self._write_lock:
                    if f.closed or row.get("phase") == "measured":  # a restart's row is written once
                        return
                    row["phase"] = "measured"
                    w.writerow(row)
                    f.flush()
                if self.on_event is not None:
                    self.on_event(row)

            try:
                self._timeline(done)
            finally:
                self._finish_restarts(done)

    def _timeline(self, done: Callable[[dict], None]) -> None:
        """Fire every group of changes at its time (returns early when stopped or on an error)."""
        groups = self._groups()
        ahead = _Lookahead(self, groups)
        ahead.start()
        for gi, group in enumerate(groups):
            fire = self.t0_s + group[0].t_s
            nxt = self.t0_s + groups[gi + 1][0].t_s - WINDOW_MARGIN_S if gi + 1 < len(groups) else float("inf")
            try:
                if self.stop_event.wait(max(0.0, fire - PREPARE_S - time.time())):
                    return
                self.busy = f"looking up the paths events.{group[0].event} ({group[0].kind}) moves"
                affected = ahead.result(gi)
                if affected is None:  # stopped
                    return
                prepared = self._prepare(group, affected)
                if self.stop_event.wait(max(0.0, fire - time.time())):
                    return
                self._apply_group(group, prepared, nxt, done, applied=lambda gi=gi: ahead.applied(gi))
            except Exception as exc:  # noqa: BLE001 - reported by the run, which then stops
                ch = group[0]
                self.error = RunFailure(f"events.{ch.event} ({ch.kind} {target_of(ch)}) at {ch.t_s:g} s "
                                        f"failed: {exc}")
                return

    def _finish_restarts(self, done: Callable[[dict], None]) -> None:
        """Wait for the restarts still running until the runner is stopped; a restart that has not
        finished by then gets its row with the note that the server was not ready."""
        for th, row in self._restarts:
            while th.is_alive() and not self.stop_event.wait(0.2):
                pass
            th.join(RESTART_JOIN_S)
            if th.is_alive():
                waited = time.time() - float(row["applied_unix_s"])
                row.update(note=f"server not ready when the run ended ({waited:.1f} s after the restart)")
                done(row)

    def _prepare(self, group: list[Change], affected: list[list[tuple[str, str]]]) -> list:
        """Raise the probes for each link change of the group (:meth:`Dynamics.prepare`); per change,
        the pairs it moves (``affected``, from :class:`_Lookahead`), or None for a cluster change."""
        dyn = getattr(self.live, "dynamics", None)  # None: no link change (lookup refused those)
        out = []
        for ch, pairs in zip(group, affected, strict=True):
            if ch.kind in LINK_KINDS:
                dyn.prepare(ch, pairs)
            out.append(pairs if ch.kind in LINK_KINDS else None)
        return out

    def lookup(self, group: list[Change]) -> list[list[tuple[str, str]]]:
        """Per change of the group, the pairs it moves (:meth:`Dynamics.affected`; empty for a
        cluster change).

        Raises:
            RunFailure: the group has link changes and the emulation no probe hosts.
        """
        dyn = getattr(self.live, "dynamics", None)
        if dyn is None and any(ch.kind in LINK_KINDS for ch in group):
            raise RunFailure("the emulation has no probe hosts for link events (built without them)")
        return [dyn.affected(ch) if ch.kind in LINK_KINDS else [] for ch in group]

    def _fired(self, row: dict) -> dict:
        """A change was applied: its row joins :attr:`rows` at once (the health watch reads which
        links are down by plan from there) and the console hears of it."""
        row["phase"] = "fired"
        self.rows.append(row)
        if self.on_event is not None:
            self.on_event(row)
        return row

    def check_on_time(self, now: float, duration_s: float) -> None:
        """Raise when a change planned inside the ``duration_s`` load (wall s, as the plan this
        runner is given) fired more than :data:`EVENT_LATE_S` emulated seconds after its time, or
        has not fired that long after it (``now``, epoch s). Lateness is judged on the emulated
        clock (:attr:`clock`): the scenario is planned in emulated time, so under dilation k a change
        may be up to k x :data:`EVENT_LATE_S` late on the wall clock.

        Raises:
            RunFailure: (exit code 4) naming the change, how late it is (emulated s, and wall s
                under dilation) and what the runner was doing (e.g. a long measurement of the
                change before it).
        """
        c = self.clock
        fired = {(r["event"], r["step"]): r for r in list(self.rows)}
        for ch in self.changes:
            if ch.t_s >= duration_s:
                continue
            row = fired.get((ch.event, ch.step))
            fired_at = float(row["applied_unix_s"]) if row is not None else now  # wall clock, as ch.t_s
            late_wall = fired_at - self.t0_s - ch.t_s
            late = c.emulated(late_wall)
            if late > EVENT_LATE_S:
                what = "fired" if row is not None else "has not fired"
                doing = f"; the event runner was busy with {self.busy}" if self.busy else ""
                wall = f" ({late_wall:.1f} s on the wall clock at k = {c.k:g})" if c.dilated else ""
                raise RunFailure(f"events.{ch.event} ({ch.kind} {target_of(ch)}) planned at {c.emulated(ch.t_s):g} s "
                                 f"{what} {late:.1f} s after its time{wall} (more than {EVENT_LATE_S:g} s){doing}: "
                                 f"the run would measure another scenario than the one planned", EXIT_COMPONENT_DIED)

    def _apply_group(self, group: list[Change], prepared: list, next_fire: float, done: Callable[[dict], None],
                     applied: Callable[[], None] = lambda: None) -> None:
        """Apply every change of one instant (each row shown as it fires; ``applied`` is called once
        all are), wait for their windows, measure each (``done`` writes the completed row)."""
        dyn = getattr(self.live, "dynamics", None)
        pending = []
        for ch, prep in zip(group, prepared, strict=True):
            self.busy = f"applying events.{ch.event} ({ch.kind} {target_of(ch)}, planned at {ch.t_s:g} s)"
            if ch.kind in CLUSTER_KINDS:
                self._apply_cluster(ch, done)
                continue
            ap = dyn.apply(ch, prep)
            row = self._fired(self._row(ch, ap.t_fire, None, None, ch.entry.shown_unit, None, None, "measuring"))
            pending.append((ap, row))
        applied()
        if not pending:
            return
        end = min(next_fire, max(ap.t_fire + dyn.window_s(ap.change) for ap, _ in pending))
        self.busy = f"measuring the changes of {group[0].t_s:g} s"
        self.stop_event.wait(max(0.0, end - time.time()))
        for ap, row in pending:
            m = self._measure(dyn, ap, next_fire)
            row.update(self._row(ap.change, ap.t_fire, m.effect_ms, m.value, m.unit, m.tolerance, m.ok, m.note))
            done(row)
        self.busy = ""

    def _measure(self, dyn, ap, next_fire: float) -> Measured:
        """Read ``ap`` (:class:`testbed.emu.linkctl.Applied`) back through ``dyn`` at the end of its
        window, and while the reading is pending (:class:`~testbed.model.timeline.Measured`: e.g. the
        controller has not rerouted yet) again every :data:`WATCH_POLL_S` until its kind's
        ``watch_s`` after the window, ``next_fire`` (unix s) or the runner's stop; the last reading
        stands (it says what had not shown in the time watched).

        Raises:
            EmulationError: a probe daemon or the controller failed to answer.
        """
        watch_end = min(next_fire, ap.t_fire + dyn.window_s(ap.change) + ap.change.entry.watch_s)
        while True:
            m = dyn.measure(ap, min(time.time(), next_fire))
            left = watch_end - time.time()
            if not m.pending or left <= 0 or self.stop_event.is_set():
                return m
            self.busy = f"watching events.{ap.change.event} ({ap.change.kind} {target_of(ap.change)}) take effect"
            self.stop_event.wait(min(WATCH_POLL_S, left))

    def _row(self, ch: Change, t_fire: float, effect_ms, measured, unit, tol, ok, note) -> dict:
        """One events.csv row, in emulated time and units (times, and values by their unit, back
        from the wall clock: :meth:`testbed.core.clock.EmulatedClock.emulated_value`); ``applied_unix_s``
        stays the wall-clock instant."""
        c = self.clock
        applied = c.emulated(t_fire - self.t0_s)
        planned = c.emulated(ch.t_s)
        asked = c.emulated_value(ch.value, ch.entry.unit or "")
        return {"event": ch.event, "step": ch.step, "kind": ch.kind, "target": target_of(ch),
                "planned_s": round(planned, 6), "applied_s": round(applied, 6),
                "lag_ms": round((applied - planned) * 1e3, 3), "effect_ms": _num(c.emulated_value(effect_ms, "ms")),
                "value_asked": _num(asked, 6), "value_measured": _num(c.emulated_value(measured, unit or "")),
                "unit": unit, "tolerance": _num(c.emulated_value(tol, unit or "")),
                "ok": "" if ok is None else int(bool(ok)), "note": note, "applied_unix_s": f"{t_fire:.6f}"}

    def _apply_cluster(self, ch: Change, done: Callable[[dict], None]) -> None:
        """Apply a cluster change now, through its kind on the cluster's server (:class:`_Server`).
        A change that brings the server back up (a restart waits until it answers) continues in
        its own thread, which writes the row once the server answers."""
        t_fire = time.time()
        server = _Server(self.servers, ch.cluster)
        if not ch.entry.sets_up:
            ch.entry.apply(ch, server)
            done(self._fired(self._row(ch, t_fire, server.down_ms, server.down_ms, "ms", None,
                                       server.down_ms is not None, server.note)))
            return
        row = self._fired(self._row(ch, t_fire, None, None, "s", None, None, "restarting"))

        def restart() -> None:
            try:
                ch.entry.apply(ch, server)
            except Exception as exc:  # noqa: BLE001 - reported by the run, which then stops
                self.error = RunFailure(f"events.{ch.event} ({ch.kind} {ch.cluster}) at {ch.t_s:g} s failed: {exc}")
                return
            ready_s = server.ready_s or 0.0
            row.update(self._row(ch, t_fire, ready_s * 1e3, ready_s, "s", None, True,
                                 "seconds until the server answered again"))
            done(row)

        th = threading.Thread(target=restart, daemon=True, name=f"restart-{ch.cluster}")
        self._restarts.append((th, row))
        th.start()

    def stop(self) -> None:
        """Stop applying (the load ended or the run is interrupted)."""
        self.stop_event.set()


class _Lookahead(threading.Thread):
    """Looks up, for each group of changes in turn, the pairs its link changes move
    (:meth:`EventRunner.lookup`) off the firing thread: once the group before it has been applied
    (the look-up reads the model and the controller as they are then) and from
    :data:`LOOKUP_LEAD_S` before the group fires, or twice the slowest look-up so far if longer
    (the first group at once). :meth:`result` waits for a group's look-up; an error in it is raised
    there."""

    def __init__(self, runner: EventRunner, groups: list[list[Change]]):
        super().__init__(daemon=True, name="events-lookahead")
        self.runner, self.groups = runner, groups
        self._done = [threading.Event() for _ in groups]
        self._applied = [threading.Event() for _ in groups]
        self._results: list[list | BaseException | None] = [None] * len(groups)
        self.slowest_s = 0.0

    def applied(self, gi: int) -> None:
        """The runner has applied group ``gi``: the next group's look-up may start."""
        self._applied[gi].set()

    def result(self, gi: int) -> list[list[tuple[str, str]]] | None:
        """Group ``gi``'s pairs per change (waits for the look-up; None once the runner is stopped).

        Raises:
            Exception: what the look-up raised.
        """
        stop = self.runner.stop_event
        while not self._done[gi].wait(0.05):
            if stop.is_set():
                return None
        got = self._results[gi]
        if isinstance(got, BaseException):
            raise got
        return got

    def run(self) -> None:
        stop, t0 = self.runner.stop_event, self.runner.t0_s
        for gi, group in enumerate(self.groups):
            if gi > 0:
                while not self._applied[gi - 1].wait(0.05):
                    if stop.is_set():
                        return
                start = t0 + group[0].t_s - max(LOOKUP_LEAD_S, 2 * self.slowest_s)
                if stop.wait(max(0.0, start - time.time())):
                    return
            t = time.time()
            try:
                self._results[gi] = self.runner.lookup(group)
            except Exception as exc:  # noqa: BLE001 - raised on the runner's thread by result()
                self._results[gi] = exc
            self.slowest_s = max(self.slowest_s, time.time() - t)
            self._done[gi].set()


class _Server:
    """One cluster's server as an event changes it (the emulation's
    :class:`~testbed.model.timeline.ClusterControl`, over :class:`testbed.emu.servers.ClusterServers`).
    ``note``: what a change down did and what its read-back saw, ``down_ms``: ms (wall) until the
    server was gone or stopped (None: it was not); ``ready_s``: seconds a change up took until the
    server answered."""

    def __init__(self, servers, cluster: str):
        self.servers, self.cluster = servers, cluster
        self.note = ""
        self.down_ms: float | None = None
        self.ready_s: float | None = None

    def set_up(self, up: bool, mode: str) -> None:
        if up:
            self.ready_s = self.servers.up(self.cluster)
            return
        self.down_ms, seen = self.servers.down(self.cluster, mode)
        self.note = f"server {'stopped (SIGSTOP)' if mode == 'stop' else 'killed (SIGKILL)'}: {seen}"


__all__ = ["APPLIED_KINDS", "EVENTS_FIELDS", "EventRunner", "unsupported"]
