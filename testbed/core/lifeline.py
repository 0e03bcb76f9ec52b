"""Children that end when the run dies: :func:`tied_popen`.

A run killed with SIGKILL cannot stop what it started: its sources kept sending queries and
writing records into the dead run's directory, and its servers, link emulators and ryu-manager
kept running, until the next run's cleanup (:mod:`testbed.emu.cleanup`) killed them. Every
long-running child of a run is therefore started through :func:`tied_popen`, which sets
``prctl(PR_SET_PDEATHSIG, SIGTERM)`` in the child between ``fork`` and ``exec``: the kernel sends
the child SIGTERM when its parent dies, however it dies, and each child's SIGTERM handling ends it
as a stop of the run would (sources record their last answers and write their tally).

Three properties of the mechanism decide how it is used:

* The death signal survives ``execve`` (Mininet's ``mnexec -da PID cmd`` joins the node's
  namespaces and execs ``cmd`` in the same process, which stays the run's child) except into a
  set-user-ID, set-group-ID or file-capability binary, or when the child changes its credentials;
  none of ours does (tcpdump runs with ``-Z root``).
* It fires when the **thread** that forked the child exits, not the process. A child forked from a
  short-lived thread (the thread that restarts a server after a ``cluster_up`` event, for one)
  would get SIGTERM as soon as that thread ends. :func:`tied_popen` therefore forks on the main
  thread when called there, and otherwise on one spawner thread that lives as long as the process.
* The parent can die between ``fork`` and the ``prctl``; the child then checks that its parent is
  still the process that forked it, and exits (:data:`EXIT_PARENT_GONE`) if not.

A child of a child (ryu-manager starts none; the servers, sources and link emulators start none)
is not covered; a stopped child (SIGSTOP) holds the SIGTERM until it is continued.
"""

from __future__ import annotations

import ctypes
import os
import signal
import threading
from collections.abc import Callable
from concurrent.futures import Future
from queue import SimpleQueue
from typing import Any, TypeVar

#: ``prctl`` option (linux/prctl.h).
PR_SET_PDEATHSIG = 1
#: The signal a child gets when the run dies: every child of ours ends cleanly on it.
DEATH_SIGNAL = signal.SIGTERM
#: Exit code of a child whose parent died before the death signal was set.
EXIT_PARENT_GONE = 70

P = TypeVar("P")

_libc = ctypes.CDLL(None, use_errno=True)
_prctl = _libc.prctl
_prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
_prctl.restype = ctypes.c_int


class _Spawner(threading.Thread):
    """The thread that forks the children asked for from other threads; it never ends before the
    process does, so their death signal fires only when the process dies."""

    def __init__(self) -> None:
        super().__init__(daemon=True, name="lifeline-spawner")
        self.jobs: SimpleQueue[tuple[Callable[[], Any], Future]] = SimpleQueue()
        self.pid = os.getpid()

    def run(self) -> None:
        while True:
            job, done = self.jobs.get()
            try:
                done.set_result(job())
            except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
                done.set_exception(exc)


_spawner: _Spawner | None = None
_spawner_lock = threading.Lock()


def _on_spawner(job: Callable[[], P]) -> P:
    global _spawner
    with _spawner_lock:
        if _spawner is None or _spawner.pid != os.getpid() or not _spawner.is_alive():  # none yet, or a fork of us
            _spawner = _Spawner()
            _spawner.start()
        spawner = _spawner
    done: Future = Future()
    spawner.jobs.put((job, done))
    return done.result()


def tie_to_parent(parent_pid: int, then: Callable[[], None] | None = None) -> Callable[[], None]:
    """A ``preexec_fn`` that sets the death signal (module docstring), then runs ``then``.

    Args:
        parent_pid: the pid of the process that forks (the child exits with
            :data:`EXIT_PARENT_GONE` if its parent is already another process).
        then: a further ``preexec_fn`` of the caller, or None.

    Raises (in the child; ``subprocess`` raises ``SubprocessError`` in the parent):
        OSError: ``prctl`` failed.
    """
    sig = int(DEATH_SIGNAL)

    def preexec() -> None:
        if _prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG)")
        if os.getppid() != parent_pid:
            os._exit(EXIT_PARENT_GONE)
        if then is not None:
            then()

    return preexec


def tied_popen(start: Callable[..., P], *args: Any, **kwargs: Any) -> P:
    """``start(*args, **kwargs)`` (``subprocess.Popen``, or a Mininet node's ``popen``, which passes
    its keyword arguments on to ``Popen``) with a ``preexec_fn`` that gives the child SIGTERM when
    this process dies, forked on a thread that lives as long as this process (module docstring).

    Returns:
        What ``start`` returns (the ``Popen``).

    Raises:
        subprocess.SubprocessError: the death signal could not be set in the child (its
            ``preexec_fn`` raised); whatever ``start`` raises (``OSError``: no such program).
    """
    kwargs["preexec_fn"] = tie_to_parent(os.getpid(), kwargs.get("preexec_fn"))
    if threading.current_thread() is threading.main_thread():
        return start(*args, **kwargs)
    return _on_spawner(lambda: start(*args, **kwargs))


__all__ = ["DEATH_SIGNAL", "EXIT_PARENT_GONE", "tie_to_parent", "tied_popen"]
