"""Smaller gaps of "Nothing silent, round 3": a stopped controller during bring-up is named as
stopped, a run refused for too little space writes its ``run.json``, and link utilization is what
the link carried (after its shaper), not the load offered to it. Fast, except the controller test
(real ryu-manager on 127.0.0.1, under the shared emulation lock like every test that starts one)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from testbed.core.errors import RunFailure
from testbed.core.util import poll_until
from testbed.model.routing import PortDelta, carried

REPO = Path(__file__).resolve().parent.parent
TRIANGLE = REPO / "experiments" / "triangle.yaml"


def test_a_stopped_process_ends_a_bring_up_wait_naming_its_state():
    """An adversarial user's find: a controller stopped (SIGSTOP) during bring-up was found only by
    a 66 s timeout that did not say it was stopped."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        os.kill(proc.pid, signal.SIGSTOP)
        with pytest.raises(RunFailure, match=rf"ryu-manager ready: the process \(pid {proc.pid}\) is stopped "
                                             r"\(process state 'T': it got SIGSTOP or SIGTSTP\)"):
            poll_until(lambda: False, 60, "ryu-manager ready", proc=proc)
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.emulation
@pytest.mark.skipif(shutil.which("ryu-manager") is None and not (Path(sys.executable).parent / "ryu-manager").exists(),
                    reason="needs ryu-manager")
def test_a_controller_stopped_before_it_is_ready_is_named_stopped(tmp_path):
    from testbed.sdn import client as ctl

    def free_port() -> int:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]

    cfg = ctl.write_config(tmp_path / "c.json", switches=[{"name": "rcx9", "dpid": 9}], links=[], hosts=[],
                           stats_interval_s=1.0)
    of_port, rest_port = free_port(), free_port()
    proc = ctl.start_controller(cfg, of_port, rest_port, tmp_path / "c.log")
    try:
        os.kill(proc.pid, signal.SIGSTOP)
        with pytest.raises(ctl.ControllerNotReady, match=r"ryu-manager is not ready and cannot become so: the "
                                                         rf"process \(pid {proc.pid}\) is stopped \(process state 'T'"):
            ctl.wait_ready(f"http://127.0.0.1:{rest_port}", timeout_s=60)
    finally:
        os.kill(proc.pid, signal.SIGCONT)
        ctl.stop_controller(proc)


@pytest.mark.skipif(os.geteuid() != 0, reason="testbed run checks for root first")
def test_a_run_refused_for_too_little_space_writes_its_run_json(tmp_path, monkeypatch, capsys):
    """docs/trustworthy-runs.md: exit 3 leaves run.json with exit_code and message; a run refused
    for too little space wrote none."""
    from testbed.cli.main import main
    from testbed.emu.storage import Storage

    monkeypatch.setattr(Storage, "free_bytes", lambda self: 1024 * 1024)
    exp = tmp_path / "e.yaml"
    exp.write_text(TRIANGLE.read_text().replace("../topologies/triangle.yaml",
                                                str(REPO / "topologies" / "triangle.yaml")))
    code = main(["run", str(exp), "--runs-dir", str(tmp_path / "runs")])
    said = " ".join(capsys.readouterr().out.split())
    assert code == 3 and "1.0 MiB free, and this run writes" in said, said
    (run_dir,) = (tmp_path / "runs").iterdir()
    rec = json.loads((run_dir / "run.json").read_text())
    assert rec["status"] == "failed" and rec["exit_code"] == 3 and "1.0 MiB free" in rec["message"]
    assert rec["mode"] == "emulation" and rec["storage"]["free_bytes_at_start"] == 1024 * 1024
    assert rec["storage"]["estimate_bytes"] > 1024 * 1024


def _delta(tx: float, rx: float, t: float = 10.0) -> PortDelta:
    return PortDelta(t=t, dt_s=1.0, tx_mbps=tx, rx_mbps=rx, tx_drops=1, rx_drops=2, reset=False)


def test_link_utilization_is_what_the_link_carried_after_its_shaper():
    """An adversarial user's find: a 2 Mbit/s link read 1.48 / 3.75 (mean / max utilization): the
    switch port's bytes sent into the link, before its shaper. The rate of a direction is now the
    bytes its far end received; the offered load only while that port is not known."""
    # 7.5 Mbit/s offered into a 2 Mbit/s link, 1.9 delivered at the far end
    assert carried(_delta(tx=7.5, rx=0.0), _delta(tx=0.0, rx=1.9, t=11.0)) == (1.9, 3, 11.0)
    assert carried(_delta(tx=7.5, rx=0.0), None) == (7.5, 1, 10.0)
    assert carried(None, None) == (0.0, 0, None)


@pytest.mark.emulation
@pytest.mark.skipif(os.geteuid() != 0, reason="emulation needs root")
def test_an_overloaded_emulated_link_reads_at_most_its_capacity(tmp_path):
    """A 2 Mbit/s A-B link offered about 4 Mbit/s of requests (srca, 25 q/s of 19 kB to edgeb): its
    utilization is what it carried, at most its capacity (a little over it within one stats
    interval, as the shaper's burst drains), no longer the offered load (1.48 / 3.75)."""
    import yaml

    from testbed.plan.build import build_plan
    from testbed.results.runs import run_emulation
    from testbed.spec.experiment import Experiment

    topo = tmp_path / "t.yaml"
    topo.write_text((REPO / "topologies" / "triangle.yaml").read_text().replace(
        "{a: A, b: B, delay: 2ms, bandwidth: 100Mbit/s}", "{a: A, b: B, delay: 2ms, bandwidth: 2Mbit/s}"))
    data = yaml.safe_load(TRIANGLE.read_text())
    data["topology"]["source"] = str(topo)
    data["sources"] = [{"name": "srca", "site": "A"}]
    data["applications"] = [{"name": "digits", "deadline": "3s", "min_accuracy": 0.5}]
    data["workload"] = [{"application": "digits", "sources": "all", "rate_qps": 25}]
    plan = build_plan(Experiment.model_validate(data), base_dir=TRIANGLE.parent)
    run_emulation(plan, runs_dir=tmp_path / "runs", duration_s=8)
    run_dir = next((tmp_path / "runs").iterdir())
    s = json.loads((run_dir / "summary.json").read_text())
    (ab,) = [v for v in s["links"].values() if v["kind"] == "switch" and v["capacity_mbps"] == 2.0]
    busy = max(ab["util_ab_max"], ab["util_ba_max"])
    assert 0.5 < busy <= 1.1, ab
