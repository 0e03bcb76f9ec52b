"""Marking the run directories of killed runs (testbed.emu.cleanup.mark_killed_runs) on fake
run directories: which are marked, what the mark says, what is left alone. No root."""

from __future__ import annotations

import json
import os
import socket
import subprocess
from datetime import datetime
from pathlib import Path

import pytest

from testbed.emu.cleanup import (
    killed_run_line,
    mark_killed_runs,
    process_gone,
    process_identity,
    remove_orphan_groups,
)

NOW = datetime(2026, 12, 2, 18, 0, 0)


@pytest.fixture(scope="module")
def dead() -> dict:
    """The identity of a process that has ended (it was alive when taken)."""
    p = subprocess.Popen(["sleep", "60"])
    ident = process_identity(p.pid)
    p.kill()
    p.wait()
    return ident


def _run(base: Path, name: str, process: dict | None, **fields) -> Path:
    d = base / name
    (d / "sources").mkdir(parents=True)
    data = {"mode": "emulation", "run_id": name, "status": "running", "duration_s": 20.0,
            "health": {"incidents": [], "watched": ["server-edgeb"]}, **fields}
    if process is not None:
        data["process"] = process
    (d / "run.json").write_text(json.dumps(data))
    (d / "sources" / "srca.records.csv").write_bytes(b"query_id,outcome\nsrca-1,success\nsrca-2,fai")
    return d


def _json(d: Path) -> dict:
    return json.loads((d / "run.json").read_text())


def test_a_killed_run_is_marked_and_what_it_measured_is_kept(tmp_path, dead):
    d = _run(tmp_path, "20261202-170000-triangle", dead)
    before = _json(d)
    records = (d / "sources" / "srca.records.csv").read_bytes()
    assert mark_killed_runs(tmp_path, "run 20261202-180000-triangle", now=NOW) == [d]
    after = _json(d)
    assert after["status"] == "killed" and "exit_code" not in after
    ended = after.pop("ended")
    assert ended["found_by"] == "run 20261202-180000-triangle" and ended["found_at"] == "2026-12-02T18:00:00"
    assert f"pid {dead['pid']}" in ended["note"] and "found unfinished by run 20261202-180000-triangle" in ended["note"]
    assert {**before, "status": "killed"} == after  # every other field as it was
    assert (d / "sources" / "srca.records.csv").read_bytes() == records  # a half-written last line too
    assert mark_killed_runs(tmp_path, "run again", now=NOW) == []  # marked once
    assert killed_run_line(d).startswith("earlier run 20261202-170000-triangle was killed before it finished")


def test_only_killed_runs_of_ours_are_marked(tmp_path, dead):
    me = process_identity()
    alive = _run(tmp_path, "alive", me)  # its process runs (this one): a run under way
    finished = _run(tmp_path, "finished", dead, status="failed", exit_code=4)
    ok = _run(tmp_path, "ok", dead, status="ok", exit_code=0)
    sim = _run(tmp_path, "sim", dead, mode="simulation")
    renamed = _run(tmp_path, "renamed", dead, run_id="another-name")  # not a run directory of its own
    elsewhere = _run(tmp_path, "other-host", {**dead, "host": socket.gethostname() + "-not"})  # cannot judge
    no_pid = _run(tmp_path, "no-process", None)  # an older run.json: its process cannot be judged
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "run.json").write_text("{not json")
    (tmp_path / "a-file").write_text("x")
    outside = _run(tmp_path / "other-runs-dir", "outside", dead)  # not under the runs dir, not in the intent log
    nested = _run(tmp_path / "alive", "nested", dead)  # below a run directory, not directly under the runs dir
    texts = {d: (d / "run.json").read_text() for d in (alive, finished, ok, sim, renamed, elsewhere, no_pid, outside,
                                                         nested)}
    assert mark_killed_runs(tmp_path, "run x", now=NOW) == []
    assert {d: (d / "run.json").read_text() for d in texts} == texts


def test_a_reused_pid_or_a_reboot_is_a_process_gone(tmp_path):
    me = process_identity()
    assert process_gone(me) is False
    assert process_gone({**me, "start_ticks": me["start_ticks"] - 1}) is True  # another process has the pid now
    assert process_gone({**me, "boot_id": "00000000-0000-0000-0000-000000000000"}) is True  # rebooted since
    assert process_gone({**me, "host": me["host"] + "-not"}) is None
    assert process_gone({"host": me["host"]}) is None
    reused = _run(tmp_path, "reused", {**me, "start_ticks": me["start_ticks"] - 1})
    assert mark_killed_runs(tmp_path, "run x", now=NOW) == [reused]


def test_the_run_the_intent_log_names_is_marked_wherever_its_runs_dir_is(tmp_path, dead):
    d = _run(tmp_path / "killed", "20261202-170000-triangle", None)  # run.json without process: the log's pid
    state = {"run_id": d.name, "run_dir": str(d), "pid": dead["pid"], "process": dead}
    assert mark_killed_runs(tmp_path / "next", "run y", state, now=NOW) == [d]
    assert _json(d)["status"] == "killed"
    other = _run(tmp_path / "killed", "other", dead)
    wrong = {"run_id": "not-its-name", "run_dir": str(other), "process": dead}  # names a directory not its own
    assert mark_killed_runs(None, "testbed cleanup", wrong, now=NOW) == []
    assert _json(other)["status"] == "running"


def test_a_run_json_that_cannot_be_rewritten_is_an_error(tmp_path, dead, monkeypatch):
    import errno

    import testbed.emu.cleanup
    from testbed.core.errors import RunFailure
    from testbed.emu import bringup

    d = _run(tmp_path, "full", dead)

    def full(path, data, indent=1):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    monkeypatch.setattr(testbed.emu.cleanup, "write_json_atomic", full)
    with pytest.raises(OSError):
        mark_killed_runs(tmp_path, "run z", now=NOW)
    monkeypatch.setattr(bringup, "remove_leftovers", lambda: 0)
    monkeypatch.setattr(bringup, "remove_control_dirs", lambda: 0)
    monkeypatch.setattr(bringup, "read_state", lambda: None)
    with pytest.raises(RunFailure, match="cannot mark a killed earlier run: .*run.json: No space left on device"):
        bringup._clean_up_earlier_runs("next", tmp_path / "next", None)
    assert _json(d)["status"] == "running"


def test_cleanup_removes_the_empty_groups_of_gone_processes_only(tmp_path):
    gone = 2**22 + 12345  # above pid_max's largest value (2^22): no such process
    for ctrl in ("cpu", "memory"):
        (tmp_path / ctrl / f"aset-profile-{gone}-litert-0p5").mkdir(parents=True)
        (tmp_path / ctrl / f"testbed-speedtest-{os.getpid()}").mkdir()  # its process lives
        (tmp_path / ctrl / f"someone-else-{gone}").mkdir()  # not ours
    (tmp_path / "cpu" / f"testbed-speedtest-{gone}" / "busy").mkdir(parents=True)  # not empty: EBUSY-like
    assert remove_orphan_groups(root=tmp_path) == 2
    left = {str(p.relative_to(tmp_path)) for p in tmp_path.glob("*/*")}
    assert left == {f"cpu/someone-else-{gone}", f"cpu/testbed-speedtest-{gone}", f"cpu/testbed-speedtest-{os.getpid()}",
                    f"memory/someone-else-{gone}", f"memory/testbed-speedtest-{os.getpid()}"}
