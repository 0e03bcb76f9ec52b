"""CPU and memory limits for cluster processes, through cgroups (v1 or v2), written directly.

CPU share ``cores`` becomes a CFS bandwidth quota of ``cores x period`` per ``period`` (100 ms):
cgroup v1 ``cpu.cfs_quota_us``/``cpu.cfs_period_us``, cgroup v2 ``cpu.max`` (Linux
Documentation/scheduler/sched-bwc.rst). Memory: v1 ``memory.limit_in_bytes``, v2 ``memory.max``.
Group names start with ``testbed-<run id>-`` so that cleanup removes only ours.

Time dilation k (``emulation.time_dilation``, :mod:`testbed.plan.dilation`) and the host's speed
(``emulation.speed``, :mod:`testbed.plan.speeds`): a cluster of c cores must run in emulated time
as it does undilated on the profiled machine, i.e. each call at k / s times its CPU time on the wall
clock (s: the host's bare call over the profile's; 1 when the speed is left to the host). Two
nested limits give that (cgroup v1 ``cpu``):

- the cluster's group: ``c x s x 100 ms`` of CPU per period of ``k x 100 ms`` (c x s / k cores;
  :func:`create_limited_group`, its quota lifted while the server starts and times its bare calls,
  then :func:`set_cpu_quota` at c x s);
- inside it, one child group per thread of the server (:func:`cap_threads`), each capped at s / k
  core over a short period (``THREAD_QUOTA_US`` per ``k / s x THREAD_QUOTA_US``): the quota alone
  would let a burst within it run at full speed, k / s times too fast in emulated time.

A quota written while a group runs refills its runtime at once, so writes during the load wait for
the start of the group's period (:class:`PeriodAligned`).

The kernel takes quotas and periods of at least 1 ms and periods of at most 1 s (sched-bwc.rst),
hence ``THREAD_QUOTA_US`` = 1 ms; past k = 10 the cluster's period stays 1 s and its quota is
``c x 1 s / k`` (:func:`dilated_quota_us`). Cgroup v1 also refuses a child whose quota/period
exceeds its parent's, so the per-thread caps need a cluster of at least one core (below, the
server pads its work instead: :func:`testbed.plan.dilation.nested_cpu`).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Iterable
from pathlib import Path

from testbed.core.errors import RunFailure

ROOT = Path("/sys/fs/cgroup")
PERIOD_US = 100_000
#: A dilated cluster's per-thread cap: this much CPU (us, the kernel's smallest quota) per
#: ``k x THREAD_QUOTA_US``. A call runs at 1 / k speed to within one such period.
THREAD_QUOTA_US = 1_000
#: The kernel's longest CFS period (us).
MAX_PERIOD_US = 1_000_000


class CgroupError(RunFailure):
    """Neither a usable cgroup v1 cpu hierarchy nor cgroup v2 is mounted, or a write failed."""


def cgroup_version() -> int:
    """1 when the v1 ``cpu`` controller is mounted, 2 for a pure v2 hierarchy.

    Raises:
        CgroupError: neither is available.
    """
    if (ROOT / "cpu" / "cpu.cfs_quota_us").exists():
        return 1
    if (ROOT / "cgroup.controllers").exists():
        return 2
    raise CgroupError("no cgroup cpu controller found under /sys/fs/cgroup; cannot limit cluster CPU")


def _write(path: Path, value: str) -> None:
    try:
        path.write_text(value)
    except OSError as exc:
        raise CgroupError(f"cannot write {value!r} to {path}: {exc.strerror}") from None


def dilated_period_us(time_dilation: float) -> int:
    """The CFS period (us) of a cluster's group at dilation k: k x :data:`PERIOD_US`, at most the
    kernel's 1 s (:data:`MAX_PERIOD_US`; k > 10 keeps 1 s, with the quota scaled down to match:
    :func:`dilated_quota_us`)."""
    return min(MAX_PERIOD_US, int(round(time_dilation * PERIOD_US)))


def dilated_quota_us(cpu_cores: float, time_dilation: float) -> int:
    """The CFS quota (us) of a cluster of ``cpu_cores`` per :func:`dilated_period_us` at dilation k:
    ``cores x period / k`` (``cores x 100 ms`` while k <= 10), at least the kernel's 1 ms."""
    return max(1000, int(round(cpu_cores * dilated_period_us(time_dilation) / time_dilation)))


