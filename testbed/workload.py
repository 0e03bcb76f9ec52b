"""A query source: workload generator + dispatcher, run inside a source host's namespace.

``python -m testbed.workload CONFIG.json`` (written by :mod:`testbed.run`). For each workload entry
it draws arrivals from the same :mod:`testbed.arrivals` process (and the same seeds) as the
simulator, window by window (the report interval), applies the policy in force per query
(:func:`testbed.policies.decide`, on the cluster state last heard), and sends the real image as a
TensorFlow Serving REST request (``POST /v1/models/NAME:predict``) to the chosen cluster.

Stale state, as in the simulator: every ``report_interval_s`` the source polls each cluster's
``GET /v1/stats`` over the emulated network (queue length, busy workers; a failed poll marks the
cluster down) and decides on that until the next poll. The policy may change at run time: with
``policy: aset`` the source asks ``testbed.aset.live.LivePolicySelector(cfg).choose(state)`` every
``aset.window_s`` which static policy to apply (see :meth:`Source._aset_state`). Each record
carries the policy in force (column ``policy``).

One CSV row per query is appended to the records file as soon as the query resolves (see
:data:`RECORD_FIELDS`). Timestamps are ``time.time_ns()``: all emulated hosts share one kernel
clock, so t0..t4 from different hosts are directly comparable.
"""

from __future__ import annotations

import asyncio
import csv
import json
import signal
import sys
import time
from pathlib import Path

import numpy as np

from testbed.inference.zoo import request_bodies
from testbed.policies import CATALOGUE, Context, Option, decide, expected_wait_ms

#: Columns of the per-query records (units in the names; times are ns since the Unix epoch).
RECORD_FIELDS = [
    "query_id", "source", "application", "cluster", "model", "policy", "fallback",
    "deadline_ms", "min_accuracy", "model_accuracy", "expected_rtt_ms",
    "t0_ns", "t1_ns", "t2_ns", "t3_ns", "t4_ns",
    "e2e_ms", "network_ms", "queueing_ms", "inference_ms",
    "request_bytes", "response_bytes", "http_status", "queue_len_at_arrival",
    "label", "predicted", "outcome", "failure_cause", "error",
]


def classify(status: int | None, e2e_ms: float | None, deadline_ms: float, accuracy: float,
             min_accuracy: float) -> tuple[str, str]:
    """Outcome and failure cause of one query.

    system-model.md: a query succeeds iff e2e <= D_a, alpha_m >= A_a and it was not dropped.
    ``status`` is the HTTP status, 0 for a connection error, None for no answer within the deadline
    plus the grace period. Causes, by precedence: ``deadline_miss`` (no answer), ``dropped``
    (HTTP 503: queue full / admission), ``error`` (other status or connection error), ``accuracy``,
    ``deadline_miss`` (answered late).
    """
    if status is None or e2e_ms is None and status == 200:
        return "failure", "deadline_miss"
    if status == 503:
        return "failure", "dropped"
    if status != 200:
        return "failure", "error"
    if accuracy < min_accuracy:
        return "failure", "accuracy"
    if e2e_ms is not None and e2e_ms > deadline_ms:
        return "failure", "deadline_miss"
    return "success", ""


