"""A process stopped (SIGSTOP) during bring-up is named as stopped, with its state, and ends the wait
for it; a controller stopped before it is ready is named so (real ryu-manager on 127.0.0.1, under
the shared emulation lock like every test that starts one).
"""

from __future__ import annotations

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

REPO = Path(__file__).resolve().parent.parent
TRIANGLE = REPO / "experiments" / "triangle.yaml"


def test_a_stopped_process_ends_a_bring_up_wait_naming_its_state():
    """A process stopped (SIGSTOP) during a bring-up wait ends the wait at once, naming its state,
    rather than at the wait's timeout."""
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
