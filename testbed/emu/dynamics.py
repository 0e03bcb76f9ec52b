"""Network dynamics in the emulation: each link change applied for real, and read back by measurement.

:class:`Dynamics` is built by the bring-up once the controller is ready. It starts a probe daemon
(:mod:`testbed.emu.probe`) in both probe hosts of every link that scenario events change
(``P<i>a`` probes ``P<i>b`` continuously over exactly that link, pinned by the controller), and,
when the scenario changes delays or fails links, in every source host (probing every cluster host)
and every cluster host (reflecting). A baseline at bring-up gives, per probed link and direction,
the forwarding overhead of the probe path (measured one-way delay minus the configured one: two
OVS traversals, the emulator, two host links), which is subtracted from every later reading.

:meth:`Dynamics.apply` applies one :class:`~testbed.model.events.Change` and
:meth:`Dynamics.measure` reads it back over a window after it. What each kind does is its
registry entry's (:mod:`testbed.model.event_kinds`): it changes the link through :class:`EmuLink`
(this module's :class:`~testbed.model.events.LinkControl`) and is read back through
:class:`Readback` (the :class:`~testbed.model.events.Probe`); its window, probe rate and tolerance
are the entry's too. The built-in kinds:

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
tolerance (:meth:`Dynamics.tolerance`); the outcome is recorded, not enforced.
"""

from __future__ import annotations

import csv
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from testbed.core.lifeline import tied_popen
from testbed.core.util import REPO_ROOT
from testbed.emu.network import EMULATOR_CEILING_MBPS, Emulation, EmulationError, ProbeHost, control_dir
from testbed.emu.probe import FRAME_EXTRA_BYTES, ProbeClient, ProbeError, wait_ready
from testbed.model.events import EVENT_KINDS, Change, Measured, Tolerance
from testbed.model.network import NetworkState
from testbed.plan.build import Plan
from testbed.sdn.client import ControllerError, get_events, get_path, post_link

#: Probes per second per target, continuously (a 64-byte UDP datagram each way). While a change is
#: measured, the link's probes run at its kind's ``boost_hz`` for the kind's window (``window_s``).
BASE_HZ = 20.0
#: Probe rate per source -> cluster path while a change that moves paths is measured.
PATH_BOOST_HZ = 100.0
#: Seconds of the baseline at bring-up, and its probe rate.
BASELINE_S, BASELINE_HZ = 1.0, 200.0
#: A baseline overhead above this (ms, one way, per direction) is suspect: the probe path is two
#: OVS traversals, the emulator and two host links, 0.3-1.0 ms here at idle, and a stall of the
#: shared machine during the baseline's second inflates it, which would make every later reading
#: short by as much. The baseline is then taken again, up to :data:`BASELINE_ROUNDS` times in all,
#: keeping the lowest median per direction (``probe_baseline.json`` lists every round).
BASELINE_SUSPECT_MS, BASELINE_ROUNDS = 1.5, 3
#: Packet trains last about this long at the link's rate (s), within these frame counts.
TRAIN_S, TRAIN_MIN, TRAIN_MAX = 0.020, 48, 800
#: ... but never longer than this (s): a train holds up the scenario's next events (48 frames at
#: 1 kbit/s would take 576 s). Fewer than :data:`TRAIN_FEWEST` frames in that time (below about
#: 0.1 Mbit/s): the rate is applied but not measured, and the row says so.
TRAIN_MAX_S, TRAIN_FEWEST = 1.0, 8
TRAIN_PAYLOAD = 1458  # + 42 = 1500-byte frames
#: Kinds whose measurement needs the source -> cluster path probes (kept current with the registry).
PATH_KINDS = EVENT_KINDS.subset(lambda k: bool(getattr(k, "paths", ())))
#: Probes sent later than this before the end of a window are not judged lost yet (s).
SETTLE_S = 0.2
#: The probes are raised and the affected paths looked up this long before a change fires (s).
PREPARE_S = 0.1


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


