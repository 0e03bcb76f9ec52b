"""``testbed run``: bring up the emulation, run the workload, measure, tear down.

Order: checks (root, tools, model zoo) -> lock + cleanup of leftovers -> intent log -> Mininet build
-> link emulators -> ryu-manager -> switches -> wait until the controller sees every switch and
link -> RTT self-check -> inference servers (CPU-limited, warmed up) -> sources -> progress until
the load ends -> summary. Whatever happens (Ctrl-C, a crash, a failed check), the ``finally``
block stops everything we started and removes our namespaces, interfaces, bridges and cgroups;
records written so far stay in the run directory.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from testbed.emulation import cgroups
from testbed.emulation.cleanup import (
    RUN_ENV,
    RunLockedError,
    acquire_lock,
    foreign_bridges,
    remove_leftovers,
    write_state,
)
from testbed.emulation.network import (
    Emulation,
    EmulationError,
    choose_datapath,
    choose_link_emulator,
    planned_root_interfaces,
)
from testbed.emulation.selfcheck import check_rtts
from testbed.inference.launch import server_command
from testbed.inference.profiles import service_time
from testbed.plan import Plan
from testbed.summary import print_summary, summarize

REPO_ROOT = Path(__file__).resolve().parent.parent
REQUIRED_TOOLS = ("ovs-vsctl", "mnexec", "ethtool", "ping", "tc", "ip")
GRACE_MS = 2000.0  # how long a source waits past a query's deadline before calling it unanswered


class RunError(RuntimeError):
    """A precondition or a self-check failed; the message says what to do."""


def _preflight(plan: Plan) -> None:
    if os.geteuid() != 0:
        raise RunError("testbed run needs root (Mininet, Open vSwitch, cgroups): run it with sudo")
    missing = [t for t in REQUIRED_TOOLS if shutil.which(t) is None]
    if missing:
        raise RunError(f"missing tools: {', '.join(missing)}; run ./install.sh")
    ovs = subprocess.run(["ovs-vsctl", "--timeout=5", "show"], capture_output=True, text=True)
    if ovs.returncode != 0:
        raise RunError("Open vSwitch is not running (ovs-vsctl show failed): start it with "
                       "`/usr/share/openvswitch/scripts/ovs-ctl start` (./install.sh does this)")


def _repo_path(path: str) -> Path:
    """An experiment's folder setting: absolute as given, else relative to the repository."""
    return Path(path) if Path(path).is_absolute() else REPO_ROOT / path


def _model_table(plan: Plan) -> dict:
    """Accuracy (manifest) and expected service time (profile p95 / CPU share) per model, checked."""
    from testbed.inference import zoo

    exp = plan.experiment
    zoo_dir, prof_dir = _repo_path(exp.zoo_dir), _repo_path(exp.profiles_dir)
    zoo.ensure_zoo(zoo_dir)
    manifest = zoo.load_manifest(zoo_dir)
    variants = manifest["variants"]
    for c in plan.clusters:
        for m in c.models:
            if m not in variants:
                raise RunError(f"cluster {c.name!r}: model {m!r} is not in the zoo ({', '.join(variants)})")
    for a in exp.applications:
        fams = zoo.families(manifest)
        if a.family not in fams:
            raise RunError(f"application {a.name!r}: family {a.family!r} not in the zoo (has: {', '.join(fams)})")
    return {"zoo_dir": zoo_dir, "profiles_dir": prof_dir, "variants": variants}


