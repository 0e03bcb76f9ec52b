"""testbed.core.lifeline: a child started with tied_popen gets SIGTERM when its parent process dies,
not when the thread that asked for it ends. Plain processes, no root."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from testbed.core.lifeline import EXIT_PARENT_GONE, tie_to_parent

REPO = Path(__file__).resolve().parent.parent

#: The parent: starts an echo child with tied_popen from a thread that then ends, waits until the
#: kernel has removed that thread, checks the child still answers, prints its pid, then waits.
PARENT = textwrap.dedent("""
    import os, subprocess, sys, threading, time
    from testbed.core.lifeline import tied_popen
    got, tid = [], []
    def spawn():
        tid.append(threading.get_native_id())
        got.append(tied_popen(subprocess.Popen, [sys.executable, "-c", CHILD], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True))
    t = threading.Thread(target=spawn)
    t.start(); t.join()
    while os.path.exists(f"/proc/self/task/{tid[0]}"):
        time.sleep(0.01)
    child = got[0]
    child.stdin.write("ping\\n"); child.stdin.flush()
    print(child.stdout.readline().strip(), child.pid, flush=True)
    time.sleep(600)
""")
#: The child: answers one line; on SIGTERM writes a mark and exits.
CHILD = textwrap.dedent("""
    import signal, sys, time
    def term(*_):
        open(MARK, "w").write("SIGTERM")
        sys.exit(0)
    signal.signal(signal.SIGTERM, term)
    print("pong" if sys.stdin.readline() else "eof", flush=True)
    time.sleep(600)  # not ended by its parent's pipes closing: only a signal ends it
""")


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def test_a_child_spawned_from_a_thread_outlives_the_thread_and_ends_with_the_process(tmp_path):
    mark = tmp_path / "child.mark"
    child_src = CHILD.replace("MARK", repr(str(mark)))
    src = f"CHILD = {child_src!r}\n" + PARENT
    parent = subprocess.Popen([sys.executable, "-c", src], cwd=REPO, stdout=subprocess.PIPE, text=True,
                              env=dict(os.environ, PYTHONPATH=str(REPO)))
    child_pid = None
    try:
        answer, pid = parent.stdout.readline().split()
        child_pid = int(pid)
        # the thread that forked it has ended: a death signal tied to that thread would have killed it
        assert answer == "pong"
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(timeout=10)
        deadline = time.monotonic() + 10
        while _alive(child_pid) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not _alive(child_pid), "the child survived its parent's SIGKILL"
        assert mark.read_text() == "SIGTERM"
    finally:
        if parent.poll() is None:
            parent.kill()
        if child_pid is not None and _alive(child_pid):
            os.kill(child_pid, signal.SIGKILL)


def test_a_child_whose_parent_is_already_gone_exits_at_once():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                            preexec_fn=tie_to_parent(os.getpid() + 4_000_000))  # never our pid
    assert proc.wait(timeout=30) == EXIT_PARENT_GONE
