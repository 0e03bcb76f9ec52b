"""Removing what a run left behind: ours only.

A run writes an intent log (``/run/aset-testbed/state.json``) *before* it builds anything: its run
id, its run directory and process (:func:`process_identity`), the OVS bridge names, root-namespace
interface names and cgroups it is about to create. Every
process the run starts (Mininet node shells, servers, sources, link emulators, ryu-manager)
inherits the environment variable ``TESTBED_RUN_ID=<id>``. :func:`cleanup` then removes exactly:

* processes whose environment carries a run id named in the state file (never ovs-vswitchd, which
  we do not start as a child);
* OVS bridges named in the state file *and* tagged ``external_ids:testbed_run=<id>``, or untagged
  ones the state file names (a crash between ``add-br`` and tagging);
* root-namespace interfaces named in the state file that still exist;
* our cgroups (``testbed-<id>-*``);
* the runs' link-emulator control folders (``/run/aset-testbed/ctl-*``, with the lock held: no run
  is under way), as the next run's bring-up does;
* empty cgroups named after a process that is gone (:data:`PID_GROUPS`: the profiler's, and the
  tests' that measure speed), which a killed profile or test leaves behind.

Nothing else is touched: no ``mn -c``. A lock (``flock``) keeps two runs from overlapping.

A run killed before it could finish (SIGKILL, a crash, a power loss) also leaves its run directory
saying ``"status": "running"``. :func:`mark_killed_runs` looks at the directory the intent log
names and at the directories directly under the runs directory of the run that cleans up, never
elsewhere; one is a killed run of ours when its ``run.json`` says ``"mode": "emulation"``, a
``run_id`` equal to the directory's name, ``"status": "running"`` and no ``exit_code``, and the
process it names (``process``: pid, start time, boot id, host) is gone. It is then marked
``"status": "killed"`` with an ``ended`` note (who found it, when); nothing else in it changes.
A run of another host, or one whose run.json names no process, is left alone.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from datetime import datetime
from pathlib import Path

from testbed.core.errors import RunFailure
from testbed.core.util import proc_stat, write_json_atomic

STATE_DIR = Path(os.environ.get("TESTBED_STATE_DIR", "/run/aset-testbed"))
#: Where the runs' control sockets live (short paths: a Unix socket path holds at most 107 bytes).
CONTROL_ROOT = STATE_DIR
STATE_FILE = STATE_DIR / "state.json"
LOCK_FILE = STATE_DIR / "lock"
RUN_ENV = "TESTBED_RUN_ID"
CGROUP_ROOT = Path("/sys/fs/cgroup")


#: Our cgroups named after the process that made them (group 1: its pid): ``aset-profile-<pid>-...``
#: (:mod:`testbed.serve.profiler`) and ``testbed-speedtest-<pid>`` (the tests).
PID_GROUPS = re.compile(r"^(?:aset-profile|testbed-speedtest)-(\d+)(?:-|$)")


class RunLockedError(RunFailure):
    """Another testbed run holds the lock."""


def read_state() -> dict | None:
    """The intent log of the last run that did not clean up after itself (None: there is none)."""
    try:
        return json.loads(STATE_FILE.read_text())
    except (OSError, ValueError):
        return None


def write_state(state: dict) -> None:
    """Atomically write the intent log (called before each build step)."""
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    tmp = STATE_FILE.with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=1))
    os.replace(tmp, STATE_FILE)


def acquire_lock() -> int:
    """Take the single-run lock; returns the fd to keep open for the run's lifetime.

    Raises:
        RunLockedError: another run is active (its pid is named).
    """
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    fd = os.open(LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        other = os.pread(fd, 32, 0).decode(errors="replace").strip()
        os.close(fd)
        raise RunLockedError(
            f"another testbed run (pid {other or '?'}) is in progress; wait for it or stop it"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)
    return fd


def _pids_with_run_ids(run_ids: set[str]) -> list[int]:
    found = []
    me = os.getpid()
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == me:
            continue
        try:
            env = (d / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        for item in env:
            if item.startswith(RUN_ENV.encode() + b"=") and item.split(b"=", 1)[1].decode() in run_ids:
                found.append(int(d.name))
                break
    return found


def kill_run_processes(run_ids: set[str], grace_s: float = 2.0) -> int:
    """SIGTERM, then SIGKILL after ``grace_s``, every process tagged with one of ``run_ids``.

    Returns the number of processes signalled.
    """
    pids = _pids_with_run_ids(run_ids)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and _pids_with_run_ids(run_ids):
        time.sleep(0.1)
    for pid in _pids_with_run_ids(run_ids):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return len(pids)


def _ovs_bridges() -> dict[str, str]:
    """Existing OVS bridges -> their ``testbed_run`` external id ('' if untagged)."""
    if shutil.which("ovs-vsctl") is None:
        return {}
    out = subprocess.run(["ovs-vsctl", "--timeout=5", "--format=json", "--columns=name,external_ids",
                          "list", "Bridge"], capture_output=True, text=True)
    if out.returncode != 0:
        return {}
    result = {}
    for name, ext in json.loads(out.stdout)["data"]:
        tags = dict(ext[1]) if isinstance(ext, list) and ext and ext[0] == "map" else {}
        result[name] = tags.get("testbed_run", "")
    return result


def foreign_bridges(names: list[str], run_ids: set[str]) -> list[str]:
    """Of ``names``, the OVS bridges that exist and are not ours (so we must not delete them)."""
    existing = _ovs_bridges()
    return [n for n in names if n in existing and existing[n] not in run_ids | {""}]


def control_dir(run_id: str) -> Path:
    """The run's folder of control sockets (short, under the state folder)."""
    return CONTROL_ROOT / f"ctl-{hashlib.sha1(run_id.encode()).hexdigest()[:10]}"


