"""Bringing the emulated network up and down: Mininet, link emulators, ryu-manager, self-check.

:func:`emulated_network` is a context manager shared by ``testbed run`` and the emulation tests:
it takes the single-run lock, removes leftovers of earlier runs and marks the run directories of
killed ones (``"status": "killed"``, :func:`testbed.emu.cleanup.mark_killed_runs`), writes the
intent log (with the run directory and the run's process, for the next run to judge), builds
Mininet, starts the link emulators, ryu-manager and the switches, waits until the controller has
every switch and link, writes ``network.json`` (what every link and host link applies) and, when
the scenario changes links, starts the probes that measure each change
(:class:`testbed.emu.dynamics.Dynamics`). On exit, whatever happened, the controller's event
log goes to ``controller_events.csv`` and every process, bridge, interface, control socket and
cgroup of the run is removed. :func:`rtt_self_check` pings every source -> cluster path.
"""

from __future__ import annotations

import csv
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from rich.console import Console
from rich.table import Table

from testbed.core import cgroups
from testbed.core.errors import InputError, RunFailure
from testbed.core.util import poll_until, repo_path, write_json_atomic
from testbed.emu.cleanup import (
    RUN_ENV,
    acquire_lock,
    foreign_bridges,
    killed_run_line,
    mark_killed_runs,
    process_identity,
    read_state,
    remove_control_dirs,
    remove_leftovers,
    remove_orphan_groups,
    write_state,
)
from testbed.emu.dynamics import Dynamics, write_controller_events
from testbed.emu.mininet_network import (
    Emulation,
    EmulationError,
    choose_datapath,
    choose_link_emulator,
)
from testbed.emu.netplan import planned_root_interfaces
from testbed.emu.selfcheck import check_rtts, check_rtts_twice, excess_per_switch_ms
from testbed.model.timeline import LINK_KINDS
from testbed.plan.boundaries import ControllerConfig, HostEntry
from testbed.plan.build import Plan
from testbed.plan.dilation import wall_clock
from testbed.sdn import client as ctl
from testbed.sdn.client import ControllerError, get_path

REQUIRED_TOOLS = ("ovs-vsctl", "ovs-appctl", "mnexec", "ethtool", "ping", "tc", "ip")
#: Capacity the controller reports for a probe host's (unshaped) link, Mbit/s.
PROBE_LINK_MBPS = 10000.0
RUN_SUBDIRS = ("logs", "linkemu", "clusters", "sources")


class RunError(RunFailure):
    """A precondition or a self-check of a run failed; the message says what to do."""


def preflight() -> None:
    """Root, the tools, and a running Open vSwitch.

    Raises:
        RunError: one is missing (exit code 2: nothing was built); the message says how to fix it.
    """
    import shutil

    if os.geteuid() != 0:
        raise RunError("testbed run needs root (Mininet, Open vSwitch, cgroups): run it with sudo",
                       InputError.exit_code)
    missing = [t for t in REQUIRED_TOOLS if shutil.which(t) is None]
    if missing:
        raise RunError(f"missing tools: {', '.join(missing)}; run ./install.sh", InputError.exit_code)
    for what, cmd in (("ovsdb-server", ["ovs-vsctl", "--timeout=5", "show"]),
                      ("ovs-vswitchd", ["ovs-appctl", "--timeout=5", "-t", "ovs-vswitchd", "version"])):
        # ovs-vsctl only talks to the database: a dead ovs-vswitchd (a SIGKILL is not restarted by
        # its monitor) made the bridges' creation wait 60 s and fail after the run began
        ovs = subprocess.run(cmd, capture_output=True, text=True)
        if ovs.returncode != 0:
            raise RunError(f"Open vSwitch is not running ({what} does not answer `{' '.join(cmd)}`): start it "
                           f"with `/usr/share/openvswitch/scripts/ovs-ctl start` (./install.sh does this)",
                           InputError.exit_code)