def _source_configs(plan: Plan, models: dict, run_dir: Path, start_ns: int, duration_s: float,
                    base_dir: Path | None = None) -> list[Path]:
    """One JSON config per source with load (see :mod:`testbed.workload`): its workload streams
    (the same specs, weights and seeds as the simulator), options, policy, report interval."""
    from testbed.arrivals import source_weights

    exp = plan.experiment
    base_dir = base_dir or REPO_ROOT / "experiments"
    site_names = {h.name: (h.site, plan.switch(h.switch).node_id) for h in plan.sources}
    weights = []
    for w in exp.workload:
        sel = [s.name for s in plan.sources if w.sources == "all" or s.name in w.sources]
        weights.append(source_weights(w, [(n, site_names[n]) for n in sel], base_dir))
    paths = []
    for i, s in enumerate(plan.sources):
        streams = [{"index": wi, "spec": w.model_dump(mode="json"), "weight": weights[wi][s.name],
                    "base_dir": str(base_dir)}
                   for wi, w in enumerate(exp.workload) if s.name in weights[wi]]
        names = {st["spec"]["application"] for st in streams}
        apps = [{"name": a.name, "family": a.family, "deadline_ms": a.deadline_ms, "min_accuracy": a.min_accuracy}
                for a in exp.applications if a.name in names]
        if not apps:
            continue
        options = []
        for c in plan.clusters:
            spec = next(x for x in exp.clusters if x.name == c.name)
            for m in c.models:
                st = service_time(models["profiles_dir"], m, c.cpu_cores, runtime=spec.server.runtime_of(m))
                # Expected t_m at the cluster's share: the profile's p95 there (the simulator does the same).
                options.append({"cluster": c.name, "ip": c.ip, "model": m, "rtt_ms": plan.rtt_ms(s.name, c.name),
                                "service_ms": st.p95_ms, "mean_service_ms": st.mean_ms,
                                "accuracy": models["variants"][m]["accuracy"], "tier": c.tier,
                                "workers": c.workers or 1})
        path_links = {p.cluster: [[a, b] for a, b in zip(p.switches, p.switches[1:], strict=False)]
                      for p in plan.paths if p.source == s.name}
        spec_s = next(x for x in exp.sources if x.name == s.name)
        cfg = {"source": s.name, "source_index": i, "seed": exp.seed, "policy": spec_s.policy or exp.policy,
               "start_ns": start_ns, "duration_s": duration_s, "grace_ms": GRACE_MS,
               "report_interval_s": exp.report_interval_s,
               "server_port": exp.emulation.server_port, "applications": apps, "streams": streams,
               "options": options, "path_links": path_links, "link_util_file": str(run_dir / "link_util.json"),
               "aset": exp.aset.model_dump(mode="json") if exp.aset else {},
               "zoo_dir": str(models["zoo_dir"]), "repo_dir": str(REPO_ROOT),
               "records": str(run_dir / "sources" / f"{s.name}.records.csv")}
        p = run_dir / "sources" / f"{s.name}.json"
        p.write_text(json.dumps(cfg, indent=1))
        paths.append(p)
    return paths


class _LinkPoller(threading.Thread):
    """Polls the controller's per-link utilization into ``link_stats.csv`` every interval."""

    FIELDS = ["t", "a", "a_port", "b", "b_port", "kind", "capacity_mbps", "rate_mbps_ab", "rate_mbps_ba",
              "util_ab", "util_ba", "drops_ab", "drops_ba", "drops_total"]

    def __init__(self, rest_url: str, path: Path, interval_s: float):
        super().__init__(daemon=True)
        self.rest_url, self.path, self.interval_s = rest_url, path, interval_s
        self.stop_event = threading.Event()

    def run(self) -> None:
        from testbed.controller import get_links

        with open(self.path, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=self.FIELDS, extrasaction="ignore")
            w.writeheader()
            while not self.stop_event.wait(self.interval_s):
                try:
                    rows = get_links(self.rest_url)
                    util = {}
                    for row in rows:
                        w.writerow(row)
                        if row.get("kind") == "switch":
                            util[f"{row.get('a_name')}-{row.get('b_name')}"] = max(row.get("util_ab") or 0.0,
                                                                                 row.get("util_ba") or 0.0)
                    f.flush()
                    tmp = self.path.with_name("link_util.json.tmp")
                    tmp.write_text(json.dumps({"t": time.time(), "links": util}))
                    os.replace(tmp, self.path.with_name("link_util.json"))
                except Exception:  # noqa: BLE001 - a missed poll is not worth stopping the run
                    continue


def _count_records(files: list[Path], offsets: dict, counts: dict) -> None:
    """Add the complete record lines appended since the last call to ``counts`` (n, ok)."""
    for f in files:
        if not f.exists():
            continue
        with open(f, "rb") as fh:
            fh.seek(offsets.get(f, 0))
            chunk = fh.read()
        cut = chunk.rfind(b"\n") + 1
        offsets[f] = offsets.get(f, 0) + cut
        for line in chunk[:cut].splitlines():
            if line and not line.startswith(b"query_id"):
                counts["n"] += 1
                counts["ok"] += b",success," in line


