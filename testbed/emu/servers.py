"""The clusters' inference servers in the emulation: started CPU-limited, at their profile's speed,
watched, killed, restarted, and every source's path to them warmed before the load.

Each cluster host runs one ``python -m testbed.serve.server`` process (config:
:class:`testbed.plan.boundaries.ServerConfig`, from the plan) inside a cgroup holding the cluster's CPU
share (CFS quota, :mod:`testbed.core.cgroups`; under time dilation k, the same quota per k x the
period) and memory limit. Each server times its models' bare calls before it is ready
(:mod:`testbed.serve.speed`; its group has no CPU limit until then: a throttled call runs cold
after each wait, so a bare call timed under the quota reads slow); from its ready file the
cluster's speed (:mod:`testbed.plan.speeds`):
with ``emulation.speed: profile`` its quota becomes cores x s per k x 100 ms and, at one core or
more, each of its threads is capped at s / k core (below one core the server pads its calls
itself: :func:`testbed.plan.dilation.nested_cpu`), s being the host's speed factor (on a host
slower than k makes up, s > k, the calls run at the host's speed and the quota alone is raised);
a quota the cluster's threads cannot use stops the run (:func:`testbed.plan.speeds.check_fits`).
:attr:`ClusterServers.speeds` holds every cluster's. During the load the quota of a padded cluster
follows its work: its server process's CPU over what the model charges (:meth:`ClusterServers.follow_quotas`,
:func:`testbed.plan.speeds.followed_quota`); ``clusters/<cluster>.cpu.json`` keeps the
factors it took.
:class:`ClusterServers` starts them all and waits until every one is warmed up, and applies outages: ``kill`` (SIGKILL,
connections refused until a restart) and ``stop`` (SIGSTOP / SIGCONT). A restarted server starts
its counters from zero; the stats file of its earlier life is kept as
``clusters/<cluster>.stats.<n>.json`` (n = 1, 2, ...), so no counter is lost.

The cold start (:meth:`ClusterServers.warm_paths`): a query's first trip over a path pays for
ARP (answered by the controller), the server's HTTP and request-decoding code running for the
first time, and the model's first calls at the server's thread count. Before the load, each
source host runs ``python -m testbed.emu.servers warm SPEC.json``: ``WARMUP_REQUESTS``
real predict requests (the application's own request bodies) to every (cluster, model) it may
use, one after the other. Their times go to ``sources/<source>.warmup.json`` (the first against
the last shows what was warmed away); they are not records. What a warm-up process cannot warm
is the source's own TCP connection: each source opens it with its first query to a cluster.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from contextlib import ExitStack
from pathlib import Path

from testbed.core import cgroups
from testbed.core.clock import EmulatedClock
from testbed.core.errors import EXIT_INTEGRITY, RunFailure, connect_error
from testbed.core.lifeline import tied_popen
from testbed.core.util import REPO_ROOT, poll_until, stop_processes, stopped, write_json_atomic
from testbed.plan.speeds import (
    FOLLOW_POLL_S,
    FOLLOW_STEP,
    FOLLOW_WINDOW_S,
    ClusterSpeed,
    Speeds,
    check_fits,
    expected_weights,
    followed_quota,
    speed_target,
    work_totals,
)
from testbed.plan.zoo import request_bodies
from testbed.serve.launch import server_command, write_server_config

#: Predict requests per (source, cluster, model) before the load (the first is the cold one).
WARMUP_REQUESTS = 2
#: Seconds one warm-up request may take (a cold model at a small CPU share included), x k under
#: time dilation.
WARMUP_REQUEST_TIMEOUT_S = 20.0
#: How often (s) the threads a ready server started are capped under time dilation.
CAP_POLL_S = 0.2


#: How long (s, wall) a cluster_down's read-back waits for the server to be gone or stopped.
DOWN_READBACK_S = 2.0


def _poll_state(pid: int, want: str, timeout_s: float) -> str | None:
    """The process state letter of ``pid`` (``/proc/<pid>/stat``, proc(5)), polled every 5 ms
    until it is ``want`` or ``timeout_s`` (s) passed; None when unreadable (the process is gone)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return None
        if state == want or time.monotonic() >= deadline:
            return state
        time.sleep(0.005)


