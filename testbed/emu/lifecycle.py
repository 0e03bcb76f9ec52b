"""``testbed run``: bring up the emulation, run the workload, measure, tear down.

Steps, in order (each a function below):

1. checks before anything is built (:func:`check_before_bringup`): root, tools and OVS
   (:func:`testbed.emu.bringup.preflight`), events the emulation can apply, the load within
   the engines' bounds (also for ``--duration``), the OpenFlow and REST ports free, the machine
   big enough (:mod:`testbed.emu.capacity`: memory, processes, file descriptors), the run
   directory writable with room for the run (:class:`testbed.emu.storage.Storage`, stating its
   estimate) and its paths within the Linux limits;
2. the network (:func:`testbed.emu.bringup.emulated_network`: lock, cleanup of leftovers,
   intent log, Mininet, link emulators, ryu-manager, switches, every link discovered); from here
   on the health watch (:mod:`testbed.emu.health`) watches every component, the links and the disk;
3. RTT self-check; 4. inference servers (CPU-limited, warmed up; :mod:`testbed.emu.servers`);
5. every source's path to every (cluster, model) warmed (:meth:`ClusterServers.warm_paths`);
6. the load: every source starts at the same instant, scenario events apply at their times
   (:mod:`testbed.emu.event_runner`), link statistics are polled, progress is shown.

The steps hand one :class:`~testbed.emu.context.RunContext` on (:mod:`testbed.emu.context`); the
load is :mod:`testbed.emu.load`'s; :func:`emulate` runs them and yields what they measured
(:class:`~testbed.emu.context.EmulationOutcome`). The summary, from the records whatever happened before, is
the results layer's (:func:`testbed.results.runs.run_emulation`: engine, then merge, summary and
exit code), above this engine.

A component that dies during the run stops it at once with exit code 4, unless an event planned
it (``cluster_down``): the health watch reports it on the console and in ``run.json`` and raises
it in this thread. ryu-manager is not restarted (docs/trustworthy-runs.md says why). Whatever
happens (Ctrl-C, a crash, a failed check) the network's context manager stops everything we
started and removes our namespaces, interfaces, bridges and cgroups; records written so far stay
in the run directory and are merged and summarised.

Exit codes: :mod:`testbed.core.errors`. ``run.json`` holds what the run was and what happened to it
(``health``, ``failure``, ``exit_code``, and ``process``: who runs it); a run directory whose
``run.json`` has no ``exit_code`` belongs to a run that was killed (SIGKILL) before it could
finish, and the next run marks it ``"status": "killed"``
(:func:`testbed.emu.cleanup.mark_killed_runs`). Every child process gets SIGTERM from the
kernel when the run dies (:mod:`testbed.core.lifeline`).
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.text import Text

from testbed.agent.live import check_agents
from testbed.core.clock import EmulatedClock
from testbed.core.errors import (
    EXIT_BRINGUP,
    EXIT_INPUT,
    EXIT_INTERRUPTED,
    EXIT_OK,
    RunFailure,
    TestbedError,
)
from testbed.core.util import native_stderr_to, provenance, repo_path, write_json_atomic
from testbed.emu.bringup import (
    Live,
    RunError,
    calibrate_datapath,
    emulated_network,
    new_run_dir,
    preflight,
    rtt_self_check,
)
from testbed.emu.capacity import refuse_unfit
from testbed.emu.cleanup import other_run_present, process_identity
from testbed.emu.context import EmulationOutcome, RunContext
from testbed.emu.event_runner import unsupported
from testbed.emu.health import (
    LINK_UP_GRACE_S,
    Component,
    HealthWatch,
    LinkCheck,
    RunRecord,
    ovs_components,
)
from testbed.emu.load import loaded_sources, run_load
from testbed.emu.mininet_network import choose_datapath, choose_link_emulator
from testbed.emu.servers import ClusterServers
from testbed.emu.storage import Storage, estimate_storage
from testbed.model.policies import plugin_origins
from testbed.model.timeline import LINK_KINDS, kind_of
from testbed.plan.build import Plan, check_load_bounds, run_dir_limit_problem
from testbed.plan.dilation import dilate, wall_clock
from testbed.plan.resolved import PlanError
from testbed.sdn.client import _port_in_use
from testbed.serve.handling import host_speed

__all__ = ["EmulationOutcome", "Live", "RunContext", "RunError", "check_before_bringup", "emulate", "emulated_network",
           "new_run_dir"]

#: How long (s, emulated) warming every source's paths may take: 180 s, x k on the wall clock.
WARM_PATHS_TIMEOUT_S = 180.0
#: How long (s, emulated) the inference servers may take to be ready (import, load, warm their
#: models): 180 s, x k on the wall clock (they start inside their cluster's dilated quota).
SERVERS_READY_TIMEOUT_S = 180.0
#: ryu-manager's death stops the run (not restarted): docs/trustworthy-runs.md, "ryu-manager".
CONTROLLER_POLICY = ("stop the run: a restarted controller clears its flows and reinstalls them only after LLDP "
                     "rediscovers every link, and it answers ARP and reroutes; without it the run no longer "
                     "measures the planned network")


class _Interrupts:
    """SIGINT and SIGTERM while a run is under way (a context manager).

    The first one unwinds like Ctrl-C (``KeyboardInterrupt``), so the same teardown runs. The
    ones after it only say that the teardown is under way: a second, impatient Ctrl-C would
    otherwise cut the teardown short and leave bridges, link emulators, the controller and
    cgroups behind, while the run said it had cleaned up. The previous handlers come back on exit, unless the run
    was interrupted: then later signals are ignored until the process ends (the run has stopped;
    a late Ctrl-C would otherwise kill the process before it reports its exit code, 130, and the
    caller would see a death by SIGINT instead). ``ignore_after``: ignore them after the run in any
    case (``testbed run``, whose process ends with the recorded exit code: otherwise a SIGTERM just after
    the run recorded 0 would kill it with 143).
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self, console: Console, ignore_after: bool = False):
        self.console = console
        self.prev: dict[int, Any] = {}
        self.interrupted = False
        self.ignore_after = ignore_after  # the caller ends the process next: a late signal is ignored too

    def __enter__(self) -> _Interrupts:
        self.prev = {s: signal.signal(s, self._first) for s in self.SIGNALS}
        return self

    def __exit__(self, *exc: object) -> None:
        for s, handler in self.prev.items():
            signal.signal(s, signal.SIG_IGN if self.interrupted or self.ignore_after else handler)

    def _first(self, signum: int, frame: object) -> None:
        self.interrupted = True
        for s in self.SIGNALS:
            signal.signal(s, self._again)
        raise KeyboardInterrupt

    def _again(self, signum: int, frame: object) -> None:
        self.console.print(f"{signal.Signals(signum).name} again: still stopping and cleaning up, please wait "
                           "(kill -9 would leave the cleanup to the next run)", markup=False)


