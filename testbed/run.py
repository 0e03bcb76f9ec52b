"""``testbed run``: bring up the emulation, run the workload, measure, tear down.

Steps, in order (each a function below): preflight (root, tools, OVS) -> the network
(:func:`testbed.emulation.bringup.emulated_network`: lock, cleanup of leftovers, intent log,
Mininet, link emulators, ryu-manager, switches, every link discovered) -> RTT self-check ->
inference servers (CPU-limited, warmed up; :mod:`testbed.emulation.servers`) -> the load: every
source starts at the same instant, scenario events apply at their times
(:mod:`testbed.emulation.events`), link statistics are polled, progress is shown -> checks that
every component lived and something was measured -> summary. Whatever happens (Ctrl-C, a crash, a
failed check) the network's context manager stops everything we started and removes our
namespaces, interfaces, bridges and cgroups; records written so far stay in the run directory.

Exit codes: :mod:`testbed.errors`.
"""

from __future__ import annotations

import csv
import signal
import subprocess
import sys
import threading
import time
from contextlib import ExitStack
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from testbed.boundaries import SourceConfig
from testbed.emulation.bringup import Live, RunError, emulated_network, new_run_dir, preflight, rtt_self_check
from testbed.emulation.events import EventRunner, unsupported
from testbed.emulation.servers import ClusterServers
from testbed.errors import (
    EXIT_COMPONENT_DIED,
    EXIT_INTERRUPTED,
    EXIT_NOTHING_MEASURED,
    EXIT_OK,
    RunFailure,
    TestbedError,
)
from testbed.model.records import GRACE_MS
from testbed.plan import Plan
from testbed.summary import print_summary, summarize
from testbed.util import REPO_ROOT, stop_processes, write_json_atomic

__all__ = ["Live", "RunError", "emulated_network", "new_run_dir", "run_experiment"]


class _LinkPoller(threading.Thread):
    """Polls the controller's per-link utilization into ``link_stats.csv`` every interval, and
    publishes the latest as ``link_util.json`` (what the sources' ASET observes)."""

    FIELDS = ["t", "a", "a_port", "b", "b_port", "kind", "capacity_mbps", "rate_mbps_ab", "rate_mbps_ba",
              "util_ab", "util_ba", "drops_ab", "drops_ba", "drops_total"]

    def __init__(self, rest_url: str, path: Path, interval_s: float):
        super().__init__(daemon=True)
        self.rest_url, self.path, self.interval_s = rest_url, path, interval_s
        self.stop_event = threading.Event()
        self.failures = 0  # consecutive failed polls

    def run(self) -> None:
        from testbed.controller import ControllerError, get_links

        with open(self.path, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=self.FIELDS, extrasaction="ignore")
            w.writeheader()
            while not self.stop_event.wait(self.interval_s):
                try:
                    rows = get_links(self.rest_url)
                except ControllerError:
                    self.failures += 1
                    continue
                self.failures = 0
                util = {}
                for row in rows:
                    w.writerow(row)
                    if row.get("kind") == "switch":
                        util[f"{row.get('a_name')}-{row.get('b_name')}"] = max(row.get("util_ab") or 0.0,
                                                                             row.get("util_ba") or 0.0)
                f.flush()
                write_json_atomic(self.path.with_name("link_util.json"), {"t": time.time(), "links": util})


class _RecordCounter:
    """Counts the complete record lines the sources appended since the last call (progress)."""

    def __init__(self, files: list[Path]):
        self.files, self.offsets = files, dict.fromkeys(files, 0)
        self.n = self.ok = 0

    def update(self) -> None:
        for f in self.files:
            if not f.exists():
                continue
            with open(f, "rb") as fh:
                fh.seek(self.offsets[f])
                chunk = fh.read()
            cut = chunk.rfind(b"\n") + 1
            self.offsets[f] += cut
            for line in chunk[:cut].splitlines():
                if line and not line.startswith(b"query_id"):
                    self.n += 1
                    self.ok += b",success," in line


