"""Link changes in the emulation, carried out and read back: what each event kind calls.

An event kind (:mod:`testbed.model.event_kinds`) changes a link through :class:`EmuLink` (the
emulation's :class:`~testbed.model.timeline.LinkControl`) and reads the change back through
:class:`Readback` (its :class:`~testbed.model.timeline.Probe`). Both work on the probe daemons and
the model that :class:`testbed.emu.dynamics.Dynamics` holds (:class:`ProbedLinks`); ``Dynamics``
builds them when it applies and measures a change. The built-in kinds:

=================  =========================================================  =====================
kind               applied by                                                 measured (unit)
=================  =========================================================  =====================
link_delay         emulator control (or ``tc qdisc change``), then the        one-way delay a>b (ms)
                   controller is told the new delay (``POST /testbed/link``)  of the link's probes
link_bandwidth     emulator shaper rate (or ``tc class change``); the         a packet train's rate
                   controller is told (utilization)                           (Mbit/s of frames; a
                                                                              second train when the
                                                                              first is out of
                                                                              tolerance)
link_loss          emulator / netem loss                                      probe loss a>b (%)
link_down          emulator sets both ends down (or ``ip link set down``):    time until every
                   OpenFlow port status -> the controller reroutes            rerouted source->cluster
                                                                              path answers again (ms)
link_up            both ends up: LLDP rediscovers the link, reroute           time until the routes
                                                                              use it again (ms)
link_congestion    background traffic from the link's probe hosts, pinned     carried rate (Mbit/s)
                   over the link (Poisson UDP or paced TCP)                   at the far probe host
=================  =========================================================  =====================

``effect_ms`` is the time from the moment the run fired the change to the first measurement that
shows it (a probe carrying the new delay, a probe lost on the downed link, background traffic at
the far end, ...); for a bandwidth or loss change, which no single probe shows, it is the time
until the emulator (or ``tc``) confirmed the change. Each measurement is judged against a stated
tolerance; the outcome is recorded, not enforced.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from testbed.core.clock import EmulatedClock
from testbed.emu.mininet_network import EMULATOR_CEILING_MBPS, Emulation, EmulationError, ProbeHost
from testbed.emu.probe import FRAME_EXTRA_BYTES, ProbeClient, ProbeError
from testbed.model.network import NetworkState
from testbed.model.timeline import Change, Measured
from testbed.plan.build import Plan
from testbed.plan.resolved import Link
from testbed.sdn.client import ControllerError, get_events, post_link

#: Packet trains last about this long at the link's rate (s), within these frame counts.
TRAIN_S, TRAIN_MIN, TRAIN_MAX = 0.020, 48, 800
#: ... but never longer than this (s of emulated time: k x this on the wall clock of a run at time
#: dilation k, whose links' rates are 1 / k): a train holds up the scenario's next events (48
#: frames at 1 kbit/s would take 576 s). Fewer than :data:`TRAIN_FEWEST` frames in that time
#: (below about 0.1 Mbit/s emulated): the rate is applied but not measured, and the row says so.
TRAIN_MAX_S, TRAIN_FEWEST = 1.0, 8
TRAIN_PAYLOAD = 1458  # + 42 = 1500-byte frames
#: Probes sent later than this before the end of a window are not judged lost yet (s).
SETTLE_S = 0.2


@dataclass
class Applied:
    """A change as applied: ``t_fire`` (unix s) when the run issued it, ``t_applied`` when the
    emulator (or tc) confirmed it, the parameters ``before``, and context for the measurement."""

    change: Change
    t_fire: float
    t_applied: float
    before: dict = field(default_factory=dict)
    note: str = ""
    affected: list[tuple[str, str]] = field(default_factory=list)  # (source, cluster) pairs over the link
    train: dict | None = None


class DaemonHandle:
    """A probe daemon (:class:`testbed.emu.probe.ProbeDaemon`) running in one emulated host: the
    host's ``name`` and ``ip``, the daemon's process and its control client."""

    def __init__(self, name: str, proc, client: ProbeClient, ip: str):
        self.name, self.proc, self.client, self.ip = name, proc, client, ip


class ProbedLinks(Protocol):
    """What :class:`EmuLink` and :class:`Readback` use of the dynamics
    (:class:`testbed.emu.dynamics.Dynamics`): the run's plan, emulation and network model, the
    controller's REST API, the probe daemons by host, each probed link's two probe hosts, the plan's
    links by index, switch dpids by name, the baseline overhead per link ((a>b, b>a) ms), and the
    probes' samples."""

    plan: Plan
    emu: Emulation
    model: NetworkState
    rest_url: str
    daemons: dict[str, DaemonHandle]
    by_link: dict[int, tuple[ProbeHost, ProbeHost]]
    links: dict[int, Link]
    dpid: dict[str, int]
    overhead: dict[int, tuple[float, float]]

    def link_index(self, ch: Change) -> int: ...

    def samples(self, daemon: str, target: str, since_ns: int, until_ns: int) -> list[list[int]]: ...

    def one_way(self, link: int, since_ns: int, until_ns: int,
                raw: bool = True) -> tuple[list[float], list[float], list[list[int]]]: ...


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def routes_over_link(events: list[dict], da: int, db: int) -> tuple[dict | None, str]:
    """When the controller routes over the link between switches ``da`` and ``db`` (dpids, either
    order) again, from its event log after a ``link_up`` (``/testbed/events``: ``seq``, ``t`` unix s,
    ``kind``, fields): the event from which it does, or None, and what it was (or what is missing).

    The link joins the controller's trees once LLDP has seen it both ways (``link_add`` src -> dst
    and dst -> src, in either order): the second one recomputes the trees
    (``controllers/testbed_controller.py``, ``_link_add``). When flows changed, a ``reroute`` whose
    reason is ``link <src>-><dst> up`` of that add follows, and the routes are in force at its
    ``reroute_done`` (every changed switch acknowledged its flows); when none changed, at the
    second ``link_add``. Another reroute (another link's change) is not this one.
    """
    evs = sorted(events, key=lambda e: e["seq"])
    seen: list[tuple[int, int]] = []
    both = None
    for e in evs:
        if e["kind"] == "link_add" and {e["src"], e["dst"]} == {da, db} and (e["src"], e["dst"]) not in seen:
            seen.append((e["src"], e["dst"]))
            if len(seen) == 2:
                both = e
                break
    if both is None:
        return None, ("LLDP has not seen the link either way" if not seen else
                      f"LLDP has seen {seen[0][0]}->{seen[0][1]} only, not {seen[0][1]}->{seen[0][0]}")
    reason = f"link {both['src']}->{both['dst']} up"
    rr = next((e for e in evs if e["kind"] == "reroute" and e["seq"] > both["seq"] and e.get("reason") == reason),
              None)
    if rr is None:
        return both, "LLDP both ways; no flow changed: the trees hold the link since"
    done = next((e for e in evs if e["kind"] == "reroute_done" and e.get("reroute") == rr["seq"]), None)
    flows = f"{rr.get('flows')} flow(s) on {len(rr.get('switches', []))} switch(es)"
    if done is None:
        return None, f"LLDP both ways; {rr.get('flows')} flow(s) rerouted, not all acknowledged yet"
    return done, f"LLDP both ways, {flows} acknowledged"