def _print_rtt(results, console: Console, run_dir: Path) -> None:
    with open(run_dir / "rtt_check.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["source", "cluster", "dpids", "expected_rtt_ms", "median_rtt_ms", "error_ms",
                     "tolerance_ms", "samples_ms", "ok"])
        for r in results:
            w.writerow([r.source, r.cluster, " ".join(map(str, r.dpids)), f"{r.expected_ms:.3f}",
                        f"{r.median_ms:.3f}", f"{r.error_ms:.3f}", f"{r.tolerance_ms:.3f}",
                        " ".join(f"{x:.3f}" for x in r.samples), int(r.ok)])
    errs = sorted(abs(r.error_ms) for r in results if r.samples)
    t = Table(title="RTT self-check (controller path, 2 x sum of one-way delays)")
    for col in ("source", "cluster", "expected ms", "measured median ms", "error ms", "ok"):
        t.add_column(col)
    for r in results:
        t.add_row(r.source, r.cluster, f"{r.expected_ms:.2f}", f"{r.median_ms:.2f}", f"{r.error_ms:+.2f}",
                  "[green]yes[/green]" if r.ok else "[red]NO[/red]")
    console.print(t)
    if errs:
        console.print(f"RTT error |measured - expected|: median {errs[len(errs) // 2]:.3f} ms, max {errs[-1]:.3f} ms")


def _raise_interrupt(signum, frame) -> None:
    """SIGTERM handler: unwind exactly like Ctrl-C, so the same teardown runs."""
    raise KeyboardInterrupt


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

    def path_of(self, src_mac: str, dst_mac: str) -> tuple[list[int], float]:
        """The controller's installed path (DPIDs) and its one-way delay in ms."""
        from testbed.controller import get_path

        p = get_path(self.rest_url, src_mac, dst_mac)
        return p["dpids"], p["delay_ms"]


def new_run_dir(plan: Plan, runs_dir: Path | None = None) -> tuple[str, Path]:
    """A fresh ``<runs_dir>/<YYYYmmdd-HHMMSS>-<name>`` directory with its sub-folders."""
    exp = plan.experiment
    run_id = f"{datetime.now():%Y%m%d-%H%M%S}-{exp.name}"
    base = Path(runs_dir) if runs_dir else _repo_path(exp.runs_dir)
    run_dir = base / run_id
    for sub in ("logs", "linkemu", "clusters", "sources"):
        (run_dir / sub).mkdir(parents=True, exist_ok=True)
    return run_id, run_dir


