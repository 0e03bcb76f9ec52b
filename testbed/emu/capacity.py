"""Will an emulation fit this machine? The pre-flight estimate of the memory, processes and file
descriptors a run needs, from its plan, against what the machine has; a run that cannot fit is
refused before anything is built (exit code 3), saying what it needs and what there is.

The estimate (:func:`estimate`) counts the run's parts from the plan, the way the bring-up builds
them (:mod:`testbed.emu.netplan`): the switches, the OVS shards (private ``ovsdb-server`` +
``ovs-vswitchd``, one per :data:`~testbed.emu.netplan.SWITCHES_PER_OVS` switches above
:data:`~testbed.emu.netplan.SHARD_ABOVE_SWITCHES`), the links and the link-emulator processes
(one per :data:`~testbed.emu.netplan.LINKS_PER_EMULATOR` links), the Mininet nodes (one shell
each: hosts, shard and emulator namespaces, probe hosts), the interfaces (veth ends), the
inference servers (one process per worker, by runtime), the sources, the controller and the run
process itself; and multiplies them by the per-item costs of :data:`COSTS`, measured on this
machine by ``benchmarks/scale_bench.py costs`` (the command and the figures are in the comment of
each constant, and in docs/scale-out.md, "Pre-flight").

What the machine has (:func:`machine`): ``MemAvailable`` of ``/proc/meminfo`` (proc(5)), the soft
``RLIMIT_NOFILE`` (``ulimit -n``: the run process holds a pseudo-terminal per Mininet node, so it
is the one process whose descriptors grow with the network), ``/proc/sys/kernel/pid_max`` and
``threads-max`` (every process and thread takes a pid). ``$TESTBED_MEM_AVAILABLE_MIB`` replaces the
measured MemAvailable (a fake memory limit: tests, and a user who wants to keep memory for other
jobs).

Rules (our choice, stated): a run fits when its memory is at most :data:`MEMORY_SHARE` of
MemAvailable, its processes and threads at most :data:`PID_SHARE` of the pids left, and the run
process's descriptors at most :data:`FD_SHARE` of ``ulimit -n``. CPU does not refuse a run: with
the plan's load, the run is told the time dilation k at which the CPU would carry it
(:func:`testbed.emu.autodilate.k_for`, the rule of ``--time-dilation auto`` with the whole
machine idle, less the CPU the idle network itself takes, :data:`IDLE_CORES_PER_SHARD` and
:data:`IDLE_CORES_PER_SWITCH`, and its continuous path probes, :func:`~testbed.emu.netplan.path_probe_cores`).
"""

from __future__ import annotations

import math
import os
import resource
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from testbed.core.errors import EXIT_BRINGUP, RunFailure
from testbed.emu.cleanup import RUN_ENV
from testbed.emu.machine import CPU_ROLES, available_cores, other_jobs
from testbed.emu.netplan import emulator_groups, ovs_shards, path_probe_cores, probe_hosts
from testbed.plan.build import Plan
from testbed.plan.traces import application_rates
from testbed.plan.transfer import TransferTable
from testbed.spec.experiment import MAX_TIME_DILATION

#: The environment variable that replaces the measured MemAvailable (MiB): a fake memory limit.
MEM_ENV = "TESTBED_MEM_AVAILABLE_MIB"
#: A run fits in at most this share of MemAvailable (the rest: the page cache the run's own files
#: and logs need, and other jobs' growth while it runs).
MEMORY_SHARE = 0.9
#: ... at most this share of the pids left (pid_max and threads-max, less what runs now).
PID_SHARE = 0.8
#: ... and the run process's descriptors at most this share of its soft ``ulimit -n``.
FD_SHARE = 0.8
#: The role of a Mininet node's shell (``bash --norc`` under ``mnexec``) in :func:`usage_by_role`.
SHELL_ROLE = "mininet shells"


@dataclass(frozen=True)
class Cost:
    """What one item of a run costs: memory (MiB, proportional set size: shared pages split among
    the processes that map them, so the sum is what the machine gives), processes, threads
    (beyond one per process), and file descriptors (in its own processes; ``run_fds``: in the run
    process)."""

    mib: float = 0.0
    processes: int = 0
    threads: int = 0
    fds: int = 0
    run_fds: int = 0