class EmuLink:
    """One emulated link as an event changes it, oriented as the change names ``link`` (the
    emulation's :class:`~testbed.model.timeline.LinkControl`): the link emulator (or ``tc``) applies
    the change; the controller is told a new delay or capacity (``POST /testbed/link``); background
    traffic comes from the link's probe daemons. ``t_applied``: when the emulator (or the
    background's sender) confirmed the last change (unix s; None before one); ``note``: what the
    controller did.

    Raises (from the setters):
        EmulationError: the emulator, ``tc`` or a probe daemon refused the change.
        testbed.sdn.client.ControllerError: the controller refused the new delay or capacity.
    """

    def __init__(self, dyn: ProbedLinks, index: int, link: tuple[str, str]):
        self.dyn, self.index, self.link = dyn, index, link
        self.t_applied: float | None = None
        self.note = ""

    @property
    def delay_ms(self) -> float:
        return self.dyn.model.link(*self.link).delay_ms

    @property
    def capacity_mbps(self) -> float:
        return self.dyn.model.link(*self.link).capacity_mbps

    def _set(self, **change: float | bool) -> None:
        self.t_applied = self.dyn.emu.set_link(self.index, **change)["t_applied"]

    def _tell(self, **value: float) -> None:
        res = post_link(self.dyn.rest_url, self.dyn.dpid[self.link[0]], self.dyn.dpid[self.link[1]], **value)
        rr = res.get("reroute")
        if rr:
            self.note = f"controller rerouted {rr['flows']} flow(s) on {len(rr['switches'])} switch(es)"

    def set_delay(self, delay_ms: float) -> None:
        self._set(delay_ms=delay_ms)
        self._tell(delay_ms=delay_ms)

    def set_rate(self, rate_mbps: float) -> None:
        self._set(rate_mbps=rate_mbps)
        self._tell(bandwidth_mbps=rate_mbps)

    def set_loss(self, loss_pct: float) -> None:
        self._set(loss_pct=loss_pct)

    def set_up(self, up: bool) -> None:
        self._set(up=up)

    def set_background(self, rate_mbps: float, direction: str, traffic: str) -> None:
        """Background traffic of ``rate_mbps`` (Mbit/s of frames) over the link (``direction`` as
        ``link`` names it): a>b from the link's ``a`` probe daemon, b>a from ``b``'s; ``t_applied``
        is when the last sender confirmed."""
        dyn, i = self.dyn, self.index
        a, b = dyn.by_link[i]
        forward = tuple(self.link) == (dyn.links[i].a, dyn.links[i].b)
        ab = direction in ("both", "ab" if forward else "ba")
        ba = direction in ("both", "ba" if forward else "ab")
        t = time.time()
        try:
            for on, src, dst in ((ab, a, b), (ba, b, a)):
                if on:
                    # TCP is paced in IP bytes; the rate asked is of frames (1514 per 1500 IP bytes)
                    rate = rate_mbps * (1500 / 1514 if traffic == "tcp" else 1.0)
                    r = dyn.daemons[src.name].client.request("blast", ip=dst.ip, rate_mbps=rate, proto=traffic)
                    t = r["t_applied_ns"] / 1e9
        except ProbeError as exc:
            raise EmulationError(f"background traffic over {a.switch}-{b.switch}: {exc}") from None
        self.t_applied = t


