"""The clusters' inference servers in the emulation: started CPU-limited, watched, killed, restarted.

Each cluster host runs one ``python -m testbed.inference.server`` process (config:
:class:`testbed.boundaries.ServerConfig`, from the plan) inside a cgroup holding the cluster's CPU
share (CFS quota, :mod:`testbed.emulation.cgroups`) and memory limit. :class:`ClusterServers`
starts them all and waits until every one is warmed up, and applies outages: ``kill`` (SIGKILL,
connections refused until a restart) and ``stop`` (SIGSTOP / SIGCONT).
"""

from __future__ import annotations

import signal
import subprocess
import time
from contextlib import ExitStack
from pathlib import Path

from testbed.emulation import cgroups
from testbed.errors import RunFailure
from testbed.inference.launch import server_command, write_server_config
from testbed.util import REPO_ROOT, poll_until, stop_processes


class ClusterServers:
    """The inference server of every cluster of a running emulation (``live``: a
    :class:`testbed.emulation.bringup.Live`). Stopped (SIGTERM, then SIGKILL) on ``stack`` exit."""

    def __init__(self, live, stack: ExitStack):
        self.live = live
        self.stack = stack
        self.procs: dict[str, subprocess.Popen] = {}
        self.groups: dict[str, list[Path]] = {}
        self.stopped: set[str] = set()
        self.killed: set[str] = set()
        self.started_at: dict[str, float] = {}
        stack.callback(self._stop_all)

    def _log(self, cluster: str):
        return self.stack.enter_context(open(self.live.run_dir / "logs" / f"server-{cluster}.log", "a"))

    def _ready_file(self, cluster: str) -> Path:
        return self.live.run_dir / "clusters" / f"{cluster}.ready.json"

    def start(self, cluster: str) -> subprocess.Popen:
        """Start (or restart) the server of ``cluster`` in its cgroup; returns at once."""
        live = self.live
        plan, run_dir = live.plan, live.run_dir
        host = plan.host(cluster)
        if cluster not in self.groups:
            spec = next(c for c in plan.experiment.clusters if c.name == cluster)
            self.groups[cluster] = cgroups.create_limited_group(f"testbed-{live.run_id}-{cluster}", host.cpu_cores,
                                                                spec.memory_mib)
        self._ready_file(cluster).unlink(missing_ok=True)
        cfg = write_server_config(plan, cluster, plan.experiment.emulation.server_port, run_dir)
        p = live.emu.node(cluster).popen(server_command(cfg), stdout=self._log(cluster), stderr=subprocess.STDOUT,
                                         cwd=str(REPO_ROOT))
        cgroups.add_process(self.groups[cluster], p.pid)
        self.procs[cluster] = p
        self.started_at[cluster] = time.monotonic()
        return p

    def wait_ready(self, clusters: list[str], timeout_s: float = 180.0) -> None:
        """Wait until each server of ``clusters`` wrote its ready file (models warm, port open).

        Raises:
            RunFailure: a server exited, or was not ready within ``timeout_s`` (names it and its log).
        """
        def check() -> bool:
            for n in clusters:
                p = self.procs[n]
                if p.poll() is not None:
                    raise RunFailure(f"inference server {n} exited (code {p.returncode}); see "
                                     f"{self.live.run_dir / 'logs' / f'server-{n}.log'}")
            return all(self._ready_file(n).exists() for n in clusters)

        poll_until(check, timeout_s, f"inference servers {', '.join(clusters)} ready (see "
                                     f"{self.live.run_dir / 'logs'})", interval_s=0.2)

    def start_all(self, timeout_s: float = 180.0) -> None:
        """Start every cluster's server and wait until all are warmed up."""
        for c in self.live.plan.clusters:
            self.start(c.name)
        self.wait_ready([c.name for c in self.live.plan.clusters], timeout_s)

    def down(self, cluster: str, mode: str) -> None:
        """``kill``: SIGKILL (what it held is lost; connections refused); ``stop``: SIGSTOP."""
        p = self.procs[cluster]
        if p.poll() is not None:
            return
        if mode == "stop":
            p.send_signal(signal.SIGSTOP)
            self.stopped.add(cluster)
        else:
            self.killed.add(cluster)
            p.kill()
            p.wait()

    def up(self, cluster: str, timeout_s: float = 180.0) -> float:
        """Resume a stopped server, or restart a killed one and wait until it is ready; returns
        the seconds it took to be ready again."""
        t = time.monotonic()
        p = self.procs[cluster]
        if cluster in self.stopped:
            self.stopped.discard(cluster)
            p.send_signal(signal.SIGCONT)
            return time.monotonic() - t
        if p.poll() is None:
            return 0.0
        self.killed.discard(cluster)
        self.start(cluster)
        self.wait_ready([cluster], timeout_s)
        return time.monotonic() - t

    def expected_dead(self, cluster: str) -> bool:
        """Whether the server of ``cluster`` is down on purpose (a planned outage)."""
        return cluster in self.stopped or cluster in self.killed

    def _stop_all(self) -> None:
        for c in list(self.stopped):
            if self.procs[c].poll() is None:
                self.procs[c].send_signal(signal.SIGCONT)
        stop_processes(self.procs.values(), signal.SIGTERM)


__all__ = ["ClusterServers"]