#: Per-item costs, measured by ``sudo .venv/bin/python benchmarks/scale_bench.py costs
#: topohub:gabriel/50/0 topohub:gabriel/100/0`` (the testbed's network of each, idle, 2026-12-05, load
#: average 8-9 from other jobs) and ``... costs --run experiments/default.yaml`` (servers and sources,
#: the largest sample of a 15 s run), on the 2-core build machine. Per role, Gabriel 50 / 100:
#: ovs-vswitchd 123.4 / 242.6 MiB, 792 / 1,556 fds, 6 threads each, for 10 / 20 shards; ovsdb-server
#: 26.7 / 49.8 MiB, 19 fds each; link emulators 20.0 / 30.2 MiB for 2 / 3 processes, 319 / 591 fds
#: for 99 / 186 links (3.1 per link); Mininet shells 0.35 MiB and 4 fds each; ryu-manager 47.8 / 48.2
#: MiB, 56 / 106 fds (one per switch); the run process 63.2 / 67.9 MiB and 43 / 66 fds for 16 / 27
#: Mininet nodes (2 per node), 129 MiB in ``testbed run``; the kernel's own memory (Slab, stacks, page
#: tables) grew 45.0 / 65.5 MiB for 424 / 792 interfaces (0.056 MiB each; the rest, about 21 MiB,
#: counted with the run process). The run of default.yaml (4 LiteRT clusters of 1 worker, 4 sources):
#: inference servers 1,210.5 MiB for 4 processes of 2 threads (and, during the paths' warm-up, 4
#: warming processes of 74 MiB that end before the sources start), sources 226.8 MiB for 4 of 2
#: threads, the run process 190.1 MiB, ryu-manager 48.8 MiB. A TensorFlow server's 530 MiB is
#: environment.md's ~525 MB RSS per process (not measured by the command above: no shipped big
#: experiment serves TensorFlow). docs/scale-out.md, "Pre-flight", has the table.
COSTS: dict[str, Cost] = {
    "run process": Cost(mib=211.0, processes=1, threads=3, fds=20),
    "mininet node": Cost(mib=0.35, processes=1, fds=4, run_fds=2),
    "switch": Cost(fds=1),
    "ovs shard": Cost(mib=14.8, processes=2, threads=5, fds=97),
    "link": Cost(fds=3),
    "link emulator": Cost(mib=10.0, processes=1, fds=5),
    "interface": Cost(mib=0.056),
    "controller": Cost(mib=49.0, processes=1, fds=6),
    "server tensorflow": Cost(mib=530.0, processes=1, threads=20, fds=40),
    "server litert": Cost(mib=303.0, processes=1, threads=1, fds=6),
    "source": Cost(mib=57.0, processes=1, threads=1, fds=6),
}
#: CPU (cores) the idle network takes, measured with :data:`COSTS` over 10 s: per OVS shard (its
#: ovs-vswitchd's periodic work; 0.0277 / 0.0456 cores for 10 / 20 shards) and per switch (ryu-manager's
#: LLDP and port statistics; 0.0148 / 0.0297 cores for 50 / 100 switches).
IDLE_CORES_PER_SHARD = 0.0025
IDLE_CORES_PER_SWITCH = 0.0003


@dataclass(frozen=True)
class Needs:
    """What a run needs: ``items`` (item -> count), ``memory_mib``, ``processes`` and ``threads``
    (pids), ``run_fds`` (descriptors of the run process), ``idle_cores`` (the idle network's CPU)."""

    items: dict[str, int]
    memory_mib: float
    processes: int
    threads: int
    run_fds: int
    idle_cores: float

    def line(self) -> str:
        """One line: the needs and the items they are for."""
        parts = ", ".join(f"{item} {n:,}" for item, n in self.items.items() if n)
        return (f"{self.memory_mib:,.0f} MiB, {self.processes:,} processes ({self.threads:,} pids with their "
                f"threads), {self.run_fds:,} file descriptors in the run process; for {parts}")


@dataclass(frozen=True)
class Machine:
    """What the machine has: ``mem_available_mib`` (``fake``: from :data:`MEM_ENV`), ``nofile``
    (soft ``ulimit -n``), ``pids_left`` (the lower of pid_max and threads-max, less the tasks that
    run now), ``cpus``."""

    mem_available_mib: float
    nofile: int
    pids_left: int
    cpus: int
    fake: bool = False


@dataclass
class Capacity:
    """The verdict: ``needs``, ``machine``, ``problems`` (one line per limit the run would pass;
    empty: it fits) and ``k`` (the time dilation at which the CPU carries it; None: none up to the
    largest)."""

    needs: Needs
    machine: Machine
    problems: list[str] = field(default_factory=list)
    k: float | None = None
    k_why: str = ""

    @property
    def fits(self) -> bool:
        return not self.problems