class Source:
    """Generates, dispatches and records the queries of one source host."""

    def __init__(self, cfg: dict):
        self.cfg = cfg
        self.name: str = cfg["source"]
        self.aset = None
        policy = cfg["policy"]
        if policy == "aset":
            from testbed.aset.live import LivePolicySelector  # only when asked: it may import torch

            self.aset = LivePolicySelector(cfg)
            policy = cfg.get("aset", {}).get("initial_policy", "closest")
        if policy not in CATALOGUE:
            raise ValueError(f"source {self.name}: unknown policy {policy!r}; known: {', '.join(CATALOGUE)}, aset")
        self.policy_name: str = policy
        self.ctx = Context(rng=np.random.default_rng([cfg["seed"], 3, cfg["source_index"]]))
        self.base = cfg["options"]
        self.ip = {o["cluster"]: o["ip"] for o in cfg["options"]}
        self.apps = {a["name"]: a for a in cfg["applications"]}
        self.heard = {o["cluster"]: {"queue_len": 0, "busy": 0, "workers": o.get("workers", 1), "utilization": 0.0,
                                     "up": True} for o in cfg["options"]}
        self._busy_s: dict[str, tuple[float, float]] = {}
        self.options = self._options()
        # JSON bodies made once per application: building them per query would cost the source.
        self.bodies = {a["name"]: request_bodies(cfg["zoo_dir"], a["family"]) for a in cfg["applications"]}
        self.rng = np.random.default_rng([cfg["seed"], cfg["source_index"]])
        self.out = open(cfg["records"], "w", newline="")  # noqa: SIM115 - closed in run()
        self.writer = csv.DictWriter(self.out, fieldnames=RECORD_FIELDS)
        self.writer.writeheader()
        self.seq = 0
        self.pending: set[asyncio.Task] = set()
        self.stopping = False
        self.win_arrivals: dict[str, int] = {}
        self.win_resolved: list[tuple[str, bool, float]] = []

    def _options(self) -> list[Option]:
        out = []
        for o in self.base:
            st = self.heard[o["cluster"]]
            w = max(1, int(st.get("workers") or 1))
            mean = o.get("mean_service_ms", o["service_ms"])
            wait = expected_wait_ms(st["queue_len"], st["busy"], w, mean)
            out.append(Option(o["cluster"], o["model"], o["rtt_ms"], o["service_ms"], o["accuracy"], wait,
                              (st["queue_len"] + st["busy"]) / w, o.get("tier", ""), st["up"]))
        return out

    def _write(self, row: dict) -> None:
        self.writer.writerow(row)
        self.out.flush()

    async def _query(self, session, app: dict) -> None:
        import aiohttp

        self.seq += 1
        qid = f"{self.name}-{self.seq}"
        bodies, labels = self.bodies[app["name"]]
        k = int(self.rng.integers(len(bodies)))
        body, label = bodies[k], labels[k]
        t0 = time.time_ns()
        policy = self.policy_name
        d = decide(policy, self.options, app["deadline_ms"], app["min_accuracy"], self.ctx)
        opt = next(o for o in self.options if o.cluster == d.cluster and o.model == d.model)
        self.win_arrivals[app["name"]] = self.win_arrivals.get(app["name"], 0) + 1
        url = f"http://{self.ip[d.cluster]}:{self.cfg['server_port']}/v1/models/{d.model}:predict"
        row = {"query_id": qid, "source": self.name, "application": app["name"], "cluster": d.cluster,
               "model": d.model, "policy": policy, "fallback": int(d.fallback),
               "deadline_ms": app["deadline_ms"], "min_accuracy": app["min_accuracy"],
               "model_accuracy": opt.accuracy, "expected_rtt_ms": round(opt.rtt_ms, 3), "t0_ns": t0,
               "request_bytes": len(body), "label": label}
        status = e2e = None
        timeout = aiohttp.ClientTimeout(total=(app["deadline_ms"] + self.cfg["grace_ms"]) / 1e3)
        try:
            async with session.post(url, data=body, timeout=timeout,
                                    headers={"Content-Type": "application/json", "X-Testbed-Query-Id": qid,
                                             "X-Testbed-Deadline-Ns": str(t0 + int(app["deadline_ms"] * 1e6))}) as resp:
                payload = await resp.read()
                t4 = time.time_ns()
                status = resp.status
                e2e = (t4 - t0) / 1e6
                row.update(t4_ns=t4, e2e_ms=round(e2e, 3), http_status=status, response_bytes=len(payload))
                h = resp.headers
                if status == 200 and "X-Testbed-T1" in h:
                    t1, t2, t3 = int(h["X-Testbed-T1"]), int(h["X-Testbed-T2"]), int(h["X-Testbed-T3"])
                    row.update(t1_ns=t1, t2_ns=t2, t3_ns=t3,
                               network_ms=round(((t1 - t0) + (t4 - t3)) / 1e6, 3),
                               queueing_ms=round((t2 - t1) / 1e6, 3), inference_ms=round((t3 - t2) / 1e6, 3),
                               queue_len_at_arrival=h.get("X-Testbed-Queue-Len", ""))
                    preds = json.loads(payload)["predictions"][0]
                    row["predicted"] = int(np.argmax(preds))
        except TimeoutError:
            pass  # no answer within deadline + grace: a deadline miss
        except (aiohttp.ClientError, OSError, ValueError, KeyError) as exc:
            status = status or 0
            row["error"] = type(exc).__name__
        outcome, cause = classify(status, e2e, app["deadline_ms"], opt.accuracy, app["min_accuracy"])
        row.update(outcome=outcome, failure_cause=cause)
        self.win_resolved.append((app["name"], outcome == "success", (t0 - self.cfg["start_ns"]) / 1e9))
        self._write(row)

    async def _poll_stats(self, session, end: float) -> None:
        """Every report interval: ``GET /v1/stats`` of each cluster; the options follow what was heard."""
        import aiohttp

        loop = asyncio.get_running_loop()
        interval = self.cfg.get("report_interval_s", 0.5)
        timeout = aiohttp.ClientTimeout(total=interval)

        async def one(cluster: str) -> None:
            url = f"http://{self.ip[cluster]}:{self.cfg['server_port']}/v1/stats"
            try:
                async with session.get(url, timeout=timeout) as resp:
                    st = await resp.json()
                workers = int(st.get("workers") or self.heard[cluster]["workers"])
                busy_s, now = float(st.get("busy_s") or 0.0), time.monotonic()
                prev = self._busy_s.get(cluster)
                self._busy_s[cluster] = (busy_s, now)
                util = st.get("utilization") or 0.0
                if prev and now > prev[1]:
                    util = (busy_s - prev[0]) / ((now - prev[1]) * workers)
                self.heard[cluster] = {"queue_len": int(st.get("queue_len") or 0),
                                       "busy": int(st.get("busy_workers", st.get("busy", 0)) or 0),
                                       "workers": workers, "utilization": max(0.0, min(1.0, float(util))), "up": True}
            except (aiohttp.ClientError, OSError, ValueError, TimeoutError):
                self.heard[cluster] = dict(self.heard[cluster], up=False)

        while not self.stopping and loop.time() < end:
            await asyncio.gather(*(one(c) for c in self.ip))
            self.options = self._options()
            await asyncio.sleep(interval)

    def _path_util(self) -> dict[str, float]:
        """Max link utilization on the path to each cluster, from the run's ``link_util.json``
        (written by testbed.run from the controller's port stats); 0 when unknown."""
        path = self.cfg.get("link_util_file")
        links: dict = {}
        if path:
            try:
                links = json.loads(Path(path).read_text()).get("links", {})
            except (OSError, ValueError):
                links = {}
        out = {}
        for c, pl in self.cfg.get("path_links", {}).items():
            out[c] = max((float(links.get(f"{a}-{b}", links.get(f"{b}-{a}", 0.0))) for a, b in pl), default=0.0)
        return out

    def _aset_state(self) -> dict:
        """The window's raw view handed to ``LivePolicySelector.choose``: ``arrivals`` {app: count},
        ``clusters`` (stats as last heard), ``path_util`` {cluster: 0..1}, ``resolved``
        [(app, success, t0_s)] (t0_s: creation time, s since the load started), ``policy`` (current)."""
        return {"arrivals": dict(self.win_arrivals), "clusters": {k: dict(v) for k, v in self.heard.items()},
                "path_util": self._path_util(), "resolved": list(self.win_resolved), "policy": self.policy_name}

    async def _aset_loop(self, end: float) -> None:
        loop = asyncio.get_running_loop()
        window = self.cfg.get("aset", {}).get("window_s", 0.1)
        while not self.stopping and loop.time() < end:
            await asyncio.sleep(window)
            state = self._aset_state()
            self.win_arrivals, self.win_resolved = {}, []
            choice = self.aset.choose(state)
            if choice in CATALOGUE:
                self.policy_name = choice

    async def _arrivals(self, session, stream: dict, t_start: float, end: float) -> None:
        """Queries of one workload entry, times from :mod:`testbed.arrivals` (same seeds as the simulator)."""
        from testbed.arrivals import make_process
        from testbed.config import WorkloadSpec

        loop = asyncio.get_running_loop()
        spec = WorkloadSpec.model_validate(stream["spec"])
        rng = np.random.default_rng([self.cfg["seed"], 1, stream["index"], self.cfg["source_index"]])
        proc = make_process(spec, rng, stream["weight"], Path(stream["base_dir"]))
        app = self.apps[spec.application]
        window = self.cfg.get("report_interval_s", 0.5)
        a = 0.0
        duration = end - t_start
        while not self.stopping and a < duration:
            for t in proc.times(a, a + window).tolist():
                if t >= duration or self.stopping:
                    return
                await asyncio.sleep(max(0.0, t_start + t - loop.time()))
                task = asyncio.create_task(self._query(session, app))
                self.pending.add(task)
                task.add_done_callback(self.pending.discard)
            a += window

    async def run(self) -> None:
        import aiohttp

        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stop)
        start = self.cfg["start_ns"] / 1e9
        await asyncio.sleep(max(0.0, start - time.time()))
        t_start = loop.time()
        end = t_start + self.cfg["duration_s"]
        conn = aiohttp.TCPConnector(limit=0, force_close=False)
        try:
            async with aiohttp.ClientSession(connector=conn) as session:
                side = [asyncio.create_task(self._poll_stats(session, end))]
                if self.aset is not None:
                    side.append(asyncio.create_task(self._aset_loop(end)))
                await asyncio.gather(*(self._arrivals(session, st, t_start, end) for st in self.cfg["streams"]))
                for t in side:
                    t.cancel()
                if self.pending:
                    await asyncio.wait(set(self.pending))
        finally:
            self.out.close()

    def _stop(self) -> None:
        self.stopping = True


def main(argv: list[str] | None = None) -> int:
    """Entry point: ``python -m testbed.workload CONFIG.json``."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m testbed.workload CONFIG.json", file=sys.stderr)
        return 2
    cfg = json.loads(Path(argv[0]).read_text())
    asyncio.run(Source(cfg).run())
    return 0


if __name__ == "__main__":
    sys.exit(main())
