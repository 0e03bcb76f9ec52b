"""The load of an emulation (step 6 of :mod:`testbed.emu.lifecycle`): the sources started in their hosts
and released at one instant, what records the load beside them (the controller's link stats,
packet capture, the machine's CPU), the scenario's events, progress until every source has its
last answers, and the last word on every component.

Files in the run folder: ``sources/<name>.json`` (each source's config), ``sources/<name>.ready``
(a source ready to send), :data:`LOAD_START_FILE` (the common start, epoch ns), ``link_stats.csv``
and ``link_util.json`` (:class:`_LinkPoller`), ``machine_cpu_samples.json``, ``logs/source-<name>.log``.
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

from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from testbed.core.errors import EXIT_COMPONENT_DIED, RunFailure
from testbed.core.lifeline import tied_popen
from testbed.core.util import REPO_ROOT, stop_processes, write_json_atomic
from testbed.emu.bringup import Live
from testbed.emu.context import RunContext
from testbed.emu.event_runner import EventRunner
from testbed.emu.health import Component, HealthWatch, PidProcess, tagged_processes
from testbed.emu.machine import SAMPLES_FILE, CpuSampler, write_samples
from testbed.emu.pcap import start_capture
from testbed.emu.servers import ClusterServers
from testbed.emu.source import OPEN_TIMEOUT_S
from testbed.plan.boundaries import SourceConfig
from testbed.plan.build import Plan
from testbed.sdn.client import ControllerError, get_links
from testbed.spec.experiment import drain_s


class _LinkPoller(threading.Thread):
    """Polls the controller's per-link utilization into ``link_stats.csv`` every interval, and
    publishes the latest as ``link_util.json`` (what the sources' ASET observes). A write that
    fails (disk full) is retried with the next poll: the rows stay buffered."""

    FIELDS = ["t", "a", "a_port", "b", "b_port", "kind", "capacity_mbps", "rate_mbps_ab", "rate_mbps_ba",
              "util_ab", "util_ba", "drops_ab", "drops_ba", "drops_total"]

    def __init__(self, rest_url: str, path: Path, interval_s: float):
        super().__init__(daemon=True)
        self.rest_url, self.path, self.interval_s = rest_url, path, interval_s
        self.stop_event = threading.Event()
        self.failures = 0  # consecutive failed polls

    def run(self) -> None:
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
                try:
                    f.flush()
                    write_json_atomic(self.path.with_name("link_util.json"), {"t": time.time(), "links": util})
                except OSError:
                    continue  # disk full: the health watch reports it; the rows stay in the buffer


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


#: How long the sources may take to be ready (imports, request bodies; their connection to every
#: cluster adds :data:`testbed.emu.source.OPEN_TIMEOUT_S` x k: :func:`sources_ready_timeout_s`) before
#: the run gives up (s); and how far after the last one is ready the load starts (s).
SOURCES_READY_TIMEOUT_S = 120.0
START_LEAD_S = 0.3
#: How much longer than the run (s) a ready source waits for the load's start: the sources are
#: started one after another, so the first is ready before the run's wait for the last begins.
GO_MARGIN_S = 60.0
#: The load's common start time, in the run folder (``{"start_ns": N}``; not under ``sources/``,
#: whose files are named after the sources).
LOAD_START_FILE = "load_start.json"


def sources_ready_timeout_s(plan: Plan) -> float:
    """Wall s the sources of ``plan`` (the wall-clock plan, at its k) may take to be ready:
    :data:`SOURCES_READY_TIMEOUT_S` plus their first request to every cluster's timeout
    (:data:`testbed.emu.source.OPEN_TIMEOUT_S` x k)."""
    return SOURCES_READY_TIMEOUT_S + OPEN_TIMEOUT_S * max(1.0, plan.time_dilation)


def _start_sources(live: Live, duration_s: float, stack: ExitStack) -> dict[str, subprocess.Popen]:
    """One ``python -m testbed.emu.source`` per source with load, in its host, held at the start
    barrier (``sources/<name>.ready``, :data:`LOAD_START_FILE`: :func:`_release_sources`); stopped on
    ``stack`` exit. Every config is written before the first source starts, so that the sources
    start within moments of each other even on a machine whose CPU the network's daemons take."""
    procs: dict[str, subprocess.Popen] = {}
    stack.callback(stop_processes, procs.values(), signal.SIGINT)
    ready_s = sources_ready_timeout_s(live.plan)
    fallback_ns = time.time_ns() + int(ready_s * 1e9)  # LOAD_START_FILE replaces it
    paths = {}
    for name, cfg in SourceConfig.all_from_plan(live.plan, fallback_ns, duration_s, live.run_dir).items():
        cfg = cfg.model_copy(update={"ready_file": str(live.run_dir / "sources" / f"{name}.ready"),
                                     "go_file": str(live.run_dir / LOAD_START_FILE),
                                     "go_timeout_s": ready_s + GO_MARGIN_S})
        paths[name] = write_json_atomic(live.run_dir / "sources" / f"{name}.json", cfg)
    for name, path in paths.items():
        log = stack.enter_context(open(live.run_dir / "logs" / f"source-{name}.log", "w"))
        procs[name] = tied_popen(live.emu.node(name).popen, [sys.executable, "-m", "testbed.emu.source", str(path)],
                                 stdout=log, stderr=subprocess.STDOUT, cwd=str(REPO_ROOT))
    return procs


def _release_sources(live: Live, procs: dict[str, subprocess.Popen], watch: HealthWatch | None) -> int:
    """Wait until every source is ready to send, then give them one start time (:data:`LOAD_START_FILE`,
    :data:`START_LEAD_S` from now); returns it (epoch ns). Sources import and build their request
    bodies after they are started: with a fixed start 1 s ahead they can begin 0.5-2.4 s late on a
    busy machine, each at its own time, and the scenario's events, timed from the planned start,
    would fall elsewhere in their load.

    Raises:
        RunFailure: a source exited before it was ready (the health watch names it), or not every
            source was ready within :func:`sources_ready_timeout_s`.
    """
    sources = live.run_dir / "sources"
    ready_s = sources_ready_timeout_s(live.plan)
    deadline = time.monotonic() + ready_s
    while not all((sources / f"{n}.ready").exists() for n in procs):
        if watch is not None:
            watch.check()
            if watch.failure is not None:
                raise watch.failure
        dead = [n for n, p in procs.items() if p.poll() is not None]
        if dead:
            raise RunFailure(f"source(s) {', '.join(dead)} exited before the load began; see "
                             f"logs/source-<name>.log", EXIT_COMPONENT_DIED)
        if time.monotonic() > deadline:
            late = [n for n in procs if not (sources / f"{n}.ready").exists()]
            raise RunFailure(f"source(s) {', '.join(late)} not ready to send after {ready_s:g} s",
                             EXIT_COMPONENT_DIED)
        time.sleep(0.02)
    start_ns = time.time_ns() + int(START_LEAD_S * 1e9)
    write_json_atomic(live.run_dir / LOAD_START_FILE, {"start_ns": start_ns})
    return start_ns


def loaded_sources(plan: Plan) -> list[str]:
    """The sources some workload entry selects (the others start no process)."""
    return [s.name for s in plan.sources if any(s.name in w for w in plan.weights)]


def _watch_capture(live: Live, watch: HealthWatch) -> None:
    comps = [Component(f"tcpdump-{pid}", "packet capture", PidProcess(pid), None, known_code=False)
             for pid in tagged_processes(live.run_id, "tcpdump")]
    watch.add(lambda: comps)


def _start_recorders(ctx: RunContext) -> None:
    """What records the load beside the sources, stopped on ``ctx.stack`` exit: the link poller
    (``link_stats.csv``), the packet capture when the experiment asks for it, and the machine's
    CPU sampler (``machine_cpu_samples.json``; the summary takes the load's window)."""
    live, stack, exp = ctx.live, ctx.stack, ctx.plan.experiment
    poller = _LinkPoller(live.rest_url, ctx.run_dir / "link_stats.csv", exp.emulation.stats_interval_s)
    poller.start()
    stack.callback(poller.join, 3)
    stack.callback(poller.stop_event.set)
    if exp.capture is not None:
        start_capture(live, exp.capture, stack)
        _watch_capture(live, ctx.watch)
    machine = CpuSampler()
    machine.start()
    stack.callback(write_samples, machine, ctx.run_dir / SAMPLES_FILE)


def _start_events(ctx: RunContext, start_ns: int) -> EventRunner | None:
    """The scenario's event runner from the load's start (``start_ns``, epoch ns), each change
    shown on the console; None when the plan has no events. Stopped on ``ctx.stack`` exit."""
    if not ctx.plan.changes:
        return None

    clock = " of emulated time" if ctx.plan.time_dilation != 1.0 else ""  # events.csv is in emulated time

    def shown(row: dict) -> None:
        ctx.console.print(f"event {row['kind']} {row['target']} {row.get('phase', 'applied')} at "
                          f"{row['applied_s']:.2f} s{clock} (asked {row['value_asked'] or '-'}, measured "
                          f"{row['value_measured'] or '-'})", markup=False, highlight=False)

    events = EventRunner(ctx.live, ctx.servers, ctx.plan.changes, start_ns / 1e9, shown)
    ctx.events.append(events)
    events.start()
    ctx.stack.callback(events.join, 5)
    ctx.stack.callback(events.stop)
    return events


def _follow_load(ctx: RunContext, sources: dict[str, subprocess.Popen], events: EventRunner | None) -> None:
    """Show progress until every source has exited (or the hard stop: the load, its last queries'
    deadline + grace, and 30 s to write and exit).

    Raises:
        RunFailure: an event could not be applied, or not on time.
    """
    exp, duration_s = ctx.plan.experiment, ctx.duration_s
    counter = _RecordCounter([ctx.run_dir / "sources" / f"{s}.records.csv" for s in sources])
    label = "[bold]load[/bold]" if ctx.plan.time_dilation == 1.0 else "[bold]load[/bold] (wall clock)"
    with Progress(TextColumn(label), BarColumn(), TimeElapsedColumn(),
                  TextColumn("{task.fields[info]}", markup=False), console=ctx.console) as prog:
        task = prog.add_task("load", total=duration_s, info="")
        t_load = time.time()
        hard_stop = time.monotonic() + duration_s + 1 + drain_s([a.deadline_ms for a in exp.applications]) + 30
        while any(p.poll() is None for p in sources.values()) and time.monotonic() < hard_stop:
            time.sleep(0.5)
            if events is not None and events.error is not None:
                raise events.error
            if events is not None:
                events.check_on_time(time.time(), duration_s)
            counter.update()
            sr = counter.ok / counter.n if counter.n else 0.0
            prog.update(task, completed=min(duration_s, max(0.0, time.time() - t_load - 1)),
                        info=f"{counter.n} queries, success {sr:.3f}")


def run_load(ctx: RunContext) -> None:
    """Start every source at the same instant, apply the scenario events, show progress until the
    load ends and every source has its last answers (``ctx``: a running network, servers and watch).

    Raises:
        RunFailure: an event could not be applied, or a component died (the health watch).
    """
    _start_recorders(ctx)
    sources = _start_sources(ctx.live, ctx.duration_s, ctx.stack)
    logs = ctx.run_dir / "logs"
    comps = [Component(f"source-{n}", "query source", p, logs / f"source-{n}.log", normal_exit=frozenset({0}))
             for n, p in sources.items()]
    ctx.watch.add(lambda: comps)
    with ctx.console.status("starting the sources..."):
        start_ns = _release_sources(ctx.live, sources, ctx.watch)
    ctx.watch.load_started(start_ns / 1e9)
    events = _start_events(ctx, start_ns)
    _follow_load(ctx, sources, events)
    ctx.watch.check()  # a source that failed in the last instant, between two ticks
    if ctx.watch.failure is not None:
        raise ctx.watch.failure
    if events is not None:  # the last word: every change of the load fired, on time
        if events.error is not None:
            raise events.error
        events.check_on_time(time.time(), ctx.duration_s)
    _check_components(ctx.live, sources, ctx.servers)


def _check_components(live: Live, sources: dict[str, subprocess.Popen], servers: ClusterServers) -> None:
    """Every source exited 0 and every server is alive unless an event took it down (the health
    watch reports these at once; this is the last word when the load ends).

    Raises:
        RunFailure: (exit code 4) naming the component and its exit code.
    """
    for name, p in sources.items():
        if p.returncode not in (0, None):
            raise RunFailure(f"source {name} exited with code {p.returncode}; see "
                             f"{live.run_dir / 'logs' / f'source-{name}.log'}", EXIT_COMPONENT_DIED)
        if p.returncode is None:
            raise RunFailure(f"source {name} did not finish within deadline + grace + 30 s after the load",
                             EXIT_COMPONENT_DIED)
    for name, p in servers.procs.items():
        if p.poll() is not None and not servers.expected_dead(name):
            raise RunFailure(f"inference server {name} died (exit code {p.returncode}) during the run; see "
                             f"{servers.log_path(name)}", EXIT_COMPONENT_DIED)
