"""A query source: workload generator + dispatcher, run inside a source host's namespace.

``python -m testbed.emu.source CONFIG.json`` (a :class:`testbed.plan.boundaries.SourceConfig` written by
:mod:`testbed.emu.lifecycle`). For each workload entry it draws arrivals from the same :mod:`testbed.model.arrivals`
process (and the same seeds) as the simulator, window by window (the report interval); the
dispatcher step is the model's (:class:`testbed.model.dispatch.Dispatcher`, deciding on the state
last heard); each query is the real request body sent as TensorFlow Serving REST
(``POST /v1/models/NAME:predict``) to the chosen cluster; each row is built by
:func:`testbed.model.records.make_record`, the simulator's builder too.

Stale state, as in the simulator: every ``report_interval_s`` the source polls each cluster's
``GET /v1/stats`` over the emulated network and the dispatcher hears it (a failed poll: the
cluster is taken as down). With ``policy: aset`` the source asks
``testbed.agent.live.SourceSelector(cfg).choose(state)`` every ``aset.window_s`` (default: the
checkpoint's window) which static policy to apply; with ``aset.selector``, the selector of one's own
(the same :class:`testbed.agent.live.SourceSelector`; one that raises stops the source with exit code 4).
Each record carries the policy in force.

Timestamps are ``time.time_ns()``: all emulated hosts share one kernel clock, so t0..t4 from
different hosts are directly comparable. t0 is taken just before the dispatcher decides, td just
after (``dispatch_ms`` = td - t0: the decision's own cost); the server's instants (t1, t1h, t2,
t3, t3h) come back in its answer's headers. ``expected_rtt_ms`` is the RTT of the path in force at
td, with the delays in force then (``SourceConfig.rtt_steps``, :func:`testbed.model.network.rtt_at`,
the simulator's rule). Under time dilation k (``SourceConfig.clock``) the arrivals are drawn in
emulated time and played k times slower, and each record is written in emulated time (instants,
the deadline and the RTT through the clock); a plug-in policy's decision, which the source makes at
the host's full speed, is padded to k times its wall time (a blocking sleep of the rest, the loop held as by the
decision's CPU: :func:`testbed.core.util.hold_loop`), so that its
emulated cost is its cost, as the simulator charges it (``plan.decision_ms``).
Records are appended (and flushed) as each query
resolves, so a run stopped at any point keeps what was measured; a write that fails (a full
disk) keeps the row in memory, retried with the next row and at exit. A records file deleted
during the run is written back from the open file at exit (the tally says ``restored``).

New connections: before the load starts the source opens a keep-alive connection to every
cluster (a ``GET /v1/stats``), so its first query to a cluster normally reuses it. A query that
still had to open a new TCP connection (no open one to its cluster was idle: its other queries or
the stats poll held them, as in a burst, or the idle one had been closed after the connector's
60 s) is marked ``cold = 1`` (aiohttp's connection tracing); its answer paid one more RTT for
the handshake. Cold queries count in every figure of the summary, latency percentiles included
(:data:`testbed.results.summary.COLD_RULE`, docs/trustworthy-runs.md).
"""

from __future__ import annotations

import asyncio
import csv
import errno
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from testbed.agent.live import SourceSelector
from testbed.agent.selector import SelectorFailed
from testbed.core.errors import EXIT_COMPONENT_DIED, connect_error
from testbed.core.plugins import add_sys_paths
from testbed.core.util import hold_loop, replace_atomic, write_json_atomic
from testbed.model import seeds
from testbed.model.dispatch import Dispatcher, Heard
from testbed.model.network import path_cut, rtt_at
from testbed.model.policies import REGISTRY, PolicyFailure
from testbed.model.records import CLIENT_ERROR, CONNECTION_REFUSED, RECORD_FIELDS, make_record
from testbed.plan.boundaries import AppInfo, SourceConfig, SourceTally, StreamConfig, read_config, tally_path
from testbed.plan.dilation import Stretched
from testbed.plan.traces import arrival_process
from testbed.plan.zoo import request_bodies
from testbed.spec.experiment import ASET_POLICY

