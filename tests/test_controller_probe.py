"""The run's switches stay connected while their controller answers nothing for longer than Open
vSwitch's default inactivity probe allows (5 s idle, then 5 s for an answer): they carry no probe
(:data:`testbed.emu.mininet_network.CONTROLLER_SETTINGS`, applied to the open connections by
:meth:`testbed.emu.mininet_network.Emulation.apply_controller_settings`), so a starved controller is
not taken for a failed one. Real Mininet, Open vSwitch and ryu-manager on the triangle; root only.
The bring-up applies them as soon as every switch is connected, before the controller installs the
flows (a unit test of :func:`testbed.sdn.client.wait_ready`'s ``on_connected``).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
import yaml

from testbed.plan.build import build_plan
from testbed.sdn.client import get_status
from testbed.spec.experiment import Experiment

REPO = Path(__file__).resolve().parent.parent
TRIANGLE = REPO / "experiments" / "triangle.yaml"
#: Longer than Open vSwitch's default probe takes to give a silent controller up (5 + 5 s).
STOPPED_S = 13.0


@pytest.mark.emulation
@pytest.mark.skipif(os.geteuid() != 0, reason="emulation needs root")
def test_switches_stay_connected_while_the_controller_answers_nothing(tmp_path):
    from testbed.emu.bringup import emulated_network, new_run_dir

    plan = build_plan(Experiment.model_validate(yaml.safe_load(TRIANGLE.read_text())), base_dir=TRIANGLE.parent)
    run_id, run_dir = new_run_dir(plan, tmp_path)
    with emulated_network(plan, run_id, run_dir) as live:
        log = run_dir / "logs" / "controller.log"
        before = len(log.read_text())
        os.kill(live.controller.pid, signal.SIGSTOP)
        try:
            time.sleep(STOPPED_S)
        finally:
            os.kill(live.controller.pid, signal.SIGCONT)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:  # ryu reads what queued while it was stopped
            status = get_status(live.rest_url)
            time.sleep(0.5)
        after = log.read_text()[before:]
    assert "disconnected" not in after, after
    assert not status.get("missing_switches"), status


def test_the_settings_are_applied_once_every_switch_is_connected_before_the_flows(monkeypatch):
    import testbed.sdn.client as ctl

    answers = iter([{"ready": False, "missing_switches": [2, 3]}, {"ready": False, "missing_switches": [3]},
                    {"ready": False, "missing_switches": [], "missing_links": [[1, 2]]},
                    {"ready": False, "missing_switches": [], "missing_links": []}, {"ready": True}])
    seen: list[str] = []

    def status(url, timeout_s=5.0):
        st = next(answers)
        seen.append("ready" if st["ready"] else f"missing {len(st['missing_switches'])}")
        return st

    monkeypatch.setattr(ctl, "get_status", status)
    ctl.wait_ready("http://127.0.0.1:1", timeout_s=5, poll_s=0.0, proc=None,
                   on_connected=lambda: seen.append("applied"))
    assert seen == ["missing 2", "missing 1", "missing 0", "applied", "missing 0", "ready"]
