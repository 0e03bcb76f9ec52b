"""The machine's CPU while an emulation's load runs: how busy its CPUs were, and which of the
testbed's processes (link emulators, Open vSwitch, inference servers, sources, the controller)
used how much of them.

Why: the emulation runs every part of the experiment on the same few CPUs, and its own processes
cost CPU per query (``docs/scale-out.md``, "Load ceiling": about 6 ms per query at 300 q/s on
digits-abilene). When the CPUs are saturated, queries wait for a CPU in every process on their
path, and that waiting shows up as network and queueing time that the simulator, which models the
clusters' CPU shares but not the testbed's own processes, does not have. The summary states the
machine's load during the run and warns when it was saturated (:data:`SATURATED_SHARE`).

:class:`CpuSampler` reads, every ``interval_s``:

* ``/proc/stat`` (proc(5), the ``cpu`` line): the machine's busy time (user + nice + system +
  irq + softirq) and the time stolen by the hypervisor (steal), in clock ticks
  (``SC_CLK_TCK``);
* ``/proc/<pid>/stat`` of every process (utime + stime), summed per role (:data:`CPU_ROLES`,
  matched on the command line; the sampling process itself is ``run process``, anything else
  ``other``: other jobs on the machine).

:meth:`CpuSampler.result` gives mean cores (CPU seconds per second) per role over the window. A
process that exits inside the window keeps the CPU it used until its last sample; what it used
after that is lost (at most ``interval_s`` of it).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

from pydantic import BaseModel

#: Roles of the processes (label, substring of the command line), first match wins.
CPU_ROLES: tuple[tuple[str, str], ...] = (
    ("link emulators", "testbed.emulation.linkemu"), ("inference servers", "testbed.inference.server"),
    ("sources", "testbed.workload"), ("controller", "testbed.ryu_launcher"), ("controller", "ryu-manager"),
    ("ovs-vswitchd", "ovs-vswitchd"), ("ovsdb-server", "ovsdb-server"), ("packet capture", "tcpdump"))
#: The roles that are the testbed's own machinery (not the clusters' inference, not other jobs).
TESTBED_ROLES = ("link emulators", "sources", "controller", "ovs-vswitchd", "ovsdb-server", "packet capture",
                 "run process")
#: The summary warns when the machine's CPUs were busy (or stolen by the hypervisor) at least this
#: share of the load window (:attr:`MachineCpu.busy_share`).
SATURATED_SHARE = 0.9
#: ... and names other jobs' CPU use, and the hypervisor's steal, from this many cores on.
OTHER_NOTABLE_CORES = 0.25
STEAL_NOTABLE_CORES = 0.1

CLK_TCK = os.sysconf("SC_CLK_TCK")


class MachineCpu(BaseModel):
    """The machine's CPU over a load window (``machine_cpu.json``): ``window_s`` (s), ``cpus``
    (online CPUs), ``busy_cores`` and ``steal_cores`` (mean CPUs busy / stolen by the hypervisor,
    from ``/proc/stat``), ``by_role`` (mean cores per role, :data:`CPU_ROLES`, ``run process`` and
    ``other``), ``testbed_cores`` (the sum over :data:`TESTBED_ROLES`)."""

    window_s: float
    cpus: int
    busy_cores: float
    steal_cores: float
    by_role: dict[str, float]
    testbed_cores: float

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


def role_of(cmdline: str) -> str:
    """The role of a process from its command line (:data:`CPU_ROLES`), else ``other``."""
    return next((role for role, pattern in CPU_ROLES if pattern in cmdline), "other")


def _proc_cpu_s(pid: str) -> float:
    """User + system CPU (s) of a process (proc(5), ``/proc/<pid>/stat`` fields 14-15).

    Raises:
        OSError: the process is gone. (ValueError, IndexError: a malformed line.)
    """
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


class CpuSampler(threading.Thread):
    """Samples the machine's CPU every ``interval_s`` over the window [``t_from``, ``t_to``] (epoch
    s; module docstring): the first sample at ``t_from`` (the thread waits for it), the last at
    ``t_to`` or at :meth:`stop`, whichever comes first. Per process, the CPU it used between the
    first and the last sample that saw it counts (from 0 for a process started after ``t_from``),
    so a process that exits inside the window keeps what it used until the last sample before its
    exit."""

    def __init__(self, t_from: float, t_to: float, interval_s: float = 1.0) -> None:
        super().__init__(daemon=True, name="machine-cpu")
        self.t_from, self.t_to, self.interval_s = t_from, t_to, interval_s
        self._done = threading.Event()
        self._roles: dict[int, str] = {}
        self._me = os.getpid()
        self._first: dict[int, float] = {}  # pid -> CPU s at the window's first sample
        self._last: dict[int, float] = {}   # pid -> CPU s at the last sample that saw it
        self._machine: list[tuple[float, float, float]] = []  # (epoch s, busy s, steal s): the first, the last

    def _role(self, pid: int) -> str:
        if pid not in self._roles:
            if pid == self._me:
                self._roles[pid] = "run process"
            else:
                try:
                    cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                except OSError:
                    cmd = ""
                self._roles[pid] = role_of(cmd)
        return self._roles[pid]

    def _sample(self) -> None:
        first = not self._machine
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                cpu = _proc_cpu_s(name)
            except (OSError, ValueError, IndexError):
                continue
            pid = int(name)
            self._role(pid)
            if first:
                self._first[pid] = cpu
            self._last[pid] = cpu
        busy, steal = machine_ticks()
        self._machine = [*self._machine[:1], (time.time(), busy, steal)]  # keep the first and this one

    def run(self) -> None:
        if self._done.wait(max(0.0, self.t_from - time.time())):
            return  # stopped before the window began: nothing measured
        self._sample()
        while not self._done.wait(max(0.0, min(self.interval_s, self.t_to - time.time()))):
            self._sample()
            if time.time() >= self.t_to:
                return
        self._sample()

    def stop(self) -> None:
        """End the window now (a last sample) if it has not ended; waits for the thread."""
        self._done.set()
        if self.is_alive():
            self.join(5.0)

    def result(self) -> MachineCpu | None:
        """Mean cores over the window sampled (call after :meth:`stop`); None with fewer than two
        samples (stopped before, or within, the window's first instant)."""
        if len(self._machine) < 2:
            return None
        (ta, busy_a, steal_a), (tb, busy_b, steal_b) = self._machine
        dt = tb - ta
        if dt <= 0:
            return None
        used: dict[str, float] = {}
        for pid, last in self._last.items():
            role = self._roles.get(pid, "other")
            used[role] = used.get(role, 0.0) + max(0.0, last - self._first.get(pid, 0.0))
        roles = {r: round(v / dt, 3) for r, v in sorted(used.items()) if v > 0}
        return MachineCpu(window_s=round(dt, 3), cpus=os.cpu_count() or 1,
                          busy_cores=round(max(0.0, busy_b - busy_a) / dt, 3),
                          steal_cores=round(max(0.0, steal_b - steal_a) / dt, 3), by_role=roles,
                          testbed_cores=round(sum(roles.get(r, 0.0) for r in TESTBED_ROLES), 3))


def write_load_window(sampler: CpuSampler, path: Path) -> MachineCpu | None:
    """Stop ``sampler`` and write its :class:`MachineCpu` to ``path`` (JSON); nothing is written for
    a window with fewer than two samples (a load interrupted before it began). A write error (a
    full disk at teardown) is reported on stderr, not raised: the run already fails with its
    storage incident."""
    sampler.stop()
    got = sampler.result()
    if got is not None:
        try:
            path.write_text(got.model_dump_json(indent=1))
        except OSError as exc:
            print(f"[testbed] cannot write {path}: {exc}; the machine's CPU during the load is not kept",
                  file=sys.stderr)
    return got
