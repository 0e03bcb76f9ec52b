"""The health watch reports a component that is stopped (SIGSTOP: alive to poll(), answering
nothing) for longer than STOPPED_GRACE_S, as it reports a death. Real stopped processes, a fake
clock; no root."""

from __future__ import annotations

import io
import json
import signal
import subprocess
import time
from pathlib import Path

import pytest
from rich.console import Console

from testbed.core.errors import EXIT_COMPONENT_DIED, RunFailure
from testbed.emu import health
from testbed.emu.health import STOPPED_GRACE_S, Component, HealthWatch, RunRecord, process_state


class Clock:
    """``health.time`` with a monotonic clock the test moves (wall time stays real)."""

    def __init__(self) -> None:
        self.t = 1000.0

    def monotonic(self) -> float:
        return self.t

    @staticmethod
    def time() -> float:
        return time.time()


@pytest.fixture
def clock(monkeypatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(health, "time", c)
    return c


@pytest.fixture
def proc():
    p = subprocess.Popen(["sleep", "600"])
    yield p
    p.send_signal(signal.SIGCONT)
    p.kill()
    p.wait()


def _set_state(p: subprocess.Popen, sig: int, want: set[str]) -> None:
    """Send ``sig`` and wait until the kernel shows the process in one of ``want``."""
    p.send_signal(sig)
    deadline = time.monotonic() + 10
    while process_state(p.pid) not in want:
        assert time.monotonic() < deadline, f"process {p.pid} never reached {want}"
        time.sleep(0.005)


def _watch(tmp_path: Path, comps: list[Component]):
    out = io.StringIO()
    record = RunRecord(tmp_path / "run.json", {"run_id": "x"})
    failed: list[int] = []
    w = HealthWatch(record, Console(file=out, markup=False, width=300), [lambda: comps],
                    on_failure=lambda: failed.append(1))
    w.t_load0 = time.time() - 5
    return w, out, failed


def test_a_stopped_server_is_reported_after_the_grace_and_fails_the_run(tmp_path, clock, proc):
    log = tmp_path / "server-edge.log"
    log.write_text("serving\n")
    w, out, failed = _watch(tmp_path, [Component("server-edge", "inference server", proc, log)])
    w.check()
    _set_state(proc, signal.SIGSTOP, {"T"})
    w.check()
    clock.t += STOPPED_GRACE_S - 0.1
    w.check()
    assert w.failure is None and not failed  # within the grace
    clock.t += 0.2
    w.check()
    assert isinstance(w.failure, RunFailure) and w.failure.exit_code == EXIT_COMPONENT_DIED and failed == [1]
    assert "HEALTH: inference server server-edge stopped: process state T, stopped (SIGSTOP or SIGTSTP)" in \
        out.getvalue()
    (inc,) = json.loads((tmp_path / "run.json").read_text())["health"]["incidents"]
    assert (inc["component"], inc["kind"], inc["fault"], inc["exit_code"]) == \
        ("server-edge", "inference server", "stopped", None)
    assert inc["last_lines"] == ["serving"] and inc["t_load_s"] > 0
    clock.t += 5
    w.check()  # reported once per stop
    assert len(json.loads((tmp_path / "run.json").read_text())["health"]["incidents"]) == 1 and failed == [1]
    proc.send_signal(signal.SIGCONT)
    proc.kill()
    proc.wait()
    w.write_epitaphs()
    lines = log.read_text().splitlines()
    assert "inference server server-edge stopped: process state T" in lines[-2]
    assert lines[-2].endswith("during the run (reported in run.json)")
    assert lines[-1].endswith("exited: killed by SIGKILL (exit code -9)")


def test_a_planned_stop_is_not_a_failure_and_a_later_unplanned_one_is(tmp_path, clock, proc):
    planned = {"now": True}
    w, out, failed = _watch(tmp_path, [Component("server-edge", "inference server", proc, None,
                                                 planned=lambda: planned["now"])])
    _set_state(proc, signal.SIGSTOP, {"T"})
    w.check()
    clock.t += STOPPED_GRACE_S + 1
    w.check()
    assert w.failure is None and "HEALTH" not in out.getvalue()
    (p,) = json.loads((tmp_path / "run.json").read_text())["health"]["planned"]
    assert p["fault"] == "stopped" and p["how"].startswith("was stopped as planned")
    _set_state(proc, signal.SIGCONT, {"S", "R"})  # cluster_up: the stop ends
    planned["now"] = False
    w.check()
    _set_state(proc, signal.SIGSTOP, {"T"})  # a second stop, nobody's plan
    w.check()
    clock.t += STOPPED_GRACE_S + 1
    w.check()
    assert w.failure is not None and failed == [1]


def test_short_stops_are_not_added_up_and_a_running_process_is_never_reported(tmp_path, clock, proc):
    w, out, failed = _watch(tmp_path, [Component("server-edge", "inference server", proc, None)])
    for _ in range(4):  # stopped, then running, at every other look: a tracer's stops
        _set_state(proc, signal.SIGSTOP, {"T"})
        w.check()
        clock.t += STOPPED_GRACE_S * 0.75
        _set_state(proc, signal.SIGCONT, {"S", "R"})
        w.check()
        clock.t += STOPPED_GRACE_S * 0.75
    w.check()
    assert w.failure is None and not failed and "HEALTH" not in out.getvalue()


def test_a_server_killed_by_its_memory_limit_says_so(tmp_path, clock, proc):
    """A server OOM-killed by its cgroup's memory limit was logged as
    'ended when the run stopped it', and nothing named memory_mib. The component's ``why`` (the
    servers' oom_note, read from the memory cgroup) goes into the incident and the epitaph."""
    log = tmp_path / "server-edge.log"
    log.write_text("loading\n")
    why = "; its cgroup's memory limit (clusters.edge.memory_mib: 64 MiB) killed it (1 OOM kill(s) in the group)"
    w, out, failed = _watch(tmp_path, [Component("server-edge", "inference server", proc, log, why=lambda: why)])
    w.check()
    proc.kill()
    proc.wait()
    w.check()
    assert f"died: killed by SIGKILL (exit code -9){why}" in out.getvalue() and failed == [1]
    w.write_epitaphs()
    assert log.read_text().splitlines()[-1].endswith(f"died: killed by SIGKILL (exit code -9){why} during the run "
                                                     f"(reported in run.json)")


def test_oom_kills_read_from_cgroup_v1_and_v2_files(tmp_path):
    from testbed.core.cgroups import oom_kills

    v1, v2 = tmp_path / "v1", tmp_path / "v2"
    v1.mkdir()
    v2.mkdir()
    (v1 / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 2\n")
    (v2 / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\noom_group_kill 0\n")
    assert oom_kills([tmp_path / "cpu-only", v1]) == 2 and oom_kills([v2]) == 1
    assert oom_kills([tmp_path / "gone"]) is None