def _meminfo_mib(key: str, path: Path = Path("/proc/meminfo")) -> float:
    for line in path.read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024
    raise ValueError(f"{path}: no {key}")


def _tasks_now() -> int:
    """Tasks (threads) running on the machine now: the 4th field of /proc/loadavg ``running/total``."""
    return int(Path("/proc/loadavg").read_text().split()[3].split("/")[1])


def machine(mem_available_mib: float | None = None) -> Machine:
    """What this machine has now (:class:`Machine`); ``mem_available_mib`` (or :data:`MEM_ENV`)
    replaces MemAvailable.

    Raises:
        RunFailure: :data:`MEM_ENV` is set but is not a number of MiB (exit code 3).
    """
    fake = mem_available_mib is not None or bool(os.environ.get(MEM_ENV))
    if mem_available_mib is None and os.environ.get(MEM_ENV):
        try:
            mem_available_mib = float(os.environ[MEM_ENV])
        except ValueError:
            raise RunFailure(f"${MEM_ENV}={os.environ[MEM_ENV]!r}: not a number of MiB", EXIT_BRINGUP) from None
    mem = mem_available_mib if mem_available_mib is not None else _meminfo_mib("MemAvailable")
    limits = [int(Path(f"/proc/sys/kernel/{k}").read_text()) for k in ("pid_max", "threads-max")]
    return Machine(float(mem), resource.getrlimit(resource.RLIMIT_NOFILE)[0], min(limits) - _tasks_now(),
                   os.cpu_count() or 1, fake)


def count_items(plan: Plan, link_emulator: str = "userspace", datapath: str = "user") -> dict[str, int]:
    """The run's parts (module doc) as the bring-up builds them for ``link_emulator`` and ``datapath``."""
    shards = len(ovs_shards(plan, datapath))
    emulators = len(emulator_groups(plan)) if link_emulator == "userspace" else 0
    probes = len(probe_hosts(plan))
    hosts = len(plan.hosts)
    links = len(plan.links)
    # veth ends: a switch link is 2 veths through its emulator (4 ends) or 1 (2); a host link 2; a shard's control 2
    interfaces = links * (4 if emulators else 2) + 2 * (hosts + probes) + 2 * shards
    workers = {"tensorflow": 0, "litert": 0}
    for c in plan.experiment.clusters:
        runtimes = {c.server.runtime_of(m) for m in c.models}
        workers["tensorflow" if "tensorflow" in runtimes else "litert"] += c.workers
    return {"switch": len(plan.switches), "ovs shard": shards, "link": links, "link emulator": emulators,
            "mininet node": hosts + probes + shards + emulators, "interface": interfaces,
            "server tensorflow": workers["tensorflow"], "server litert": workers["litert"],
            "source": len(plan.sources), "controller": 1, "run process": 1}


def estimate(plan: Plan, link_emulator: str = "userspace", datapath: str = "user",
             costs: dict[str, Cost] | None = None) -> Needs:
    """What a run of ``plan`` needs (:class:`Needs`): :func:`count_items` x :data:`COSTS`."""
    costs = costs or COSTS
    items = count_items(plan, link_emulator, datapath)
    mem = sum(n * costs[i].mib for i, n in items.items())
    procs = sum(n * costs[i].processes for i, n in items.items())
    threads = procs + sum(n * costs[i].threads for i, n in items.items())
    run_fds = costs["run process"].fds + sum(n * costs[i].run_fds for i, n in items.items())
    idle = (items["ovs shard"] * IDLE_CORES_PER_SHARD + items["switch"] * IDLE_CORES_PER_SWITCH
            + path_probe_cores(plan, datapath))
    return Needs(items, mem, procs, threads, run_fds, idle)


#: The busy fraction a k keeps the available cores (and Open vSwitch's one thread) under (the rule of
#: ``--time-dilation auto``, :mod:`testbed.emu.autodilate`: below half busy the mean wait for a CPU
#: stays below the work's own time, M/M/1).
MAX_BUSY_FRACTION = 0.5
#: The CPU a query costs the testbed (ms, wall clock) before anything is measured: Open vSwitch and
#: the link emulators per switch link of the path, and the sources, controller and run process per
#: query. From ``testbed run experiments/default.yaml --duration 10s`` on the 2-core build machine
#: (243 queries, summary.json machine_cpu: Open vSwitch 6.2 and link emulators 1.7 ms per query over
#: 3.6 links per path; sources 2.8, controller 0.2, run process 0.5). A guess: auto's warm-ups measure.
GUESS_CPU_MS_PER_HOP = 2.2
GUESS_CPU_MS_PER_QUERY = 3.5