class _Daemon:
    """A probe daemon in one emulated host."""

    def __init__(self, name: str, proc, client: ProbeClient, ip: str):
        self.name, self.proc, self.client, self.ip = name, proc, client, ip


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


class Dynamics:
    """Applies and measures link changes (module doc).

    Args:
        plan: the run's plan. emu: the started emulation. rest_url: the controller's REST API.
        run_dir: the run directory (``probes/`` gets the daemons' CSVs).

    Raises (from :meth:`start`):
        EmulationError: a probe daemon did not start, or probes across a link do not get through.
    """

    def __init__(self, plan: Plan, emu: Emulation, rest_url: str, run_dir: Path):
        self.plan, self.emu, self.rest_url, self.run_dir = plan, emu, rest_url, run_dir
        self.daemons: dict[str, _Daemon] = {}
        self.by_link: dict[int, tuple[ProbeHost, ProbeHost]] = {}
        for p in emu.probes:
            a, b = self.by_link.get(p.link, (None, None))
            self.by_link[p.link] = (p, b) if p.side == "a" else (a, p)
        self.index = {frozenset((lk.a, lk.b)): lk.index for lk in plan.links}
        self.links = {lk.index: lk for lk in plan.links}
        self.dpid = {s.name: s.dpid for s in plan.switches}
        self.overhead: dict[int, tuple[float, float]] = {}  # link -> (a>b, b>a) ms
        self.baseline_rounds: list[dict[int, tuple[float, float]]] = []  # per round, link -> (a>b, b>a) ms
        self.path_probes = any(c.kind in PATH_KINDS for c in plan.changes)
        self.model = plan.network_state()
        em = plan.experiment.emulation
        self.tol = Tolerance(em.rtt_tolerance_ms, em.rtt_tolerance_pct, em.rtt_tolerance_per_switch_ms)

    # ------------------------------------------------------------------ start / stop
    def start(self, python: str = sys.executable) -> None:
        """Start the daemons, point the probers at their peers, take the baseline."""
        (self.run_dir / "probes").mkdir(exist_ok=True)
        hosts = [(p.name, p.ip) for p in self.emu.probes]
        if self.path_probes:
            hosts += [(h.name, h.ip) for h in self.plan.hosts]
        ctl = control_dir(self.emu.run_id)
        ctl.mkdir(parents=True, exist_ok=True)
        started = []
        for i, (name, ip) in enumerate(hosts):
            log = open(self.run_dir / "logs" / f"probe-{name}.log", "w")  # noqa: SIM115 - lives with the process
            cmd = [python, "-m", "testbed.emu.probe", "--control", str(ctl / f"{name}.sock"),
                   "--out", str(self.run_dir / "probes" / name), "--seed", str(self.plan.experiment.seed * 1000 + i)]
            proc = tied_popen(self.emu.node(name).popen, cmd, stdout=log, stderr=subprocess.STDOUT, cwd=str(REPO_ROOT))
            started.append((name, ip, proc))
        for name, ip, proc in started:
            try:
                client = wait_ready(ctl / f"{name}.sock", proc=proc)
            except ProbeError as exc:
                raise EmulationError(f"probe daemon in {name}: {exc}") from None
            self.daemons[name] = _Daemon(name, proc, client, ip)
        for a, b in self.by_link.values():
            self.daemons[a.name].client.request("probe", targets={b.name: b.ip}, hz=BASE_HZ)
        if self.path_probes:
            for s in self.plan.sources:
                self.daemons[s.name].client.request("probe", targets={c.name: c.ip for c in self.plan.clusters},
                                                    hz=BASE_HZ)
        self.baseline()

    def baseline(self) -> None:
        """Take the probe paths' baseline (module doc): per probed link and direction, the lowest
        median over rounds of (measured one-way delay - configured), a round more while one is above
        :data:`BASELINE_SUSPECT_MS` (at most :data:`BASELINE_ROUNDS`). Called at start, and again
        after the link emulators' delays were compensated for the datapath
        (:func:`testbed.emu.bringup.calibrate_datapath`).

        Raises:
            EmulationError: a link's probes do not get through.
        """
        self.overhead, self.baseline_rounds = {}, []
        for _ in range(BASELINE_ROUNDS):
            got = self._baseline_round()
            self.baseline_rounds.append(got)
            for i, (ab, ba) in got.items():
                old = self.overhead.get(i, (float("inf"), float("inf")))
                self.overhead[i] = (min(old[0], ab), min(old[1], ba))
            if all(max(o) <= BASELINE_SUSPECT_MS for o in self.overhead.values()):
                break

    def _baseline_round(self) -> dict[int, tuple[float, float]]:
        """One baseline round: per probed link, the median (measured - configured) one way, a>b and b>a (ms)."""
        out = {}
        t0 = time.time_ns()
        for a, _ in self.by_link.values():
            self.daemons[a.name].client.request("boost", hz=BASELINE_HZ, for_s=BASELINE_S)
        time.sleep(BASELINE_S + 0.1)
        for i, (a, b) in self.by_link.items():
            ab, ba, _ = self._one_way(i, t0, time.time_ns())
            if not ab:
                raise EmulationError(f"probes from {a.name} to {b.name} over link {a.switch}-{b.switch} do not get "
                                     f"through (see logs/probe-{a.name}.log and the controller log)")
            d = self.links[i].delay_ms
            out[i] = (statistics.median(ab) - d, statistics.median(ba) - d)
        return out

    def components(self) -> dict[str, object]:
        """The daemons' processes by name (``probe-<host>``)."""
        return {f"probe-{n}": d.proc for n, d in self.daemons.items()}

    def stop(self) -> None:
        """Stop background traffic and the daemons (their CSVs are flushed on SIGTERM)."""
        for d in self.daemons.values():
            d.client.close()
            if d.proc.poll() is None:
                d.proc.terminate()
        for d in self.daemons.values():
            try:
                d.proc.wait(timeout=3)
            except subprocess.TimeoutExpired:
                d.proc.kill()

    # ------------------------------------------------------------------ samples
    def _samples(self, daemon: str, target: str, since_ns: int, until_ns: int) -> list[list[int]]:
        return self.daemons[daemon].client.request("samples", target=target, since_ns=since_ns,
                                                   until_ns=until_ns)["samples"]

    def _one_way(self, link: int, since_ns: int, until_ns: int, raw: bool = True):
        """One-way delays (ms) a>b and b>a of the link's answered probes sent in [since, until), and
        the rows; minus the baseline overhead unless ``raw``."""
        a, b = self.by_link[link]
        rows = [r for r in self._samples(a.name, b.name, since_ns, until_ns) if r[4]]
        oa, ob = (0.0, 0.0) if raw else self.overhead.get(link, (0.0, 0.0))
        ab = [(r[2] - r[1]) / 1e6 - oa for r in rows]
        ba = [(r[4] - r[3]) / 1e6 - ob for r in rows]
        return ab, ba, rows

    # ------------------------------------------------------------------ apply
    def window_s(self, ch: Change) -> float:
        """How long to measure ``ch`` after applying it (s): its kind's window given the model's link now."""
        return ch.entry.window(ch, self.model.control(*ch.link))

    def link_index(self, ch: Change) -> int:
        return self.index[frozenset(ch.link)]

    def prepare(self, ch: Change) -> list[tuple[str, str]]:
        """Before ``ch`` fires (:data:`PREPARE_S` ahead): raise the probe rates for its window and
        find the source -> cluster pairs whose paths it changes. Returns those pairs.

        Raises:
            EmulationError: a probe daemon refused.
        """
        i = self.link_index(ch)
        a, _ = self.by_link[i]
        for_s = PREPARE_S + self.window_s(ch) + SETTLE_S
        affected = self._affected(ch) if ch.entry.paths and self.path_probes else []
        try:
            self.daemons[a.name].client.request("boost", hz=ch.entry.boost_hz, for_s=for_s)
            for s in {s for s, _ in affected}:
                self.daemons[s].client.request("boost", hz=PATH_BOOST_HZ, for_s=for_s)
        except ProbeError as exc:
            raise EmulationError(str(exc)) from None
        return affected

    def apply(self, ch: Change, affected: list[tuple[str, str]] | None = None) -> Applied:
        """Apply one link change now: its kind changes the link through :class:`EmuLink`, the model
        follows, then the kind may start its measurement
        (:meth:`~testbed.model.events.EventKind.after_apply`: a bandwidth change's packet train).
        ``affected`` from :meth:`prepare` (looked up now when None).

        Raises:
            EmulationError: the emulator, ``tc`` or a probe daemon refused it.
            testbed.sdn.client.ControllerError: the controller refused the new delay.
        """
        i = self.link_index(ch)
        if affected is None:
            affected = self.prepare(ch)
        before = dict(self.emu.applied.get(i, {}))
        t_fire = time.time()
        link = EmuLink(self, i, ch.link)
        ch.entry.apply(ch, link)
        self.model.apply(ch)
        applied = Applied(ch, t_fire, link.t_applied if link.t_applied is not None else t_fire, before, link.note,
                          affected)
        ch.entry.after_apply(ch, Readback(self, applied), self.tol)
        return applied

    def _bandwidth_train(self, ap: Applied, rate_mbps: float, tolerance_mbps: float) -> None:
        """A packet train a>b at the new rate (:meth:`_train`) into ``ap.train``; one more when it is
        out of tolerance (a stall of the machine bunches a train's frames: the emulator catches up back
        to back), the first one's rate kept in the note."""
        a, b = self.by_link[self.link_index(ap.change)]
        ap.train = self._train(a, b, rate_mbps)
        rate = ap.train.get("rate_mbps")
        if "not_measured" not in ap.train and (rate is None or abs(rate - rate_mbps) > tolerance_mbps):
            first, second = ap.train, self._train(a, b, rate_mbps)
            if second.get("frames_received") == second.get("frames_sent"):  # else the first stands
                ap.train = {**second, "first_rate_mbps": first.get("rate_mbps"),
                            "first_part_rates_mbps": first.get("part_rates_mbps")}
            else:
                ap.train = {**first, "second_train": f"{second.get('frames_received')}/"
                                                     f"{second.get('frames_sent')} frames, not used"}

    def _affected(self, ch: Change) -> list[tuple[str, str]]:
        """(source, cluster) pairs whose paths the change moves, as its kind's ``paths`` says:
        ``after``: pairs whose least-delay path will cross ``ch.link`` (per the model after the
        change); ``now``: pairs whose installed path crosses it now."""
        da, db = self.dpid[ch.link[0]], self.dpid[ch.link[1]]
        out = []
        if "after" in ch.entry.paths:  # pairs the change moves onto the link
            after = NetworkState([(lk.a, lk.b, lk.delay_ms, lk.capacity_mbps, lk.loss_pct) for lk in self.model.links],
                                 self.model.switches, mtu=self.model.mtu, dpids=self.model.dpids)
            for lk, lk2 in zip(self.model.links, after.links, strict=True):
                lk2.up = lk.up
            after.apply(ch)
            routes = after.routes({(s.switch, c.switch) for s in self.plan.sources for c in self.plan.clusters})
            for s in self.plan.sources:
                for c in self.plan.clusters:
                    path = routes.get((s.switch, c.switch)) or []
                    if any({x, y} == set(ch.link) for x, y in zip(path, path[1:], strict=False)):
                        out.append((s.name, c.name))
        if "now" not in ch.entry.paths:
            return out
        for s in self.plan.sources:  # pairs whose installed path crosses the link now
            for c in self.plan.clusters:
                try:
                    dpids = get_path(self.rest_url, s.mac, c.mac)["dpids"]
                except ControllerError:
                    continue
                if (s.name, c.name) not in out and any({x, y} == {da, db} for x, y in zip(dpids, dpids[1:],
                                                                                             strict=False)):
                    out.append((s.name, c.name))
        return out

    def _congest(self, i: int, link: tuple[str, str], rate_mbps: float, direction: str, traffic: str) -> float:
        """Background traffic over link ``i`` (``direction`` as ``link`` names it): a>b from the
        link's ``a`` probe daemon, b>a from ``b``'s. Returns when the last sender confirmed (unix s)."""
        a, b = self.by_link[i]
        forward = tuple(link) == (self.links[i].a, self.links[i].b)
        ab = direction in ("both", "ab" if forward else "ba")
        ba = direction in ("both", "ba" if forward else "ab")
        t = time.time()
        try:
            for on, src, dst in ((ab, a, b), (ba, b, a)):
                if on:
                    # TCP is paced in IP bytes; the rate asked is of frames (1514 per 1500 IP bytes)
                    rate = rate_mbps * (1500 / 1514 if traffic == "tcp" else 1.0)
                    r = self.daemons[src.name].client.request("blast", ip=dst.ip, rate_mbps=rate, proto=traffic)
                    t = r["t_applied_ns"] / 1e9
        except ProbeError as exc:
            raise EmulationError(f"background traffic over {a.switch}-{b.switch}: {exc}") from None
        return t

    def _train(self, a: ProbeHost, b: ProbeHost, rate_mbps: float) -> dict:
        """A packet train a>b sized to last about :data:`TRAIN_S` at ``rate_mbps`` (at most
        :data:`TRAIN_MAX_S`); ``{"not_measured": why}`` when fewer than :data:`TRAIN_FEWEST` frames
        fit in that time."""
        frame_bits = (TRAIN_PAYLOAD + FRAME_EXTRA_BYTES) * 8
        fit = rate_mbps * 1e6 * TRAIN_MAX_S / frame_bits
        if fit < TRAIN_FEWEST:
            return {"not_measured": f"a packet train of {TRAIN_FEWEST} frames of {TRAIN_PAYLOAD + FRAME_EXTRA_BYTES} "
                                    f"bytes would take {TRAIN_FEWEST * frame_bits / (rate_mbps * 1e6):.1f} s at "
                                    f"{rate_mbps:g} Mbit/s, more than the {TRAIN_MAX_S:g} s a train may hold up the "
                                    f"next events: the rate is applied (the shaper confirmed it), not measured"}
        frames = int(min(TRAIN_MAX, fit, max(TRAIN_MIN, rate_mbps * 1e6 * TRAIN_S / frame_bits)))
        c = self.daemons[a.name].client
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

    # ------------------------------------------------------------------ measure
    def tolerance(self, ch: Change, n: int = 0) -> float | None:
        """The tolerance a measurement of ``ch`` is judged with, in its unit (its kind's
        :meth:`~testbed.model.events.EventKind.tolerance` with this run's RTT tolerance; ``n``
        probes counted)."""
        return ch.entry.tolerance(ch, self.tol, n)

    def measure(self, ap: Applied, until: float) -> Measured:
        """Read ``ap``'s change back from the probes sent in ``[t_fire, until]`` (unix s): its kind's
        :meth:`~testbed.model.events.EventKind.measure` through :class:`Readback`.

        Raises:
            EmulationError: a probe daemon or the controller failed to answer.
        """
        ch = ap.change
        try:
            return ch.entry.measure(ch, Readback(self, ap, until), self.model.control(*ch.link), self.tol)
        except ProbeError as exc:
            raise EmulationError(f"measuring {ch.kind}: {exc}") from None

    def _m_delay(self, ap: Applied, t0: int, t1: int, expect: float, tol: float) -> Measured:
        """The link's probes' one-way delay after the change, against ``expect`` (ms) within ``tol``."""
        ch = ap.change
        i = self.link_index(ch)
        forward = tuple(ch.link) == (self.links[i].a, self.links[i].b)
        ab, ba, rows = self._one_way(i, t0, t1, raw=False)
        fwd, rev = (ab, ba) if forward else (ba, ab)
        k = next((j for j, x in enumerate(fwd) if abs(x - expect) <= tol), None)
        if k is None:
            return Measured(_median(fwd), "ms", None, tol, False,
                            f"no probe carried the new delay within tolerance ({len(fwd)} probes)")
        effect = (rows[k][1] - t0) / 1e6
        med, med_rev = statistics.median(fwd[k:]), statistics.median(rev[k:])
        ok = abs(med - expect) <= tol and abs(med_rev - expect) <= tol
        note = (f"{len(fwd) - k} probes; reverse direction {med_rev:.3f} ms; probe-path overhead "
                f"{self.overhead[i][0]:.3f}/{self.overhead[i][1]:.3f} ms subtracted")
        note = "; ".join(x for x in (note, ap.note, self._paths_note(ap, t0 + int(effect * 1e6), t1)) if x)
        return Measured(round(med, 3), "ms", round(effect, 3), round(tol, 3), ok, note)

    def _paths_note(self, ap: Applied, t0: int, t1: int) -> str:
        """For a delay change: the affected source -> cluster paths' one-way delay now vs the model's."""
        if not ap.affected:
            return ""
        routes = self.model.routes({(self.plan.host(s).switch, self.plan.host(c).switch) for s, c in ap.affected})
        parts = []
        for s, c in ap.affected[:4]:
            rows = [r for r in self._samples(s, c, t0, t1) if r[4]]
            got = _median([(r[2] - r[1]) / 1e6 for r in rows])
            path = routes.get((self.plan.host(s).switch, self.plan.host(c).switch))
            want = sum(self.model.link(x, y).delay_ms for x, y in zip(path, path[1:], strict=False)) if path else None
            parts.append(f"{s}>{c} {got:.2f} ms (least-delay path now {want:.2f} + forwarding)"
                         if got is not None and want is not None else f"{s}>{c} unanswered")
        return "paths that crossed the link, one way: " + ", ".join(parts)

    def _m_bandwidth(self, ap: Applied, expect: float, tol: float) -> Measured:
        """The packet train's rate (:meth:`_bandwidth_train`) against ``expect`` (Mbit/s) within ``tol``."""
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

    def _m_loss(self, ap: Applied, t0: int, t1: int, expect: float, tolerance: Callable[[int], float]) -> Measured:
        """The link's probe loss a>b against ``expect`` (%) within ``tolerance(probes sent)``."""
        ch = ap.change
        i = self.link_index(ch)
        a, b = self.by_link[i]
        rows = self._samples(a.name, b.name, t0, t1)
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
        ok = abs(loss_ab - expect) <= tol
        note = f"{sent} probes a>b; b>a loss {loss_ba:.2f} %; effect = time until the change was confirmed"
        return Measured(round(loss_ab, 3), "%", effect, round(tol, 3), ok, note)

    def _link_loss_effect(self, i: int, t0: int, t1: int) -> float | None:
        """ms from ``t0`` to the first link probe that was lost (or answered: ``answered``)."""
        a, b = self.by_link[i]
        rows = self._samples(a.name, b.name, t0, t1 - int(SETTLE_S * 1e9))
        first = next((r for r in rows if not r[4]), None)
        return None if first is None else round((first[1] - t0) / 1e6, 3)

    def _m_down(self, ap: Applied, t0: int, t1: int) -> Measured:
        i = self.link_index(ap.change)
        effect = self._link_loss_effect(i, t0, t1)
        alt = self.model.routes({(self.plan.host(s).switch, self.plan.host(c).switch) for s, c in ap.affected})
        restored, stuck, no_route = [], [], []
        ta = int(ap.t_applied * 1e9)
        for s, c in ap.affected:
            if alt.get((self.plan.host(s).switch, self.plan.host(c).switch)) is None:
                no_route.append(f"{s}>{c}")
                continue
            rows = self._samples(s, c, ta, t1 - int(SETTLE_S * 1e9))
            lost = next((j for j, r in enumerate(rows) if not r[4]), None)
            back = next((r for r in rows[lost:] if r[4]), None) if lost is not None else (rows[0] if rows else None)
            if back is None:
                stuck.append(f"{s}>{c}")
            else:
                restored.append(((back[1] - t0) / 1e6, f"{s}>{c}"))
        events = self._controller_note(ap.t_fire)
        if not ap.affected:
            return Measured(None, "ms", effect, None, effect is not None,
                            "no source-cluster path used the link; " + events)
        worst = max(restored)[0] if restored else None
        note = ", ".join(f"{p} {ms:.0f} ms" for ms, p in sorted(restored))
        if stuck:
            note += f"; not restored within the window: {', '.join(stuck)}"
        if no_route:
            note += f"; no other route: {', '.join(no_route)}"
        return Measured(None if worst is None else round(worst, 3), "ms", effect, None, not stuck,
                        f"connectivity restored after: {note}; {events}")

    def _controller_note(self, t_fire: float) -> str:
        """Port status / link delete / reroute timing from the controller's event log since ``t_fire``."""
        try:
            evs = [e for e in get_events(self.rest_url) if e["t"] >= t_fire - 0.01]
        except ControllerError as exc:
            return f"controller events unavailable: {exc}"
        parts = []
        for kind in ("port_status", "link_delete", "link_add", "reroute", "reroute_done"):
            e = next((e for e in evs if e["kind"] == kind), None)
            if e is not None:
                parts.append(f"{kind} +{(e['t'] - t_fire) * 1e3:.0f} ms")
        return "controller: " + (", ".join(parts) if parts else "no event")

    def _m_up(self, ap: Applied, t0: int, t1: int) -> Measured:
        i = self.link_index(ap.change)
        a, b = self.by_link[i]
        rows = self._samples(a.name, b.name, t0, t1)
        first = next((r for r in rows if r[4]), None)
        effect = None if first is None else round((first[1] - t0) / 1e6, 3)
        da, db = self.dpid[ap.change.link[0]], self.dpid[ap.change.link[1]]
        try:
            evs = [e for e in get_events(self.rest_url) if e["t"] >= ap.t_fire - 0.01]
        except ControllerError as exc:
            raise EmulationError(f"controller events: {exc}") from None
        adds = [e for e in evs if e["kind"] == "link_add" and {e["src"], e["dst"]} == {da, db}]
        done = None
        if len(adds) >= 2:  # seen both ways: the trees were recomputed with it
            last = max(adds, key=lambda e: e["seq"])
            done = next((e for e in evs if e["kind"] == "reroute_done" and e["reroute"] > last["seq"]), last)
        value = None if done is None else round((done["t"] - ap.t_fire) * 1e3, 3)
        note = (f"link probes answered again after {effect} ms; routes over the link again after {value} ms "
                f"(LLDP both ways, flows acknowledged); pairs expected back on it: "
                f"{', '.join(f'{s}>{c}' for s, c in ap.affected) or 'none'}")
        return Measured(value, "ms", effect, None, effect is not None and done is not None, note)

    def _m_congestion(self, ap: Applied, t0: int, t1: int, rate_mbps: float, tol: float) -> Measured:
        """The background rate carried at the far probe host, against ``rate_mbps`` (at most the
        link's capacity) within ``tol``."""
        ch = ap.change
        i = self.link_index(ch)
        a, b = self.by_link[i]
        forward = tuple(ch.link) == (self.links[i].a, self.links[i].b)
        # measured in the plan link's a>b direction unless only b>a is loaded
        a_to_b = ch.direction == "both" or ch.direction == ("ab" if forward else "ba")
        sink = b if a_to_b else a
        buckets = self.daemons[sink.name].client.request("sink", since_ns=t0)["buckets"]
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
        cap = self.model.link(*ch.link).capacity_mbps
        expect = min(rate_mbps, cap)
        ok = rate is not None and abs(rate - expect) <= max(tol, 0.1 * expect)
        ab, ba, _ = self._one_way(i, start, t1, raw=False)
        q = _median(ab if a_to_b else ba)
        note = (f"carried at {sink.name} ({ch.traffic}); link {cap:g} Mbit/s; probes' one-way delay now "
                f"{q:.3f} ms (configured {self.model.link(*ch.link).delay_ms:g})" if q is not None
                else f"carried at {sink.name} ({ch.traffic}); no probe answered (queue full or lost)")
        return Measured(None if rate is None else round(rate, 3), "Mbit/s", round(effect, 3), tol, ok, note)

    # ------------------------------------------------------------------ outputs
    def write_outputs(self) -> None:
        """``probe_baseline.json``: the probe paths' overhead per link (ms)."""
        out = {f"{self.links[i].a}-{self.links[i].b}": {
            "overhead_ab_ms": round(o[0], 4), "overhead_ba_ms": round(o[1], 4),
            "rounds_ms": [[round(x, 4) for x in r[i]] for r in self.baseline_rounds if i in r]}
            for i, o in self.overhead.items()}
        (self.run_dir / "probe_baseline.json").write_text(json.dumps(out, indent=1))


