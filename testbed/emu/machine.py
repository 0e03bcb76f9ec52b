"""The machine's CPU while an emulation's load runs: how busy its CPUs were, and which of the
testbed's processes (link emulators, Open vSwitch, inference servers, sources, the controller)
used how much of them.

Why: the emulation runs every part of the experiment on the same few CPUs, and its own processes
cost CPU per query (``docs/scale-out.md``, "Load ceiling": about 6 ms per query at 300 q/s on
digits-abilene). When the CPUs are saturated, queries wait for a CPU in every process on their
path, and that waiting shows up as network and queueing time that the simulator, which models the
clusters' CPU shares but not the testbed's own processes, does not have. The summary states the
machine's load during the run and warns when it was saturated (:data:`SATURATED_SHARE`).

:class:`CpuSampler` reads, every ``interval_s`` from the moment the sources are started until the
load's teardown:

* ``/proc/stat`` (proc(5), the ``cpu`` line): the machine's busy time (user + nice + system +
  irq + softirq) and the time stolen by the hypervisor (steal), in clock ticks
  (``SC_CLK_TCK``);
* ``/proc/<pid>/stat`` of every process (utime + stime), summed per role (:data:`CPU_ROLES`,
  matched on the command line; the sampling process itself is ``run process``, anything else
  ``other``: other jobs on the machine; :data:`NICED_OTHER` for those niced above this run, which
  yield the CPU to it: :func:`competing_cores`).

Each sample is cumulative: the machine's busy and steal seconds, and per role the CPU seconds of
every process seen so far (a process that exited keeps what it used until its last sample; what
it used after that, at most ``interval_s`` of it, is lost). The samples are written to
``machine_cpu_samples.json`` (:class:`CpuSamples`), and the summary takes the window the load
really ran, from the records (the first and the last query's t0: the sources start after their
own start-up, which must not count, and the teardown after the last query must not either), with
:func:`cores_between`: mean cores per role over the window, and how many of its seconds were
saturated (a mean can hide a saturated stretch).

A single thread can be the bottleneck while the machine still has idle CPU: Open vSwitch's
user-space datapath forwards every packet in its main thread, the link emulator and each source are
one Python thread. The sampler also reads ``/proc/<pid>/task/<tid>/stat`` of the testbed's own
processes (:data:`TESTBED_ROLES`) and keeps, per sample, the threads that used at least
:data:`HOT_THREAD_RECORD` of a CPU since the previous one (:attr:`Sample.hot_threads`); the summary
counts, per thread, the seconds of the load it was at least :data:`SATURATED_SHARE` busy
(:attr:`MachineCpu.hot_threads`), and warns when that is at least a tenth of the load.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path

from pydantic import BaseModel, Field

from testbed.core.util import write_json_atomic
from testbed.serve.handling import CLK_TCK, proc_cpu_s  # written once there (proc(5))

#: Roles of the processes (label, substring of the command line), first match wins.
CPU_ROLES: tuple[tuple[str, str], ...] = (
    ("link emulators", "testbed.emu.linkemu"), ("inference servers", "testbed.serve.server"),
    ("sources", "testbed.emu.source"), ("controller", "testbed.sdn.launcher"), ("controller", "ryu-manager"),
    ("ovs-vswitchd", "ovs-vswitchd"), ("ovsdb-server", "ovsdb-server"), ("packet capture", "tcpdump"),
    ("link probes", "testbed.emu.probe"))
#: The role of other jobs' processes niced above this run's own niceness (nice(1)): the kernel's
#: scheduler gives the CPU to this run's processes first (CFS weights: each nice level is ~1.25 x
#: less weight; sched(7)), so their CPU counts as available to the emulation, not as taken.
NICED_OTHER = "other (niced)"
#: The roles that are the testbed's own machinery (not the clusters' inference, not other jobs).
TESTBED_ROLES = ("link emulators", "sources", "controller", "ovs-vswitchd", "ovsdb-server", "packet capture",
                 "link probes", "run process")
#: The inference servers' role (:data:`CPU_ROLES`): with :data:`TESTBED_ROLES`, the emulation's own CPU.
SERVER_ROLE = "inference servers"
#: The summary warns when the machine's CPUs were busy (or stolen by the hypervisor) at least this
#: share of the load window (:attr:`MachineCpu.busy_share`).
SATURATED_SHARE = 0.9
#: ... and names other jobs' CPU use, and the hypervisor's steal, from this many cores on.
OTHER_NOTABLE_CORES = 0.25
STEAL_NOTABLE_CORES = 0.1

#: A thread of the testbed's own processes that used at least this share of one CPU between two
#: samples is kept in the later one (:attr:`Sample.hot_threads`); below it, it is not.
HOT_THREAD_RECORD = 0.5
#: A step between two samples shorter than this many clock ticks (``SC_CLK_TCK``) measures a
#: thread's share of a CPU to worse than 10 % (a thread's CPU time counts whole ticks): its hot
#: threads are not counted (one tick in a 10 ms step would read as a whole CPU).
HOT_STEP_TICKS = 10

#: The samples of a run (:class:`CpuSamples`), in its folder.
SAMPLES_FILE = "machine_cpu_samples.json"


class MachineCpu(BaseModel):
    """The machine's CPU over a load window (``summary.json`` ``machine_cpu``): ``window_s`` (s),
    ``cpus`` (online CPUs), ``busy_cores`` and ``steal_cores`` (mean CPUs busy / stolen by the
    hypervisor, from ``/proc/stat``), ``by_role`` (mean cores per role, :data:`CPU_ROLES`, ``run
    process`` and ``other``), ``testbed_cores`` (the sum over :data:`TESTBED_ROLES`),
    ``saturated_s`` (seconds of the window between two samples in which the CPUs were at least
    :data:`SATURATED_SHARE` busy or stolen), ``short_s`` (seconds of the window between two samples
    in which the emulation's own processes and its servers used at least :data:`SATURATED_SHARE`
    of the cores available to them in that step: :func:`available_cores` beside the other jobs not
    niced and the hypervisor's steal of the step), ``peak_share`` (the highest busy share) and
    ``hot_threads`` (per thread of the testbed's own processes, ``"<role>: <thread name> (pid P,
    thread T)"``, the seconds of the window in which it was at least :data:`SATURATED_SHARE` of one
    CPU busy; threads that never were are left out)."""

    window_s: float = Field(gt=0)
    cpus: int = Field(ge=1)
    busy_cores: float = Field(ge=0)
    steal_cores: float = Field(ge=0)
    by_role: dict[str, float]
    testbed_cores: float = Field(ge=0)
    saturated_s: float = Field(0.0, ge=0)
    short_s: float = Field(0.0, ge=0)
    peak_share: float = Field(0.0, ge=0)
    hot_threads: dict[str, float] = Field(default_factory=dict)

    @property
    def busy_share(self) -> float:
        """``(busy_cores + steal_cores) / cpus`` (0 to 1): the share of the CPUs' time this VM
        could not give to an idle process (used here, or taken by the hypervisor for others)."""
        return min(1.0, (self.busy_cores + self.steal_cores) / self.cpus) if self.cpus else 0.0


def machine_ticks(stat: Path = Path("/proc/stat")) -> tuple[float, float]:
    """(busy, steal) CPU seconds of the whole machine since boot, from the ``cpu`` line of
    ``/proc/stat`` (proc(5): user nice system idle iowait irq softirq steal ...; busy = user +
    nice + system + irq + softirq; guest time is inside user already).

    Raises:
        OSError: ``stat`` cannot be read. ValueError: it has no ``cpu`` line.
    """
    for line in stat.read_text().splitlines():
        if line.startswith("cpu "):
            v = [int(x) for x in line.split()[1:]]
            v += [0] * (8 - len(v))
            return (v[0] + v[1] + v[2] + v[5] + v[6]) / CLK_TCK, v[7] / CLK_TCK
    raise ValueError(f"{stat}: no 'cpu' line")


def role_of(cmdline: str, nice: int = 0, own_nice: int = 0) -> str:
    """The role of a process from its command line (:data:`CPU_ROLES`), else ``other``, or
    :data:`NICED_OTHER` when its niceness ``nice`` is above ``own_nice`` (this run's)."""
    role = next((role for role, pattern in CPU_ROLES if pattern in cmdline), "other")
    return NICED_OTHER if role == "other" and nice > own_nice else role


def proc_cpu_nice(path: Path) -> tuple[float, int]:
    """(user + system CPU s, niceness) from a ``/proc/<pid>/stat`` file (proc(5): utime, stime,
    nice: fields 14, 15 and 19).

    Raises:
        OSError: the process is gone. ValueError, IndexError: not a stat line.
    """
    fields = path.read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK, int(fields[16])


def own_nice() -> int:
    """This process's niceness (what another job's must exceed for it to yield to this run)."""
    return os.getpriority(os.PRIO_PROCESS, 0)


def runnable_s(path: Path) -> float:
    """Seconds a task has been runnable, on a CPU or waiting for one: ``/proc/<pid>/schedstat``'s
    first two fields (ns; Linux Documentation/scheduler/sched-stats.rst); 0 when it cannot be read."""
    try:
        run_ns, wait_ns = path.read_text().split()[:2]
        return (int(run_ns) + int(wait_ns)) / 1e9
    except (OSError, ValueError):
        return 0.0


def cpu_by_process(proc: Path = Path("/proc")) -> dict[int, tuple[float, int, float]]:
    """Every process's (CPU s, niceness, runnable s of its main thread) now (:func:`proc_cpu_nice`,
    :func:`runnable_s`); processes that vanish while read are left out."""
    out: dict[int, tuple[float, int, float]] = {}
    for name in os.listdir(proc):
        if name.isdigit():
            try:
                cpu, nice = proc_cpu_nice(proc / name / "stat")
            except (OSError, ValueError, IndexError):
                continue
            out[int(name)] = (cpu, nice, runnable_s(proc / name / "schedstat"))
    return out


def competing_cores(before: dict[int, tuple[float, int, float]], after: dict[int, tuple[float, int, float]],
                    dt_s: float, nice: int, exclude: frozenset[int] = frozenset()) -> tuple[float, float]:
    """(cores that compete with a process of niceness ``nice``, cores that yield to it) over
    ``dt_s`` s between two :func:`cpu_by_process` readings. A process's demand is the larger of the
    CPU it used and the time its main thread was runnable (on a CPU or waiting for one: on a
    saturated machine an always-busy job uses less than it asks for); split by whether its
    niceness is at most ``nice`` (it competes: the CPU it asks for is not available) or above it
    (niced: it yields, :data:`NICED_OTHER`; there the CPU it used). ``exclude``: pids not counted
    (this run's own). A process seen only in ``after`` counts from 0; one gone by then is left out."""
    if dt_s <= 0:
        return 0.0, 0.0
    compete = yield_ = 0.0
    for pid, (cpu, n, runnable) in after.items():
        if pid in exclude:
            continue
        cpu0, _, runnable0 = before.get(pid, (0.0, n, 0.0))
        used = max(0.0, cpu - cpu0)
        if n > nice:
            yield_ += used
        else:
            compete += max(used, min(dt_s, runnable - runnable0))
    return compete / dt_s, yield_ / dt_s


class Sample(BaseModel):
    """One cumulative sample: ``t`` (epoch s), ``busy_s`` / ``steal_s`` (machine CPU seconds since
    boot), ``by_role`` (CPU seconds of every process of the role seen so far); and, not cumulative,
    ``hot_threads``: the threads of the testbed's own processes that used at least
    :data:`HOT_THREAD_RECORD` of one CPU since the previous sample (label -> share of one CPU,
    0 to 1)."""

    t: float
    busy_s: float
    steal_s: float
    by_role: dict[str, float]
    hot_threads: dict[str, float] = Field(default_factory=dict)


class CpuSamples(BaseModel):
    """``machine_cpu_samples.json``: the sampler's ``interval_s`` and its samples, oldest first."""

    cpus: int = Field(ge=1)
    interval_s: float = Field(gt=0)
    samples: list[Sample]


class CpuSampler(threading.Thread):
    """Samples the machine's CPU every ``interval_s`` (module docstring) until :meth:`stop`."""

    def __init__(self, interval_s: float = 1.0) -> None:
        super().__init__(daemon=True, name="machine-cpu")
        self.interval_s = interval_s
        self.samples: list[Sample] = []
        self._done = threading.Event()
        self._roles: dict[int, str] = {}
        self._me = os.getpid()
        self._nice = own_nice()
        self._last: dict[int, float] = {}  # pid -> CPU s at the last sample that saw it (kept after its exit)
        self._threads: dict[tuple[int, int], float] = {}  # (pid, tid) -> CPU s at the previous sample
        self._t_prev: float | None = None

    def _role(self, pid: int, nice: int = 0) -> str:
        if pid not in self._roles:
            if pid == self._me:
                self._roles[pid] = "run process"
            else:
                try:
                    cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                except OSError:
                    cmd = ""
                self._roles[pid] = role_of(cmd, nice, self._nice)
        return self._roles[pid]

    def _sample(self) -> None:
        for pid, (cpu, nice, _) in cpu_by_process().items():
            self._role(pid, nice)
            self._last[pid] = cpu
        by_role: dict[str, float] = {}
        for pid, cpu in self._last.items():
            by_role[self._roles[pid]] = by_role.get(self._roles[pid], 0.0) + cpu
        busy, steal = machine_ticks()
        now = time.time()
        hot = self._hot_threads(now)
        self.samples.append(Sample(t=now, busy_s=busy, steal_s=steal, by_role=by_role, hot_threads=hot))

    def _hot_threads(self, now: float) -> dict[str, float]:
        """The threads of the testbed's running processes that used at least :data:`HOT_THREAD_RECORD`
        of one CPU since the previous sample (label -> share); remembers every thread's CPU for the next."""
        dt = now - self._t_prev if self._t_prev is not None else 0.0
        self._t_prev = now
        seen: dict[tuple[int, int], float] = {}
        hot: dict[str, float] = {}
        for pid, role in self._roles.items():
            if role not in TESTBED_ROLES or pid not in self._last:
                continue
            try:
                tids = os.listdir(f"/proc/{pid}/task")
            except OSError:
                continue
            for tid in tids:
                task = Path(f"/proc/{pid}/task/{tid}")
                try:
                    cpu = proc_cpu_s(task / "stat")
                except (OSError, ValueError, IndexError):
                    continue
                key = (pid, int(tid))
                seen[key] = cpu
                prev = self._threads.get(key)
                if prev is None or dt <= 0 or (share := (cpu - prev) / dt) < HOT_THREAD_RECORD:
                    continue
                try:
                    name = (task / "comm").read_text().strip()
                except OSError:
                    name = "?"
                hot[f"{role}: {name!r} (pid {pid}, thread {tid})"] = round(min(1.0, share), 3)
        self._threads = seen
        return hot

    def run(self) -> None:
        while True:
            self._sample()
            if self._done.wait(self.interval_s):
                self._sample()
                return

    def stop(self) -> None:
        """Take a last sample and end the thread (waits for it)."""
        self._done.set()
        if self.is_alive():
            self.join(5.0)

    def result(self, t_from: float | None = None, t_to: float | None = None) -> MachineCpu | None:
        """:func:`cores_between` over the samples (between ``t_from`` and ``t_to``, epoch s, when given)."""
        return cores_between(self.samples, t_from, t_to)


def cores_between(samples: list[Sample], t_from: float | None = None, t_to: float | None = None,
                  cpus: int | None = None) -> MachineCpu | None:
    """:class:`MachineCpu` over the samples inside [``t_from``, ``t_to``] (epoch s; None: open),
    widened by the sample just before ``t_from`` and the one just after ``t_to`` so that the whole
    window is covered (at most one ``interval_s`` more on each side); None with fewer than two.
    ``cpus``: the machine's CPUs (default: this machine's)."""
    if t_from is not None:
        before = [i for i, s in enumerate(samples) if s.t <= t_from]
        samples = samples[before[-1] if before else 0:]
    if t_to is not None:
        after = [i for i, s in enumerate(samples) if s.t >= t_to]
        samples = samples[:after[0] + 1] if after else samples
    if len(samples) < 2 or samples[-1].t <= samples[0].t:
        return None
    a, b = samples[0], samples[-1]
    dt = b.t - a.t
    n = cpus or os.cpu_count() or 1
    roles = {r: round(max(0.0, b.by_role.get(r, 0.0) - a.by_role.get(r, 0.0)) / dt, 3)
             for r in sorted(set(a.by_role) | set(b.by_role))}
    shares: list[float] = []  # per step between two samples: the CPUs' busy + stolen share
    saturated = short = 0.0
    hot: dict[str, float] = {}  # thread -> seconds at >= SATURATED_SHARE (a sample's: of the step ending there)
    for x, y in zip(samples[:-1], samples[1:], strict=True):
        d = y.t - x.t
        if d <= 0:
            continue
        share = min(1.0, ((y.busy_s - x.busy_s) + (y.steal_s - x.steal_s)) / (d * n))
        shares.append(share)
        saturated += d if share >= SATURATED_SHARE else 0.0
        short += d if _own_share(x, y, d, n) >= SATURATED_SHARE else 0.0
        for label, thread_share in y.hot_threads.items() if d * CLK_TCK >= HOT_STEP_TICKS else ():
            if thread_share >= SATURATED_SHARE:
                hot[label] = hot.get(label, 0.0) + d
    # /proc/stat and the clock are read a moment apart: on a busy machine busy / dt can pass n
    busy = min(float(n), max(0.0, b.busy_s - a.busy_s) / dt)
    return MachineCpu(window_s=round(dt, 3), cpus=n, busy_cores=round(busy, 3),
                      steal_cores=round(max(0.0, b.steal_s - a.steal_s) / dt, 3),
                      by_role={r: v for r, v in roles.items() if v > 0},
                      testbed_cores=round(sum(roles.get(r, 0.0) for r in TESTBED_ROLES), 3),
                      saturated_s=round(saturated, 1), short_s=round(short, 1),
                      peak_share=round(max(shares, default=0.0), 3),
                      hot_threads={k: round(v, 1) for k, v in sorted(hot.items(), key=lambda kv: -kv[1])})


def _own_share(x: Sample, y: Sample, d: float, cpus: int) -> float:
    """The emulation's own processes' and servers' cores between samples ``x`` and ``y`` (``d`` s
    apart) over the cores available to them then (:func:`emulation_cores` of the step)."""
    roles = {r: max(0.0, y.by_role.get(r, 0.0) - x.by_role.get(r, 0.0)) / d for r in {*x.by_role, *y.by_role}}
    own, available = emulation_cores(roles, max(0.0, y.steal_s - x.steal_s) / d, cpus)
    return own / available


def emulation_cores(by_role: Mapping[str, float], steal_cores: float, cpus: int) -> tuple[float, float]:
    """(the emulation's own cores: :data:`TESTBED_ROLES` and :data:`SERVER_ROLE`; the cores
    available to it: :func:`available_cores` beside other jobs not niced and the hypervisor's
    steal) from cores per role (``by_role``) over one window."""
    own = sum(by_role.get(r, 0.0) for r in (*TESTBED_ROLES, SERVER_ROLE))
    return own, available_cores(cpus, by_role.get("other", 0.0) + steal_cores)


def write_samples(sampler: CpuSampler, path: Path) -> None:
    """Stop ``sampler`` and write its samples (:class:`CpuSamples`, atomically) to ``path``. A
    write error (a full disk at teardown) is reported on stderr, not raised: the run already fails
    with its storage incident."""
    sampler.stop()
    try:
        write_json_atomic(path, CpuSamples(cpus=os.cpu_count() or 1, interval_s=sampler.interval_s,
                                           samples=sampler.samples))
    except OSError as exc:
        print(f"[testbed] cannot write {path}: {exc}; the machine's CPU during the load is not kept", file=sys.stderr)


def machine_cpu_of_run(run_dir: Path, t_from: float | None, t_to: float | None) -> tuple[MachineCpu | None, str]:
    """The machine's CPU over [``t_from``, ``t_to``] (epoch s) from ``run_dir/machine_cpu_samples.json``,
    and what went wrong when there is none: "" (no file: a simulation, or a run stopped before its
    load), or a sentence naming the file (unreadable, or too few samples in the window)."""
    path = run_dir / SAMPLES_FILE
    if not path.exists():
        return None, ""
    try:
        data = CpuSamples.model_validate_json(path.read_bytes())
    except (OSError, ValueError) as exc:
        return None, f"{path.name} cannot be read ({type(exc).__name__}): the machine's CPU is not known"
    got = cores_between(data.samples, t_from, t_to, data.cpus)
    if got is None:
        return None, (f"{path.name}: fewer than two samples cover the load (it lasted less than one sampling "
                      f"interval, {data.interval_s:g} s): the machine's CPU is not known")
    return got, ""


def other_jobs(sample_s: float, proc: Path = Path("/proc")) -> tuple[float, float]:
    """Other jobs' CPU now, over ``sample_s`` s of sleep (this process left out): (cores of the
    processes not niced above this one plus the hypervisor's steal, at most the machine's CPUs;
    cores of the niced ones, which yield), each rounded to 0.001 (:func:`competing_cores`)."""
    nice = own_nice()
    _, s0 = machine_ticks()
    before, t0 = cpu_by_process(proc), time.monotonic()
    time.sleep(sample_s)
    after, dt = cpu_by_process(proc), time.monotonic() - t0
    _, s1 = machine_ticks()
    compete, niced = competing_cores(before, after, dt, nice, frozenset({os.getpid()}))
    steal = max(0.0, (s1 - s0) / dt)
    return round(min(float(os.cpu_count() or 1), compete + steal), 3), round(niced, 3)


def available_cores(cpus: int, competing: float) -> float:
    """Cores an emulation can count on beside ``competing`` cores of other jobs: ``cpus -
    competing``, at least ``cpus / (1 + competing)`` (the share CFS gives a waking process beside
    ``competing`` always-busy ones)."""
    return max(cpus - competing, cpus / (1.0 + competing))