# ----------------------------------------------------------------------------- step 1: checks

def _check_ports(plan: Plan) -> None:
    """The OpenFlow and REST ports free on 127.0.0.1 (the servers' port lives in the hosts'
    namespaces, always free). Skipped when another run is active or left processes behind: the
    lock then says so, or the bring-up's cleanup frees the ports (ryu-manager checks them again).

    Raises:
        RunFailure: (exit code 3) a port is in use; names it.
    """
    if other_run_present():
        return
    em = plan.experiment.emulation
    for what, key, port in (("OpenFlow", "of_port", em.of_port), ("REST", "rest_port", em.rest_port)):
        if _port_in_use(port):
            raise RunFailure(f"emulation.{key}: the {what} port {port} on 127.0.0.1 is in use (another ryu-manager "
                             f"or service? `ss -ltnp 'sport = :{port}'`); choose another port", EXIT_BRINGUP)


def check_before_bringup(plan: Plan, duration_s: float, runs_dir: Path | None, link_emulator: str | None = None,
                         console: Console | None = None) -> tuple[str, Path, Storage]:
    """Step 1 (module docstring); creates the run directory and takes its storage reserve. The
    pre-flight estimate (:func:`testbed.emu.capacity.refuse_unfit`: memory, processes, file
    descriptors, the k the CPU needs) is printed on ``console``; a run that cannot fit is refused
    before the run directory is created.

    Returns:
        (run id, run directory, its :class:`Storage`).

    Raises:
        TestbedError: a check failed (exit code 2: input or tools; 3: a precondition), naming it.
    """
    preflight()
    bad = unsupported(plan.changes)
    if bad:
        raise RunError(f"the emulation cannot apply {', '.join(bad)} yet; run the scenario with "
                       f"`testbed simulate`, or remove the event", EXIT_INPUT)
    expected = check_load_bounds(plan.experiment, plan.weights, duration_s, Path(plan.base_dir))
    check_agents(plan)  # every aset source's agent resolves and fits it (as testbed plan)
    _check_ports(plan)
    em = plan.experiment.emulation
    refuse_unfit(plan, console, choose_link_emulator(link_emulator or em.link_emulator), choose_datapath(em.datapath))
    base = Path(runs_dir) if runs_dir else repo_path(plan.experiment.runs_dir)
    problem = run_dir_limit_problem(base, plan)
    if problem:
        raise RunFailure(problem, EXIT_BRINGUP)
    try:
        run_id, run_dir = new_run_dir(plan, runs_dir)
    except OSError as exc:
        raise RunFailure(f"cannot create the run directory under {base}: {exc.strerror}; choose another "
                         f"--runs-dir (or runs_dir in the experiment)", EXIT_BRINGUP) from None
    storage = Storage(run_dir, estimate_storage(plan, duration_s, expected))
    try:
        storage.check()
    except RunFailure as exc:
        raise _record_refusal(run_id, run_dir, duration_s, storage, exc) from None
    return run_id, run_dir, storage


