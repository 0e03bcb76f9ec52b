"""A query source: Poisson workload generator + dispatcher, run inside a source host's namespace.

``python -m testbed.workload CONFIG.json`` (written by :mod:`testbed.run`). For each application
it draws Poisson arrivals (exponential inter-arrival times, rate ``rate_qps`` queries/s, seeded),
applies the configured policy per query (:mod:`testbed.policies`), and sends the real image as
a TensorFlow Serving REST request (``POST /v1/models/NAME:predict``) to the chosen cluster. One
CSV row per query is appended to the records file as soon as the query resolves (see
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
from testbed.policies import POLICIES, Option

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
        self.policy = POLICIES[cfg["policy"]]
        self.options = [Option(o["cluster"], o["model"], o["rtt_ms"], o["service_ms"], o["accuracy"])
                        for o in cfg["options"]]
        self.ip = {o["cluster"]: o["ip"] for o in cfg["options"]}
        # JSON bodies made once per application: building them per query would cost the source.
        self.bodies = {a["name"]: request_bodies(cfg["zoo_dir"], a["family"]) for a in cfg["applications"]}
        self.rng = np.random.default_rng([cfg["seed"], cfg["source_index"]])
        self.out = open(cfg["records"], "w", newline="")  # noqa: SIM115 - closed in run()
        self.writer = csv.DictWriter(self.out, fieldnames=RECORD_FIELDS)
        self.writer.writeheader()
        self.seq = 0
        self.pending: set[asyncio.Task] = set()
        self.stopping = False

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
        d = self.policy(self.options, app["deadline_ms"], app["min_accuracy"])
        opt = next(o for o in self.options if o.cluster == d.cluster and o.model == d.model)
        url = f"http://{self.ip[d.cluster]}:{self.cfg['server_port']}/v1/models/{d.model}:predict"
        row = {"query_id": qid, "source": self.name, "application": app["name"], "cluster": d.cluster,
               "model": d.model, "policy": self.cfg["policy"], "fallback": int(d.fallback),
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
        self._write(row)

    async def _arrivals(self, session, app: dict, end: float) -> None:
        loop = asyncio.get_running_loop()
        t = loop.time()
        while not self.stopping:
            t += float(self.rng.exponential(1.0 / app["rate_qps"]))
            if t >= end:
                return
            await asyncio.sleep(max(0.0, t - loop.time()))
            task = asyncio.create_task(self._query(session, app))
            self.pending.add(task)
            task.add_done_callback(self.pending.discard)

    async def run(self) -> None:
        import aiohttp

        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stop)
        start = self.cfg["start_ns"] / 1e9
        await asyncio.sleep(max(0.0, start - time.time()))
        end = loop.time() + self.cfg["duration_s"]
        conn = aiohttp.TCPConnector(limit=0, force_close=False)
        try:
            async with aiohttp.ClientSession(connector=conn) as session:
                await asyncio.gather(*(self._arrivals(session, a, end) for a in self.cfg["applications"]))
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