def _raise_interrupt(signum, frame) -> None:
    """SIGTERM handler: unwind exactly like Ctrl-C, so the same teardown runs."""
    raise KeyboardInterrupt


def _start_sources(live: Live, start_ns: int, duration_s: float, stack: ExitStack) -> dict[str, subprocess.Popen]:
    """One ``python -m testbed.workload`` per source with load, in its host; stopped on ``stack`` exit."""
    procs: dict[str, subprocess.Popen] = {}
    stack.callback(stop_processes, procs.values(), signal.SIGINT)
    for s in live.plan.sources:
        cfg = SourceConfig.from_plan(live.plan, s.name, start_ns, duration_s, live.run_dir)
        if cfg is None:
            continue
        path = write_json_atomic(live.run_dir / "sources" / f"{s.name}.json", cfg)
        log = stack.enter_context(open(live.run_dir / "logs" / f"source-{s.name}.log", "w"))
        procs[s.name] = live.emu.node(s.name).popen([sys.executable, "-m", "testbed.workload", str(path)],
                                                    stdout=log, stderr=subprocess.STDOUT, cwd=str(REPO_ROOT))
    return procs


def _tail(path: Path, n: int = 5) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no log)"


def _check_components(live: Live, sources: dict[str, subprocess.Popen], servers: ClusterServers) -> None:
    """Every source exited 0 and every server is alive unless an event took it down.

    Raises:
        RunFailure: (exit code 4) naming the component, its exit code and its last log lines.
    """
    logs = live.run_dir / "logs"
    for name, p in sources.items():
        if p.returncode not in (0, None):
            raise RunFailure(f"source {name} exited with code {p.returncode}; last lines of its log:\n"
                             f"{_tail(logs / f'source-{name}.log')}", EXIT_COMPONENT_DIED)
    for name, p in servers.procs.items():
        if p.poll() is not None and not servers.expected_dead(name):
            raise RunFailure(f"inference server {name} died (exit code {p.returncode}) during the run; last lines "
                             f"of its log:\n{_tail(logs / f'server-{name}.log')}", EXIT_COMPONENT_DIED)


def run_load(live: Live, duration_s: float, stack: ExitStack, console: Console, servers: ClusterServers) -> None:
    """Start every source at the same instant, apply the scenario events, show progress until the
    load ends and every source has its last answers.

    Raises:
        RunFailure: an event could not be applied, or a component died (see :func:`_check_components`).
    """
    exp, run_dir = live.plan.experiment, live.run_dir
    poller = _LinkPoller(live.rest_url, run_dir / "link_stats.csv", exp.emulation.stats_interval_s)
    poller.start()
    stack.callback(poller.join, 3)
    stack.callback(poller.stop_event.set)
    if exp.capture is not None:
        from testbed.capture.capture import start_capture

        start_capture(live, exp.capture, stack)
    start_ns = time.time_ns() + 1_000_000_000
    sources = _start_sources(live, start_ns, duration_s, stack)
    events = None
    if live.plan.changes:
        def shown(row: dict) -> None:
            console.print(f"event {row['kind']} {row['target']} at {row['applied_s']:.2f} s "
                          f"(asked {row['value_asked'] or '-'}, measured {row['value_measured'] or '-'})",
                          markup=False, highlight=False)

        events = EventRunner(live, servers, live.plan.changes, start_ns / 1e9, shown)
        events.start()
        stack.callback(events.join, 5)
        stack.callback(events.stop)
    counter = _RecordCounter([run_dir / "sources" / f"{s}.records.csv" for s in sources])
    with Progress(TextColumn("[bold]load[/bold]"), BarColumn(), TimeElapsedColumn(),
                  TextColumn("{task.fields[info]}"), console=console) as prog:
        task = prog.add_task("load", total=duration_s, info="")
        t_load = time.time()
        hard_stop = time.monotonic() + duration_s + 1 + GRACE_MS / 1e3 + 30
        while any(p.poll() is None for p in sources.values()) and time.monotonic() < hard_stop:
            time.sleep(0.5)
            if events is not None and events.error is not None:
                raise events.error
            counter.update()
            sr = counter.ok / counter.n if counter.n else 0.0
            prog.update(task, completed=min(duration_s, max(0.0, time.time() - t_load - 1)),
                        info=f"{counter.n} queries, success {sr:.3f}")
    _check_components(live, sources, servers)