def _record_refusal(run_id: str, run_dir: Path, duration_s: float, storage: Storage, exc: RunFailure) -> RunFailure:
    """``run.json`` of a run its storage check refused (too little space, or not writable), as
    docs/trustworthy-runs.md states for exit code 3: status, exit code, message and the storage
    estimate. Returns ``exc``, or a copy whose message adds that ``run.json`` could not be written
    (the directory is not writable) and why."""
    try:
        free: int | None = storage.free_bytes()
    except OSError:
        free = None
    try:
        write_json_atomic(run_dir / "run.json", {
            "mode": "emulation", "run_id": run_id, "status": "failed", "exit_code": exc.exit_code,
            "message": str(exc), "provenance": provenance(), "duration_s": duration_s,
            "storage": {"estimate_bytes": storage.estimate.total, "reserve_bytes": storage.estimate.reserve,
                        "free_bytes_at_start": free}}, indent=1)
    except OSError as err:
        return RunFailure(f"{exc}; its run.json could not be written either: {err.strerror}", exc.exit_code)
    return exc


# ----------------------------------------------------------------------------- the health watch

def _network_components(live: Live) -> list[Component]:
    """The network's processes for the health watch; a link emulator process with the links it
    serves (:meth:`Live.served`), so that its death names every one."""
    kinds = {"ryu-manager": ("SDN controller", live.run_dir / "logs" / "controller.log")}
    served = live.served()
    out = []
    for name, proc in live.components().items():
        kind, log = kinds.get(name, ("link emulator" if name.startswith("linkemu-") else "network process",
                                     live.run_dir / "logs" / f"{name}.log"))
        out.append(Component(name, kind, proc, log if log.exists() else None, serves=tuple(served.get(name, ()))))
    return out


def _server_components(servers: ClusterServers) -> list[Component]:
    return [Component(f"server-{c}", "inference server", p, servers.log_path(c),
                      planned=lambda c=c: servers.expected_dead(c), why=lambda c=c: servers.oom_note(c))
            for c, p in list(servers.procs.items())]