@dataclass
class Live:
    """A running emulation: Mininet network, ryu-manager, and where to reach the controller."""

    plan: Plan
    emu: Emulation
    run_id: str
    run_dir: Path
    rest_url: str
    link_emulator: str
    datapath: str
    bringup_s: float
    controller: subprocess.Popen | None = None
    dynamics: object = None  # testbed.emu.dynamics.Dynamics when the scenario changes links
    phases: dict[str, float] = field(default_factory=dict)  # bring-up step -> s since its start, when it ended
    _served: dict[str, list[str]] | None = field(default=None, repr=False)  # served(), fixed once built

    def components(self) -> dict[str, object]:
        """The long-running processes of the network, by component name (``ryu-manager``,
        ``linkemu-<node>``: one per link emulator process, ``E<g>``; ``probe-<host>``, ...), each a
        ``subprocess.Popen``-like object with ``poll()`` and ``returncode``, for the run's health
        watch."""
        out: dict[str, object] = {}
        if self.controller is not None:
            out["ryu-manager"] = self.controller
        for node, (proc, _links) in self._emulator_processes().items():
            out[f"linkemu-{node}"] = proc
        out.update(self.emu.components() if hasattr(self.emu, "components") else {})
        if self.dynamics is not None:
            out.update(self.dynamics.components())
        return out

    def _emulator_processes(self) -> dict[str, tuple[object, list[str]]]:
        emu = getattr(self.emu, "emulator_processes", None)
        return emu() if emu is not None else {}

    def served(self) -> dict[str, list[str]]:
        """Per component that serves several links (``linkemu-<node>``), the links it forwards, as
        ``lK (A-B)`` with the switches' labels: an incident of one process names every one. Built
        once (the health watch asks every tick; the processes' links do not change)."""
        if self._served is None:
            label = {s.name: s.label for s in self.plan.switches}
            ends = {lk.emu_name: f"{label[lk.a]}-{label[lk.b]}" for lk in self.plan.links}
            self._served = {f"linkemu-{node}": [f"{name} ({ends.get(name, '?')})" for name in links]
                            for node, (_proc, links) in self._emulator_processes().items()}
        return self._served

    def path_of(self, src_mac: str, dst_mac: str) -> tuple[list[int], float]:
        """The controller's installed path (DPIDs) and its one-way delay in ms."""
        p = get_path(self.rest_url, src_mac, dst_mac)
        return p["dpids"], p["delay_ms"]


def new_run_dir(plan: Plan, runs_dir: Path | None = None) -> tuple[str, Path]:
    """A fresh ``<runs_dir>/<YYYYmmdd-HHMMSS>-<name>`` directory with its sub-folders."""
    exp = plan.experiment
    run_id = f"{datetime.now():%Y%m%d-%H%M%S}-{exp.name}"
    base = Path(runs_dir) if runs_dir else repo_path(exp.runs_dir)
    run_dir = base / run_id
    for sub in RUN_SUBDIRS:
        (run_dir / sub).mkdir(parents=True, exist_ok=True)
    return run_id, run_dir


def wait_listening(port: int, proc: subprocess.Popen, timeout_s: float, host: str = "127.0.0.1") -> None:
    """Wait until ryu-manager accepts OpenFlow connections on ``host``:``port``, so the switches
    find it at their first attempt.

    Raises:
        RunFailure: it exited or did not listen within ``timeout_s``.
    """
    def listening() -> bool:
        with socket.socket() as s:
            s.settimeout(0.2)
            return s.connect_ex((host, port)) == 0

    poll_until(listening, timeout_s, f"ryu-manager listening on {host}:{port}", interval_s=0.01, proc=proc)


def _intent_log(plan: Plan, run_id: str, run_dir: Path, link_emulator: str, datapath: str) -> None:
    write_state({"run_id": run_id, "pid": os.getpid(), "process": process_identity(),
                 "run_dir": str(Path(run_dir).resolve()), "bridges": [s.name for s in plan.switches],
                 "interfaces": planned_root_interfaces(plan, link_emulator, datapath, run_id),
                 "cgroups": [str(cgroups.ROOT / sub / f"testbed-{run_id}-{c.name}")
                             for c in plan.clusters for sub in ("cpu", "memory", "")]})


def controller_config(plan: Plan, emu: Emulation) -> ControllerConfig:
    """The plan's controller view plus the probe hosts (their traffic is pinned, see :func:`_pins`)."""
    cfg = ControllerConfig.from_plan(plan, emu.host_ports)
    dpid = {s.name: s.dpid for s in plan.switches}
    probes = [HostEntry(name=p.name, mac=p.mac, ip=p.ip, dpid=dpid[p.switch], port=emu.host_ports[p.name],
                        bandwidth_mbps=PROBE_LINK_MBPS) for p in emu.probes]
    return ControllerConfig(switches=cfg.switches, links=cfg.links, hosts=[*cfg.hosts, *probes],
                            stats_interval_s=cfg.stats_interval_s)


