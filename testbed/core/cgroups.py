"""CPU and memory limits for cluster processes, through cgroups (v1 or v2), written directly.

CPU share ``cores`` becomes a CFS bandwidth quota of ``cores x period`` per ``period`` (100 ms):
cgroup v1 ``cpu.cfs_quota_us``/``cpu.cfs_period_us``, cgroup v2 ``cpu.max`` (Linux
Documentation/scheduler/sched-bwc.rst). Memory: v1 ``memory.limit_in_bytes``, v2 ``memory.max``.
Group names start with ``testbed-<run id>-`` so that cleanup removes only ours.
"""

from __future__ import annotations

from pathlib import Path

from testbed.core.errors import RunFailure

ROOT = Path("/sys/fs/cgroup")
PERIOD_US = 100_000


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


def create_limited_group(name: str, cpu_cores: float, memory_mib: int) -> list[Path]:
    """Create cgroup(s) called ``name`` limited to ``cpu_cores`` cores and ``memory_mib`` MiB.

    Returns the created directories (to record for cleanup and to pass to :func:`add_process`).

    Raises:
        CgroupError: cgroups unavailable or a limit cannot be written.
    """
    quota = max(1000, int(round(cpu_cores * PERIOD_US)))
    limit = str(memory_mib * 1024 * 1024)
    if cgroup_version() == 1:
        cpu, mem = ROOT / "cpu" / name, ROOT / "memory" / name
        cpu.mkdir(exist_ok=True)
        _write(cpu / "cpu.cfs_period_us", str(PERIOD_US))
        _write(cpu / "cpu.cfs_quota_us", str(quota))
        dirs = [cpu]
        if (ROOT / "memory").is_dir():
            mem.mkdir(exist_ok=True)
            _write(mem / "memory.limit_in_bytes", limit)
            dirs.append(mem)
        return dirs
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


def cpu_stat(dirs: list[Path]) -> dict[str, float]:
    """CFS bandwidth counters of a group made by :func:`create_limited_group`: ``periods`` (CFS
    periods in which the group ran), ``throttled_periods`` (of those, how many ran out of quota),
    ``throttled_s`` (time its threads waited for the next period). From ``cpu.stat`` (v1:
    ``throttled_time`` ns; v2: ``throttled_usec``; Linux Documentation/scheduler/sched-bwc.rst).
    Empty when the file cannot be read (the group is gone)."""
    for d in dirs:
        kv = _flat_keyed(d / "cpu.stat")
        if kv is None or "nr_periods" not in kv:
            continue
        if "throttled_time" in kv:  # v1, ns
            throttled = int(kv["throttled_time"]) / 1e9
        else:  # v2, us
            throttled = int(kv.get("throttled_usec", 0)) / 1e6
        return {"periods": int(kv["nr_periods"]), "throttled_periods": int(kv.get("nr_throttled", 0)),
                "throttled_s": throttled}
    return {}


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
        return dict(line.split() for line in path.read_text().splitlines() if len(line.split()) == 2)
    except OSError:
        return None


def add_process(dirs: list[Path], pid: int) -> None:
    """Move process ``pid`` (all its threads) into the groups ``dirs``.

    Raises:
        CgroupError: the write fails (e.g. the process has exited).
    """
    for d in dirs:
        _write(d / "cgroup.procs", str(pid))