#: A planned ``link_down`` counts from this long (s) before its planned time (the event runner
#: prepares each change ahead of it: testbed.emu.event_runner.LOOKUP_LEAD_S, dynamics.PREPARE_S).
EVENT_LEAD_S = 1.0


def _planned_links(plan: Plan, t0_s: float | None, rows: list[dict] | None = None) -> set[frozenset[str]]:
    """Links the plan's timeline holds down now: its last change that takes the link down or up
    (a kind with ``sets_up``: ``link_down`` / ``link_up``) at or before now takes it down, or
    brings it up but the event runner has not yet reported it
    (``rows``: its events.csv rows, written only once a change is measured) or reported less than
    :data:`testbed.emu.health.LINK_UP_GRACE_S` ago (LLDP rediscovery). A change counts from
    :data:`EVENT_LEAD_S` before its time (it is prepared ahead)."""
    if t0_s is None:
        return set()
    now = time.time()
    applied = {(int(r["event"]), int(r["step"])): float(r.get("applied_unix_s") or t0_s + float(r["applied_s"]))
               for r in (rows or []) if r.get("kind") in LINK_KINDS and kind_of(r["kind"]).sets_up}
    last: dict[frozenset[str], object] = {}
    for ch in plan.changes:
        if ch.link and ch.entry.sets_up is not None and ch.t_s <= now - t0_s + EVENT_LEAD_S:
            last[frozenset(ch.link)] = ch
    out = set()
    for link, ch in last.items():
        up_at = applied.get((ch.event, ch.step))
        if not ch.entry.sets_up or up_at is None or now - up_at < LINK_UP_GRACE_S:
            out.add(link)
    return out


def _start_watch(live: Live, record: RunRecord, storage: Storage, console: Console,
                 events_ref: list) -> HealthWatch:
    """The health watch of a running network; its first unplanned death is raised in this thread
    (SIGUSR1, see :func:`_raising_failures`), wherever the run is (self-check, warm-up, load).
    ``events_ref`` gets the event runner once the load starts."""
    main = threading.main_thread().ident
    watch_ref: list[HealthWatch] = []

    def planned() -> set[frozenset[str]]:
        return _planned_links(live.plan, watch_ref[0].t_load0, list(events_ref[0].rows) if events_ref else None)

    links = LinkCheck(live.rest_url, live.plan, planned, live.plan.experiment.emulation.stats_interval_s)
    watch = HealthWatch(record, console, [lambda: _network_components(live), ovs_components], storage, links,
                        on_failure=lambda: signal.pthread_kill(main, signal.SIGUSR1))
    watch.time_dilation = live.plan.time_dilation  # incidents say both clocks under dilation
    watch_ref.append(watch)
    watch.start()
    return watch


@contextmanager
def _raising_failures(watch_ref: list) -> Iterator[None]:
    """While inside: SIGUSR1 (sent by the health watch) raises the watch's failure in this thread."""
    def raise_failure(signum, frame) -> None:
        watch = watch_ref[0] if watch_ref else None
        if watch is not None and watch.failure is not None and not watch.stopped:
            raise watch.failure

    prev = signal.signal(signal.SIGUSR1, raise_failure)
    try:
        yield
    finally:
        signal.signal(signal.SIGUSR1, prev)


# ----------------------------------------------------------------------------- the run

def _emulate(ctx: RunContext) -> None:
    """Bring-up, self-check, servers, warm-up and load, inside the network's context manager;
    the health watch from the moment the network is up until the run stops its components."""
    ctx.t0 = time.monotonic()
    watch_ref: list[HealthWatch] = []
    try:
        with _raising_failures(watch_ref), \
                emulated_network(ctx.plan, ctx.run_id, ctx.run_dir, ctx.link_emulator, ctx.console) as live, \
                ExitStack() as stack:
            ctx.live, ctx.stack = live, stack
            ctx.timings["network_s"] = live.bringup_s
            ctx.record.update(link_emulator=live.link_emulator, datapath=live.datapath)
            ctx.watch = _start_watch(live, ctx.record, ctx.storage, ctx.console, ctx.events)
            watch_ref.append(ctx.watch)
            try:
                _bring_up_and_load(ctx)
            finally:
                ctx.watch.stop()
                _record_watched(ctx)
    finally:
        if watch_ref:
            watch_ref[0].write_epitaphs()  # every process has ended: say how in its log