def k_grid(k: float) -> float:
    """``k`` rounded up on the grid auto chooses from: steps of 0.5 up to 10, of 1 up to 20, of 5
    above (at least 1)."""
    k = max(1.0, float(k))
    step = 0.5 if k <= 10 else 1.0 if k <= 20 else 5.0
    return math.ceil(k / step - 1e-9) * step


def emulated_rate_qps(plan: Plan) -> float:
    """The plan's peak emulated query rate (q/s): each workload entry's arrival process at each
    source it selects, with the source's spatial weight (a step process counts its highest rate)."""
    return sum(application_rates(plan.experiment.workload, plan.weights, Path(plan.base_dir)).values())


def guess_cores(plan: Plan) -> float:
    """The cores the emulation of ``plan`` needs at k = 1, guessed from the plan alone: its peak rate
    x (:data:`GUESS_CPU_MS_PER_QUERY` + :data:`GUESS_CPU_MS_PER_HOP` x the mean path length in switch
    links), plus the servers' busy CPU at that rate, capped at the clusters' cores."""
    rate = emulated_rate_qps(plan)
    table = TransferTable(plan.to_dict())
    hops = [table.hops(p.source, p.cluster) or 0 for p in plan.paths]
    per_query = GUESS_CPU_MS_PER_QUERY + GUESS_CPU_MS_PER_HOP * (float(np.mean(hops)) if hops else 0.0)
    services = [f.busy_mean_ms for by in plan.services.values() for f in by.values()]
    cluster_cores = sum(c.cpu_cores for c in plan.experiment.clusters)
    servers = min(cluster_cores, rate * (float(np.mean(services)) if services else 0.0) / 1e3)
    return rate * per_query / 1e3 + servers


def k_for(plan: Plan, available: float) -> tuple[float | None, str]:
    """The k at which ``available`` cores would carry ``plan``'s load by the rule of ``auto``
    (:data:`MAX_BUSY_FRACTION`), from :func:`guess_cores` (nothing measured): (k on :func:`k_grid`,
    or None above the largest; a line saying why)."""
    needed = guess_cores(plan)
    k = k_grid(needed / (MAX_BUSY_FRACTION * max(available, 1e-9)))
    why = (f"{emulated_rate_qps(plan):.1f} q/s emulated: about {needed:.2f} cores at k = 1 (a guess from the plan's "
           f"rate and path lengths), on {max(available, 0):.2f} available cores")
    return (k if k <= MAX_TIME_DILATION else None), why


def check_capacity(plan: Plan, link_emulator: str = "userspace", datapath: str = "user",
                   have: Machine | None = None, others: float = 0.0) -> Capacity:
    """The verdict for ``plan`` on this machine (or ``have``), with the k the CPU needs (module doc)
    on the cores other jobs leave (``others``: the cores they take now, niced ones left out; what
    is left is at least the share CFS gives beside them, as ``auto`` counts it)."""
    needs = estimate(plan, link_emulator, datapath)
    have = have or machine()
    out = Capacity(needs, have)
    fake = f" (${MEM_ENV})" if have.fake else ""
    if needs.memory_mib > MEMORY_SHARE * have.mem_available_mib:
        out.problems.append(f"memory: it needs about {needs.memory_mib:,.0f} MiB, over {MEMORY_SHARE:.0%} of the "
                            f"{have.mem_available_mib:,.0f} MiB available{fake}")
    if needs.threads > PID_SHARE * have.pids_left:
        out.problems.append(f"processes: it needs about {needs.threads:,} pids (processes and threads), over "
                            f"{PID_SHARE:.0%} of the {have.pids_left:,} left (pid_max, threads-max)")
    if needs.run_fds > FD_SHARE * have.nofile:
        out.problems.append(f"file descriptors: the run process needs about {needs.run_fds:,}, over {FD_SHARE:.0%} "
                            f"of its limit of {have.nofile:,} (`ulimit -n`; raise it, e.g. `ulimit -n 65536`)")
    out.k, out.k_why = k_for(plan, available_cores(have.cpus, others) - needs.idle_cores)
    if others > 0:
        out.k_why += f"; other jobs take {others:.2f} cores now"
    out.k_why += (f"; the idle network takes {needs.idle_cores:.2f} cores, which no k reduces, and its forwarding "
                  f"under traffic (Open vSwitch, link emulators) is not in the guess: the run measures it and says "
                  f"whether its k was too small")
    return out