def _wait_listening(port: int, proc: subprocess.Popen, timeout_s: float) -> None:
    """Wait until ryu-manager accepts OpenFlow connections on 127.0.0.1:``port``, so the switches
    find it at their first attempt. Raises RunError if it exits or times out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RunError(f"ryu-manager exited with code {proc.returncode}; see its log in the run directory")
        with socket.socket() as s:
            s.settimeout(0.2)
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise RunError(f"ryu-manager did not listen on 127.0.0.1:{port} within {timeout_s:g} s")


@contextmanager
def emulated_network(plan: Plan, run_id: str, run_dir: Path, link_emulator: str | None = None,
                     console: Console | None = None) -> Iterator[Live]:
    """Bring up the network of ``plan`` and tear it down on exit, whatever happens.

    Takes the single-run lock, removes leftovers of earlier runs, writes the intent log, builds
    Mininet, starts link emulators, ryu-manager and the switches, and waits until the controller has
    every switch and link. On exit: Mininet stopped, controller stopped, and every process,
    bridge, interface and cgroup of this run removed.

    Raises:
        RunError: not root, missing tools, OVS not running, or a bridge name owned by someone else.
        RunLockedError: another run is active.
        EmulationError: Mininet could not build, or netem/kernel datapath forced but missing.
        testbed.controller.ControllerNotReady: switches or links missing after the timeout.
    """
    from testbed import controller as ctl

    console = console or Console(quiet=True)
    exp = plan.experiment
    _preflight(plan)
    lock = acquire_lock()
    os.environ[RUN_ENV] = run_id
    emu: Emulation | None = None
    ctrl = None
    t_start = time.monotonic()
    try:
        left = remove_leftovers()
        if left:
            console.print(f"removed {left} leftover item(s) of an earlier run")
        le = choose_link_emulator(link_emulator or exp.emulation.link_emulator)
        dp = choose_datapath(exp.emulation.datapath)
        console.print(f"run {run_id}: link delay by [bold]{le}[/bold], OVS datapath [bold]{dp}[/bold]; "
                      f"results in {run_dir}")
        bridges = [s.name for s in plan.switches]
        foreign = foreign_bridges(bridges, {run_id})
        if foreign:
            raise RunError(f"OVS bridge(s) {', '.join(foreign)} exist and are not ours; remove them or "
                           f"rename the switches (topology node 'name')")
        write_state({"run_id": run_id, "pid": os.getpid(), "bridges": bridges,
                     "interfaces": planned_root_interfaces(plan, le),
                     "cgroups": [str(cgroups.ROOT / sub / f"testbed-{run_id}-{c.name}")
                                 for c in plan.clusters for sub in ("cpu", "memory", "")]})
        plan.write_json(run_dir / "plan.json")
        with console.status("building the network (Mininet)..."):
            emu = Emulation(plan, le, dp, run_dir)
            emu.build()
            emu.start_link_emulators(sys.executable)
        sw_dpid = {s.name: s.dpid for s in plan.switches}
        cfg_path = run_dir / "controller.json"
        ctl.write_config(
            cfg_path,
            switches=[{"name": s.name, "dpid": s.dpid} for s in plan.switches],
            links=[{"a": sw_dpid[lk.a], "b": sw_dpid[lk.b], "delay_ms": lk.delay_ms,
                    "bandwidth_mbps": lk.bandwidth_mbps} for lk in plan.links],
            hosts=[{"name": h.name, "mac": h.mac, "ip": h.ip, "dpid": sw_dpid[h.switch],
                    "port": emu.host_ports[h.name], "delay_ms": 0.0, "bandwidth_mbps": h.bandwidth_mbps}
                   for h in plan.hosts],
            stats_interval_s=exp.emulation.stats_interval_s,
        )
        rest_url = f"http://127.0.0.1:{exp.emulation.rest_port}"
        with console.status("starting ryu-manager and the switches..."):
            ctrl = ctl.start_controller(cfg_path, exp.emulation.of_port, exp.emulation.rest_port,
                                        run_dir / "logs" / "controller.log")
            _wait_listening(exp.emulation.of_port, ctrl, timeout_s=30)
            emu.start_switches(run_id)
            ctl.wait_ready(rest_url, timeout_s=60 + 2 * len(plan.links))
        live = Live(plan, emu, run_id, run_dir, rest_url, le, dp, time.monotonic() - t_start)
        console.print(f"controller ready: {len(plan.switches)} switches, {len(plan.links)} links discovered, "
                      f"flows installed ({live.bringup_s:.1f} s)")
        yield live
    finally:
        if emu is not None:
            try:
                emu.stop()
            except Exception as exc:  # noqa: BLE001 - the cleanup below still runs
                console.print(f"[yellow]warning:[/yellow] Mininet stop: {exc}")
        if ctrl is not None:
            ctl.stop_controller(ctrl)
        remove_leftovers()
        os.close(lock)
        os.environ.pop(RUN_ENV, None)


def rtt_self_check(live: Live, console: Console) -> None:
    """Ping every source -> cluster path, save ``rtt_check.csv``, print the table.

    Raises:
        EmulationError: a path is out of tolerance (the message names it and the figures).
    """
    em = live.plan.experiment.emulation
    with console.status("RTT self-check (ping every source -> cluster path)..."):
        results = check_rtts(live.emu, live.plan, live.path_of, em.ping_count, em.rtt_tolerance_ms,
                             em.rtt_tolerance_pct, em.rtt_tolerance_per_switch_ms)
    _print_rtt(results, console, live.run_dir)
    bad = [r for r in results if not r.ok]
    if bad:
        b = bad[0]
        raise EmulationError(
            f"RTT self-check failed on {len(bad)} path(s), e.g. {b.source} -> {b.cluster}: measured "
            f"{b.median_ms:.2f} ms vs expected {b.expected_ms:.2f} ms (tolerance {b.tolerance_ms:.2f} ms). "
            f"The emulated delays are not trustworthy now (CPU overload?); see {live.run_dir / 'rtt_check.csv'}")


def start_servers(live: Live, models: dict, stack: ExitStack, timeout_s: float = 180.0) -> dict[str, subprocess.Popen]:
    """Start one CPU-limited inference server per cluster host and wait until all are warmed up.

    Raises:
        RunError: a server exited or was not ready within ``timeout_s``.
        CgroupError: the CPU limit cannot be applied.
    """
    exp, run_dir = live.plan.experiment, live.run_dir
    servers: dict[str, subprocess.Popen] = {}
    stack.callback(_stop_processes, servers.values(), signal.SIGTERM)
    for c in live.plan.clusters:
        spec = next(x for x in exp.clusters if x.name == c.name)
        cg = cgroups.create_limited_group(f"testbed-{live.run_id}-{c.name}", c.cpu_cores, spec.memory_mib)
        log = stack.enter_context(open(run_dir / "logs" / f"server-{c.name}.log", "w"))
        cmd = server_command(spec, c.cpu_cores, exp.emulation.server_port, models["zoo_dir"], run_dir)
        p = live.emu.node(c.name).popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=str(REPO_ROOT))
        servers[c.name] = p
        cgroups.add_process(cg, p.pid)
    deadline = time.monotonic() + timeout_s
    while True:
        dead = [n for n, p in servers.items() if p.poll() is not None]
        if dead:
            raise RunError(f"inference server {dead[0]} exited (code {servers[dead[0]].returncode}); "
                           f"see {run_dir / 'logs' / f'server-{dead[0]}.log'}")
        waiting = [n for n in servers if not (run_dir / "clusters" / f"{n}.ready.json").exists()]
        if not waiting:
            return servers
        if time.monotonic() > deadline:
            raise RunError(f"inference servers {', '.join(waiting)} not ready after {timeout_s:g} s; "
                           f"see {run_dir / 'logs'}")
        time.sleep(0.2)


def _stop_processes(procs, sig: int) -> None:
    procs = list(procs)
    for p in procs:
        if p.poll() is None:
            p.send_signal(sig)
    for p in procs:
        try:
            p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            p.kill()


class _EventRunner(threading.Thread):
    """Applies the experiment's scenario events during the load. Emulated: ``cluster_down`` /
    ``cluster_up`` (SIGSTOP / SIGCONT of the cluster's server: it stops answering, queries time out;
    queued ones are served late after the recovery). ``link_delay`` / ``link_congestion`` are not
    emulated yet (the user-space link emulator has no run-time control): logged and skipped."""

    def __init__(self, events, servers: dict, t_start: float, log: Path):
        super().__init__(daemon=True)
        self.events, self.servers, self.t_start, self.log = events, servers, t_start, log
        self.stop_event = threading.Event()

    def run(self) -> None:
        with open(self.log, "w") as f:
            for ev in sorted(self.events, key=lambda e: e.at_s):
                if self.stop_event.wait(max(0.0, self.t_start + ev.at_s - time.time())):
                    return
                if ev.kind in ("cluster_down", "cluster_up") and ev.cluster in self.servers:
                    p = self.servers[ev.cluster]
                    if p.poll() is None:
                        p.send_signal(signal.SIGSTOP if ev.kind == "cluster_down" else signal.SIGCONT)
                    f.write(f"{time.time():.3f} {ev.kind} {ev.cluster}\n")
                else:
                    f.write(f"{time.time():.3f} {ev.kind} NOT EMULATED (simulator only): {ev.model_dump()}\n")
                f.flush()

    def resume_all(self) -> None:
        """SIGCONT every server (so that teardown can stop them)."""
        for p in self.servers.values():
            if p.poll() is None:
                p.send_signal(signal.SIGCONT)


def run_load(live: Live, models: dict, duration_s: float, stack: ExitStack, console: Console,
             servers: dict | None = None, base_dir: Path | None = None) -> None:
    """Start every source at the same instant, apply the scenario events, show progress until the
    load ends. ``servers``: cluster name -> server process (for cluster failure events)."""
    exp, run_dir = live.plan.experiment, live.run_dir
    poller = _LinkPoller(live.rest_url, run_dir / "link_stats.csv", exp.emulation.stats_interval_s)
    poller.start()
    stack.callback(poller.join, 3)
    stack.callback(poller.stop_event.set)
    sources: list[subprocess.Popen] = []
    stack.callback(_stop_processes, sources, signal.SIGINT)
    if exp.capture is not None:
        from testbed.capture.capture import start_capture

        start_capture(live, exp.capture, stack)
    start_ns = time.time_ns() + 1_000_000_000
    cfgs = _source_configs(live.plan, models, run_dir, start_ns, duration_s, base_dir)
    if exp.events:
        events = _EventRunner(exp.events, servers or {}, start_ns / 1e9, run_dir / "logs" / "events.log")
        events.start()
        stack.callback(events.resume_all)
        stack.callback(events.join, 3)
        stack.callback(events.stop_event.set)
    for cfg in cfgs:
        log = stack.enter_context(open(run_dir / "logs" / f"source-{cfg.stem}.log", "w"))
        sources.append(live.emu.node(cfg.stem).popen([sys.executable, "-m", "testbed.workload", str(cfg)],
                                                     stdout=log, stderr=subprocess.STDOUT, cwd=str(REPO_ROOT)))
    files = [c.with_name(f"{c.stem}.records.csv") for c in cfgs]
    offsets: dict = {}
    counts = {"n": 0, "ok": 0}
    with Progress(TextColumn("[bold]load[/bold]"), BarColumn(), TimeElapsedColumn(),
                  TextColumn("{task.fields[info]}"), console=console) as prog:
        task = prog.add_task("load", total=duration_s, info="")
        t_load = time.time()
        hard_stop = time.monotonic() + duration_s + 1 + GRACE_MS / 1e3 + 30
        while any(p.poll() is None for p in sources) and time.monotonic() < hard_stop:
            time.sleep(0.5)
            _count_records(files, offsets, counts)
            sr = counts["ok"] / counts["n"] if counts["n"] else 0.0
            prog.update(task, completed=min(duration_s, max(0.0, time.time() - t_load - 1)),
                        info=f"{counts['n']} queries, success {sr:.3f}")
    failed = [p for p in sources if p.returncode not in (0, None)]
    if failed:
        console.print(f"[yellow]warning:[/yellow] {len(failed)} source(s) exited with an error; "
                      f"see {run_dir / 'logs'}")


def run_experiment(plan: Plan, console: Console | None = None, runs_dir: Path | None = None,
                   duration_s: float | None = None, link_emulator: str | None = None,
                   base_dir: Path | None = None) -> int:
    """Run a planned experiment end to end; returns the exit code (0 ok, 2 bad input or
    precondition, 3 a component or self-check failed, 130 interrupted). Results go to
    ``runs_dir/<timestamp>-<name>/``; records measured before an interruption are kept and summarised.
    """
    from testbed.controller import ControllerError

    console = console or Console()
    try:
        _preflight(plan)
        models = _model_table(plan)
    except RunError as exc:
        console.print(f"[red]error:[/red] {exc}")
        return 2
    duration_s = duration_s or plan.experiment.duration_s
    run_id, run_dir = new_run_dir(plan, runs_dir)
    prev = signal.signal(signal.SIGTERM, _raise_interrupt)
    status = 0
    timings: dict[str, float] = {}
    t0 = time.monotonic()
    try:
        with emulated_network(plan, run_id, run_dir, link_emulator, console) as live, ExitStack() as stack:
            timings["network_s"] = live.bringup_s
            (run_dir / "run.json").write_text(json.dumps(
                {"mode": "emulation", "run_id": run_id, "link_emulator": live.link_emulator,
                 "datapath": live.datapath, "duration_s": duration_s, "seed": plan.experiment.seed,
                 "report_interval_s": plan.experiment.report_interval_s}, indent=1))
            if plan.experiment.emulation.rtt_check:
                rtt_self_check(live, console)
            with console.status("starting inference servers (TensorFlow, warm-up)..."):
                servers = start_servers(live, models, stack)
            timings["bringup_s"] = time.monotonic() - t0
            console.print(f"{len(servers)} inference servers ready; bring-up took {timings['bringup_s']:.1f} s")
            run_load(live, models, duration_s, stack, console, servers, base_dir)
            timings["total_s"] = time.monotonic() - t0
    except KeyboardInterrupt:
        console.print("[yellow]interrupted: stopped and cleaned up; what was measured so far is kept[/yellow]")
        status = 130
    except (RunError, RunLockedError) as exc:
        console.print(f"[red]error:[/red] {exc}")
        status = 2 if not timings else 3
    except (EmulationError, cgroups.CgroupError, ControllerError) as exc:
        console.print(f"[red]error:[/red] {exc}")
        status = 3
    finally:
        signal.signal(signal.SIGTERM, prev)
    if any((run_dir / "sources").glob("*.records.csv")):
        if plan.experiment.capture is not None and (run_dir / "pcap").is_dir():
            from testbed.capture.analysis import analyze_run

            analyze_run(run_dir)
        s = summarize(run_dir, duration_s)
        s["timings_s"] = {k: round(v, 2) for k, v in timings.items()}
        (run_dir / "summary.json").write_text(json.dumps(s, indent=2))
        print_summary(s, console, run_dir)
    console.print(f"run directory: {run_dir}")
    return status