def _record_watched(ctx: RunContext) -> None:
    """The components the health watch has seen, into ``run.json``'s ``health``."""
    ctx.record.update(health=dict(ctx.record.data.get("health", {}), watched=sorted(ctx.watch.seen)))


def _bring_up_and_load(ctx: RunContext) -> None:
    """Steps 3-6 (module docstring) on a running network."""
    _calibrate_and_check(ctx)
    _start_servers_and_warm(ctx)
    ctx.watch.check()
    _record_watched(ctx)
    wall = " of wall clock" if ctx.plan.time_dilation != 1.0 else ""
    ctx.console.print(f"{len(ctx.servers.procs)} inference servers ready, every path warmed; bring-up took "
                      f"{ctx.timings['bringup_s']:.1f} s{wall}; watching {len(ctx.watch.seen)} components")
    _check_host_speed(ctx.plan, ctx.run_dir, ctx.console, ctx.timings)
    cpu_before = ctx.servers.cpu_stats()
    ctx.stack.callback(ctx.servers.write_cpu_during_load, cpu_before)  # also after a failed or interrupted load
    ctx.servers.follow_quotas()
    ctx.load_started = True
    run_load(ctx)
    ctx.timings["total_s"] = time.monotonic() - ctx.t0


def _calibrate_and_check(ctx: RunContext) -> None:
    """The datapath's own delay measured and compensated, then the RTT self-check (step 3)."""
    calibration = calibrate_datapath(ctx.live, ctx.console)
    ctx.record.update(datapath_compensation={k: v for k, v in calibration.items() if k != "paths"})
    if ctx.plan.experiment.emulation.rtt_check:
        rtt_self_check(ctx.live, ctx.console)


def _start_servers_and_warm(ctx: RunContext) -> None:
    """The inference servers up and watched, every source's path warmed (steps 4-5)."""
    ctx.servers = servers = ClusterServers(ctx.live, ctx.stack)
    ctx.watch.add(lambda: _server_components(servers))
    clock = wall_clock(ctx.plan)
    with ctx.console.status("starting inference servers (warm-up, speed check)..."):
        servers.start_all(clock.wall(SERVERS_READY_TIMEOUT_S))  # they start under their k-dilated quota
    speeds = servers.speeds_of_run()  # each server's bare calls against the profile (testbed.plan.speeds)
    ctx.record.update(speeds=speeds.model_dump(mode="json"))
    ctx.console.print(Text(speeds.line()))
    for warning in speeds.warnings():
        ctx.console.print(Text(warning))
    if not ctx.warm_paths:  # auto dilation's warm-up: the sources still open one connection per cluster
        ctx.record.update(warm_up="not done: a warm-up of time dilation auto (testbed.emu.autodilate)")
        ctx.timings["bringup_s"] = time.monotonic() - ctx.t0
        return
    with ctx.console.status("warming every source -> cluster path..."):
        t_warm = time.monotonic()
        # each request takes k x its emulated time on the wall clock: so does the whole warm-up
        warm = servers.warm_paths(loaded_sources(ctx.plan), timeout_s=clock.wall(WARM_PATHS_TIMEOUT_S))
        ctx.timings["warm_paths_s"] = time.monotonic() - t_warm
    ctx.record.update(warm_up=_warm_summary(warm))
    ctx.timings["bringup_s"] = time.monotonic() - ctx.t0