def _summarize(plan: Plan, run_dir: Path, duration_s: float, timings: dict, console: Console) -> dict | None:
    if not any((run_dir / "sources").glob("*.records.csv")):
        return None
    if plan.experiment.capture is not None and (run_dir / "pcap").is_dir():
        from testbed.capture.analysis import analyze_run

        analyze_run(run_dir)
    s = summarize(run_dir, duration_s)
    s["timings_s"] = {k: round(v, 2) for k, v in timings.items()}
    write_json_atomic(run_dir / "summary.json", s, indent=2)
    print_summary(s, console, run_dir)
    return s


def _emulate(plan: Plan, run_id: str, run_dir: Path, duration_s: float, link_emulator: str | None,
             console: Console, timings: dict) -> None:
    """Bring-up, self-check, servers and load, inside the network's context manager."""
    t0 = time.monotonic()
    with emulated_network(plan, run_id, run_dir, link_emulator, console) as live, ExitStack() as stack:
        timings["network_s"] = live.bringup_s
        write_json_atomic(run_dir / "run.json", {
            "mode": "emulation", "run_id": run_id, "link_emulator": live.link_emulator, "datapath": live.datapath,
            "duration_s": duration_s, "seed": plan.experiment.seed,
            "report_interval_s": plan.experiment.report_interval_s})
        if plan.experiment.emulation.rtt_check:
            rtt_self_check(live, console)
        servers = ClusterServers(live, stack)
        with console.status("starting inference servers (warm-up)..."):
            servers.start_all()
        timings["bringup_s"] = time.monotonic() - t0
        console.print(f"{len(servers.procs)} inference servers ready; bring-up took {timings['bringup_s']:.1f} s")
        run_load(live, duration_s, stack, console, servers)
        timings["total_s"] = time.monotonic() - t0


def run_experiment(plan: Plan, console: Console | None = None, runs_dir: Path | None = None,
                   duration_s: float | None = None, link_emulator: str | None = None,
                   base_dir: Path | None = None) -> int:
    """Run a planned experiment end to end; returns the exit code (:mod:`testbed.errors`). Results
    go to ``runs_dir/<timestamp>-<name>/``; records measured before a failure or an interruption
    are kept and summarised. ``base_dir`` is unused (the plan carries the experiment's folder)."""
    console = console or Console()
    bad = unsupported(plan.changes)
    try:
        preflight()
        if bad:
            raise RunError(f"the emulation cannot apply {', '.join(bad)} yet; run the scenario with "
                           f"`testbed simulate`, or remove the event", 2)
    except RunError as exc:
        console.print(f"error: {exc}", markup=False, highlight=False)
        return exc.exit_code
    duration_s = duration_s or plan.experiment.duration_s
    run_id, run_dir = new_run_dir(plan, runs_dir)
    prev = signal.signal(signal.SIGTERM, _raise_interrupt)
    status, timings = EXIT_OK, {}
    try:
        _emulate(plan, run_id, run_dir, duration_s, link_emulator, console, timings)
    except KeyboardInterrupt:
        console.print("interrupted: stopped and cleaned up; what was measured so far is kept", markup=False)
        status = EXIT_INTERRUPTED
    except TestbedError as exc:
        console.print(f"error: {exc}", markup=False, highlight=False)
        status = exc.exit_code
    finally:
        signal.signal(signal.SIGTERM, prev)
    s = _summarize(plan, run_dir, duration_s, timings, console)
    if status == EXIT_OK and (s is None or not s.get("queries")):
        console.print("error: the run measured no query", markup=False)
        status = EXIT_NOTHING_MEASURED
    console.print(f"run directory: {run_dir}", markup=False, highlight=False)
    write_json_atomic(run_dir / "exit.json", {"exit_code": status})
    return status