def _pins(plan: Plan, emu: Emulation) -> list[dict]:
    """Probe pairs whose traffic the controller sends over exactly their link."""
    dpid = {s.name: s.dpid for s in plan.switches}
    by = {(p.link, p.side): p for p in emu.probes}
    return [{"a_mac": by[(i, "a")].mac, "b_mac": by[(i, "b")].mac, "a": dpid[by[(i, "a")].switch],
             "b": dpid[by[(i, "b")].switch]} for i, side in by if side == "a"]


def _launch_controller(plan: Plan, emu: Emulation, run_dir: Path):
    """Write the controller's config and pins and start ryu-manager (not waiting for it)."""
    em = plan.experiment.emulation
    cfg_path = ctl.write_config(run_dir / "controller.json", config=controller_config(plan, emu))
    pins = run_dir / "controller-pins.json"
    pins.write_text(json.dumps(_pins(plan, emu), indent=1))
    return ctl.start_controller(cfg_path, em.of_port, em.rest_port, run_dir / "logs" / "controller.log", pins,
                                of_host=emu.controller_host, check_s=0.0)  # wait_listening watches it


def _start_switches(plan: Plan, emu: Emulation, proc, run_id: str, console: Console, mark) -> None:
    """Once ryu-manager listens: the switches, then every switch, link and flow acknowledged. The
    controller settings are applied to the open connections as soon as every switch is connected,
    before the controller installs the flows: while it computes and sends them (20,484 flows on
    backbone/americas) it answers no echo request, and Open vSwitch's own 5 s probe would drop
    the switches, each reconnection making it recompute the routes again."""
    em = plan.experiment.emulation
    with console.status("starting the switches (ryu-manager discovers the links)..."):
        wait_listening(em.of_port, proc, timeout_s=30, host=emu.controller_host)
        mark("controller_listening")
        emu.start_switches(run_id)
        mark("switches_started")
        ctl.wait_ready(f"http://127.0.0.1:{em.rest_port}", timeout_s=60 + 2 * len(plan.links), poll_s=0.02,
                       nudge=emu.nudge_switches, on_connected=emu.apply_controller_settings)
        mark("controller_ready")


def _clean_up_earlier_runs(run_id: str, run_dir: Path, console: Console) -> None:
    """With the lock held: remove what earlier runs left in the system, then mark the run
    directories of runs that were killed (:func:`testbed.emu.cleanup.mark_killed_runs`: the
    one the intent log names and those beside ``run_dir``), one console line each.

    Raises:
        RunFailure: (exit code 3) a killed run's ``run.json`` cannot be rewritten.
    """
    state = read_state()
    left = remove_leftovers() + remove_control_dirs() + remove_orphan_groups()
    if left:
        console.print(f"removed {left} leftover item(s) of an earlier run")
    try:
        killed = mark_killed_runs(Path(run_dir).parent, f"run {run_id}", state)
    except OSError as exc:
        raise RunFailure(f"cannot mark a killed earlier run: {exc.filename}: {exc.strerror}; fix its permissions "
                         f"or move it out of {Path(run_dir).parent}") from None
    for d in killed:
        console.print(killed_run_line(d), markup=False, highlight=False)