def _check_host_speed(plan: Plan, run_dir: Path, console: Console, timings: dict) -> None:
    """Time one model's bare call now against its profile (``host_speed.json``;
    :func:`testbed.serve.handling.host_speed`): a machine slower than when the profiles were
    measured makes every simulated figure of this plan optimistic, and the summary says so."""
    models = {m: c.server.runtime_of(m) for c in plan.experiment.clusters for m in c.models}
    t = time.monotonic()
    with native_stderr_to(run_dir / "logs" / "host_speed.log"):  # LiteRT's "INFO: Created ... delegate"
        got = host_speed(plan.zoo_dir, plan.profiles_dir, models)
    timings["host_speed_s"] = time.monotonic() - t
    write_json_atomic(run_dir / "host_speed.json", got)
    if got:
        console.print(Text(f"host speed: {got['model']} bare call {got['now_ms']} ms now against "
                           f"{got['profile_ms']} ms profiled ({got['ratio']}x)"))


def _warm_summary(warm: dict[str, dict]) -> dict:
    """Per source, the first (cold) and last warm-up request time (ms) to each cluster/model."""
    return {s: {k: {"first_ms": v[0], "last_ms": v[-1]} for k, v in d.items() if v} for s, d in warm.items()}


#: ``run.json``'s ``clocks``: the clock of each time it holds (under dilation they differ).
RUN_CLOCKS = {"duration_s": "emulated", "wall_duration_s": "wall", "report_interval_s": "emulated",
              "timings_s": "wall", "health.incidents.t_run_s": "wall", "health.incidents.t_load_s": "wall",
              "health.incidents.t_load_emulated_s": "emulated", "health.incidents.wall_time": "wall (local date)",
              "time_dilation_auto": "wall (warm-ups' wall_s), emulated (their network figures, ms)"}


def _start_record(plan: Plan, run_id: str, run_dir: Path, duration_s: float, storage: Storage,
                  auto: dict | None = None) -> RunRecord:
    """``run.json`` as the run begins: what it is, who runs it, its storage estimate, its
    controller policy, where each policy plug-in of the sources came from (``policy_plugins``:
    import path, distribution and version, file and SHA-256; :func:`testbed.model.policies.plugin_origins`),
    the clock of each time (``clocks``: :data:`RUN_CLOCKS`), and with ``time_dilation: auto`` how
    k was chosen (``time_dilation_auto``: :meth:`testbed.emu.autodilate.AutoDilation.to_dict`)
    (``status: running`` until the outcome is recorded)."""
    record = RunRecord(run_dir / "run.json", {
        "mode": "emulation", "run_id": run_id, "status": "running", "process": process_identity(),
        "provenance": provenance(),
        "duration_s": duration_s,
        "time_dilation": plan.time_dilation, "wall_duration_s": EmulatedClock(plan.time_dilation).wall(duration_s),
        "clocks": RUN_CLOCKS,
        "seed": plan.experiment.seed, "report_interval_s": plan.experiment.report_interval_s,
        "mtu_bytes": plan.experiment.topology.mtu,
        "storage": {"estimate_bytes": storage.estimate.total, "reserve_bytes": storage.estimate.reserve,
                    "free_bytes_at_start": storage.free_bytes()},
        "health": {"controller_policy": CONTROLLER_POLICY},
        "policy_plugins": plugin_origins({s.policy or plan.experiment.policy for s in plan.experiment.sources})})
    selector = check_agents(plan)  # what drives the aset sources: a checkpoint (file, kind, SHA-256) or a selector
    if selector is not None:
        record.update(selector=selector)
    if auto is not None:
        record.update(time_dilation_auto=auto)
    record.update()
    return record


def _run_steps(ctx: RunContext) -> tuple[int, str]:
    """Steps 2-6, whatever stops them: (exit code, message). The storage reserve is released at
    the end, so the merge and the summary after it always have room."""
    try:
        _emulate(ctx)
    except KeyboardInterrupt:
        kept = ("what was measured so far is kept" if ctx.load_started
                else "before the load: no query was sent, nothing was measured")
        ctx.console.print(f"interrupted: stopped and cleaned up; {kept}", markup=False)
        return EXIT_INTERRUPTED, "interrupted"
    except TestbedError as exc:
        ctx.console.print(f"error: {exc}", markup=False, highlight=False)
        return exc.exit_code, str(exc)
    finally:
        ctx.storage.release()
    return EXIT_OK, "ok"


