"""Fault injection on the real emulation: kill a server, kill ryu-manager, take a link
down, fill the run directory, SIGKILL the run during bring-up; and a planned outage that must not
fail the run. Each test asserts what is reported (console and run.json), the exit code, that no
record is lost (every source's query ids 1..n present, the merge holds every row) and that nothing
of the run is left behind.

Each runs ``testbed run`` as a command (the health watch raises in the main thread of the real
process), on the triangle, and injects the fault once both sources have written some records.
Root only; marked ``emulation``. About 30 s each here.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pytest
import yaml
from emu_checks import host_too_slow
from test_emulation import _assert_nothing_left

from testbed.emu.cleanup import STATE_FILE, _ovs_bridges, _pids_with_run_ids
from testbed.plan.build import plan_experiment

REPO = Path(__file__).resolve().parent.parent

pytestmark = [
    pytest.mark.emulation,
    pytest.mark.skipif(os.geteuid() != 0, reason="emulation needs root"),
]

#: The fault tests' experiment: the triangle with LiteRT servers (bring-up 4 s instead of 12 s; the
#: faults are the processes', not the runtime's). test_emulation.py keeps TensorFlow.
TRIANGLE = REPO / "experiments" / "triangle-litert.yaml"


def _cli(args: list[str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "testbed.cli", *args], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=dict(os.environ, COLUMNS="200"))


def _run_with_fault(runs: Path, fault: Callable[[Path], None] | None, duration: str = "20",
                    experiment: Path = TRIANGLE, min_lines: int = 6) -> tuple[int, str, Path]:
    """``testbed run`` under ``runs``; once every source file has ``min_lines`` lines, ``fault(run_dir)``.
    Returns (exit code, console output, run directory: the one this run made under ``runs``)."""
    earlier = set(runs.iterdir()) if runs.is_dir() else set()
    proc = _cli(["run", str(experiment), "--runs-dir", str(runs), "--duration", duration])
    injected = fault is None
    deadline = time.monotonic() + 180
    while proc.poll() is None and time.monotonic() < deadline:
        recs = [r for r in runs.glob("*/sources/*.records.csv") if r.parent.parent not in earlier]
        if not injected and len(recs) == 2 and all(r.read_bytes().count(b"\n") >= min_lines for r in recs):
            fault(recs[0].parent.parent)
            injected = True
        time.sleep(0.05)
    out, _ = proc.communicate(timeout=120)
    run_dir = next(p for p in runs.iterdir() if p.is_dir() and p not in earlier)
    if (run_dir / "run.json").exists() and (why := host_too_slow(run_dir)):
        pytest.skip(why)
    assert injected, f"the fault was never injected:\n{out}"
    return proc.returncode, out, run_dir


def _incidents(run_dir: Path) -> list[dict]:
    return json.loads((run_dir / "run.json").read_text()).get("health", {}).get("incidents", [])


def _assert_no_record_lost(run_dir: Path) -> pd.DataFrame:
    df = pd.read_csv(run_dir / "records.csv")
    per_file = sum(len(pd.read_csv(f)) for f in (run_dir / "sources").glob("*.records.csv"))
    assert len(df) == per_file > 0
    for src, g in df.groupby("source"):
        n = sorted(int(q.rsplit("-", 1)[1]) for q in g["query_id"])
        assert n == list(range(1, len(n) + 1)), f"query ids of {src} have gaps"
    s = json.loads((run_dir / "summary.json").read_text())
    assert s["queries"] == len(df) and s["records_check"]["missing_query_ids"] == {}
    for cl, g in df.groupby("cluster"):  # the per-cluster table is the records'
        assert s["per_cluster"][cl]["queries"] == len(g)
        assert s["per_cluster"][cl]["success"] == int((g["outcome"] == "success").sum())
    return df


def _run_id(run_dir: Path) -> str:
    return json.loads((run_dir / "run.json").read_text())["run_id"]


def test_killed_server_stops_the_run_with_exit_4(tmp_path):
    killed_at = []

    def kill_server(run_dir: Path) -> None:
        pid = json.loads((run_dir / "clusters" / "edgeb.ready.json").read_text())["pid"]
        os.kill(pid, signal.SIGKILL)
        killed_at.append(time.time())

    code, out, run_dir = _run_with_fault(tmp_path, kill_server)
    assert code == 4, out
    assert "HEALTH: inference server server-edgeb died: killed by SIGKILL (exit code -9)" in out
    (inc,) = _incidents(run_dir)
    assert (inc["component"], inc["kind"], inc["exit_code"]) == ("server-edgeb", "inference server", -9)
    assert inc["t_load_s"] > 0 and inc["last_lines"], inc
    assert json.loads((run_dir / "run.json").read_text())["exit_code"] == 4
    df = _assert_no_record_lost(run_dir)
    # whatever was sent to edgeb after the kill is server_down, never the generic 'error'
    after = df[(df["cluster"] == "edgeb") & (df["t0_ns"] > killed_at[0] * 1e9 + 50e6)]
    assert set(after["failure_cause"].dropna()) <= {"server_down"}
    assert "error" not in set(df["failure_cause"].dropna())
    log = (run_dir / "logs" / "server-edgeb.log").read_text()
    assert "died: killed by SIGKILL (exit code -9) during the run" in log.splitlines()[-1]
    assert "RUN FAILED: inference server server-edgeb" in (run_dir / "summary.md").read_text()
    _assert_nothing_left(_run_id(run_dir), plan_experiment(TRIANGLE))


def test_a_killed_link_emulator_is_named_with_its_pid_and_every_link_it_served(tmp_path):
    """One process (E0) forwards the triangle's three links: its death was reported as linkemu-l1
    and linkemu-l2 (l3 missing, no pid, no log); now as one incident naming the process, its pid
    and every link."""
    killed: list[int] = []

    def kill_linkemu(run_dir: Path) -> None:
        (pid,) = [p for p, cmd in _processes_of(_run_id(run_dir)).items() if "-m testbed.emu.linkemu" in cmd]
        os.kill(pid, signal.SIGKILL)
        killed.append(pid)

    code, out, run_dir = _run_with_fault(tmp_path, kill_linkemu)
    assert code == 4, out
    said = (f"HEALTH: link emulator linkemu-E0 (pid {killed[0]}; serving 3 link(s): l1 (A-B), l2 (B-C), l3 (A-C)) "
            f"died: killed by SIGKILL (exit code -9)")
    assert said in out, out
    inc = _incidents(run_dir)[0]
    assert (inc["component"], inc["pid"], inc["serves"]) == ("linkemu-E0", killed[0],
                                                             ["l1 (A-B)", "l2 (B-C)", "l3 (A-C)"])
    assert inc["log"].endswith("logs/linkemu-E0.log")
    assert not [i for i in _incidents(run_dir) if i["component"].startswith("linkemu-l")]
    _assert_no_record_lost(run_dir)
    _assert_nothing_left(_run_id(run_dir), plan_experiment(TRIANGLE))


def test_a_stopped_server_stops_the_run_with_exit_4(tmp_path):
    """SIGSTOP of a server mid-load: alive to poll(), it answers nothing; the watch reports it once
    it has been stopped for STOPPED_GRACE_S, and the run stops with exit code 4."""
    stopped: list[int] = []

    def stop_server(run_dir: Path) -> None:
        pid = json.loads((run_dir / "clusters" / "edgeb.ready.json").read_text())["pid"]
        os.kill(pid, signal.SIGSTOP)
        stopped.append(pid)

    run_dir = None
    try:
        code, out, run_dir = _run_with_fault(tmp_path, stop_server)
    finally:  # whatever happened, never leave a stopped server of ours behind
        for pid in stopped:
            if run_dir is None or pid in _processes_of(_run_id(run_dir)):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
                    os.kill(pid, signal.SIGKILL)
    assert code == 4, out
    assert "HEALTH: inference server server-edgeb stopped: process state T, stopped (SIGSTOP or SIGTSTP)" in out
    rj = json.loads((run_dir / "run.json").read_text())
    (inc,) = rj["health"]["incidents"]
    assert (inc["component"], inc["kind"], inc["fault"], inc["exit_code"]) == \
        ("server-edgeb", "inference server", "stopped", None)
    assert inc["t_load_s"] > 0 and rj["exit_code"] == 4 and rj["failure"]["component"] == "server-edgeb"
    _assert_no_record_lost(run_dir)
    log = (run_dir / "logs" / "server-edgeb.log").read_text().splitlines()
    assert "server-edgeb stopped: process state T" in log[-2]
    # the teardown continued it, so it ended on its SIGTERM rather than the SIGKILL after the timeout
    assert log[-1].endswith("exited: exit code 0"), log[-1]
    _assert_nothing_left(_run_id(run_dir), plan_experiment(TRIANGLE))


def test_killed_controller_stops_the_run_with_a_clear_message(tmp_path):
    killed_at = []

    def kill_ryu(run_dir: Path) -> None:
        run_id = _run_id(run_dir)
        (pid,) = [p for p in _pids_with_run_ids({run_id})
                  if b"testbed.sdn.launcher" in Path(f"/proc/{p}/cmdline").read_bytes()]
        os.kill(pid, signal.SIGKILL)
        killed_at.append(time.time())

    code, out, run_dir = _run_with_fault(tmp_path, kill_ryu)
    assert code == 4, out
    assert "HEALTH: SDN controller ryu-manager died: killed by SIGKILL (exit code -9)" in out
    assert "The run stops" in out
    (inc,) = _incidents(run_dir)
    assert inc["component"] == "ryu-manager" and inc["exit_code"] == -9
    detected = pd.Timestamp(inc["wall_time"]).timestamp() - killed_at[0]
    print(f"ryu-manager death detected after {detected:.3f} s")
    assert json.loads((run_dir / "run.json").read_text())["health"]["controller_policy"].startswith("stop the run")
    _assert_no_record_lost(run_dir)
    _assert_nothing_left(_run_id(run_dir), plan_experiment(TRIANGLE))


def test_a_link_taken_down_from_outside_stops_the_run(tmp_path):
    # s1-eth1 is switch A's port on link #1 (A - B, link emulator l1); as if a cable were pulled
    code, out, run_dir = _run_with_fault(tmp_path, lambda _d: subprocess.run(["ip", "link", "set", "s1-eth1", "down"],
                                                                             check=True))
    assert code == 4, out
    assert "HEALTH: network link s1-s2 (l1) went down without a planned event" in out
    (inc,) = _incidents(run_dir)
    assert inc["component"] == "s1-s2 (l1)" and inc["kind"] == "network link"
    _assert_no_record_lost(run_dir)
    _assert_nothing_left(_run_id(run_dir), plan_experiment(TRIANGLE))


def test_planned_outages_of_a_server_and_a_link_do_not_fail_the_run(tmp_path):
    data = yaml.safe_load(TRIANGLE.read_text())
    data["topology"]["source"] = str((TRIANGLE.parent / data["topology"]["source"]).resolve())
    data["events"] = [{"at": "2s", "kind": "cluster_down", "cluster": "edgeb", "mode": "kill"},
                      {"at": "2s", "kind": "link_down", "link": ["A", "C"]},
                      {"at": "4s", "kind": "cluster_up", "cluster": "edgeb"},
                      {"at": "4s", "kind": "link_up", "link": ["A", "C"]}]
    exp = tmp_path / "outage.yaml"
    exp.write_text(yaml.safe_dump(data))
    runs = tmp_path / "runs"
    code, out, run_dir = _run_with_fault(runs, None, duration="10", experiment=exp)
    assert code == 0, out
    assert "HEALTH" not in out
    rj = json.loads((run_dir / "run.json").read_text())
    assert rj["health"].get("incidents", []) == []
    (planned,) = rj["health"]["planned"]
    assert planned["component"] == "server-edgeb"
    assert planned["how"].startswith("went down as planned: killed by SIGKILL")
    df = _assert_no_record_lost(run_dir)
    assert "error" not in set(df["failure_cause"].dropna())
    ev = pd.read_csv(run_dir / "events.csv")
    assert {"cluster_down", "cluster_up", "link_down", "link_up"} <= set(ev["kind"])
    down = ev[ev["kind"] == "cluster_down"].iloc[0]  # read back: the process was gone
    assert down["ok"] == 1 and "gone (killed by SIGKILL)" in down["note"] and down["value_measured"] >= 0
    s = json.loads((run_dir / "summary.json").read_text())
    server = s["per_cluster"]["edgeb"]["server"]
    assert server["lives"] == 2  # both lives counted, the second even if the run ended while it loaded
    restart = ev[ev["kind"] == "cluster_up"].iloc[0]
    not_ready = str(restart["note"]).startswith("server not ready when the run ended")
    assert server["lives_not_ready"] == int(not_ready), restart["note"]
    _assert_nothing_left(rj["run_id"], plan_experiment(exp))


def test_a_planned_stop_of_a_server_does_not_fail_the_run(tmp_path):
    """``cluster_down`` with ``mode: stop`` for 3 s (longer than STOPPED_GRACE_S): the watch sees the
    server stopped and calls it planned; the run ends 0."""
    data = yaml.safe_load(TRIANGLE.read_text())
    data["topology"]["source"] = str((TRIANGLE.parent / data["topology"]["source"]).resolve())
    data["events"] = [{"at": "2s", "kind": "cluster_down", "cluster": "edgeb", "mode": "stop"},
                      {"at": "5s", "kind": "cluster_up", "cluster": "edgeb"}]
    exp = tmp_path / "stop.yaml"
    exp.write_text(yaml.safe_dump(data))
    code, out, run_dir = _run_with_fault(tmp_path / "runs", None, duration="8", experiment=exp)
    assert code == 0, out
    assert "HEALTH" not in out
    rj = json.loads((run_dir / "run.json").read_text())
    assert rj["health"].get("incidents", []) == []
    (planned,) = rj["health"]["planned"]
    assert (planned["component"], planned["fault"]) == ("server-edgeb", "stopped")
    assert planned["how"].startswith("was stopped as planned: process state T")
    ev = pd.read_csv(run_dir / "events.csv")
    down = ev[ev["kind"] == "cluster_down"].iloc[0]  # read back: the process was stopped
    assert down["ok"] == 1 and "stopped (state T)" in down["note"]
    _assert_no_record_lost(run_dir)
    _assert_nothing_left(rj["run_id"], plan_experiment(exp))


@contextlib.contextmanager
def _tmpfs(path: Path, size: str, options: str = ""):
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}{options}", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def test_a_run_directory_that_fills_up_mid_run(tmp_path):
    with _tmpfs(tmp_path / "small", "48m") as runs:
        def fill(_run_dir: Path) -> None:
            # all but 0.5 MiB at once (fallocate): a dd that is still writing when the run frees
            # its reserve would take the reserve too
            st = os.statvfs(runs)
            with open(runs / "filler", "wb") as f:
                os.posix_fallocate(f.fileno(), 0, st.f_bavail * st.f_frsize - 512 * 1024)

        code, out, run_dir = _run_with_fault(runs, fill)
        run_id = _run_id(run_dir)
        assert code == 4, out
        assert "HEALTH: storage run directory failed: the file system of the run directory" in out
        (inc,) = _incidents(run_dir)
        assert inc["kind"] == "storage"
        _assert_no_record_lost(run_dir)  # the reserve made room for the merge and the summary
        assert (run_dir / "summary.md").stat().st_size > 0 and (run_dir / "records.parquet").exists()
        assert "exited: exit code 0" in (run_dir / "logs" / "server-edgeb.log").read_text()
        (runs / "filler").unlink()
    _assert_nothing_left(run_id, plan_experiment(TRIANGLE))


def test_unwritable_or_too_small_run_directory_is_refused_before_bringup(tmp_path):
    with _tmpfs(tmp_path / "ro", "8m", ",ro") as runs:
        r = subprocess.run([sys.executable, "-m", "testbed.cli", "run", str(TRIANGLE), "--runs-dir", str(runs)],
                           cwd=REPO, capture_output=True, text=True)
        assert r.returncode == 3 and "cannot create the run directory under" in r.stdout, r.stdout + r.stderr
    with _tmpfs(tmp_path / "tiny", "2m") as runs:
        r = subprocess.run([sys.executable, "-m", "testbed.cli", "run", str(TRIANGLE), "--runs-dir", str(runs)],
                           cwd=REPO, capture_output=True, text=True)
        assert r.returncode == 3 and "MiB free, and this run writes about" in r.stdout, r.stdout + r.stderr
        assert "records" in r.stdout and "reserve" in r.stdout
    assert not STATE_FILE.exists() and not any(tag for tag in _ovs_bridges().values())  # nothing was built


def test_sigkill_during_bringup_then_the_next_run_removes_the_leftovers(tmp_path):
    proc = _cli(["run", str(TRIANGLE), "--runs-dir", str(tmp_path / "killed"), "--duration", "30"])
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (STATE_FILE.exists() and any(_ovs_bridges().values())):
        time.sleep(0.05)
    killed_id = json.loads(STATE_FILE.read_text())["run_id"]
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=10)
    killed_dir = next((tmp_path / "killed").iterdir())
    rj = json.loads((killed_dir / "run.json").read_text())
    assert rj["status"] == "running" and "exit_code" not in rj  # says it never finished
    assert not list((killed_dir / "sources").glob("*.records.csv"))  # no load had started: nothing to lose
    code, out, run_dir = _run_with_fault(tmp_path / "next", None, duration="3")
    assert code == 0, out
    assert "leftover item(s) of an earlier run" in out
    # in another runs directory, found through the intent log, which names it
    assert f"earlier run {killed_id} was killed before it finished" in out
    after = json.loads((killed_dir / "run.json").read_text())
    assert after["status"] == "killed" and after["ended"]["found_by"] == f"run {_run_id(run_dir)}"
    _assert_no_record_lost(run_dir)
    plan = plan_experiment(TRIANGLE)
    _assert_nothing_left(killed_id, plan)
    _assert_nothing_left(_run_id(run_dir), plan)


def test_repeated_ctrl_c_still_tears_everything_down(tmp_path):
    """An impatient user: five SIGINTs 0.2 s apart during the load. The first stops the run; the
    others must not cut its teardown short (they used to leave bridges, link emulators, the
    controller and cgroups behind while the run said it had cleaned up)."""
    proc = _cli(["run", str(TRIANGLE), "--runs-dir", str(tmp_path), "--duration", "20"])
    deadline = time.monotonic() + 180
    while proc.poll() is None and time.monotonic() < deadline:
        recs = list(tmp_path.glob("*/sources/*.records.csv"))
        if len(recs) == 2 and all(r.read_bytes().count(b"\n") >= 6 for r in recs):
            break
        time.sleep(0.05)
    for _ in range(5):
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGINT)
        time.sleep(0.2)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, out
    assert "interrupted: stopped and cleaned up" in out and "SIGINT again: still stopping" in out
    run_dir = next(p for p in tmp_path.iterdir() if p.is_dir())
    rec = json.loads((run_dir / "run.json").read_text())
    assert (rec["status"], rec["exit_code"]) == ("failed", 130)
    _assert_no_record_lost(run_dir)
    _assert_nothing_left(_run_id(run_dir), plan_experiment(TRIANGLE))


def _processes_of(run_id: str) -> dict[int, str]:
    """Pid -> command line of every process tagged with ``run_id`` (still there, zombies aside)."""
    out = {}
    for pid in _pids_with_run_ids({run_id}):
        with contextlib.suppress(OSError, IndexError):
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                continue
            out[pid] = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    return out


#: What a run's children are, by their command lines (every one must be there when the run is killed).
CHILD_ROLES = {"sources": "testbed.emu.source", "servers": "testbed.serve.server",
               "link emulators": "testbed.emu.linkemu", "ryu-manager": "testbed.sdn.launcher"}


def test_sigkill_during_the_load_ends_every_child_of_the_run(tmp_path):
    """``kill -9`` of ``testbed run`` mid-load: its sources, servers, link emulators and ryu-manager
    end with it (they used to run on, the sources writing records into the dead run's directory,
    until the next run's cleanup); the next run removes what is left (bridges, interfaces, cgroups)
    and marks the killed run's directory ``killed``, its records untouched."""
    runs = tmp_path / "runs"
    proc = _cli(["run", str(TRIANGLE), "--runs-dir", str(runs), "--duration", "60"])
    deadline = time.monotonic() + 180
    recs: list[Path] = []
    while proc.poll() is None and time.monotonic() < deadline:
        recs = list(runs.glob("*/sources/*.records.csv"))
        if len(recs) == 2 and all(r.read_bytes().count(b"\n") >= 6 for r in recs):
            break
        time.sleep(0.05)
    assert proc.poll() is None, proc.communicate()[0]
    killed_dir = recs[0].parent.parent
    killed_id = _run_id(killed_dir)
    before = _processes_of(killed_id)
    for role, module in CHILD_ROLES.items():
        assert any(module in cmd for cmd in before.values()), f"no {role} running before the kill: {before}"
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=10)
    deadline = time.monotonic() + 60
    while _processes_of(killed_id) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _processes_of(killed_id), f"children of the killed run still run: {_processes_of(killed_id)}"
    sizes = {r: r.stat().st_size for r in recs}
    time.sleep(1.0)
    assert {r: r.stat().st_size for r in recs} == sizes, "records still grow after the run died"
    for r in recs:  # each source ended on its SIGTERM: it recorded what it had in flight and wrote its tally
        assert r.with_name(r.name.replace(".records.csv", ".tally.json")).exists(), r
    rj = json.loads((killed_dir / "run.json").read_text())
    assert rj["status"] == "running" and "exit_code" not in rj
    assert STATE_FILE.exists() and json.loads(STATE_FILE.read_text())["run_id"] == killed_id
    records = {r: r.read_bytes() for r in recs}
    # the next run, in the same runs directory: its cleanup still removes what the killed one left in
    # the system, and it marks the killed run's directory
    code, out, run_dir = _run_with_fault(runs, None, duration="3")
    assert code == 0, out
    assert "leftover item(s) of an earlier run" in out
    assert f"earlier run {killed_id} was killed before it finished" in out
    after = json.loads((killed_dir / "run.json").read_text())
    assert after["status"] == "killed" and "exit_code" not in after
    assert after["ended"]["found_by"] == f"run {_run_id(run_dir)}"
    assert {k: v for k, v in after.items() if k not in ("status", "ended")} == \
        {k: v for k, v in rj.items() if k != "status"}
    assert {r: r.read_bytes() for r in recs} == records  # what it measured is as it was
    assert json.loads((run_dir / "run.json").read_text())["status"] == "ok"  # the next run is not marked
    _assert_no_record_lost(run_dir)
    plan = plan_experiment(TRIANGLE)
    _assert_nothing_left(killed_id, plan)
    _assert_nothing_left(_run_id(run_dir), plan)