class ClusterServers:
    """The inference server of every cluster of a running emulation (``live``: a
    :class:`testbed.emu.bringup.Live`). Stopped (SIGTERM, then SIGKILL) on ``stack`` exit."""

    def __init__(self, live, stack: ExitStack):
        self.live = live
        self.stack = stack
        self.procs: dict[str, subprocess.Popen] = {}
        self.groups: dict[str, list[Path]] = {}
        self.stopped: set[str] = set()
        self.killed: set[str] = set()
        self.started_at: dict[str, float] = {}
        self.lives: dict[str, int] = {}
        self.ready_lives: dict[str, int] = {}
        self.clock = EmulatedClock(live.plan.time_dilation)
        self.k = self.clock.k
        self.speeds: dict[str, ClusterSpeed] = {}
        self._weights = expected_weights(live.plan)
        self.cap_error: str = ""
        self._capping = threading.Event()
        self._following = threading.Event()
        #: Per followed cluster, the quota factors set during the load: (s since the load started, r).
        self.followed: dict[str, list[tuple[float, ...]]] = {}
        stack.callback(self._stop_all)

    def _log(self, cluster: str):
        return self.stack.enter_context(open(self.log_path(cluster), "a"))

    def log_path(self, cluster: str) -> Path:
        """The log of ``cluster``'s server (every life appends to it)."""
        return self.live.run_dir / "logs" / f"server-{cluster}.log"

    def _last_line(self, cluster: str) -> str:
        """The last line the server of ``cluster`` logged from our code (``[inference-server] ...``)."""
        try:
            lines = self.log_path(cluster).read_text(errors="replace").splitlines()
        except OSError:
            return "(its log cannot be read)"
        ours = [ln.removeprefix("[inference-server] ") for ln in lines if ln.startswith("[inference-server]")]
        return ours[-1] if ours else (lines[-1] if lines else "(its log is empty)")

    def _ready_file(self, cluster: str) -> Path:
        return self.live.run_dir / "clusters" / f"{cluster}.ready.json"

    def _keep_stats(self, cluster: str) -> None:
        """Before a restart: keep the stats file of the life that ended (``<cluster>.stats.<n>.json``)."""
        stats = self.live.run_dir / "clusters" / f"{cluster}.stats.json"
        if stats.exists():
            stats.replace(stats.with_name(f"{cluster}.stats.{self.lives[cluster]}.json"))

    def _write_lives(self, cluster: str) -> None:
        """``clusters/<cluster>.lives.json``: the lives started and how many became ready (a life
        killed or ended while it still loaded wrote no stats file, but it was a life)."""
        write_json_atomic(self.live.run_dir / "clusters" / f"{cluster}.lives.json",
                          {"lives": self.lives[cluster], "ready": self.ready_lives.get(cluster, 0)})

    def start(self, cluster: str) -> subprocess.Popen:
        """Start (or restart) the server of ``cluster`` in its cgroup; returns at once."""
        live = self.live
        plan, run_dir = live.plan, live.run_dir
        host = plan.host(cluster)
        if cluster not in self.groups:
            spec = plan.cluster_spec(cluster)
            self.groups[cluster] = cgroups.create_limited_group(f"testbed-{live.run_id}-{cluster}", host.cpu_cores,
                                                                spec.memory_mib, time_dilation=self.k)
            # no CPU limit until the first life has timed its bare calls (a call throttled by the
            # quota runs cold after each wait: testbed.serve.speed): _apply_speed sets it
            cgroups.set_cpu_quota(self.groups[cluster], None)
        if cluster in self.lives:
            self._keep_stats(cluster)
            cgroups.remove_thread_groups(self.groups[cluster])  # the ended life's (a reused tid gets a fresh cap)
        self.lives[cluster] = self.lives.get(cluster, 0) + 1
        self._write_lives(cluster)
        self._ready_file(cluster).unlink(missing_ok=True)
        first = self.speeds.get(cluster)  # a later life keeps the first one's bare calls, hence its scale
        target = speed_target(plan, cluster, first, self._weights)
        cfg = write_server_config(plan, cluster, plan.experiment.emulation.server_port, run_dir, target,
                                  cgroups.cpu_stat_file(self.groups[cluster]))
        p = tied_popen(live.emu.node(cluster).popen, server_command(cfg), stdout=self._log(cluster),
                       stderr=subprocess.STDOUT, cwd=str(REPO_ROOT))
        cgroups.add_process(self.groups[cluster], p.pid)
        self.procs[cluster] = p
        self.started_at[cluster] = time.monotonic()
        return p

    def oom_note(self, cluster: str) -> str:
        """``"; its cgroup's memory limit ... killed it ..."`` when the cluster's memory cgroup has
        OOM-killed a process (:func:`testbed.core.cgroups.oom_kills`), else ``""``: a SIGKILL
        by the memory limit names ``memory_mib`` instead of passing for any other death."""
        kills = cgroups.oom_kills(self.groups.get(cluster, []))
        if not kills:
            return ""
        mib = self.live.plan.cluster_spec(cluster).memory_mib
        return (f"; its cgroup's memory limit (clusters.{cluster}.memory_mib: {mib} MiB) killed it ({kills} OOM "
                f"kill(s) in the group): raise memory_mib")

    def wait_ready(self, clusters: list[str], timeout_s: float = 180.0) -> None:
        """Wait until each server of ``clusters`` wrote its ready file (models warm, port open).

        Then apply each one's speed (:meth:`_apply_speed`).

        Raises:
            RunFailure: a server exited, or was not ready within ``timeout_s`` (names it and its log);
                exit code 7 (:data:`~testbed.core.errors.EXIT_INTEGRITY`) with the server's own
                message, which names the file, when a model failed its integrity check; a quota at
                the profile's speed that the cluster's threads cannot use (names the k that fits).
            CgroupError: the scaled quota or a thread's cap cannot be written.
        """
        def check() -> bool:
            for n in clusters:
                p = self.procs[n]
                if p.poll() == EXIT_INTEGRITY:
                    raise RunFailure(f"inference server {n} refused to serve: {self._last_line(n)} (see "
                                     f"{self.log_path(n)})", EXIT_INTEGRITY)
                if p.poll() is not None:
                    raise RunFailure(f"inference server {n} exited (code {p.returncode}){self.oom_note(n)}; see "
                                     f"{self.log_path(n)}")
                if stopped(p.pid) and not self._ready_file(n).exists():
                    raise RunFailure(f"inference server {n} is not ready and cannot become so: {stopped(p.pid)}")
            return all(self._ready_file(n).exists() for n in clusters)

        poll_until(check, timeout_s, f"inference servers {', '.join(clusters)} ready (see "
                                     f"{self.live.run_dir / 'logs'})", interval_s=0.2)
        for n in clusters:
            self.ready_lives[n] = self.ready_lives.get(n, 0) + 1
            self._write_lives(n)
            self._apply_speed(n)
            if self._nested(n):  # raises: the dilation, or the speed, not applied
                cgroups.cap_threads(self.groups[n], self.procs[n].pid, self.speeds[n].slowdown)
        if any(self._nested(c) for c in self.speeds) and not self._capping.is_set():
            self._capping.set()
            threading.Thread(target=self._cap_new_threads, name="thread-caps", daemon=True).start()

    def _apply_speed(self, cluster: str) -> None:
        """The first ready life of ``cluster``: its speed from the ready file (the server's check,
        :mod:`testbed.serve.speed`, made with no CPU limit), checked against the dilation
        (:func:`testbed.plan.speeds.check_fits`), and its cgroup's quota set to cores x scale (until
        then it had none). A later life ran at the same scale (its server was given the first
        life's bare calls) under the quota already set."""
        if cluster in self.speeds:
            return
        ready = json.loads(self._ready_file(cluster).read_text())
        if not ready.get("speed"):
            raise RunFailure(f"inference server {cluster} reported no speed check in {self._ready_file(cluster)}")
        cs = ClusterSpeed.model_validate(ready["speed"])
        check_fits(cluster, cs, os.cpu_count() or 1)
        cgroups.set_cpu_quota(self.groups[cluster], cs.quota_cores)
        self.speeds[cluster] = cs

    def speeds_of_run(self) -> Speeds:
        """Every cluster's speed (``run.json`` ``speeds``)."""
        em = self.live.plan.experiment.emulation
        return Speeds(mode=em.speed, time_dilation=self.k, clusters=dict(self.speeds))

    def _nested(self, cluster: str) -> bool:
        """Whether ``cluster``'s threads get their own caps (at one core or more, when its calls
        must be slowed: :attr:`testbed.plan.speeds.ClusterSpeed.applied_by`; below one core its
        server pads its calls instead)."""
        cs = self.speeds.get(cluster)
        return cs is not None and cs.applied_by == "caps"

    def _cap_new_threads(self) -> None:
        """While a cluster's threads are capped: every :data:`CAP_POLL_S`, cap the threads the ready servers started
        since (:func:`testbed.core.cgroups.cap_threads`); a failure is kept in ``cap_error``, which
        fails the run when the load ends (:meth:`write_cpu_during_load`)."""
        while self._capping.is_set():
            for c, p in list(self.procs.items()):
                if self._nested(c) and p.poll() is None and self._ready_file(c).exists():
                    try:
                        cgroups.cap_threads(self.groups[c], p.pid, self.speeds[c].slowdown)
                    except cgroups.CgroupError as exc:
                        self.cap_error = self.cap_error or f"cluster {c}: {exc}"
            time.sleep(CAP_POLL_S)

    def start_all(self, timeout_s: float = 180.0) -> None:
        """Start every cluster's server and wait until all are warmed up."""
        for c in self.live.plan.clusters:
            self.start(c.name)
        self.wait_ready([c.name for c in self.live.plan.clusters], timeout_s)

    def warm_paths(self, sources: list[str], timeout_s: float = 180.0) -> dict[str, dict]:
        """Warm every source's path to every (cluster, model) (module docstring); returns, per
        source, ``{"cluster/model": [ms of each request]}``.

        Raises:
            RunFailure: a warm-up request failed or timed out (the path or the server is broken:
                names the source, the cluster and the model).
        """
        plan, run_dir = self.live.plan, self.live.run_dir
        port = plan.experiment.emulation.server_port
        procs: dict[str, subprocess.Popen] = {}
        try:
            for s in sources:
                spec = {"source": s, "zoo_dir": plan.zoo_dir, "requests": WARMUP_REQUESTS,
                        "timeout_s": self.clock.wall(WARMUP_REQUEST_TIMEOUT_S),
                        "out": str(run_dir / "sources" / f"{s}.warmup.json"),
                        "targets": [{"cluster": c.name, "url": f"http://{c.ip}:{port}/v1/models/{m}:predict",
                                     "model": m, "family": plan.models[m].family}
                                    for c in plan.clusters for m in plan.services[c.name]]}
                path = write_json_atomic(run_dir / "sources" / f"{s}.warmup-spec.json", spec)
                log = self.stack.enter_context(open(run_dir / "logs" / f"warmup-{s}.log", "w"))
                procs[s] = tied_popen(self.live.emu.node(s).popen, [sys.executable, "-m", "testbed.emu.servers",
                                                                    "warm", str(path)],
                                      stdout=log, stderr=subprocess.STDOUT, cwd=str(REPO_ROOT))
            poll_until(lambda: all(p.poll() is not None for p in procs.values()), timeout_s,
                       "warm-up of every source -> cluster path", interval_s=0.2)
        finally:
            stop_processes(procs.values(), signal.SIGTERM, timeout_s=2)
        out = {}
        for s, p in procs.items():
            try:
                out[s] = json.loads((run_dir / "sources" / f"{s}.warmup.json").read_text())
            except (OSError, ValueError):
                out[s] = {}
            if p.returncode != 0:
                log = (run_dir / "logs" / f"warmup-{s}.log").read_text(errors="replace").strip().splitlines()[-3:]
                raise RunFailure(f"warm-up from source {s} failed (exit code {p.returncode}): {' / '.join(log)}")
        return out

    def down(self, cluster: str, mode: str) -> tuple[float | None, str]:
        """``kill``: SIGKILL (what it held is lost; connections refused); ``stop``: SIGSTOP. Read
        back: the ms (wall) until the process was gone (reaped, killed by SIGKILL) or stopped (its
        state in ``/proc/<pid>/stat`` is ``T``), within :data:`DOWN_READBACK_S`; None when it was
        not, and what was seen."""
        p = self.procs[cluster]
        t = time.monotonic()
        if p.poll() is not None:
            return None, f"the server had already exited (code {p.returncode})"
        if mode == "stop":
            self.stopped.add(cluster)
            p.send_signal(signal.SIGSTOP)
            state = _poll_state(p.pid, "T", DOWN_READBACK_S)
            ms = round((time.monotonic() - t) * 1e3, 3)
            return (ms, "stopped (state T)") if state == "T" else (None, f"not stopped: state {state or 'unreadable'}")
        self.killed.add(cluster)
        p.kill()
        try:
            code = p.wait(DOWN_READBACK_S)
        except subprocess.TimeoutExpired:
            return None, f"still running {DOWN_READBACK_S:g} s after SIGKILL"
        ms = round((time.monotonic() - t) * 1e3, 3)
        return (ms, "gone (killed by SIGKILL)") if code == -signal.SIGKILL else (None, f"exited with code {code}")

    def up(self, cluster: str, timeout_s: float = 180.0) -> float:
        """Resume a stopped server, or restart a killed one and wait until it is ready; returns
        the seconds it took to be ready again."""
        t = time.monotonic()
        p = self.procs[cluster]
        if cluster in self.stopped:
            p.send_signal(signal.SIGCONT)  # then unplanned: the health watch never sees it stopped and unplanned
            self.stopped.discard(cluster)
            return time.monotonic() - t
        if p.poll() is None:
            return 0.0
        self.start(cluster)  # the new process replaces the dead one first: the health watch sees a new life
        self.killed.discard(cluster)
        self.wait_ready([cluster], timeout_s)
        return time.monotonic() - t

    def expected_dead(self, cluster: str) -> bool:
        """Whether the server of ``cluster`` is down on purpose (a planned outage)."""
        return cluster in self.stopped or cluster in self.killed

    def cpu_stats(self) -> dict[str, dict[str, float]]:
        """Per cluster, its cgroup's CFS counters now (:func:`testbed.core.cgroups.cpu_stat`)."""
        return {c: cgroups.cpu_stat(dirs) for c, dirs in self.groups.items()}

    def follow_quotas(self) -> None:
        """From now (the load's start) until :meth:`write_cpu_during_load`, every
        :data:`~testbed.plan.speeds.FOLLOW_POLL_S`, set the quota of each padded cluster with paced
        models to ``cores x s x r / u`` (:func:`testbed.plan.speeds.followed_quota` over the
        last :data:`~testbed.plan.speeds.FOLLOW_WINDOW_S` of its server's counters); the factors
        go to :attr:`followed`. A quota that cannot be set fails the run when the load ends."""
        clusters = [c for c, cs in self.speeds.items() if cs.applied_by == "pad"]
        if not clusters or self._following.is_set():
            return
        self.followed = {c: [] for c in clusters}
        self._following.set()
        t0 = time.monotonic()
        for c in clusters:
            threading.Thread(target=self._follow, args=(c, t0), name=f"quota-follow-{c}", daemon=True).start()

    def _work_totals(self, cluster: str) -> tuple[float, float, float] | None:
        """The counters' time, the server process's CPU time and what the model charges for its work (s,
        :func:`testbed.plan.speeds.work_totals`), from the live server's counters
        (``clusters/<cluster>.stats.json``); None when unreadable or none paced."""
        try:
            stats = json.loads((self.live.run_dir / "clusters" / f"{cluster}.stats.json").read_text())
        except (OSError, ValueError):
            return None
        return work_totals(stats) if isinstance(stats, dict) else None

    def _follow(self, c: str, t0: float) -> None:
        """Cluster ``c``'s quota follower (:meth:`follow_quotas`); its writes wait for the start of
        the group's CFS period (:class:`testbed.core.cgroups.PeriodAligned`: a write in mid-period
        would grant the period's quota twice)."""
        # (poll s, snapshot s, CPU taken s, expected s, quota applied until then)
        w: deque[tuple[float, float, float, float, float]] = deque()
        applied = self.speeds[c].quota_cores
        writer = cgroups.PeriodAligned(self.groups[c], cgroups.dilated_period_us(self.k) / 1e6)
        while self._following.is_set():
            time.sleep(FOLLOW_POLL_S)
            now = time.monotonic()
            totals = self._work_totals(c)
            if totals is None or not self._following.is_set():
                continue
            if w and (totals[1] < w[-1][2] or totals[2] < w[-1][3]):
                w.clear()  # a new life: its counters start from zero
            w.append((now, *totals, applied))
            while len(w) > 2 and now - w[1][0] >= FOLLOW_WINDOW_S:
                w.popleft()
            got = followed_quota(self.speeds[c].quota_cores, self.k, w[-1][2] - w[0][2], w[-1][3] - w[0][3],
                                 w[-1][1] - w[0][1], sum(x[4] for x in list(w)[1:]) / max(1, len(w) - 1))
            if got is None:
                continue
            r, u, cores = got
            if abs(cores - applied) > FOLLOW_STEP * applied:
                try:
                    writer.set_cpu_quota(cores)
                    applied = cores
                except cgroups.CgroupError as exc:
                    self.cap_error = self.cap_error or f"cluster {c}'s quota could not follow its calls: {exc}"
                    continue
            self.followed[c].append((round(now - t0, 3), round(r, 4), round(u, 4), round(w[-1][2] - w[0][2], 6),
                                     round(w[-1][3] - w[0][3], 6)))

    def write_cpu_during_load(self, before: dict[str, dict[str, float]]) -> None:
        """``clusters/<cluster>.cpu.json``: the CFS counters' growth since ``before`` (taken when the
        load started): periods, throttled periods and their share, seconds throttled; for a
        cluster whose quota followed its calls (:meth:`follow_quotas`, which this stops), the
        factors r it took (``quota_factor``: mean, min, max; ``quota_overrun``: u's mean and max;
        ``quota_factors``: every one as
        [s since the load's start, r, the overrun u it corrected, the window's CPU taken (s), the
        work's expected CPU (s)]; :func:`testbed.plan.speeds.followed_quota`).

        Raises:
            RunFailure: a thread could not be capped during the load (the clusters' CPU was not
                dilated, or not held to the profile's speed, as planned).
        """
        self._following.clear()
        for c, now in self.cpu_stats().items():
            b = before.get(c) or {}
            if not now or not b:
                continue
            d: dict = {k: now[k] - b.get(k, 0) for k in now}
            d["throttled_share"] = round(d["throttled_periods"] / d["periods"], 4) if d["periods"] else 0.0
            rs = [f[1] for f in self.followed.get(c, [])]
            us = [f[2] for f in self.followed.get(c, [])]
            if rs:
                d["quota_factor"] = {"mean": round(sum(rs) / len(rs), 4), "min": min(rs), "max": max(rs)}
                d["quota_overrun"] = {"mean": round(sum(us) / len(us), 4), "max": max(us)}
                d["quota_factors"] = self.followed[c]
            path = self.live.run_dir / "clusters" / f"{c}.cpu.json"
            try:
                write_json_atomic(path, d, indent=1)
            except OSError as exc:  # a full disk at teardown: the run already fails with the storage incident
                print(f"[testbed] cannot write {path}: {exc}; cluster {c}'s CFS counters are not kept",
                      file=sys.stderr)
        if self.cap_error:
            raise RunFailure(f"a server thread could not be capped during the load ({self.cap_error}); its CPU ran "
                             f"faster than the emulated system's")

    def _stop_all(self) -> None:
        self._capping.clear()
        self._following.clear()
        for c in list(self.stopped):
            if self.procs[c].poll() is None:
                self.procs[c].send_signal(signal.SIGCONT)
        stop_processes(self.procs.values(), signal.SIGTERM)
        for dirs in self.groups.values():
            cgroups.remove_thread_groups(dirs)