@contextmanager
def emulated_network(plan: Plan, run_id: str, run_dir: Path, link_emulator: str | None = None,
                     console: Console | None = None) -> Iterator[Live]:
    """Bring up the network of ``plan`` and tear it down on exit, whatever happens (module docstring).

    Raises:
        RunError: not root, missing tools, OVS not running, or a bridge name owned by someone else.
        testbed.emu.cleanup.RunLockedError: another run is active.
        EmulationError: Mininet could not build, or netem/kernel datapath forced but missing.
        testbed.sdn.client.ControllerError: ryu-manager failed, or switches or links are missing
            after the timeout.
    """
    console = console or Console(quiet=True)
    exp = plan.experiment
    preflight()
    lock = acquire_lock()
    os.environ[RUN_ENV] = run_id
    emu: Emulation | None = None
    ctrl = None
    live: Live | None = None
    t_start = time.monotonic()
    phases: dict[str, float] = {}

    def mark(step: str) -> None:
        phases[step] = round(time.monotonic() - t_start, 3)

    try:
        _clean_up_earlier_runs(run_id, run_dir, console)
        le = choose_link_emulator(link_emulator or exp.emulation.link_emulator)
        dp = choose_datapath(exp.emulation.datapath)
        console.print(f"run {run_id}: link delay by {le}, OVS datapath {dp}; results in {run_dir}", markup=False)
        foreign = foreign_bridges([s.name for s in plan.switches], {run_id})
        if foreign:
            raise RunError(f"OVS bridge(s) {', '.join(foreign)} exist and are not ours; remove them or "
                           f"rename the switches (topology node 'name')")
        _intent_log(plan, run_id, run_dir, le, dp)
        plan.emulated.write_json(run_dir / "plan.json")  # in emulated time, as the records
        emu = Emulation(plan, le, dp, run_dir, run_id)
        if not emu.sharded:  # ryu-manager imports (~1 s) while Mininet builds; shards' address comes with the build
            ctrl = _launch_controller(plan, emu, run_dir)
        mark("preparation")
        with console.status("building the network (Mininet)..."):
            emu.build()  # also starts the link emulators
            mark("mininet_build")
            emu.create_bridges(run_id)  # without shards: bridges, ports, host-port HTB, while ryu starts
            mark("bridges_and_shaping")
            emu.start_link_emulators(sys.executable)
            mark("link_emulators_ready")
        if ctrl is None:
            ctrl = _launch_controller(plan, emu, run_dir)
        _start_switches(plan, emu, ctrl, run_id, console, mark)
        live = Live(plan, emu, run_id, run_dir, f"http://127.0.0.1:{exp.emulation.rest_port}", le, dp,
                    time.monotonic() - t_start, ctrl, phases=phases)
        console.print(f"controller ready: {len(plan.switches)} switches, {len(plan.links)} links discovered, "
                      f"flows installed ({live.bringup_s:.1f} s)")
        _write_network_json(live, console=console)
        _start_dynamics(live, console)
        yield live
    finally:
        try:
            _teardown_outputs(live, console)
        except Exception as exc:  # noqa: BLE001 - the network must come down whatever the outputs did
            console.print(f"warning: the run's last outputs were not all written: {exc}", markup=False)
        if emu is not None:
            try:
                emu.stop()
            except Exception as exc:  # noqa: BLE001 - the cleanup below still runs
                console.print(f"warning: Mininet stop: {exc}", markup=False)
        if ctrl is not None:
            ctl.stop_controller(ctrl)
        remove_leftovers()
        os.close(lock)
        os.environ.pop(RUN_ENV, None)


def _start_dynamics(live: Live, console: Console) -> None:
    """Probe daemons and their baseline, when the scenario changes links (module doc)."""
    kinds = {c.kind for c in live.plan.changes}
    if not kinds & LINK_KINDS:
        return
    with console.status("starting probes for the scenario's link events (baseline)..."):
        dyn = Dynamics(live.plan, live.emu, live.rest_url, live.run_dir)
        live.dynamics = dyn
        dyn.start()
        dyn.write_outputs()
    probed = ", ".join(f"{dyn.links[i].a}-{dyn.links[i].b} ({o[0]:.2f}/{o[1]:.2f} ms)"
                       for i, o in dyn.overhead.items())
    console.print(f"probes ready on {len(dyn.overhead)} link(s), probe-path overhead a>b/b>a: {probed}"
                  + (f"; source->cluster path probes on, {dyn.path_hz:.3g} Hz per path (wall clock)"
                     if dyn.path_probes else ""),
                  markup=False)


def _write_network_json(live: Live, final: bool = False, console: Console | None = None) -> None:
    """``network.json``: what each link and host link applies (and, at the end, the emulators'
    counters); at bring-up the console says how links are shaped and notes links shaped above
    what one emulator forwards."""

    table = live.emu.applied_table()
    if console is not None:
        rates = [r["bandwidth_mbps"] for r in table["links"]]
        hrates = [h["applied_mbps_switch_to_host"] for h in table["hosts"]]
        shaper = table["links"][0]["shaper"] if table["links"] else "-"
        console.print(f"shaping: {len(rates)} switch link(s) by {shaper} ({min(rates, default=0):g}-"
                      f"{max(rates, default=0):g} Mbit/s), {len(hrates)} host link(s) by tc htb on both ends "
                      f"({min(hrates, default=0):g}-{max(hrates, default=0):g} Mbit/s); see network.json",
                      markup=False, highlight=False)
        console.print(f"MTU: {table['mtu_bytes']} bytes on every interface (topology.mtu, read back at creation): "
                      f"{table['mss_bytes']} bytes of TCP payload per frame", markup=False, highlight=False)
        for r in table["links"]:
            if r.get("note"):
                console.print(f"note: link {r['link']}: {r['note']}", markup=False, highlight=False)
    if final and live.emu.emulator_procs:
        try:
            table["emulator_stats"] = live.emu.emulator_stats()
        except Exception as exc:  # noqa: BLE001 - an emulator already gone: say so, keep the rest
            table["emulator_stats"] = {"error": str(exc)}
    write_json_atomic(live.run_dir / "network.json", table, indent=1)


