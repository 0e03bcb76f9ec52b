"""Removing what a run left behind: ours only.

A run writes an intent log (``/run/aset-testbed/state.json``) *before* it builds anything: its run
id, the OVS bridge names, root-namespace interface names and cgroups it is about to create. Every
process the run starts (Mininet node shells, servers, sources, link emulators, ryu-manager)
inherits the environment variable ``TESTBED_RUN_ID=<id>``. :func:`cleanup` then removes exactly:

* processes whose environment carries a run id named in the state file (never ovs-vswitchd, which
  we do not start as a child);
* OVS bridges named in the state file *and* tagged ``external_ids:testbed_run=<id>``, or untagged
  ones the state file names (a crash between ``add-br`` and tagging);
* root-namespace interfaces named in the state file that still exist;
* our cgroups (``testbed-<id>-*``).

Nothing else is touched: no ``mn -c``. A lock (``flock``) keeps two runs from overlapping.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from testbed.errors import RunFailure

STATE_DIR = Path(os.environ.get("TESTBED_STATE_DIR", "/run/aset-testbed"))
STATE_FILE = STATE_DIR / "state.json"
LOCK_FILE = STATE_DIR / "lock"
RUN_ENV = "TESTBED_RUN_ID"
CGROUP_ROOT = Path("/sys/fs/cgroup")


class RunLockedError(RunFailure):
    """Another testbed run holds the lock."""


def _read_state() -> dict | None:
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


def cleanup(verbose: bool = False) -> int:
    """Remove leftovers of earlier runs named in the state file. Returns how many items were removed.

    Safe to call when nothing is left (returns 0). Does not touch a run that holds the lock.

    Raises:
        RunLockedError: a run is active right now.
    """
    fd = acquire_lock()
    try:
        return remove_leftovers(verbose)
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
    state = _read_state()
    if state is None:
        return 0
    run_ids = {state["run_id"]}
    removed = kill_run_processes(run_ids)
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
        if p.is_dir() and p.name.startswith("testbed-"):
            try:
                p.rmdir()
                removed += 1
            except OSError:
                pass
    STATE_FILE.unlink(missing_ok=True)
    return removed