class EmuLink:
    """One emulated link as an event changes it, oriented as the change names ``link`` (the
    emulation's :class:`~testbed.model.events.LinkControl`): the link emulator (or ``tc``) applies
    the change; the controller is told a new delay or capacity (``POST /testbed/link``); background
    traffic comes from the link's probe daemons. ``t_applied``: when the emulator (or the
    background's sender) confirmed the last change (unix s; None before one); ``note``: what the
    controller did."""

    def __init__(self, dyn: Dynamics, index: int, link: tuple[str, str]):
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
        self.t_applied = self.dyn._congest(self.index, self.link, rate_mbps, direction, traffic)


class Readback:
    """The emulation's :class:`~testbed.model.events.Probe` for one applied change ``ap``: each
    reading is of the probes sent from its firing to ``until`` (unix s; the end of its window)."""

    def __init__(self, dyn: Dynamics, ap: Applied, until: float | None = None):
        self.dyn, self.ap = dyn, ap
        self.t0, self.t1 = int(ap.t_fire * 1e9), int((until if until is not None else time.time()) * 1e9)

    def delay(self, expect_ms: float, tolerance_ms: float) -> Measured:
        return self.dyn._m_delay(self.ap, self.t0, self.t1, expect_ms, tolerance_ms)

    def train(self, rate_mbps: float, tolerance_mbps: float) -> None:
        self.dyn._bandwidth_train(self.ap, rate_mbps, tolerance_mbps)

    def rate(self, expect_mbps: float, tolerance_mbps: float) -> Measured:
        return self.dyn._m_bandwidth(self.ap, expect_mbps, tolerance_mbps)

    def loss(self, expect_pct: float, tolerance: Callable[[int], float]) -> Measured:
        return self.dyn._m_loss(self.ap, self.t0, self.t1, expect_pct, tolerance)

    def reroute(self) -> Measured:
        return self.dyn._m_down(self.ap, self.t0, self.t1)

    def rediscovery(self) -> Measured:
        return self.dyn._m_up(self.ap, self.t0, self.t1)

    def carried(self, expect_mbps: float, tolerance_mbps: float) -> Measured:
        return self.dyn._m_congestion(self.ap, self.t0, self.t1, expect_mbps, tolerance_mbps)


def write_controller_events(rest_url: str, path: Path) -> int:
    """Write the controller's event log to ``path`` (CSV: seq, t, kind, detail JSON); how many rows.

    Raises:
        testbed.sdn.client.ControllerError: the controller is unreachable.
    """
    evs = get_events(rest_url)
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["seq", "t", "kind", "detail"])
        for e in evs:
            detail = {k: v for k, v in e.items() if k not in ("seq", "t", "kind")}
            w.writerow([e["seq"], f"{e['t']:.6f}", e["kind"], json.dumps(detail, sort_keys=True)])
    return len(evs)