def remove_control_dirs(verbose: bool = False) -> int:
    """Remove every control-socket folder of earlier runs (call with the run lock held: the one run
    that may exist is ours). Returns how many were removed; ``verbose`` prints each, and each one
    that could not be removed (with why): it is not counted."""
    n = 0
    for d in CONTROL_ROOT.glob("ctl-*"):
        try:
            shutil.rmtree(d)
        except OSError as exc:
            if d.exists():
                if verbose:
                    print(f"could not remove control folder {d}: {exc.strerror or exc}")
                continue
        n += 1
        if verbose:
            print(f"removed control folder {d}")
    return n


def _remove_group(p: Path) -> bool:
    """Remove cgroup ``p`` and its per-thread groups (``t<n>``, a dilated cluster's:
    :mod:`testbed.core.cgroups`); False when the kernel refuses (EBUSY: a task is still in it)."""
    try:
        for child in p.glob("t[0-9]*"):
            child.rmdir()
        p.rmdir()
    except OSError:
        return False
    return True


def remove_orphan_groups(verbose: bool = False, root: Path = CGROUP_ROOT) -> int:
    """Remove the empty cgroups of :data:`PID_GROUPS` whose process is gone, under every controller
    of ``root`` (cgroup v1: ``cpu``, ``memory``, ...; v2: the root itself). Returns how many; a group
    that still holds a task, or whose process lives, is left alone."""
    n = 0
    for parent in [root, *(d for d in root.iterdir() if d.is_dir())] if root.is_dir() else []:
        for g in parent.iterdir():
            m = PID_GROUPS.match(g.name)
            if m is None or not g.is_dir() or Path(f"/proc/{m.group(1)}").exists():
                continue
            if not _remove_group(g):
                continue
            n += 1
            if verbose:
                print(f"removed cgroup {g} (its process {m.group(1)} is gone)")
    return n


def cleanup(verbose: bool = False) -> int:
    """Remove leftovers of earlier runs named in the state file. Returns how many items were removed.

    Safe to call when nothing is left (returns 0). Does not touch a run that holds the lock.

    Raises:
        RunLockedError: a run is active right now.
    """
    fd = acquire_lock()
    try:
        state = read_state()
        removed = remove_leftovers(verbose) + remove_control_dirs(verbose) + remove_orphan_groups(verbose)
        for run_dir in mark_killed_runs(None, "testbed cleanup", state):
            if verbose:
                print(killed_run_line(run_dir))
        return removed
    finally:
        os.close(fd)


def other_run_present() -> bool:
    """Whether another run holds the lock, or left an intent log behind: its processes may hold
    ports that the bring-up's cleanup (or the lock's error) will deal with."""
    if STATE_FILE.exists():
        return True
    try:
        fd = os.open(LOCK_FILE, os.O_RDWR)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def remove_leftovers(verbose: bool = False) -> int:
    """Like :func:`cleanup`, for a caller that already holds the lock."""
    state = read_state()
    if state is None:
        return 0
    run_ids = {state["run_id"]}
    removed = kill_run_processes(run_ids)
    if verbose and removed:  # every item counted is named (the count said 8 where 6 were listed)
        print(f"stopped {removed} process(es) of run {state['run_id']}")
    bridges = _ovs_bridges()
    for name in state.get("bridges", []):
        if name in bridges and bridges[name] in run_ids | {""}:
            subprocess.run(["ovs-vsctl", "--timeout=5", "--if-exists", "del-br", name], capture_output=True)
            removed += 1
            if verbose:
                print(f"removed OVS bridge {name}")
    for name in state.get("interfaces", []):
        if Path(f"/sys/class/net/{name}").exists():
            subprocess.run(["ip", "link", "del", name], capture_output=True)
            removed += 1
            if verbose:
                print(f"removed interface {name}")
    for cg in state.get("cgroups", []):
        p = Path(cg)
        if p.is_dir() and p.name.startswith("testbed-") and _remove_group(p):
            removed += 1
            if verbose:
                print(f"removed cgroup {p}")
    STATE_FILE.unlink(missing_ok=True)
    return removed


# --------------------------------------------------------------------------------------- killed runs

BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