def create_limited_group(name: str, cpu_cores: float, memory_mib: int, time_dilation: float = 1.0) -> list[Path]:
    """Create cgroup(s) called ``name`` limited to ``cpu_cores`` cores and ``memory_mib`` MiB; under
    ``time_dilation`` k > 1 the same quota (``cpu_cores x 100 ms``) per period of k x 100 ms, past
    k = 10 ``cpu_cores x 1 s / k`` per 1 s (:func:`dilated_quota_us`; the threads' own caps
    follow with :func:`cap_threads`).

    Returns the created directories (to record for cleanup and to pass to :func:`add_process`).

    Raises:
        CgroupError: cgroups unavailable, a limit cannot be written, or k > 1 on cgroup v2 (its
            per-thread groups would need a threaded subtree, which this module does not build).
    """
    quota = dilated_quota_us(cpu_cores, time_dilation)
    period = dilated_period_us(time_dilation)
    limit = str(memory_mib * 1024 * 1024)
    if cgroup_version() == 1:
        cpu, mem = ROOT / "cpu" / name, ROOT / "memory" / name
        cpu.mkdir(exist_ok=True)
        _write(cpu / "cpu.cfs_period_us", str(period))
        _write(cpu / "cpu.cfs_quota_us", str(quota))
        dirs = [cpu]
        if (ROOT / "memory").is_dir():
            mem.mkdir(exist_ok=True)
            _write(mem / "memory.limit_in_bytes", limit)
            dirs.append(mem)
        return dirs
    if time_dilation != 1.0:
        raise CgroupError(f"time dilation {time_dilation:g} needs cgroup v1's cpu controller (per-thread groups); "
                          f"this machine has cgroup v2 only")
    subtree = ROOT / "cgroup.subtree_control"
    enabled = subtree.read_text().split()
    for ctl in ("cpu", "memory"):
        if ctl not in enabled:
            _write(subtree, f"+{ctl}")
    group = ROOT / name
    group.mkdir(exist_ok=True)
    _write(group / "cpu.max", f"{quota} {PERIOD_US}")
    _write(group / "memory.max", limit)
    return [group]


def set_cpu_quota(dirs: list[Path], cpu_cores: float | None) -> int:
    """Set the CFS quota of a group made by :func:`create_limited_group` to ``cpu_cores`` x
    :data:`PERIOD_US` (rounded up, at least the kernel's 1 ms) per its period as it stands (k x
    100 ms under time dilation), or lift it (``cpu_cores`` None: no limit, quota -1 / ``max``);
    returns the quota (us; -1 when lifted).

    Raises:
        CgroupError: no cpu group among ``dirs``, or the write fails (v1: a child group's
            quota/period above the new one's).
    """
    quota = -1 if cpu_cores is None else max(1000, math.ceil(cpu_cores * PERIOD_US - 1e-6))
    for d in dirs:
        if (d / "cpu.cfs_quota_us").exists():
            _write(d / "cpu.cfs_quota_us", str(quota))
            return quota
        if (d / "cpu.max").exists():
            period = (d / "cpu.max").read_text().split()[1]
            _write(d / "cpu.max", f"{'max' if quota < 0 else quota} {period}")
            return quota
    raise CgroupError(f"no cgroup cpu group among {[str(d) for d in dirs]}: cannot set the quota")


class PeriodAligned:
    """Quota writes timed to the start of a group's CFS period.

    Writing ``cpu.cfs_quota_us`` (v1) or ``cpu.max`` (v2) refills the group's runtime to the whole
    quota at once (Linux kernel/sched/core.c, ``tg_set_cfs_bandwidth`` calls
    ``__refill_cfs_bandwidth_runtime``), so a write in mid-period grants the CPU already used in that
    period a second time: a saturated group whose quota is written once a second runs
    ``1 + period / 1 s`` times its quota (1.25x at k = 2.5, 2x at k >= 10). Written just after the
    period timer's own refill, which ``cpu.stat``'s ``nr_periods`` counts, a write grants only what
    the group ran since, at most :attr:`step_s` of its CPUs.

    The next period's start is predicted from the last one seen (the period timer keeps its phase
    while the group is active) and checked; an idle group (its timer stopped, its runtime full,
    nothing to grant twice) is written after one period of waiting.
    """

    def __init__(self, dirs: list[Path], period_s: float, step_s: float = 0.0005) -> None:
        """``dirs``: a group made by :func:`create_limited_group`; ``period_s``: its CFS period (s,
        :func:`dilated_period_us` / 1e6); ``step_s``: how often (s) ``cpu.stat`` is read while a
        period's end is due."""
        self.dirs, self.period_s, self.step_s = dirs, period_s, step_s
        self.last_start: float | None = None  # clock time a period was last seen to start

    def _periods(self) -> int | None:
        return cpu_stat(self.dirs).get("periods")  # type: ignore[return-value]

    def _watch(self, until: float) -> bool:
        """Read ``nr_periods`` every :attr:`step_s` until it counts up (True) or ``until``."""
        n0 = self._periods()
        while n0 is not None and time.monotonic() < until:
            time.sleep(self.step_s)
            if self._periods() != n0:
                self.last_start = time.monotonic()
                return True
        return False

    def wait_period_start(self) -> bool:
        """Return just after the group's next CFS period starts (True), or after a period and a
        little more without one (False: the group is idle, its period timer stopped)."""
        if self.last_start is not None:
            now = time.monotonic()
            due = self.last_start + math.ceil((now - self.last_start) / self.period_s + 1e-9) * self.period_s
            if due - now > 0.003:
                time.sleep(due - now - 0.003)
            if self._watch(due + 0.005):
                return True
        return self._watch(time.monotonic() + self.period_s + 0.005)

    def set_cpu_quota(self, cpu_cores: float | None) -> int:
        """:func:`set_cpu_quota`, written when :meth:`wait_period_start` returns.

        Raises:
            CgroupError: as :func:`set_cpu_quota`.
        """
        self.wait_period_start()
        return set_cpu_quota(self.dirs, cpu_cores)