# ----------------------------------------------------------------------------- warm-up client

async def _warm(spec: dict) -> dict[str, list[float]]:
    """Send the warm-up requests of ``spec`` one after the other; ms of each, per cluster/model.

    Raises:
        RuntimeError: a request failed or did not answer 200 (names the target).
    """
    import aiohttp

    bodies: dict[str, list[bytes]] = {}
    out: dict[str, list[float]] = {}
    timeout = aiohttp.ClientTimeout(total=float(spec["timeout_s"]))
    async with aiohttp.ClientSession() as session:
        for t in spec["targets"]:
            fam = t["family"]
            if fam not in bodies:
                bodies[fam] = request_bodies(spec["zoo_dir"], fam, n=spec["requests"])[0]
            times = []
            for k in range(int(spec["requests"])):
                t0 = time.perf_counter()
                headers = {"Content-Type": "application/json", "X-Testbed-Query-Id": f"warmup-{spec['source']}-{k}"}
                try:
                    async with session.post(t["url"], data=bodies[fam][k % len(bodies[fam])], headers=headers,
                                            timeout=timeout) as resp:
                        await resp.read()
                        status = resp.status
                except (aiohttp.ClientError, OSError, TimeoutError) as exc:
                    raise RuntimeError(f"{t['cluster']} / {t['model']}: {connect_error(exc)}") from None
                if status != 200:
                    raise RuntimeError(f"{t['cluster']} / {t['model']}: HTTP {status}")
                times.append(round((time.perf_counter() - t0) * 1e3, 3))
            out[f"{t['cluster']}/{t['model']}"] = times
    return out


def main(argv: list[str] | None = None) -> int:
    """``python -m testbed.emu.servers warm SPEC.json`` (run in a source host): 0 when every
    warm-up request was answered, 1 (with the reason on stderr) otherwise."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2 or argv[0] != "warm":
        print("usage: python -m testbed.emu.servers warm SPEC.json", file=sys.stderr)
        return 2
    spec = json.loads(Path(argv[1]).read_text())
    try:
        out = asyncio.run(_warm(spec))
    except RuntimeError as exc:
        print(f"warm-up from {spec['source']}: {exc}", file=sys.stderr)
        return 1
    write_json_atomic(spec["out"], out)
    return 0


__all__ = ["WARMUP_REQUESTS", "ClusterServers", "main"]

if __name__ == "__main__":
    sys.exit(main())