#: How a source's log says that it could not open its connection to a cluster before the load
#: (:mod:`testbed.emu.autodilate` refuses a warm-up whose sources say so).
CANNOT_REACH = "[source] cannot reach cluster"
#: How long (emulated s; x k on the wall clock) a source's first request to a cluster may take before the
#: load: a new connection and the server's stats, over the path's RTT, on a machine that may be busy (the
#: path warm-up's request timeout, :data:`testbed.emu.servers.WARMUP_REQUEST_TIMEOUT_S`).
OPEN_TIMEOUT_S = 20.0
#: Client-side errors that mean nothing listens at the server (it is down): connection refused or
#: reset. "No route to host" is a network failure, not a server that is down: it stays an ``error``.
REFUSED_ERRNOS = frozenset({errno.ECONNREFUSED, errno.ECONNRESET})


def heard_from_stats(stats: dict[str, Any], workers: int, utilization: float, at_s: float) -> Heard:
    """What a dispatcher hears from a server's ``GET /v1/stats`` answer (:meth:`Heard.of`), with
    ``utilization`` measured by the caller from ``busy_s`` differences."""
    return Heard.of({**stats, "utilization": utilization}, workers, at_s)


def _refused(exc: BaseException) -> bool:
    """Whether a client error means the server is down: the connection was refused or reset, or
    the server closed it without answering (``aiohttp.ServerDisconnectedError``: a killed server's
    kernel closes its keep-alive connections, and a query sent on one then ends so). A live server
    of ours never closes a connection with a request in it: its keep-alive timeout (aiohttp's
    default, 3630 s) is longer than the sources' connector's (60 s), so an idle connection is
    closed by the source first."""
    from aiohttp import ServerDisconnectedError

    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, (ConnectionRefusedError, ConnectionResetError, ServerDisconnectedError)) or \
                getattr(exc, "errno", None) in REFUSED_ERRNOS:
            return True
        exc = getattr(exc, "os_error", None) or exc.__cause__ or exc.__context__
    return False


#: The instants a query's answer carries (t0 and td are taken before it is sent).
_INSTANTS = ("t1_ns", "t1h_ns", "t2_ns", "t3_ns", "t3h_ns", "t4_ns")

#: How often a source looks for the run's go (s); how long it waits at most is its config's ``go_timeout_s``.
GO_POLL_S = 0.005


