"""Network dynamics in the emulation: each link change applied for real, and read back by measurement.

:class:`Dynamics` is built by the bring-up once the controller is ready. It starts a probe daemon
(:mod:`testbed.emu.probe`) in both probe hosts of every link that scenario events change
(``P<i>a`` probes ``P<i>b`` continuously over exactly that link, pinned by the controller), and,
when the scenario changes delays or fails links, in every source host (probing every cluster host)
and every cluster host (reflecting). A baseline at bring-up gives, per probed link and direction,
the forwarding overhead of the probe path (measured one-way delay minus the configured one: two
OVS traversals, the emulator, two host links), which is subtracted from every later reading.

The continuous probes run at :data:`~testbed.emu.netplan.BASE_HZ` of emulated time: under time
dilation k, 1 / k of that a wall second, as every other rate of the emulated system (what they
cost at the wall clock's rate: docs/dilation.md, "The probes"). The raised rates around a change
(a kind's ``boost_hz``, :data:`PATH_BOOST_HZ`) and the baseline's stay on the wall clock: a
read-back's samples per wall second are what its tolerance counts.

:meth:`Dynamics.apply` applies one :class:`~testbed.model.timeline.Change` and
:meth:`Dynamics.measure` reads it back over a window after it. What each kind does is its
registry entry's (:mod:`testbed.model.event_kinds`): it changes the link through
:class:`testbed.emu.linkctl.EmuLink` (the emulation's :class:`~testbed.model.timeline.LinkControl`)
and is read back through :class:`testbed.emu.linkctl.Readback` (the
:class:`~testbed.model.timeline.Probe`); its window, probe rate and tolerance are the entry's too.
:mod:`testbed.emu.linkctl` lists how the built-in kinds are applied and measured, and what
``effect_ms`` means. Each measurement is judged against a stated tolerance
(:meth:`Dynamics.tolerance`); the outcome is recorded, not enforced.

This module holds the probes' life (start, baseline, samples, stop), the order of a change
(prepare, apply, measure), the source -> cluster pairs a change moves, and the run's outputs
(``probe_baseline.json``, the controller's event log).
"""

from __future__ import annotations

import csv
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from testbed.core.clock import EmulatedClock
from testbed.core.lifeline import tied_popen
from testbed.core.util import REPO_ROOT
from testbed.emu.linkctl import SETTLE_S, Applied, DaemonHandle, EmuLink, Readback
from testbed.emu.mininet_network import Emulation, EmulationError, ProbeHost, control_dir
from testbed.emu.netplan import (
    PATH_BOOST_BUDGET,
    continuous_probe_hz,
    has_path_probes,
    ovs_ports,
    path_probe_hz,
)
from testbed.emu.probe import ProbeError, wait_ready
from testbed.model.network import NetworkState
from testbed.model.timeline import Change, Measured, Tolerance
from testbed.plan.build import Plan
from testbed.sdn.client import ControllerError, get_events, get_paths

#: Probe rate per source -> cluster path while a change that moves paths is measured. The path
#: probes' rates are lowered to keep to a CPU budget on large networks (:func:`path_probe_hz`).
PATH_BOOST_HZ = 100.0
#: Seconds of the baseline at bring-up, and its probe rate.
BASELINE_S, BASELINE_HZ = 1.0, 200.0
#: A baseline overhead above this (ms, one way, per direction) is suspect: the probe path is two
#: OVS traversals, the emulator and two host links, 0.3-1.0 ms here at idle, and a stall of the
#: shared machine during the baseline's second inflates it, which would make every later reading
#: short by as much. The baseline is then taken again, up to :data:`BASELINE_ROUNDS` times in all,
#: keeping the lowest median per direction (``probe_baseline.json`` lists every round).
BASELINE_SUSPECT_MS, BASELINE_ROUNDS = 1.5, 3
#: The probes are raised this long before a change fires (s, wall clock). The source -> cluster
#: pairs it moves are looked up earlier, off the firing thread (:class:`testbed.emu.event_runner.EventRunner`).
PREPARE_S = 0.1