class Readback:
    """The emulation's :class:`~testbed.model.timeline.Probe` for one applied change ``ap``: each
    reading is of the probes sent, and the controller's events logged, from its firing to ``until``
    (unix s; the end of its window, or of its watch: now when None). Values and ``effect_ms`` are
    on the wall clock (the event runner takes them back to emulated time); the notes of the link
    down / up readings give their times in emulated ms already, as ``events.csv`` is.

    Raises (from the readings):
        EmulationError: a packet train could not be sent, or the controller's events could not be read.
        ProbeError: a probe daemon failed to answer.
    """

    def __init__(self, dyn: ProbedLinks, ap: Applied, until: float | None = None):
        self.dyn, self.ap = dyn, ap
        self.t0, self.t1 = int(ap.t_fire * 1e9), int((until if until is not None else time.time()) * 1e9)

    def _ms(self, wall_ms: float) -> str:
        """A duration measured on the wall clock (ms) as the emulated ms a note shows."""
        return f"{EmulatedClock(self.dyn.plan.time_dilation).emulated(wall_ms):.1f} ms"

    def _clock_note(self) -> str:
        """Under time dilation, which clock the note's times are on ('' at k = 1)."""
        k = self.dyn.plan.time_dilation
        return f"times in emulated ms (k = {k:g})" if EmulatedClock(k).dilated else ""

    def _events(self) -> list[dict]:
        """The controller's events logged from the firing to the end of the reading (unix s ``t``).

        Raises:
            testbed.sdn.client.ControllerError: the controller did not answer.
        """
        lo, hi = self.ap.t_fire - 0.01, self.t1 / 1e9
        return [e for e in get_events(self.dyn.rest_url) if lo <= e["t"] <= hi]

    # ------------------------------------------------------------------ delay
    def delay(self, expect_ms: float, tolerance_ms: float) -> Measured:
        """The link's probes' one-way delay after the change, against ``expect_ms`` within ``tolerance_ms``."""
        dyn, ap, t0, t1, tol = self.dyn, self.ap, self.t0, self.t1, tolerance_ms
        ch = ap.change
        i = dyn.link_index(ch)
        forward = tuple(ch.link) == (dyn.links[i].a, dyn.links[i].b)
        ab, ba, rows = dyn.one_way(i, t0, t1, raw=False)
        fwd, rev = (ab, ba) if forward else (ba, ab)
        k = next((j for j, x in enumerate(fwd) if abs(x - expect_ms) <= tol), None)
        if k is None:
            return Measured(_median(fwd), "ms", None, tol, False,
                            f"no probe carried the new delay within tolerance ({len(fwd)} probes)")
        effect = (rows[k][1] - t0) / 1e6
        med, med_rev = statistics.median(fwd[k:]), statistics.median(rev[k:])
        ok = abs(med - expect_ms) <= tol and abs(med_rev - expect_ms) <= tol
        note = (f"{len(fwd) - k} probes; reverse direction {med_rev:.3f} ms; probe-path overhead "
                f"{dyn.overhead[i][0]:.3f}/{dyn.overhead[i][1]:.3f} ms subtracted")
        note = "; ".join(x for x in (note, ap.note, self._paths_note(t0 + int(effect * 1e6), t1)) if x)
        return Measured(round(med, 3), "ms", round(effect, 3), round(tol, 3), ok, note)

    def _paths_note(self, t0: int, t1: int) -> str:
        """For a delay change: the affected source -> cluster paths' one-way delay now vs the model's."""
        dyn, ap = self.dyn, self.ap
        if not ap.affected:
            return ""
        routes = dyn.model.routes({(dyn.plan.host(s).switch, dyn.plan.host(c).switch) for s, c in ap.affected})
        parts = []
        for s, c in ap.affected[:4]:
            rows = [r for r in dyn.samples(s, c, t0, t1) if r[4]]
            got = _median([(r[2] - r[1]) / 1e6 for r in rows])
            path = routes.get((dyn.plan.host(s).switch, dyn.plan.host(c).switch))
            want = sum(dyn.model.link(x, y).delay_ms for x, y in zip(path, path[1:], strict=False)) if path else None
            parts.append(f"{s}>{c} {got:.2f} ms (least-delay path now {want:.2f} + forwarding)"
                         if got is not None and want is not None else f"{s}>{c} unanswered")
        return "paths that crossed the link, one way: " + ", ".join(parts)

    # ------------------------------------------------------------------ bandwidth
    def train(self, rate_mbps: float, tolerance_mbps: float) -> None:
        """A packet train a>b at the new rate (:meth:`_one_train`) into ``ap.train``; one more when it
        is out of tolerance (a stall of the machine bunches a train's frames: the emulator catches up
        back to back), the first one's rate kept in the note."""
        ap = self.ap
        a, b = self.dyn.by_link[self.dyn.link_index(ap.change)]
        ap.train = self._one_train(a, b, rate_mbps)
        rate = ap.train.get("rate_mbps")
        if "not_measured" not in ap.train and (rate is None or abs(rate - rate_mbps) > tolerance_mbps):
            first, second = ap.train, self._one_train(a, b, rate_mbps)
            if second.get("frames_received") == second.get("frames_sent"):  # else the first stands
                ap.train = {**second, "first_rate_mbps": first.get("rate_mbps"),
                            "first_part_rates_mbps": first.get("part_rates_mbps")}
            else:
                ap.train = {**first, "second_train": f"{second.get('frames_received')}/"
                                                     f"{second.get('frames_sent')} frames, not used"}

    def _one_train(self, a: ProbeHost, b: ProbeHost, rate_mbps: float) -> dict:
        """A packet train a>b sized to last about :data:`TRAIN_S` at ``rate_mbps`` (the wall
        clock's, Mbit/s; at most :data:`TRAIN_MAX_S` x the run's time dilation k on the wall
        clock); ``{"not_measured": why}`` when fewer than :data:`TRAIN_FEWEST` frames fit in that time."""
        frame_bits = (TRAIN_PAYLOAD + FRAME_EXTRA_BYTES) * 8
        budget_s = TRAIN_MAX_S * self.dyn.plan.time_dilation
        fit = rate_mbps * 1e6 * budget_s / frame_bits
        if fit < TRAIN_FEWEST:
            return {"not_measured": f"a packet train of {TRAIN_FEWEST} frames of {TRAIN_PAYLOAD + FRAME_EXTRA_BYTES} "
                                    f"bytes would take {TRAIN_FEWEST * frame_bits / (rate_mbps * 1e6):.1f} s at "
                                    f"{rate_mbps:g} Mbit/s on the wall clock, more than the {budget_s:g} s a train "
                                    f"may hold up the next events: the rate is applied (the shaper confirmed it), "
                                    f"not measured"}
        frames = int(min(TRAIN_MAX, fit, max(TRAIN_MIN, rate_mbps * 1e6 * TRAIN_S / frame_bits)))
        c = self.dyn.daemons[a.name].client
        try:
            tid = c.request("train", ip=b.ip, frames=frames, size=TRAIN_PAYLOAD)["id"]
            deadline = time.monotonic() + 1.0
            time.sleep(frames * (TRAIN_PAYLOAD + FRAME_EXTRA_BYTES) * 8 / (rate_mbps * 1e6) + 0.02)
            while True:
                tr = c.request("train_result", id=tid)["train"]
                if tr.get("frames_received") is not None or time.monotonic() > deadline:
                    return tr
                time.sleep(0.02)
        except ProbeError as exc:
            raise EmulationError(f"packet train over {a.switch}-{b.switch}: {exc}") from None

    def rate(self, expect_mbps: float, tolerance_mbps: float) -> Measured:
        """The packet train's rate (:meth:`train`) against ``expect_mbps`` within ``tolerance_mbps``."""
        ap, expect, tol = self.ap, expect_mbps, tolerance_mbps
        tr = ap.train or {}
        rate = tr.get("rate_mbps")
        effect = round((ap.t_applied - ap.t_fire) * 1e3, 3)
        if rate is None:
            why = tr.get("not_measured") or f"packet train not measured: {tr}"
            return Measured(None, "Mbit/s", effect, tol, False, "; ".join(x for x in (why, ap.note) if x))
        ok = abs(rate - expect) <= tol
        note = (f"packet train of {tr.get('frames_received')}/{tr.get('frames_sent')} frames, sent at "
                f"{tr.get('send_rate_mbps', 0):.0f} Mbit/s, quarters {tr.get('part_rates_mbps')} Mbit/s (median "
                f"taken); effect = time until the shaper confirmed")
        if "second_train" in tr:
            note = f"a second train lost frames ({tr['second_train']}); " + note
        if "first_rate_mbps" in tr:
            note = (f"second train (the first measured {tr['first_rate_mbps']} Mbit/s, quarters "
                    f"{tr['first_part_rates_mbps']}); ") + note
        if not ok and expect > min(EMULATOR_CEILING_MBPS, tr.get("send_rate_mbps") or 0):
            note += (f"; asked rate above what the probe sender or this machine forwards "
                     f"(~{EMULATOR_CEILING_MBPS:g} Mbit/s per emulated link)")
        return Measured(round(rate, 3), "Mbit/s", effect, tol, ok, "; ".join(x for x in (note, ap.note) if x))

    # ------------------------------------------------------------------ loss
    def loss(self, expect_pct: float, tolerance: Callable[[int], float]) -> Measured:
        """The link's probe loss a>b against ``expect_pct`` within ``tolerance(probes sent)``."""
        dyn, ap = self.dyn, self.ap
        a, b = dyn.by_link[dyn.link_index(ap.change)]
        rows = dyn.samples(a.name, b.name, self.t0, self.t1)
        ans = [r for r in rows if r[4]]
        effect = round((ap.t_applied - ap.t_fire) * 1e3, 3)
        if len(ans) < 2:
            return Measured(100.0 if rows else None, "%", effect, None, False,
                            f"{len(ans)} of {len(rows)} probes answered")
        sent = ans[-1][0] - ans[0][0]
        recv = ans[-1][5] - ans[0][5]
        loss_ab = 100 * (1 - recv / sent) if sent else 0.0
        loss_ba = 100 * (1 - (len(ans) - 1) / recv) if recv else 100.0
        tol = tolerance(sent)
        ok = abs(loss_ab - expect_pct) <= tol
        note = f"{sent} probes a>b; b>a loss {loss_ba:.2f} %; effect = time until the change was confirmed"
        return Measured(round(loss_ab, 3), "%", effect, round(tol, 3), ok, note)

    # ------------------------------------------------------------------ down / up
    def reroute(self) -> Measured:
        """After a link went down: the time (ms) until every affected source -> cluster path that
        has another route answers again; ok when none is left unanswered in the window (pending
        while some is: the event runner reads it again within the kind's watch)."""
        dyn, ap, t0, t1 = self.dyn, self.ap, self.t0, self.t1
        effect = self._link_loss_effect(dyn.link_index(ap.change))
        alt = dyn.model.routes({(dyn.plan.host(s).switch, dyn.plan.host(c).switch) for s, c in ap.affected})
        restored, stuck, no_route = [], [], []
        ta = int(ap.t_applied * 1e9)
        for s, c in ap.affected:
            if alt.get((dyn.plan.host(s).switch, dyn.plan.host(c).switch)) is None:
                no_route.append(f"{s}>{c}")
                continue
            rows = dyn.samples(s, c, ta, t1 - int(SETTLE_S * 1e9))
            lost = next((j for j, r in enumerate(rows) if not r[4]), None)
            back = next((r for r in rows[lost:] if r[4]), None) if lost is not None else (rows[0] if rows else None)
            if back is None:
                stuck.append(f"{s}>{c}")
            else:
                restored.append(((back[1] - t0) / 1e6, f"{s}>{c}"))
        events = "; ".join(x for x in (self._controller_note(), self._clock_note()) if x)
        if not ap.affected:
            return Measured(None, "ms", effect, None, effect is not None,
                            "no source-cluster path used the link; " + events)
        worst = max(restored)[0] if restored else None
        note = ", ".join(f"{p} {self._ms(ms)}" for ms, p in sorted(restored))
        if stuck:
            note += f"; not restored in the {self._ms((t1 - t0) / 1e6)} watched: {', '.join(stuck)}"
        if no_route:
            note += f"; no other route: {', '.join(no_route)}"
        return Measured(None if worst is None else round(worst, 3), "ms", effect, None, not stuck,
                        f"connectivity restored after: {note}; {events}", pending=bool(stuck))

    def _link_loss_effect(self, i: int) -> float | None:
        """ms from the firing to the first probe of link ``i`` that was lost (None: none was)."""
        a, b = self.dyn.by_link[i]
        rows = self.dyn.samples(a.name, b.name, self.t0, self.t1 - int(SETTLE_S * 1e9))
        first = next((r for r in rows if not r[4]), None)
        return None if first is None else round((first[1] - self.t0) / 1e6, 3)

    def _controller_note(self) -> str:
        """Port status / link delete / reroute timing (emulated ms) from the controller's event log
        from the firing to the end of the reading."""
        t_fire = self.ap.t_fire
        try:
            evs = self._events()
        except ControllerError as exc:
            return f"controller events unavailable: {exc}"
        parts = []
        for kind in ("port_status", "link_delete", "link_add", "reroute", "reroute_done"):
            e = next((e for e in evs if e["kind"] == kind), None)
            if e is not None:
                parts.append(f"{kind} +{self._ms((e['t'] - t_fire) * 1e3)}")
        return "controller: " + (", ".join(parts) if parts else "no event")

    def rediscovery(self) -> Measured:
        """After a link came up: the time (ms) until the controller routes over it again
        (:func:`routes_over_link`: LLDP seen both ways, flows acknowledged); ``effect_ms`` when its
        probes answer again. Pending (the event runner reads it again within the kind's watch)
        until both have shown; the note says which had not in the time watched.

        Raises:
            EmulationError: the controller's events could not be read.
        """
        dyn, ap = self.dyn, self.ap
        a, b = dyn.by_link[dyn.link_index(ap.change)]
        rows = dyn.samples(a.name, b.name, self.t0, self.t1)
        first = next((r for r in rows if r[4]), None)
        effect = None if first is None else round((first[1] - self.t0) / 1e6, 3)
        try:
            at, how = routes_over_link(self._events(), dyn.dpid[ap.change.link[0]], dyn.dpid[ap.change.link[1]])
        except ControllerError as exc:
            raise EmulationError(f"controller events: {exc}") from None
        value = None if at is None else round((at["t"] - ap.t_fire) * 1e3, 3)
        watched = self._ms((self.t1 - self.t0) / 1e6)
        probes = (f"link probes answered again after {self._ms(effect)}" if effect is not None
                  else f"no link probe answered in the {watched} watched")
        routes = (f"routes over the link again after {self._ms(value)} ({how})" if value is not None
                  else f"routes not over the link again in the {watched} watched ({how})")
        pairs = f"pairs expected back on it: {', '.join(f'{s}>{c}' for s, c in ap.affected) or 'none'}"
        note = "; ".join(x for x in (probes, routes, pairs, self._clock_note()) if x)
        done = effect is not None and value is not None
        return Measured(value, "ms", effect, None, done, note, pending=not done)

    # ------------------------------------------------------------------ congestion
    def carried(self, expect_mbps: float, tolerance_mbps: float) -> Measured:
        """The background rate carried at the far probe host, against ``expect_mbps`` (at most the
        link's capacity) within ``tolerance_mbps``."""
        dyn, ap, t0, t1, rate_mbps, tol = self.dyn, self.ap, self.t0, self.t1, expect_mbps, tolerance_mbps
        ch = ap.change
        i = dyn.link_index(ch)
        a, b = dyn.by_link[i]
        forward = tuple(ch.link) == (dyn.links[i].a, dyn.links[i].b)
        # measured in the plan link's a>b direction unless only b>a is loaded
        a_to_b = ch.direction == "both" or ch.direction == ("ab" if forward else "ba")
        sink = b if a_to_b else a
        buckets = dyn.daemons[sink.name].client.request("sink", since_ns=t0)["buckets"]
        bucket_ns = 10_000_000
        busy = [t for t, n in buckets if n > 0 and t < t1]
        if rate_mbps > 0:
            if not busy:
                return Measured(0.0, "Mbit/s", None, tol, False, "no background traffic arrived")
            effect = max(0.0, (busy[0] - t0) / 1e6)
            start = busy[0] + 10 * bucket_ns
        else:
            effect = max(0.0, (busy[-1] + bucket_ns - t0) / 1e6) if busy else 0.0
            start = t0 + int(effect * 1e6) + bucket_ns
        end = t1 - bucket_ns
        total = sum(n for t, n in buckets if start <= t < end)
        rate = total * 8 / max(1e-9, (end - start) / 1e9) / 1e6 if end > start else None
        cap = dyn.model.link(*ch.link).capacity_mbps
        expect = min(rate_mbps, cap)
        ok = rate is not None and abs(rate - expect) <= max(tol, 0.1 * expect)
        ab, ba, _ = dyn.one_way(i, start, t1, raw=False)
        q = _median(ab if a_to_b else ba)
        note = (f"carried at {sink.name} ({ch.traffic}); link {cap:g} Mbit/s; probes' one-way delay now "
                f"{q:.3f} ms (configured {dyn.model.link(*ch.link).delay_ms:g})" if q is not None
                else f"carried at {sink.name} ({ch.traffic}); no probe answered (queue full or lost)")
        return Measured(None if rate is None else round(rate, 3), "Mbit/s", round(effect, 3), tol, ok, note)


__all__ = ["SETTLE_S", "TRAIN_FEWEST", "TRAIN_MAX", "TRAIN_MAX_S", "TRAIN_MIN", "TRAIN_PAYLOAD", "TRAIN_S", "Applied",
           "DaemonHandle", "EmuLink", "ProbedLinks", "Readback", "routes_over_link"]