def _teardown_outputs(live: Live | None, console: Console) -> None:
    """Before anything stops: the controller's event log, the final network table, the probes."""
    if live is None:
        return
    try:
        write_controller_events(live.rest_url, live.run_dir / "controller_events.csv")
    except (ControllerError, OSError) as exc:  # OSError: the run folder moved or removed, a full disk
        console.print(f"warning: controller events not saved: {exc}", markup=False)
    try:
        _write_network_json(live, final=True)
    except Exception as exc:  # noqa: BLE001 - teardown must go on
        console.print(f"warning: network.json not updated: {exc}", markup=False)
    if live.dynamics is not None:
        live.dynamics.stop()


def _write_rtt_csv(results, run_dir: Path) -> None:
    with open(run_dir / "rtt_check.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["source", "cluster", "dpids", "expected_rtt_ms", "median_rtt_ms", "error_ms",
                    "tolerance_ms", "samples_ms", "ok", "attempt", "first_median_ms"])
        for r in results:
            first = "" if r.first_median_ms is None else f"{r.first_median_ms:.3f}"
            w.writerow([r.source, r.cluster, " ".join(map(str, r.dpids)), f"{r.expected_ms:.3f}",
                        f"{r.median_ms:.3f}", f"{r.error_ms:.3f}", f"{r.tolerance_ms:.3f}",
                        " ".join(f"{x:.3f}" for x in r.samples), int(r.ok), r.attempt, first])


def _print_rtt(results, console: Console) -> None:
    t = Table(title="RTT self-check (controller path, 2 x sum of one-way delays)")
    for col in ("source", "cluster", "expected ms", "measured median ms", "error ms", "ok"):
        t.add_column(col)
    for r in results:
        t.add_row(r.source, r.cluster, f"{r.expected_ms:.2f}", f"{r.median_ms:.2f}", f"{r.error_ms:+.2f}",
                  "yes" if r.ok else "NO")
    console.print(t)
    for r in results:
        if r.attempt > 1:
            console.print(f"re-measured after failing once: {r.source} -> {r.cluster}, first median "
                          f"{r.first_median_ms:.2f} ms, then {r.median_ms:.2f} ms", markup=False)
    errs = sorted(abs(r.error_ms) for r in results if r.samples)
    if errs:
        console.print(f"RTT error |measured - expected|: median {errs[len(errs) // 2]:.3f} ms, max {errs[-1]:.3f} ms")