#: How long (s) a probe daemon may take to answer its first ping: a Python start-up, which took over
#: 10 s in a QEMU guest under software emulation (TCG) beside other jobs; a daemon that exits is
#: reported at once, so the bound costs nothing when it is healthy.
PROBE_START_TIMEOUT_S = 60.0


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
        self.daemons: dict[str, DaemonHandle] = {}
        self.by_link: dict[int, tuple[ProbeHost, ProbeHost]] = {}
        for p in emu.probes:
            a, b = self.by_link.get(p.link, (None, None))
            self.by_link[p.link] = (p, b) if p.side == "a" else (a, p)
        self.index = {frozenset((lk.a, lk.b)): lk.index for lk in plan.links}
        self.links = {lk.index: lk for lk in plan.links}
        self.dpid = {s.name: s.dpid for s in plan.switches}
        self.overhead: dict[int, tuple[float, float]] = {}  # link -> (a>b, b>a) ms
        self.baseline_rounds: list[dict[int, tuple[float, float]]] = []  # per round, link -> (a>b, b>a) ms
        self.path_probes = has_path_probes(plan)
        self.ovs_ports = ovs_ports(plan, emu.datapath)  # once: each boost's rate reads it (netplan.path_probe_us)
        self.link_hz, self.path_hz = continuous_probe_hz(plan, self.ovs_ports)  # wall clock, per target
        self.model = plan.network_state()
        em = plan.experiment.emulation
        w = EmulatedClock(plan.time_dilation).wall  # the read-backs measure on the wall clock: tolerances in wall ms
        self.tol = Tolerance(w(em.rtt_tolerance_ms), em.rtt_tolerance_pct, w(em.rtt_tolerance_per_switch_ms))

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
                client = wait_ready(ctl / f"{name}.sock", PROBE_START_TIMEOUT_S, proc=proc)
            except ProbeError as exc:
                raise EmulationError(f"probe daemon in {name}: {exc}") from None
            self.daemons[name] = DaemonHandle(name, proc, client, ip)
        for a, b in self.by_link.values():
            self.daemons[a.name].client.request("probe", targets={b.name: b.ip}, hz=self.link_hz)
        if self.path_probes:
            for s in self.plan.sources:
                self.daemons[s.name].client.request("probe", targets={c.name: c.ip for c in self.plan.clusters},
                                                    hz=self.path_hz)
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
            ab, ba, _ = self.one_way(i, t0, time.time_ns())
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
    def samples(self, daemon: str, target: str, since_ns: int, until_ns: int) -> list[list[int]]:
        """The probes ``daemon``'s host sent to ``target`` in [since, until) (unix ns), one row each as
        the probe daemon keeps them (:mod:`testbed.emu.probe`): ``[seq, t_tx, t_rx_remote, t_echo,
        t_back, remote_count]``, times in unix ns, 0 while unanswered.

        Raises:
            ProbeError: the daemon failed to answer.
        """
        return self.daemons[daemon].client.request("samples", target=target, since_ns=since_ns,
                                                   until_ns=until_ns)["samples"]

    def one_way(self, link: int, since_ns: int, until_ns: int,
                raw: bool = True) -> tuple[list[float], list[float], list[list[int]]]:
        """One-way delays (ms) a>b and b>a of the link's answered probes sent in [since, until), and
        the rows; minus the baseline overhead unless ``raw``."""
        a, b = self.by_link[link]
        rows = [r for r in self.samples(a.name, b.name, since_ns, until_ns) if r[4]]
        oa, ob = (0.0, 0.0) if raw else self.overhead.get(link, (0.0, 0.0))
        ab = [(r[2] - r[1]) / 1e6 - oa for r in rows]
        ba = [(r[4] - r[3]) / 1e6 - ob for r in rows]
        return ab, ba, rows

    # ------------------------------------------------------------------ apply
    def window_s(self, ch: Change) -> float:
        """How long to measure ``ch`` after applying it (s): its kind's window given the model's link now."""
        return ch.entry.window(ch, self.model.control(*ch.link))

    def link_index(self, ch: Change) -> int:
        """The plan's index of the link ``ch`` changes."""
        return self.index[frozenset(ch.link)]

    def prepare(self, ch: Change, affected: list[tuple[str, str]]) -> None:
        """Before ``ch`` fires (:data:`PREPARE_S` ahead): raise the probe rates for its window, on the
        link and on the paths of the source -> cluster pairs ``affected`` (from :meth:`affected`).

        Raises:
            EmulationError: a probe daemon refused.
        """
        i = self.link_index(ch)
        a, _ = self.by_link[i]
        for_s = PREPARE_S + self.window_s(ch) + SETTLE_S
        try:
            self.daemons[a.name].client.request("boost", hz=ch.entry.boost_hz, for_s=for_s)
            boosted = {s for s, _ in affected}
            hz = path_probe_hz(self.plan, PATH_BOOST_HZ, PATH_BOOST_BUDGET, boosted, ports=self.ovs_ports)
            for s in boosted:
                self.daemons[s].client.request("boost", hz=hz, for_s=for_s)
        except ProbeError as exc:
            raise EmulationError(str(exc)) from None

    def apply(self, ch: Change, affected: list[tuple[str, str]] | None = None) -> Applied:
        """Apply one link change now: its kind changes the link through :class:`EmuLink`, the model
        follows, then the kind may start its measurement
        (:meth:`~testbed.model.timeline.EventKind.after_apply`: a bandwidth change's packet train).
        ``affected`` from :meth:`affected` (looked up, and the probes raised, now when None).

        Raises:
            EmulationError: the emulator, ``tc`` or a probe daemon refused it.
            testbed.sdn.client.ControllerError: the controller refused the new delay.
        """
        i = self.link_index(ch)
        if affected is None:
            affected = self.affected(ch)
            self.prepare(ch, affected)
        before = dict(self.emu.applied.get(i, {}))
        t_fire = time.time()
        link = EmuLink(self, i, ch.link)
        ch.entry.apply(ch, link)
        self.model.apply(ch)
        applied = Applied(ch, t_fire, link.t_applied if link.t_applied is not None else t_fire, before, link.note,
                          affected)
        ch.entry.after_apply(ch, Readback(self, applied), self.tol)
        return applied

    def affected(self, ch: Change) -> list[tuple[str, str]]:
        """(source, cluster) pairs whose paths the change moves, as its kind's ``paths`` says:
        ``after``: pairs whose least-delay path will cross ``ch.link`` (per the model after the
        change; the model must hold every earlier change); ``now``: pairs whose installed path
        crosses it now (one controller query: 0.4-1.2 s on a busy 594-switch controller, more when
        the machine is starved). Empty for a kind that moves no paths, or a run without path probes.
        """
        if not (ch.entry.paths and self.path_probes):
            return []
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
        try:  # one look-up for every pair: a call per pair takes seconds on a busy 1,000-switch controller
            installed = {(p["src"], p["dst"]): p["dpids"] for p in get_paths(self.rest_url)}
        except ControllerError:
            installed = {}
        for s in self.plan.sources:  # pairs whose installed path crosses the link now
            for c in self.plan.clusters:
                dpids = installed.get((s.mac, c.mac), [])
                if (s.name, c.name) not in out and any({x, y} == {da, db} for x, y in zip(dpids, dpids[1:],
                                                                                             strict=False)):
                    out.append((s.name, c.name))
        return out

    # ------------------------------------------------------------------ measure
    def tolerance(self, ch: Change, n: int = 0) -> float | None:
        """The tolerance a measurement of ``ch`` is judged with, in its unit (its kind's
        :meth:`~testbed.model.timeline.EventKind.tolerance` with this run's RTT tolerance; ``n``
        probes counted)."""
        return ch.entry.tolerance(ch, self.tol, n)

    def measure(self, ap: Applied, until: float) -> Measured:
        """Read ``ap``'s change back from the probes sent in ``[t_fire, until]`` (unix s): its kind's
        :meth:`~testbed.model.timeline.EventKind.measure` through :class:`Readback`.

        Raises:
            EmulationError: a probe daemon or the controller failed to answer.
        """
        ch = ap.change
        try:
            return ch.entry.measure(ch, Readback(self, ap, until), self.model.control(*ch.link), self.tol)
        except ProbeError as exc:
            raise EmulationError(f"measuring {ch.kind}: {exc}") from None

    # ------------------------------------------------------------------ outputs
    def write_outputs(self) -> None:
        """``probe_baseline.json``: the probe paths' overhead per link (ms)."""
        out = {f"{self.links[i].a}-{self.links[i].b}": {
            "overhead_ab_ms": round(o[0], 4), "overhead_ba_ms": round(o[1], 4),
            "rounds_ms": [[round(x, 4) for x in r[i]] for r in self.baseline_rounds if i in r]}
            for i, o in self.overhead.items()}
        (self.run_dir / "probe_baseline.json").write_text(json.dumps(out, indent=1))


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