#: How long (s) the pre-flight samples other jobs' CPU (:func:`testbed.emu.machine.other_jobs`): a
#: glance, not a measurement of the run's conditions (auto samples 1 s, then measures warm-ups).
PREFLIGHT_SAMPLE_S = 0.5


def refuse_unfit(plan: Plan, console, link_emulator: str = "userspace", datapath: str = "user") -> Capacity:
    """Say what the run needs against what the machine has; refuse a run that cannot fit.

    Raises:
        RunFailure: (exit code 3, nothing built) naming every limit it would pass and the figures.
    """
    cap = check_capacity(plan, link_emulator, datapath, others=other_jobs(PREFLIGHT_SAMPLE_S)[0])
    m = cap.machine
    have = (f"{m.mem_available_mib:,.0f} MiB available{' ($' + MEM_ENV + ')' if m.fake else ''}, "
            f"ulimit -n {m.nofile:,}, {m.pids_left:,} pids left, {m.cpus} CPUs")
    k = f"k = {cap.k:g}" if cap.k is not None else "no k up to the largest"
    if console is not None:
        console.print(f"pre-flight: needs {cap.needs.line()}; the machine has {have}; CPU: {k} would carry the load "
                      f"({cap.k_why})", markup=False, highlight=False)
    if not cap.fits:
        raise RunFailure("this run does not fit this machine: " + "; ".join(cap.problems)
                         + f" (it needs {cap.needs.line()}; the machine has {have}); nothing was built. Run it on a "
                           f"larger machine, or plan fewer switches, links, clusters' workers or sources "
                           f"(docs/scale-out.md, \"Pre-flight\")", EXIT_BRINGUP)
    return cap


# ----------------------------------------------------------------------------- measuring the costs

@dataclass
class Usage:
    """What the processes of one role use now: how many, their threads, their memory (PSS, MiB)
    and file descriptors (``max_fds``: the most of any one)."""

    processes: int = 0
    threads: int = 0
    pss_mib: float = 0.0
    fds: int = 0
    max_fds: int = 0


def role_of(cmdline: str) -> str:
    """A process's role (:data:`testbed.emu.machine.CPU_ROLES`, or :data:`SHELL_ROLE`, else ``other``)."""
    for role, pattern in CPU_ROLES:
        if pattern in cmdline:
            return role
    if "mnexec" in cmdline or cmdline.startswith("bash --norc"):
        return SHELL_ROLE
    return "other"


def usage_by_role(run_id: str) -> dict[str, Usage]:
    """Per role, what the processes tagged ``TESTBED_RUN_ID=run_id`` use now, and the calling
    process as ``run process`` (the measurement of :data:`COSTS`; needs root to read others'
    memory maps)."""
    import psutil

    out: dict[str, Usage] = {}
    me = os.getpid()
    for p in psutil.process_iter(["cmdline"]):
        try:
            if p.pid == me:
                role = "run process"
            elif p.environ().get(RUN_ENV) == run_id:
                role = role_of(" ".join(p.info["cmdline"] or []))
            else:
                continue
            u = out.setdefault(role, Usage())
            fds = p.num_fds()
            u.processes += 1
            u.threads += p.num_threads()
            u.pss_mib += p.memory_full_info().pss / 2**20
            u.fds += fds
            u.max_fds = max(u.max_fds, fds)
        except (psutil.Error, OSError):
            continue
    return out


def kernel_mib() -> float:
    """The kernel's own memory now (MiB): Slab + KernelStack + PageTables + Percpu of /proc/meminfo."""
    return sum(_meminfo_mib(k) for k in ("Slab", "KernelStack", "PageTables", "Percpu"))


__all__ = ["COSTS", "FD_SHARE", "IDLE_CORES_PER_SHARD", "IDLE_CORES_PER_SWITCH", "MEMORY_SHARE", "MEM_ENV",
           "PID_SHARE", "Capacity", "Cost", "Machine", "Needs", "Usage", "check_capacity", "count_items", "estimate",
           "kernel_mib", "machine", "refuse_unfit", "role_of", "usage_by_role"]