def _start_ticks(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks since boot, field 22 of ``/proc/PID/stat``);
    None when there is no such process, or it is a zombie."""
    fields = proc_stat(pid)
    return None if fields is None or fields[0] in ("Z", "X") else int(fields[19])


def process_identity(pid: int | None = None) -> dict:
    """What names a process uniquely on this machine: ``pid``, ``start_ticks`` (its start, clock
    ticks since boot: a reused pid has another), ``boot_id`` (the kernel's, new at each boot) and
    ``host``. ``pid`` None: this process.

    Raises:
        OSError: ``/proc`` cannot be read (not Linux).
    """
    pid = os.getpid() if pid is None else pid
    return {"pid": pid, "start_ticks": _start_ticks(pid), "boot_id": BOOT_ID.read_text().strip(),
            "host": socket.gethostname()}


def process_gone(identity: dict) -> bool | None:
    """Whether the process of ``identity`` (:func:`process_identity`) has ended: True, False, or
    None when this machine cannot tell (another host, or no pid recorded)."""
    pid = identity.get("pid")
    if not isinstance(pid, int) or identity.get("host") not in (None, socket.gethostname()):
        return None
    try:
        boot = BOOT_ID.read_text().strip()
    except OSError:
        return None
    if identity.get("boot_id") not in (None, boot):
        return True  # this machine rebooted since
    now = _start_ticks(pid)
    if now is None:
        return True
    want = identity.get("start_ticks")
    return want is not None and now != want  # the pid was reused: another process


def _unfinished(run_dir: Path, fallback: dict | None = None) -> dict | None:
    """``run.json`` of ``run_dir`` when it is one of our emulated runs that says it is still running
    and whose process is gone (``fallback``: the intent log's pid, for a run.json without one)."""
    try:
        data = json.loads((run_dir / "run.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("mode") != "emulation" or data.get("run_id") != run_dir.name:
        return None
    if data.get("status") != "running" or "exit_code" in data:
        return None
    identity = data.get("process") if isinstance(data.get("process"), dict) else fallback
    return data if identity is not None and process_gone(identity) is True else None


def _candidates(runs_dir: Path | None, state: dict | None) -> list[tuple[Path, dict | None]]:
    """The run directory the intent log names, then every directory directly under ``runs_dir``."""
    out: list[tuple[Path, dict | None]] = []
    if state and state.get("run_dir") and state.get("run_id"):
        d = Path(state["run_dir"])
        if d.name == state["run_id"]:
            ident = state.get("process") if isinstance(state.get("process"), dict) else None
            out.append((d, ident or ({"pid": state["pid"]} if isinstance(state.get("pid"), int) else None)))
    if runs_dir is not None:
        try:
            out += [(d, None) for d in sorted(Path(runs_dir).iterdir()) if d.is_dir() and not d.is_symlink()]
        except OSError:
            pass
    return out


def mark_killed(run_dir: Path, data: dict, found_by: str, now: datetime | None = None) -> dict:
    """Write ``run_dir``'s ``run.json`` as ``data`` with ``status: "killed"`` and an ``ended`` note
    (``found_by``, ``found_at``, what it means); every other field is kept as it was.

    Returns:
        The ``run.json`` written.

    Raises:
        OSError: ``run.json`` cannot be written.
    """
    when = (now or datetime.now()).isoformat(timespec="seconds")
    pid = (data.get("process") or {}).get("pid")
    out = dict(data, status="killed", ended={
        "found_by": found_by, "found_at": when,
        "note": (f"found unfinished by {found_by} at {when}: run.json still said running and the run's process"
                 f"{f' (pid {pid})' if pid else ''} was gone, so it was killed (SIGKILL, a crash, a power loss) "
                 "before it could finish; no summary or exit code; what it measured so far is as it was left "
                 "(records in sources/, testbed report merges them)")})
    write_json_atomic(run_dir / "run.json", out, indent=1)
    return out


def mark_killed_runs(runs_dir: Path | None, found_by: str, state: dict | None = None,
                     now: datetime | None = None) -> list[Path]:
    """Mark every killed run of ours (module docstring) ``"status": "killed"``: the one the intent
    log ``state`` names (:func:`read_state`, read before the cleanup removes it) and those directly
    under ``runs_dir`` (None: only the former). A run whose process cannot be judged from here
    (another host, no pid recorded) is left alone.

    Returns:
        The run directories marked.

    Raises:
        OSError: a killed run's ``run.json`` cannot be rewritten.
    """
    marked: list[Path] = []
    seen: set[Path] = set()
    for d, fallback in _candidates(runs_dir, state):
        key = d.resolve()
        if key in seen:
            continue
        seen.add(key)
        data = _unfinished(d, fallback)
        if data is not None:
            mark_killed(d, data, found_by, now)
            marked.append(d)
    return marked


def killed_run_line(run_dir: Path) -> str:
    """The console line naming a run :func:`mark_killed_runs` marked."""
    return (f"earlier run {run_dir.name} was killed before it finished (run.json said running, its process is "
            f"gone): marked \"killed\" in {run_dir / 'run.json'}; what it measured is kept")