def cpu_stat(dirs: list[Path]) -> dict[str, float]:
    """CFS bandwidth counters of a group made by :func:`create_limited_group`: ``periods`` (CFS
    periods in which the group ran), ``throttled_periods`` (of those, how many ran out of quota),
    ``throttled_s`` (time its threads waited for the next period), and on cgroup v2 ``usage_s``
    (the CPU time its threads took). From ``cpu.stat`` (v1: ``throttled_time`` ns; v2:
    ``throttled_usec``, ``usage_usec``; Linux Documentation/scheduler/sched-bwc.rst,
    Documentation/admin-guide/cgroup-v2.rst). Empty when the file cannot be read (the group is gone)."""
    for d in dirs:
        kv = _flat_keyed(d / "cpu.stat")
        if kv is None or "nr_periods" not in kv:
            continue
        out = {"periods": int(kv["nr_periods"]), "throttled_periods": int(kv.get("nr_throttled", 0)),
               "throttled_s": _throttled_s(kv)}
        if "usage_usec" in kv:
            out["usage_s"] = int(kv["usage_usec"]) / 1e6
        return out
    return {}


def _throttled_s(kv: dict[str, str]) -> float:
    """The time (s) a group's threads waited for their periods' ends, from its ``cpu.stat``
    (v1: ``throttled_time`` ns; v2: ``throttled_usec``)."""
    if "throttled_time" in kv:  # v1, ns
        return int(kv["throttled_time"]) / 1e9
    return int(kv.get("throttled_usec", 0)) / 1e6


def cpu_stat_file(dirs: list[Path]) -> Path | None:
    """The ``cpu.stat`` of a group made by :func:`create_limited_group` (its CPU directory's), as
    any mount namespace can reach it: through this process's root (``/proc/<pid>/root``, proc(5)),
    since a Mininet host mounts a /sys of its own, without the cgroup hierarchy (mnexec remounts
    /sys for its network namespace). Valid while this process lives; None when the group has no
    ``cpu.stat``."""
    stat = next((d / "cpu.stat" for d in dirs if (d / "cpu.stat").exists()), None)
    return None if stat is None else Path(f"/proc/{os.getpid()}/root") / stat.relative_to(stat.anchor)


class ThrottleCounters:
    """The throttling counters of one group, read again and again from one open ``cpu.stat``
    (``pread`` at offset 0 makes the kernel write the file anew; a few us against a path's
    lookup's tens to hundreds): how many CFS periods the group has run out of quota in so far
    (``nr_throttled``) and how long (s) it has waited for its periods' ends (:func:`cpu_stat`'s
    ``throttled_s``), as the kernel counts them (Linux
    Documentation/scheduler/sched-bwc.rst): the first counts up when the quota runs out, the
    second when the wait ends. A server calls it around each paced model call and through its pad.

    Raises:
        OSError: ``stat_file`` cannot be opened.
    """

    def __init__(self, stat_file: Path) -> None:
        self.fd = os.open(stat_file, os.O_RDONLY | os.O_CLOEXEC)

    def __call__(self) -> tuple[int, float] | None:
        """(nr_throttled, the wait in s); None when the file cannot be read or lacks them."""
        try:
            kv = _flat_keyed_text(os.pread(self.fd, 4096, 0).decode())
            return int(kv["nr_throttled"]), _throttled_s(kv)
        except (OSError, KeyError, ValueError, UnicodeDecodeError):
            return None

    def close(self) -> None:
        """Close the file."""
        os.close(self.fd)