@contextmanager
def emulate(plan: Plan, console: Console | None = None, runs_dir: Path | None = None,
            duration_s: float | None = None, link_emulator: str | None = None,
            process_ends: bool = False, auto: dict | None = None, warm_paths: bool = True
            ) -> Iterator[EmulationOutcome]:
    """Emulate a planned experiment (steps 1-6 of the module docstring) and yield its
    :class:`EmulationOutcome`. ``plan`` is in emulated time (``duration_s`` too); under time
    dilation k the steps run :func:`testbed.plan.dilation.dilate`'s wall-clock plan, k x longer.
    Results go to ``runs_dir/<timestamp>-<name>/``; records measured before a failure or an
    interruption are kept there.

    Inside the ``with`` the caller summarises the run (:func:`testbed.results.runs.run_emulation`)
    and may change the outcome's ``status`` and ``message``; on leaving it the outcome goes into
    ``run.json`` (``status``, ``exit_code``, ``message``), the run directory is printed, and
    ``exit.json`` written. SIGINT and SIGTERM unwind the run once and are then held off until the
    outcome is recorded (:class:`_Interrupts`); ``process_ends``: the caller exits with the
    status right after (the CLI), so they stay ignored after it. A check before the bring-up that
    refuses the run yields an outcome without ``run_dir``, its exit code and message, and does
    nothing more. ``auto``: how ``time_dilation: auto`` chose k (:func:`testbed.emu.autodilate.resolve`),
    for ``run.json``. ``warm_paths``: False skips step 5 (auto dilation's warm-ups; run.json's
    ``warm_up`` says so). The outcome carries ``run.json`` (``record``), so that the caller records its
    verdict before it summarises.

    Raises:
        PlanError: ``plan``'s time dilation is ``auto`` and not chosen yet (choose it first:
            :func:`testbed.emu.autodilate.resolve`).
    """
    console = console or Console(markup=False, highlight=False, soft_wrap=True)
    if plan.dilation_auto:
        raise PlanError("time dilation auto is chosen before the emulation: testbed.emu.autodilate.resolve(plan)")
    duration_s = duration_s or plan.experiment.duration_s
    try:
        run_id, run_dir, storage = check_before_bringup(plan, duration_s, runs_dir, link_emulator, console)
    except TestbedError as exc:
        console.print(f"error: {exc}", markup=False, highlight=False)
        yield EmulationOutcome(exc.exit_code, str(exc), duration_s=duration_s)
        return
    record = _start_record(plan, run_id, run_dir, duration_s, storage, auto)
    wall = dilate(plan)  # the constants on the wall clock: every process and the network run these
    clock = wall_clock(wall)
    if clock.dilated:
        console.print(f"time dilation k = {clock.k:g}: the emulated system runs {clock.k:g} "
                      f"times slower than the wall clock ({duration_s:g} s emulated take "
                      f"{clock.wall(duration_s):g} s); records are in emulated time", markup=False)
    ctx = RunContext(wall, run_id, run_dir, clock.wall(duration_s), link_emulator, console, record,
                     storage, warm_paths=warm_paths)
    with _Interrupts(console, process_ends):  # until run.json has its outcome: a second Ctrl-C cannot cut the teardown
        status, message = _run_steps(ctx)
        outcome = EmulationOutcome(status, message, run_dir, duration_s, ctx.timings,
                                   capture=plan.experiment.capture is not None, record=record)
        yield outcome
        record.update(status="ok" if outcome.status == EXIT_OK else "failed", exit_code=outcome.status,
                      message=outcome.message)
    console.print(f"run directory: {run_dir}", markup=False, highlight=False)
    try:
        write_json_atomic(run_dir / "exit.json", {"exit_code": outcome.status})
    except OSError as exc:
        console.print(f"warning: cannot write {run_dir / 'exit.json'}: {exc.strerror}", markup=False)
