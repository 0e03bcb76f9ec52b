"""The run's health: every component, the links and the storage watched while the run lasts.

:class:`HealthWatch` is a thread started once the network is up. Every ``interval_s`` (0.25 s) it
looks at every component the run has, whatever started it:

==================  ==========================================  =================================
component           where it comes from                         a death is planned when
==================  ==========================================  =================================
``source-<name>``   the run's sources (a normal end is exit 0)  never (exit 0 is not a death)
``server-<name>``   :class:`testbed.emu.servers.          a ``cluster_down`` event took it
                    ClusterServers`                             down (``expected_dead``)
``ryu-manager``,    :meth:`testbed.emu.bringup.Live.      never
``linkemu-<node>``  components` (the network's processes)
``ovs-vswitchd``,   their pid files (not children of the run:   never
``ovsdb-server``    exit code unknown)
``tcpdump-<pid>``   processes of the run found in ``/proc``     never
                    (capture), and anything the network adds
                    to ``Live.components()`` (background
                    traffic generators)
links               the controller's ``/testbed/status``        a ``link_down`` event is in force
                    (``missing_links``)                         (or a ``link_up`` < 10 s ago)
storage             ``statvfs`` of the run directory; the       never
                    sources' records files still there
==================  ==========================================  =================================

An unplanned death is reported at once: on the console, and in ``run.json`` (``health.incidents``:
component, kind, fault, time since the run and the load started, exit code and signal, the last
lines of its log). A process that is alive to ``poll()`` but stopped (state ``T`` or ``t`` in
``/proc/PID/stat``: SIGSTOP, a debugger) for :data:`STOPPED_GRACE_S` is reported the same way,
with fault ``stopped`` (planned when a ``cluster_down`` with ``mode: stop`` holds it). The first
unplanned one stops the run: :attr:`HealthWatch.failure` is set (a
:class:`testbed.core.errors.RunFailure` with exit code 4, or 7 when the process itself exited 7, a
model failing its integrity check: :data:`testbed.core.errors.EXIT_INTEGRITY`) and ``on_failure`` is called (the run
raises it in its main thread). Planned deaths and stops go to ``health.planned``. After the run, every
component's log gets a last line saying how it ended (:meth:`HealthWatch.write_epitaphs`), so a
log is never silent about why its process exited (a SIGKILLed process cannot say it itself).

The run directory's storage (:class:`testbed.emu.storage.Storage`: checked before bring-up, a
reserve file held during the run) is watched here too: when the file system fills up the watch
frees the reserve at once, so the sources' buffered records, the merge and the summary still fit,
and stops the run; a source's records file that is no longer there (deleted during the run,
:meth:`testbed.emu.storage.Storage.vanished`) is a storage fault too, and stops the run.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from testbed.core.errors import EXIT_COMPONENT_DIED, EXIT_INTEGRITY, RunFailure
from testbed.core.util import proc_stat, write_json_atomic
from testbed.emu.cleanup import RUN_ENV
from testbed.emu.storage import MIB, Storage
from testbed.sdn import client as ctl  # its functions looked up at call time (tests replace them)

#: How many lines of a component's log an incident quotes.
TAIL_LINES = 8
#: After a planned ``link_up``, how long (s) the controller may take to rediscover the link by LLDP.
LINK_UP_GRACE_S = 10.0
#: How long (s) a component may stay stopped (``/proc/PID/stat`` state ``T``, or ``t``: traced)
#: before the watch reports it. A tracer or profiler stops a process for milliseconds at a time
#: (strace's syscall stops, py-spy's samples, gdb attaching and detaching) and one 0.25 s look can
#: land on such a stop; a stop through 2 s of looks (8) is no sample. A process stopped that long
#: answers nothing while ``poll()`` says it runs: a stopped server has answered no query for 2 s.
STOPPED_GRACE_S = 2.0
#: Process states (``/proc/PID/stat``, third field) of a stopped process, and what they mean.
STOPPED_STATES = {"T": "stopped (SIGSTOP or SIGTSTP)", "t": "stopped by a tracer or debugger"}
OVS_RUN_DIR = Path("/var/run/openvswitch")
OVS_LOG_DIR = Path("/var/log/openvswitch")


def tail(path: Path | None, n: int = TAIL_LINES) -> list[str]:
    """The last ``n`` lines of a text file ([] when there is none)."""
    if path is None:
        return []
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 64 * 1024))
            return f.read().decode(errors="replace").splitlines()[-n:]
    except OSError:
        return []


def process_state(pid: int) -> str | None:
    """The state letter of process ``pid`` (``R``, ``S``, ``D``, ``T``, ``t``, ``Z``, ...; the third
    field of ``/proc/PID/stat``), or None when there is no such process."""
    fields = proc_stat(pid)
    return fields[0] if fields else None


def describe_exit(code: int | None) -> str:
    """``"exit code 1"``, ``"killed by SIGKILL (exit code -9)"``, or ``"exit code unknown"``."""
    if code is None:
        return "exit code unknown (not a child of the run)"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name} (exit code {code})"
        except ValueError:
            return f"killed by signal {-code} (exit code {code})"
    return f"exit code {code}"


class PidProcess:
    """A process the run did not start (OVS daemons, processes found in /proc), watched by pid:
    ``poll()`` is None while it runs, then -1 (its exit code is not ours to know)."""

    def __init__(self, pid: int):
        self.pid = pid
        self.returncode: int | None = None
        self._start = self._start_time()

    def _start_time(self) -> str | None:
        fields = proc_stat(self.pid)
        return fields[19] if fields else None

    def poll(self) -> int | None:
        if self.returncode is None:
            state = process_state(self.pid) or "gone"
            if state in ("Z", "X", "gone") or self._start_time() != self._start:
                self.returncode = -1
        return self.returncode


@dataclass
class Component:
    """A long-running process of the run. ``planned()``: whether its death now is planned;
    ``normal_exit``: exit codes that are a normal end rather than a death (sources: 0);
    ``serves``: what else goes with the process (a link emulator's links), named in its incidents."""

    name: str
    kind: str
    proc: Any
    log: Path | None = None
    planned: Callable[[], bool] | None = None
    normal_exit: frozenset[int] = frozenset()
    known_code: bool = True  # False: not our child, the exit code cannot be known
    serves: tuple[str, ...] = ()
    why: Callable[[], str] | None = None  # more on a death, e.g. its cgroup's memory limit ("" when nothing)


@dataclass
class Incident:
    """A component that died or was stopped (or a link that went down, or the disk that filled up).
    ``kind``: what the component is (``inference server``, ...); ``fault``: what happened to it
    (``died``, ``stopped``, ``link_down``, ``storage``; ``ended`` for a normal end); ``pid``: its
    process; ``serves``: what went with it (a link emulator process: every link it forwarded)."""

    component: str
    kind: str
    wall_time: str
    t_run_s: float
    t_load_s: float | None
    exit_code: int | None
    how: str
    planned: bool
    log: str | None = None
    last_lines: list[str] = field(default_factory=list)
    fault: str = "died"
    pid: int | None = None
    serves: list[str] = field(default_factory=list)
    #: The run's time dilation k: ``t_run_s`` and ``t_load_s`` are on the wall clock, and under
    #: dilation ``t_load_emulated_s`` (``t_load_s / k``) is the same instant in emulated time.
    time_dilation: float = 1.0
    t_load_emulated_s: float | None = None

    def message(self, with_log: bool = True) -> str:
        """One line (and, ``with_log``, the log's last lines) for the console and errors; under time
        dilation each time says its clock."""
        k = self.time_dilation
        if self.t_load_s is None:
            when = f"{self.t_run_s:.1f} s{' (wall clock)' if k != 1.0 else ''} into the run, before the load"
        elif k != 1.0:
            when = (f"{self.t_load_s:.2f} s (wall clock) into the load, {self.t_load_emulated_s:.3f} s of emulated "
                    f"time (k = {k:g})")
        else:
            when = f"{self.t_load_s:.2f} s into the load"
        proc = ""  # a process serving several things (a link emulator's links) is named with all of them
        if self.serves:
            pid = f"pid {self.pid}; " if self.pid is not None else ""
            proc = f" ({pid}serving {len(self.serves)} link(s): {', '.join(self.serves)})"
        text = f"{self.kind} {self.component}{proc} {self.how} at {when}"
        if not with_log:
            return text + (f" (its log: {self.log})" if self.log else "")
        if self.last_lines:
            text += f"; last lines of {self.log}:\n    " + "\n    ".join(self.last_lines)
        elif self.log:
            text += f" ({self.log} is empty)"
        return text


def _pid_of(c: Component | None) -> int | None:
    """The pid of a component's process (None: no component, or a process object without one)."""
    pid = getattr(c.proc, "pid", None) if c is not None else None
    return pid if isinstance(pid, int) else None


class RunRecord:
    """``run.json``: what the run is and what happened to it, rewritten atomically on each update
    (thread-safe). A write that fails (disk full) is kept in memory and retried on the next."""

    def __init__(self, path: Path, data: dict | None = None):
        self.path = Path(path)
        self.data: dict = dict(data or {})
        self.lock = threading.Lock()

    def update(self, **kv: Any) -> None:
        with self.lock:
            self.data.update(kv)
            self._write()

    def append(self, key: str, item: Any, section: str = "health") -> None:
        """Append ``item`` to ``data[section][key]``."""
        with self.lock:
            self.data.setdefault(section, {}).setdefault(key, []).append(item)
            self._write()

    def _write(self) -> None:
        with contextlib.suppress(OSError):
            write_json_atomic(self.path, self.data, indent=1)


# --------------------------------------------------------------------------------------- links

class LinkCheck:
    """Links the controller lost (``missing_links`` of ``/testbed/status``) that no event took
    down. ``planned_down()``: the (switch, switch) pairs the plan holds down now (a ``link_down``
    event's, and a ``link_up``'s until :data:`LINK_UP_GRACE_S` after it: LLDP rediscovery);
    ``brought_up``: the pairs some ``link_up`` event of the plan brings back (a missing one may
    not have been rediscovered in the grace)."""

    def __init__(self, rest_url: str, plan, planned_down: Callable[[], set[frozenset[str]]] | None = None,
                 interval_s: float = 1.0):
        self.rest_url, self.interval_s = rest_url, interval_s
        self.planned_down = planned_down or (lambda: set())
        self.names = {s.dpid: s.name for s in plan.switches}
        self.emu = {frozenset((lk.a, lk.b)): lk.emu_name for lk in plan.links}
        self.brought_up = {frozenset(ch.link) for ch in plan.changes if ch.link and ch.entry.sets_up}
        self.next_at = 0.0

    def down(self) -> list[tuple[str, str]]:
        """Unplanned missing links now ([] when none, or the controller cannot be asked: the
        controller's own death is a component death)."""
        now = time.monotonic()
        if now < self.next_at:
            return []
        self.next_at = now + self.interval_s
        try:
            st = ctl.get_status(self.rest_url, timeout_s=2.0)
        except ctl.ControllerError:
            return []
        planned = self.planned_down()
        out = []
        for a, b in st.get("missing_links", []):
            pair = (self.names.get(a, str(a)), self.names.get(b, str(b)))
            if frozenset(pair) not in planned:
                out.append(pair)
        return out


# --------------------------------------------------------------------------------------- the watch

def ovs_components() -> list[Component]:
    """ovs-vswitchd and ovsdb-server, by their pid files (skipped when absent)."""
    out = []
    for daemon in ("ovs-vswitchd", "ovsdb-server"):
        try:
            pid = int((OVS_RUN_DIR / f"{daemon}.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue
        out.append(Component(daemon, "Open vSwitch daemon", PidProcess(pid), OVS_LOG_DIR / f"{daemon}.log",
                             known_code=False))
    return out


def tagged_processes(run_id: str, comm: str) -> list[int]:
    """Pids of processes called ``comm`` whose environment carries ``TESTBED_RUN_ID=run_id``."""
    tag = f"{RUN_ENV}={run_id}".encode()
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            if (d / "comm").read_text().strip() != comm or tag not in (d / "environ").read_bytes().split(b"\0"):
                continue
        except OSError:
            continue
        out.append(int(d.name))
    return out


class HealthWatch(threading.Thread):
    """Watches the components the ``providers`` list (each a callable returning components, asked
    every tick, so restarted servers and late components are seen), the links and the storage.

    Args:
        record: ``run.json`` (incidents go to ``health.incidents`` / ``health.planned``).
        console: where deaths are reported at once (plain text).
        providers: callables returning the components now.
        storage: the run directory's :class:`Storage` (None: not watched).
        links: a :class:`LinkCheck` (None: links not watched).
        on_failure: called once, from this thread, after the first unplanned death.
    """

    def __init__(self, record: RunRecord, console, providers: Iterable[Callable[[], Iterable[Component]]] = (),
                 storage: Storage | None = None, links: LinkCheck | None = None,
                 on_failure: Callable[[], None] | None = None, interval_s: float = 0.25):
        super().__init__(daemon=True, name="health")
        self.record, self.console = record, console
        self.providers = list(providers)
        self.storage, self.links, self.on_failure = storage, links, on_failure
        self.interval_s = interval_s
        self.t_run0 = time.monotonic()
        self.t_load0: float | None = None  # epoch s the load started
        self.time_dilation = 1.0  # k: incidents' times are on the wall clock; they also give the emulated one
        self.failure: RunFailure | None = None
        self.incidents: list[Incident] = []
        self.seen: dict[str, tuple[int, Component]] = {}  # name -> (id of its process object, component)
        self.ended: dict[str, Incident] = {}
        # name -> monotonic s its process was first seen stopped (None: this stop is reported)
        self.stopped_since: dict[str, float | None] = {}
        self.stops: dict[str, list[Incident]] = {}  # name -> its stops reported, oldest first
        self.links_down: set[frozenset[str]] = set()
        self._halt = threading.Event()
        self.lock = threading.Lock()

    def add(self, provider: Callable[[], Iterable[Component]]) -> None:
        with self.lock:
            self.providers.append(provider)

    def load_started(self, t0_s: float) -> None:
        """The load starts at epoch ``t0_s`` s (incident times are then given from it)."""
        self.t_load0 = t0_s

    def stop(self) -> None:
        """Stop watching (before the run stops its components on purpose)."""
        self._halt.set()
        if self.is_alive() and threading.current_thread() is not self:
            self.join(timeout=5)

    @property
    def stopped(self) -> bool:
        return self._halt.is_set()

    def run(self) -> None:
        while not self._halt.wait(self.interval_s):
            self.check()

    def check(self) -> None:
        """One look at everything (also called directly by tests)."""
        self._check_storage()
        with self.lock:
            providers = list(self.providers)
        for provider in providers:
            try:
                comps = list(provider())
            except Exception:  # noqa: BLE001 - a provider's bad moment must not kill the watch
                continue
            for c in comps:
                self._check_component(c)
        self._check_links()

    # -- the checks --
    def _check_component(self, c: Component) -> None:
        key = id(c.proc)
        prev = self.seen.get(c.name)
        if prev is None or prev[0] != key:  # new, or restarted (a new process object)
            self.seen[c.name] = (key, c)
            self.ended.pop(c.name, None)
        if c.name in self.ended:
            return
        code = c.proc.poll()
        if code is None:
            self._check_stopped(c)
            return
        self.stopped_since.pop(c.name, None)
        if code in c.normal_exit:
            self.ended[c.name] = self._incident(c.name, c.kind, code, "ended normally", True, c.log, known=True,
                                                fault="ended", of=c)
            return
        planned = bool(c.planned and c.planned())
        inc = self._incident(c.name, c.kind, code if c.known_code else None,
                             ("went down as planned: " if planned else "died: ") + describe_exit(code if c.known_code
                                                                                              else None)
                             + (c.why() if c.why is not None and not planned else ""),
                             planned, c.log, known=c.known_code, of=c)
        self.ended[c.name] = inc
        self._report(inc)

    def _check_stopped(self, c: Component) -> None:
        """A process alive to ``poll()`` but stopped (:data:`STOPPED_STATES`) for
        :data:`STOPPED_GRACE_S` is reported as a death is (fault ``stopped``), once per stop."""
        pid = getattr(c.proc, "pid", None)
        state = process_state(pid) if isinstance(pid, int) else None
        if state not in STOPPED_STATES:
            self.stopped_since.pop(c.name, None)  # running (again): a later stop is a new one
            return
        now = time.monotonic()
        since = self.stopped_since.setdefault(c.name, now)
        if since is None or now - since < STOPPED_GRACE_S:  # None: this stop is reported already
            return
        self.stopped_since[c.name] = None
        planned = bool(c.planned and c.planned())
        how = (f"{'was stopped as planned' if planned else 'stopped'}: process state {state}, "
               f"{STOPPED_STATES[state]}, for {now - since:.1f} s (alive to poll(), answering nothing)")
        inc = self._incident(c.name, c.kind, None, how, planned, c.log, fault="stopped", of=c)
        self.stops.setdefault(c.name, []).append(inc)
        self._report(inc)

    def _check_links(self) -> None:
        if self.links is None:
            return
        down = {frozenset(p): p for p in self.links.down()}
        for key, (a, b) in down.items():
            if key in self.links_down:
                continue
            self.links_down.add(key)
            emu = self.links.emu.get(key)
            how = ((f"is missing at the controller with no planned event holding it down (lost again, or not "
                    f"rediscovered by LLDP within {LINK_UP_GRACE_S:g} s, wall clock, of its planned link_up)")
                   if key in self.links.brought_up else
                   "went down without a planned event (the controller lost it: its port went down, or a switch "
                   "disconnected)")
            inc = self._incident(f"{a}-{b}" + (f" ({emu})" if emu else ""), "network link", None,
                                 how + "; traffic is rerouted, so the run no longer measures the planned network",
                                 False, None, fault="link_down")
            self._report(inc)
        self.links_down &= set(down)

    def _check_storage(self) -> None:
        if self.storage is None:
            return
        for rel in self.storage.vanished():
            inc = self._incident(rel, "storage", None,
                                 "was deleted during the run: what the source wrote there is no longer on disk; the "
                                 "source keeps writing to its open file and writes it back when it stops, and the "
                                 "run stops", False, None, fault="storage")
            self._report(inc)
        if self.storage.released:
            return
        problem = self.storage.problem()
        if problem is None:
            return
        self.storage.release()
        inc = self._incident("run directory", "storage", None,
                             f"failed: {problem}; the run freed its {self.storage.estimate.reserve / MIB:.1f} MiB "
                             f"reserve so that the records, the merge and the summary still fit, and stops",
                             False, None, fault="storage")
        self._report(inc)

    # -- reporting --
    def _incident(self, name: str, kind: str, code: int | None, how: str, planned: bool, log: Path | None,
                  known: bool = True, fault: str = "died", of: Component | None = None) -> Incident:
        """An incident of ``name`` now; ``of``: its component (its pid and what it serves)."""
        now = time.time()
        wall = datetime.fromtimestamp(now).isoformat(timespec="milliseconds")
        t_load = None if self.t_load0 is None or now < self.t_load0 else round(now - self.t_load0, 3)
        k = self.time_dilation
        return Incident(component=name, kind=kind, wall_time=wall,
                        t_run_s=round(time.monotonic() - self.t_run0, 3),
                        t_load_s=t_load,
                        exit_code=code if known else None, how=how, planned=planned,
                        log=None if log is None else str(log), last_lines=tail(log) if not planned else [],
                        fault=fault, pid=_pid_of(of), serves=list(of.serves) if of is not None else [],
                        time_dilation=k, t_load_emulated_s=None if t_load is None else round(t_load / k, 4))

    def _report(self, inc: Incident) -> None:
        if self.stopped:
            return
        self.incidents.append(inc)
        self.record.append("planned" if inc.planned else "incidents", asdict(inc))
        if inc.planned:
            return
        self.console.print(f"HEALTH: {inc.message()}", markup=False, highlight=False)
        if self.failure is None:
            integrity = inc.fault == "died" and inc.exit_code == EXIT_INTEGRITY  # the server's own refusal
            said = (f" (it refused to serve: {inc.last_lines[-1] if inc.last_lines else 'see its log'})"
                    if integrity else "")
            self.failure = RunFailure(f"{inc.message(with_log=False)}{said}. The run stops: its measurements after "
                                      f"this point would not be of the planned experiment (run.json: health).",
                                      EXIT_INTEGRITY if integrity else EXIT_COMPONENT_DIED)
            self.record.update(failure={"component": inc.component, "kind": inc.kind, "message": str(self.failure)})
            if self.on_failure is not None:
                self.on_failure()

    def write_epitaphs(self) -> None:
        """Append to each component's log (in the run directory) how it ended."""
        run_dir = self.record.path.parent.resolve()
        for name, (_key, c) in self.seen.items():
            if c.log is None or run_dir not in Path(c.log).resolve().parents:
                continue
            inc = self.ended.get(name)
            code = c.proc.poll()
            if inc is not None and inc.how == "ended normally":
                line = f"{c.kind} {name} ended normally ({describe_exit(inc.exit_code)})"
            elif inc is not None and not inc.planned:
                line = f"{c.kind} {name} {inc.how} during the run (reported in run.json)"
            elif inc is not None:
                line = f"{c.kind} {name} {inc.how} (a planned event)"
            elif code is None:
                line = f"{c.kind} {name} was still running when the run ended"
            else:  # stopped by the run's teardown, or dead before the watch saw it (a warm-up check said so)
                line = f"{c.kind} {name} exited: {describe_exit(code)}" + (c.why() if c.why is not None else "")
            stamp = f"[testbed {datetime.now().isoformat(timespec='seconds')}]"
            stops = [f"{stamp} {c.kind} {name} {s.how} at {s.wall_time}"
                     + (" (a planned event)" if s.planned else " during the run (reported in run.json)")
                     for s in self.stops.get(name, [])]
            with contextlib.suppress(OSError), open(c.log, "a") as f:
                f.write("".join(f"{text}\n" for text in [*stops, f"{stamp} {line}"]))


def summary_of(record: RunRecord) -> dict:
    """The ``health`` section of ``run.json`` as the summary shows it."""
    h = record.data.get("health", {})
    return {"incidents": h.get("incidents", []), "planned": h.get("planned", []),
            "watched": h.get("watched", [])}


def read_health(run_dir: Path) -> dict:
    """The ``health`` and ``failure`` sections of a run directory's ``run.json`` ({} if none)."""
    try:
        data = json.loads((Path(run_dir) / "run.json").read_text())
    except (OSError, ValueError):
        return {}
    out = dict(data.get("health") or {})
    if data.get("failure"):
        out["failure"] = data["failure"]
    if "exit_code" in data:
        out["exit_code"] = data["exit_code"]
    return out


__all__ = ["STOPPED_GRACE_S", "Component", "HealthWatch", "Incident", "LinkCheck", "PidProcess", "RunRecord",
           "describe_exit", "ovs_components", "process_state", "read_health", "tagged_processes", "tail"]