class Source:
    """Generates, dispatches and records the queries of one source host."""

    def __init__(self, cfg: SourceConfig):
        self.cfg = cfg
        self.name = cfg.source
        self.aset = None
        policy = cfg.policy
        self.selector_failed: SelectorFailed | None = None
        if policy == ASET_POLICY:
            self.aset = SourceSelector(cfg)
            policy = self.aset.initial
        add_sys_paths(cfg.plugin_paths)  # where the plan found its policy plug-ins
        origin = REGISTRY.resolve(policy, f"source {self.name}").origin
        if origin is not None and cfg.plugin_sha256.get(policy, origin.sha256) != origin.sha256:
            raise ValueError(f"policy {policy!r}: {origin.file} has SHA-256 {origin.sha256}, not the "
                             f"{cfg.plugin_sha256[policy]} of the file the plan resolved (changed since); run again")
        self.dispatcher = Dispatcher([o.option for o in cfg.options], policy,
                                     seeds.dispatcher(seeds.run_key(cfg.seed), cfg.source_index))
        self.ip = {o.option.cluster: o.ip for o in cfg.options}
        self.options = {(o.option.cluster, o.option.model): o.option for o in cfg.options}
        self.workers = {o.option.cluster: o.option.workers for o in cfg.options}
        self.apps = {a.name: a for a in cfg.applications}
        self._busy_s: dict[str, tuple[float, float]] = {}
        # Request bodies made once per application: building them per query would cost the source.
        self.bodies = {a.name: request_bodies(cfg.zoo_dir, a.family) for a in cfg.applications}
        self.rng = seeds.payloads(cfg.seed, cfg.source_index)
        self.out = open(cfg.records, "w", newline="")  # noqa: SIM115 - closed in run()
        self.writer = csv.DictWriter(self.out, fieldnames=RECORD_FIELDS)
        self.writer.writeheader()
        self.out.flush()
        self.unwritten: list[dict] = []
        self.write_error = ""
        self.seq = 0
        self.written = 0  # rows handed to the CSV writer
        self.pending: set[asyncio.Task] = set()
        self.failed_queries = 0  # query tasks that raised (a bug): the source then exits 3
        self.policy_failure: PolicyFailure | None = None  # a plug-in policy raised: the source stops, exit 4
        self.stopping = False
        self.win_arrivals: dict[str, int] = {}
        # (application, success, t0_s, cluster, e2e_ms or None) of the queries resolved in the window
        self.win_resolved: list[tuple[str, bool, float, str, float | None]] = []
        self.in_flight: dict[str, int] = {}  # per cluster: this source's queries sent, not resolved yet
        self._plugins: dict[str, bool] = {}

    @property
    def policy_name(self) -> str:
        return self.dispatcher.policy

    def _is_plugin(self, policy: str) -> bool:
        """Whether ``policy`` is a plug-in (not a built-in policy: those cost nothing in the simulator)."""
        plugin = self._plugins.get(policy)
        if plugin is None:
            plugin = self._plugins[policy] = REGISTRY.resolve(policy, f"source {self.name}").origin is not None
        return plugin

    def _write(self, row: dict) -> None:
        self.unwritten.append(row)
        try:
            self._drain()
            self.out.flush()
        except OSError as exc:  # e.g. the disk is full: keep the rows, the run's health watch reports it
            if not self.write_error:
                print(f"[source] cannot write records to {self.cfg.records}: {exc}; keeping them in memory",
                      file=sys.stderr, flush=True)
            self.write_error = str(exc)

    async def _post(self, session, url: str, body: bytes, headers: dict, timeout, trace: dict) -> dict[str, Any]:
        """One predict request; the times and status the record needs (module docstring).
        ``trace["cold"]`` becomes True if it had to open a new connection."""
        out: dict[str, Any] = {"status": None}
        async with session.post(url, data=body, timeout=timeout, headers=headers, trace_request_ctx=trace) as resp:
            payload = await resp.read()
            out.update(t4_ns=time.time_ns(), status=resp.status, response_bytes=len(payload))
            h = resp.headers
            if "X-Testbed-T1" in h:
                out.update(t1_ns=int(h["X-Testbed-T1"]), queue_len_at_arrival=int(h.get("X-Testbed-Queue-Len", 0)))
                if "X-Testbed-T1h" in h:
                    out["t1h_ns"] = int(h["X-Testbed-T1h"])
            if resp.status == 200 and "X-Testbed-T2" in h:
                out.update(t2_ns=int(h["X-Testbed-T2"]), t3_ns=int(h["X-Testbed-T3"]),
                           t3h_ns=int(h["X-Testbed-T3h"]), batch=int(h.get("X-Testbed-Batch", 1)))
                preds = json.loads(payload).get("predictions")
                if isinstance(preds, list) and preds and isinstance(preds[0], list):
                    out["predicted"] = int(np.argmax(preds[0]))
            elif resp.status == 503:
                try:
                    out["drop_reason"] = str(json.loads(payload).get("reason", ""))
                except ValueError:
                    pass
        return out

    async def _query(self, session, app: AppInfo) -> None:
        import aiohttp

        bodies, labels = self.bodies[app.name]
        k = int(self.rng.integers(len(bodies)))
        body, label = bodies[k], labels[k]
        clock = self.cfg.clock
        t0 = time.time_ns()
        policy = self.dispatcher.policy
        d = self.dispatcher.dispatch(app.deadline_ms, app.min_accuracy, app.family, t0 / 1e9)  # a plug-in may raise
        td = time.time_ns()
        if clock.dilated and self._is_plugin(policy):  # the decision at the emulated speed (module doc)
            hold_loop(clock.wall((td - t0) / 1e9) - (td - t0) / 1e9)  # the loop's own CPU, as the decision's
            td = time.time_ns()
        self.seq += 1  # a query exists once it is dispatched
        qid = f"{self.name}-{self.seq}"
        opt = self.options[(d.cluster, d.model)]
        self.win_arrivals[app.name] = self.win_arrivals.get(app.name, 0) + 1
        self.in_flight[d.cluster] = self.in_flight.get(d.cluster, 0) + 1
        url = f"http://{self.ip[d.cluster]}:{self.cfg.server_port}/v1/models/{d.model}:predict"
        headers = {"Content-Type": "application/json", "X-Testbed-Query-Id": qid,
                   "X-Testbed-Deadline-Ns": str(t0 + int(app.deadline_ms * 1e6))}
        timeout = aiohttp.ClientTimeout(total=(app.deadline_ms + self.cfg.grace_ms) / 1e3)
        got: dict[str, Any] = {"status": None}
        error = ""
        trace = {"cold": False}
        try:
            got = await self._post(session, url, body, headers, timeout, trace)
        except TimeoutError:
            pass  # no answer within deadline + grace
        except (aiohttp.ClientError, OSError, ValueError, KeyError) as exc:
            error = type(exc).__name__
            got = {"status": CONNECTION_REFUSED if _refused(exc) else CLIENT_ERROR, "t4_ns": time.time_ns()}
        t0_s = (t0 - self.cfg.start_ns) / 1e9
        cut = path_cut(self.cfg.no_route.get(d.cluster, ()), t0_s, t0_s + (app.deadline_ms + self.cfg.grace_ms) / 1e3)
        steps = self.cfg.rtt_steps.get(d.cluster)
        rtt = rtt_at(steps, (td - self.cfg.start_ns) / 1e9) if steps else opt.rtt_ms  # wall ms; None: no route
        # the record in emulated time (SourceConfig.clock)
        got.update(clock.instants({name: got[name] for name in _INSTANTS if name in got}))
        row = make_record(query_id=qid, source=self.name, application=app.name, cluster=d.cluster, model=d.model,
                          policy=policy, fallback=d.fallback, deadline_ms=clock.emulated(app.deadline_ms),
                          min_accuracy=app.min_accuracy, model_accuracy=opt.accuracy,
                          expected_rtt_ms=None if rtt is None else clock.emulated(rtt), t0_ns=clock.emulated_ns(t0),
                          td_ns=clock.emulated_ns(td), request_bytes=len(body), label=label, error=error,
                          cold=trace["cold"], cut=cut, **got)
        self._write(row)  # first: whatever follows, the query is on record
        self.in_flight[d.cluster] -= 1
        # e2e_ms is absent for a query with no answer within deadline + grace (the simulator's None)
        self.win_resolved.append((app.name, row["outcome"] == "success", (row["t0_ns"] - self.cfg.start_ns) / 1e9,
                                  d.cluster, row.get("e2e_ms")))

    async def _poll_stats(self, session, end: float) -> None:
        """Every report interval: ``GET /v1/stats`` of each cluster; the dispatcher hears it."""
        import aiohttp

        loop = asyncio.get_running_loop()
        interval = self.cfg.report_interval_s
        timeout = aiohttp.ClientTimeout(total=interval)

        async def one(cluster: str) -> tuple[str, Heard | None]:
            url = f"http://{self.ip[cluster]}:{self.cfg.server_port}/v1/stats"
            try:
                async with session.get(url, timeout=timeout) as resp:
                    st = await resp.json()
            except (aiohttp.ClientError, OSError, ValueError, TimeoutError):
                return cluster, None
            workers = int(st.get("workers") or self.workers[cluster])
            busy_s, now = float(st.get("busy_s") or 0.0), time.monotonic()
            prev = self._busy_s.get(cluster)
            self._busy_s[cluster] = (busy_s, now)
            util = st.get("utilization") or 0.0
            if prev and now > prev[1]:
                util = (busy_s - prev[0]) / ((now - prev[1]) * workers)
            return cluster, heard_from_stats(st, workers, util, time.time())

        while not self.stopping and loop.time() < end:
            for cluster, heard in await asyncio.gather(*(one(c) for c in self.ip)):
                if heard is None:
                    self.dispatcher.lost(cluster, time.time())
                else:
                    self.dispatcher.hear(cluster, heard)
            await asyncio.sleep(interval)

    def _path_util(self) -> dict[str, float]:
        """Max link utilization on the path to each cluster, from the run's ``link_util.json``
        (written by testbed.emu.lifecycle from the controller's port stats); 0 when unknown."""
        links: dict = {}
        if self.cfg.link_util_file:
            try:
                links = json.loads(Path(self.cfg.link_util_file).read_text()).get("links", {})
            except (OSError, ValueError):
                links = {}
        return {c: max((float(links.get(f"{a}-{b}", links.get(f"{b}-{a}", 0.0))) for a, b in pl), default=0.0)
                for c, pl in self.cfg.path_links.items()}

    def _aset_state(self) -> dict:
        """The window's raw view handed to ``SourceSelector.choose`` (testbed.agent.observation)."""
        # No ``report_age_s``: the simulator's windows start right after a report (age 0, the agent was
        # trained on that), while here the stats poll and the window run on separate timers.
        return {"arrivals": dict(self.win_arrivals), "clusters": self.dispatcher.heard_state(),
                "path_util": self._path_util(), "resolved": list(self.win_resolved), "in_flight": dict(self.in_flight),
                "policy": self.policy_name,
                "now_s": self.cfg.clock.emulated((time.time_ns() - self.cfg.start_ns) / 1e9)}

    async def _aset_loop(self, end: float) -> None:
        loop = asyncio.get_running_loop()
        # the agent's window (aset.window, default the checkpoint's), in emulated time: dilated on the wall clock
        window = self.cfg.clock.wall(self.aset.window_s)
        while not self.stopping and loop.time() < end:
            await asyncio.sleep(window)
            state = self._aset_state()
            self.win_arrivals, self.win_resolved = {}, []
            try:
                choice = self.aset.choose(state)
            except SelectorFailed as exc:  # a selector of one's own raised: told with its traceback, the run stops
                print(f"[source] {exc}", file=sys.stderr, flush=True)
                self.selector_failed = exc
                self._stop()
                return
            self.dispatcher.policy = choice  # a name of its action set (the selector checks what it returns)

    async def _arrivals(self, session, stream: StreamConfig, t_start: float, end: float) -> None:
        """Queries of one workload entry, times from :mod:`testbed.model.arrivals` (same seeds as the simulator)."""
        loop = asyncio.get_running_loop()
        rng = seeds.arrivals(seeds.run_key(self.cfg.seed), stream.index, self.cfg.source_index)
        proc = arrival_process(stream.spec, rng, stream.weight, Path(self.cfg.base_dir))
        if self.cfg.clock.dilated:
            proc = Stretched(proc, self.cfg.clock)  # drawn in emulated time, played k x slower
        app = self.apps[stream.spec.application]
        window = self.cfg.report_interval_s
        a = 0.0
        duration = end - t_start
        while not self.stopping and a < duration:
            for t in proc.times(a, a + window).tolist():
                if t >= duration or self.stopping:
                    return
                await asyncio.sleep(max(0.0, t_start + t - loop.time()))
                task = asyncio.create_task(self._query(session, app))
                self.pending.add(task)
                task.add_done_callback(self._query_done)
            a += window

    async def _open_connections(self, session) -> None:
        """One keep-alive connection to every cluster before the load (a ``GET /v1/stats`` each,
        within :data:`OPEN_TIMEOUT_S` x k); a failure is noted in the log (:data:`CANNOT_REACH`, with
        its errno: :func:`testbed.core.errors.connect_error`): after the run's path warm-up it does not
        happen; auto dilation's warm-ups, which skip that, refuse to measure when it does."""
        import aiohttp

        timeout = aiohttp.ClientTimeout(total=self.cfg.clock.wall(OPEN_TIMEOUT_S))

        async def one(cluster: str) -> None:
            url = f"http://{self.ip[cluster]}:{self.cfg.server_port}/v1/stats"
            try:
                async with session.get(url, timeout=timeout) as resp:
                    await resp.read()
            except (aiohttp.ClientError, OSError, TimeoutError) as exc:

                print(f"{CANNOT_REACH} {cluster} before the load: {connect_error(exc)}", file=sys.stderr)

        await asyncio.gather(*(one(c) for c in self.ip))

    async def _wait_for_go(self) -> None:
        """The run's start barrier (:class:`SourceConfig` ``ready_file`` / ``go_file``): say ready,
        then wait for the common start time and take it (this source's ``start_ns`` and its ASET
        selector's). Without a barrier, the configured ``start_ns`` stands.

        Raises:
            TimeoutError: no go within the config's ``go_timeout_s`` (the run stops the source before that).
        """
        if not self.cfg.go_file:
            return
        if self.cfg.ready_file:
            Path(self.cfg.ready_file).touch()
        go, deadline = Path(self.cfg.go_file), time.monotonic() + self.cfg.go_timeout_s
        while not go.exists():
            if time.monotonic() > deadline:
                raise TimeoutError(f"no start from the run ({go}) within {self.cfg.go_timeout_s:g} s")
            await asyncio.sleep(GO_POLL_S)
        start_ns = int(json.loads(go.read_text())["start_ns"])
        self.cfg = self.cfg.model_copy(update={"start_ns": start_ns})
        if self.aset is not None:
            self.aset.restart_at(start_ns)

    @staticmethod
    def _tracing():
        """aiohttp tracing that marks a request's context ``cold`` when it opens a connection."""
        import aiohttp

        async def created(session, ctx, params) -> None:
            if isinstance(ctx.trace_request_ctx, dict):
                ctx.trace_request_ctx["cold"] = True

        tc = aiohttp.TraceConfig()
        tc.on_connection_create_end.append(created)
        return tc

    async def run(self) -> None:
        import aiohttp

        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stop)
        conn = aiohttp.TCPConnector(limit=0, force_close=False, keepalive_timeout=60)
        try:
            async with aiohttp.ClientSession(connector=conn, trace_configs=[self._tracing()]) as session:
                await self._open_connections(session)
                await self._wait_for_go()
                await asyncio.sleep(max(0.0, self.cfg.start_ns / 1e9 - time.time()))
                t_start = loop.time()
                end = t_start + self.cfg.duration_s
                side = [asyncio.create_task(self._poll_stats(session, end))]
                if self.aset is not None:
                    side.append(asyncio.create_task(self._aset_loop(end)))
                await asyncio.gather(*(self._arrivals(session, st, t_start, end) for st in self.cfg.streams))
                for t in side:
                    t.cancel()
                if self.pending:
                    await asyncio.wait(set(self.pending))
        finally:
            self._close()

    def _drain(self) -> None:
        """Hand every row kept in memory to the CSV writer, oldest first (raises OSError, a full
        disk: the rows not written stay kept)."""
        while self.unwritten:
            self.writer.writerow(self.unwritten[0])
            self.unwritten.pop(0)
            self.written += 1

    def _restore_if_deleted(self) -> bool:
        """Write the records file back from the open file when it is no longer at its path (deleted
        during the run: the rows written since went to the open, unlinked file); True when it did.
        The run's health watch has reported the deletion already (a storage fault)."""
        path = Path(self.cfg.records)
        try:
            self.out.flush()
            mine = os.fstat(self.out.fileno())
            there = os.stat(path) if path.exists() else None
            if there is not None and (there.st_dev, there.st_ino) == (mine.st_dev, mine.st_ino):
                return False
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(f"/proc/self/fd/{self.out.fileno()}", "rb") as src:
                replace_atomic(path, lambda p: p.write_bytes(src.read()))
        except OSError as exc:
            print(f"[source] its records file {path} was deleted during the run and cannot be written back: {exc}",
                  file=sys.stderr, flush=True)
            return False
        print(f"[source] its records file {path} was deleted during the run; written back from the open file "
              f"({self.written} rows)", file=sys.stderr, flush=True)
        return True

    def _close(self) -> None:
        """Write what a failed write kept, write the records file back if it was deleted during the
        run, close it, then write the tally (:class:`testbed.plan.boundaries.SourceTally`)."""
        restored = False
        try:
            self._drain()
            restored = self._restore_if_deleted()
            self.out.close()
        except OSError as exc:
            print(f"[source] {len(self.unwritten)} record(s) could not be written: {exc}", file=sys.stderr)
        tally = SourceTally(source=self.name, created=self.seq, written=self.written,
                            unwritten=len(self.unwritten), failed=self.failed_queries, restored=restored)
        try:
            tally_path(self.cfg.records).parent.mkdir(parents=True, exist_ok=True)
            write_json_atomic(tally_path(self.cfg.records), tally)
        except OSError as exc:
            print(f"[source] cannot write its tally ({tally.model_dump_json()}): {exc}", file=sys.stderr)

    def _stop(self) -> None:
        self.stopping = True

    def _query_done(self, task: asyncio.Task) -> None:
        """A query's task ended: a bug in it (an exception) is counted and told, never dropped."""
        self.pending.discard(task)
        if task.cancelled() or task.exception() is None:
            return
        exc = task.exception()
        if isinstance(exc, PolicyFailure):  # the plug-in's bug, not the source's: told, and the source stops
            if self.policy_failure is None:
                import traceback

                self.policy_failure = exc
                self.stopping = True
                print("[source] the policy failed while dispatching; the source stops (exit 4):\n"
                      + "".join(traceback.format_exception(exc)), file=sys.stderr, flush=True)
            return
        self.failed_queries += 1
        if self.failed_queries == 1:
            import traceback

            print("[source] a query failed inside the source (its record may be missing):\n"
                  + "".join(traceback.format_exception(exc)), file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    """Entry point: ``python -m testbed.emu.source CONFIG.json``. Exit code 0; 2 with the reason
    on stderr when the config or the zoo is unusable (a policy plug-in that does not resolve
    too); 3 when a query's task raised (its record may be missing: the run fails rather than
    report a biased success ratio); 4 when a policy plug-in raised while dispatching
    (:class:`testbed.model.policies.PolicyFailure`, its traceback on stderr), or its selector of
    one's own (``aset.selector``) raised or returned no policy (the traceback on stderr): the source
    stops at once, and the run's health watch stops the run (exit 4)."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m testbed.emu.source CONFIG.json", file=sys.stderr)
        return 2
    try:
        source = Source(read_config(argv[0], SourceConfig))
    except Exception as exc:  # noqa: BLE001 - any reason not to start is reported, with exit code 2
        print(f"[source] cannot start: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    asyncio.run(source.run())
    if source.policy_failure is not None:
        print(f"[source] stopped: {str(source.policy_failure).splitlines()[0]}", file=sys.stderr)
        return EXIT_COMPONENT_DIED
    if source.selector_failed is not None:
        return EXIT_COMPONENT_DIED
    if source.failed_queries:
        print(f"[source] {source.failed_queries} query task(s) failed inside the source (first traceback above); "
              "the run's records are incomplete", file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