def calibrate_datapath(live: Live, console: Console) -> dict:
    """Measure the datapath's own RTT per switch and take half of it off every switch link's
    emulated one-way delay (``emulation.compensate_datapath``, user-space link emulator only).

    The user-space datapath (OVS userspace, the link emulator's packet sockets) costs 0.5-0.8 ms
    of RTT per switch on a path here (the calibrations of docs/scale-out.md, "Datapath
    compensation"; plain Mininet alone 0.6 ms at 11 bridges), so, uncompensated, every emulated path
    is longer than configured by that much per switch. With ``rtt_check: false`` it still applies,
    and nothing checks the result. A link
    joins two switches: lowering each link's one-way delay by half the per-switch RTT removes all
    but one switch's worth from every path (k switches, k - 1 links); links shorter than the offset
    go to 0 ms and keep the rest. The RTT self-check that follows (tolerance unchanged) reports the
    residual error per path. The offset is measured at idle; under load the datapath costs more
    and the records measure that, as they measure everything else.

    Returns:
        ``applied: True`` and what ``datapath_calibration.json`` holds (per-path figures, the
        per-switch excess, the offset, the links at 0 ms), or ``applied: False`` and ``why``.

    Raises:
        EmulationError: no path answered a ping, or an emulator refused the change.
    """
    em = live.plan.experiment.emulation
    why = ("emulation.compensate_datapath is false" if not em.compensate_datapath
           else f"the link emulator is {live.link_emulator}, not userspace" if live.link_emulator != "userspace"
           else "no switch links" if not live.plan.links else None)
    if why:
        return {"applied": False, "why": why}
    with console.status("measuring the datapath's own latency (ping every source -> cluster path)..."):
        results = check_rtts(live.emu, live.plan, live.path_of, em.ping_count, em.rtt_tolerance_ms,
                             em.rtt_tolerance_pct, em.rtt_tolerance_per_switch_ms)
    per_switch = excess_per_switch_ms(results)
    if per_switch is None:
        raise EmulationError("datapath calibration: no source -> cluster path answered a ping; see "
                             f"{live.run_dir / 'logs'}")
    offset = round(max(0.0, per_switch) / 2.0, 4)
    floored = live.emu.compensate_delays(offset) if offset > 0 else []
    if offset > 0 and live.dynamics is not None:
        live.dynamics.baseline()  # the probe paths are shorter by the offset now
        live.dynamics.write_outputs()  # probe_baseline.json: the baseline the readbacks use
    # on the wall clock, as the emulators' delays it lowers (under time dilation k: k x the emulated ms)
    info = {"time_dilation": live.plan.time_dilation, "clock": "wall",
            "rtt_per_switch_ms": round(per_switch, 4), "link_offset_one_way_ms": offset,
            "links_at_zero": [f"{lk.a}-{lk.b}" for lk in live.plan.links if lk.index in set(floored)],
            "paths": [{"source": r.source, "cluster": r.cluster, "switches": len(r.dpids),
                       "expected_rtt_ms": round(r.expected_ms, 3),
                       "min_rtt_ms": round(min(r.samples), 3) if r.samples else None,
                       "median_rtt_ms": round(r.median_ms, 3) if r.samples else None} for r in results]}
    write_json_atomic(live.run_dir / "datapath_calibration.json", info, indent=1)
    console.print(f"datapath compensation: {per_switch:.3f} ms of RTT per switch measured (min over pings); each "
                  f"link's emulated one-way delay lowered by {offset:.3f} ms"
                  + (f" ({len(floored)} link(s) shorter, emulated at 0 ms)" if floored else "")
                  + "; see datapath_calibration.json", markup=False, highlight=False)
    return {"applied": True, **info}


def rtt_self_check(live: Live, console: Console) -> None:
    """Ping every source -> cluster path, a failed one once more
    (:func:`~testbed.emu.selfcheck.check_rtts_twice`), save ``rtt_check.csv``, print the table.

    Raises:
        EmulationError: a path is out of tolerance twice (the message names it and the figures; a path
            that answered no ping is named as broken, not slow).
    """
    em = live.plan.experiment.emulation
    with console.status("RTT self-check (ping every source -> cluster path)..."):
        results = check_rtts_twice(live.emu, live.plan, live.path_of, em.ping_count, em.rtt_tolerance_ms,
                                   em.rtt_tolerance_pct, em.rtt_tolerance_per_switch_ms,
                                   clock=wall_clock(live.plan))  # judged in emulated ms
    _write_rtt_csv(results, live.run_dir)
    _print_rtt(results, console)
    bad = [r for r in results if not r.ok]
    if bad:
        silent = [r for r in bad if not r.samples]
        b = (silent or bad)[0]
        why = (f"; {len(silent)} answered no ping at all, e.g. {b.source} -> {b.cluster} (expected "
               f"{b.expected_ms:.2f} ms): the path is broken (its flows, a link emulator or a host route), not slow"
               if silent else
               f", e.g. {b.source} -> {b.cluster}: measured {b.first_median_ms:.2f} then {b.median_ms:.2f} ms vs "
               f"expected {b.expected_ms:.2f} ms (tolerance {b.tolerance_ms:.2f} ms). The emulated delays are not "
               "trustworthy now (CPU overload?)")
        raise EmulationError(f"RTT self-check failed on {len(bad)} path(s), twice each{why}; see "
                             f"{live.run_dir / 'rtt_check.csv'}")


__all__ = ["Live", "RunError", "calibrate_datapath", "emulated_network", "new_run_dir", "preflight", "rtt_self_check",
           "wait_listening"]