def oom_kills(dirs: list[Path]) -> int | None:
    """How many processes the memory limit of a group made by :func:`create_limited_group` has
    killed: ``oom_kill`` of ``memory.oom_control`` (v1) or ``memory.events`` (v2) (Linux
    Documentation/admin-guide/cgroup-v1/memory.rst, cgroup-v2.rst). None when it cannot be read."""
    for d in dirs:
        for name in ("memory.oom_control", "memory.events"):
            kv = _flat_keyed(d / name)
            if kv is not None and "oom_kill" in kv:
                return int(kv["oom_kill"])
    return None


def _flat_keyed(path: Path) -> dict[str, str] | None:
    """A cgroup file of ``key value`` lines (cgroup-v2.rst, "flat keyed") as a dict; None when it
    cannot be read (the group is gone, or the controller has no such file)."""
    try:
        return _flat_keyed_text(path.read_text())
    except OSError:
        return None


def _flat_keyed_text(text: str) -> dict[str, str]:
    """The ``key value`` lines of a flat-keyed cgroup file's ``text`` as a dict."""
    return dict(line.split() for line in text.splitlines() if len(line.split()) == 2)


def thread_groups(dirs: list[Path]) -> list[Path]:
    """The per-thread child groups :func:`cap_threads` made under the v1 cpu group of ``dirs``."""
    return [c for d in dirs if d.parent == ROOT / "cpu" for c in sorted(d.glob("t[0-9]*")) if c.is_dir()]


def cap_threads(dirs: list[Path], pid: int, slowdown: float) -> int:
    """Put every thread of process ``pid`` not yet capped into a child group of its own under the
    v1 cpu group of ``dirs``, capped at 1 / ``slowdown`` core (:data:`THREAD_QUOTA_US` per
    ``slowdown`` x that): ``slowdown`` = k / s, a call's wall time over its CPU time (k under time
    dilation at the host's speed). Call it again to catch threads started since (a thread starts in
    its creator's group, so until then it shares that cap: slower, never faster). Returns how many
    threads it placed; 0 when ``slowdown`` is 1.

    Raises:
        CgroupError: a group cannot be made or written (a thread that has exited meanwhile is
            skipped).
    """
    if slowdown == 1.0:
        return 0
    cpu = next((d for d in dirs if d.parent == ROOT / "cpu"), None)
    if cpu is None:
        raise CgroupError(f"a slowdown of {slowdown:g}: no cgroup v1 cpu group among {[str(d) for d in dirs]}")
    # rounded up: the cap never exceeds 1 / slowdown, nor the cluster's share (cgroup v1 refuses that)
    period = str(max(THREAD_QUOTA_US, math.ceil(slowdown * THREAD_QUOTA_US - 1e-6)))
    try:
        tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return 0  # the process has exited
    placed = 0
    for tid in tids:
        child = cpu / f"t{tid}"
        if child.is_dir():
            continue
        child.mkdir()
        _write(child / "cpu.cfs_period_us", period)
        try:
            (child / "cpu.cfs_quota_us").write_text(str(THREAD_QUOTA_US))
        except OSError as exc:
            child.rmdir()
            raise CgroupError(f"cannot cap thread {tid} of {cpu.name} at 1/{slowdown:.3g} core: {exc.strerror} "
                              f"(cgroup v1 refuses a child whose quota/period exceeds its parent's: the group has "
                              f"less than one core)") from None
        try:
            (child / "tasks").write_text(str(tid))
        except OSError:  # the thread ended meanwhile (ESRCH)
            child.rmdir()
            continue
        placed += 1
    return placed


def remove_groups(dirs: Iterable[Path]) -> None:
    """Remove the groups ``dirs``, in that order (each empty once its processes ended; a busy or
    vanished one is left as it is)."""
    for d in dirs:
        try:
            d.rmdir()
        except OSError:
            pass


def remove_thread_groups(dirs: list[Path]) -> None:
    """Remove the per-thread child groups (empty once the process ended; a busy one is left)."""
    remove_groups(thread_groups(dirs))


def add_process(dirs: list[Path], pid: int) -> None:
    """Move process ``pid`` (all its threads) into the groups ``dirs``.

    Raises:
        CgroupError: the write fails (e.g. the process has exited).
    """
    for d in dirs:
        _write(d / "cgroup.procs", str(pid))
