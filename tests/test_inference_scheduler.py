"""The server's queue rules with exact counts: bounded queue, FIFO / EDF order, admission, batching.

Pure logic: the model is a fake whose ``predict`` blocks until the test releases it, so which
queries are waiting, in service or refused is decided by the test, not by timing.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from testbed.serve.scheduler import ADMISSION, QUEUE_FULL, Job, Scheduler


class GateModel:
    """Fake model: ``predict`` records its batch and blocks until ``gate`` is set; returns one-hot of x[:, 0]."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.calls: list[list[int]] = []
        self.entered = threading.Semaphore(0)

    def predict(self, x: np.ndarray) -> np.ndarray:
        self.calls.append([int(v) for v in x[:, 0]])
        self.entered.release()
        self.gate.wait(10)
        out = np.zeros((len(x), 4), np.float32)
        out[np.arange(len(x)), x[:, 0].astype(int) % 4] = 1.0
        return out


def job(tag: int, model: str = "m", deadline_ns: int | None = None, done=None) -> Job:
    return Job(model=model, x=np.full((1, 3), tag, np.float32), deadline_ns=deadline_ns, done=done)


def start(model: GateModel, **kw) -> Scheduler:
    s = Scheduler({"m": model, "n": model}, **kw)
    s.start()
    return s


def occupy_worker(s: Scheduler, model: GateModel) -> None:
    """Submit query 0 and wait until the (only) worker is inside predict with it."""
    assert s.submit(job(0)) is None
    assert model.entered.acquire(timeout=5)


def test_bounded_queue_refuses_exactly_the_excess():
    model = GateModel()
    s = start(model, workers=1, queue_limit=2)
    occupy_worker(s, model)
    results = [s.submit(job(i)) for i in range(1, 6)]
    assert results[:2] == [None, None]
    assert [r[0] for r in results[2:]] == [QUEUE_FULL] * 3
    assert "limit 2" in results[2][1]
    model.gate.set()
    s.stop()
    snap = s.snapshot()
    assert (snap["served"], snap["dropped"], snap["dropped_queue_full"], snap["dropped_admission"]) == (3, 3, 3, 0)
    assert model.calls == [[0], [1], [2]]


@pytest.mark.parametrize("discipline,order", [("fifo", [0, 1, 2, 3, 4]), ("edf", [0, 3, 1, 4, 2])])
def test_discipline_order(discipline, order):
    model = GateModel()
    s = start(model, workers=1, queue_limit=10, discipline=discipline)
    occupy_worker(s, model)
    now = time.time_ns()
    for tag, d in ((1, 30), (2, None), (3, 10), (4, 30)):  # deadlines in s from now; None = no deadline
        assert s.submit(job(tag, deadline_ns=None if d is None else now + d * 10**9)) is None
    model.gate.set()
    s.stop()
    assert [c[0] for c in model.calls] == order


def test_admission_counts_queries_ahead():
    """1 worker, 100 ms mean service: expected completion = now + (ahead + 1) x 100 ms."""
    model = GateModel()
    s = start(model, workers=1, queue_limit=10, admission=True, service_ms={"m": 100.0, "n": 100.0})
    occupy_worker(s, model)  # busy worker: ahead >= 1
    now = time.time_ns()
    ms = 10**6
    got = [s.submit(job(1, deadline_ns=now + 150 * ms)),  # 1 ahead -> 200 ms > 150: refused
           s.submit(job(2, deadline_ns=now + 260 * ms)),  # 1 ahead -> 200 ms: admitted
           s.submit(job(3, deadline_ns=now + 260 * ms)),  # 2 ahead -> 300 ms > 260: refused
           s.submit(job(4)),                              # no deadline: never refused by admission
           s.submit(job(5, deadline_ns=now + 10**10))]    # 3 ahead -> 400 ms < 10 s: admitted
    assert [g[0] if g else None for g in got] == [ADMISSION, None, ADMISSION, None, None]
    assert "after the deadline" in got[0][1]
    model.gate.set()
    s.stop()
    snap = s.snapshot()
    assert (snap["served"], snap["dropped_admission"], snap["dropped_queue_full"]) == (4, 2, 0)


def test_admission_under_edf_counts_only_earlier_deadlines():
    model = GateModel()
    s = start(model, workers=1, queue_limit=10, discipline="edf", admission=True,
              service_ms={"m": 100.0, "n": 100.0})
    occupy_worker(s, model)
    now, ms = time.time_ns(), 10**6
    assert s.submit(job(1, deadline_ns=now + 10**10)) is None   # late deadline, waiting
    assert s.submit(job(2, deadline_ns=now + 260 * ms)) is None  # ahead = busy only (job 1 is later)
    got = s.submit(job(3, deadline_ns=now + 270 * ms))           # ahead = busy + job 2 -> 300 ms
    assert got is not None and got[0] == ADMISSION
    model.gate.set()
    s.stop()
    assert [c[0] for c in model.calls] == [0, 2, 1]


def test_batching_groups_same_model_up_to_max_batch():
    model = GateModel()
    done: list[Job] = []
    s = start(model, workers=1, queue_limit=20, max_batch=3, max_queue_delay_ms=0)
    occupy_worker(s, model)
    for tag, m in ((1, "m"), (2, "n"), (3, "m"), (4, "m"), (5, "m"), (6, "n")):
        assert s.submit(job(tag, model=m, done=done.append)) is None
    model.gate.set()
    s.stop()
    # head 1 (m) + the next m's up to 3 inputs; then head 2 (n) with 6; then the remaining m (5).
    assert model.calls == [[0], [1, 3, 4], [2, 6], [5]]
    by_tag = {int(j.x[0, 0]): j for j in done}
    assert [by_tag[t].batch for t in (1, 2, 3, 4, 5, 6)] == [3, 2, 3, 3, 1, 2]
    assert all(by_tag[t].result.argmax() == t % 4 for t in by_tag)  # each query gets its own row back
    assert s.snapshot()["batches"] == 4


def test_batching_waits_for_the_batch_to_fill_until_the_delay():
    model = GateModel()
    model.gate.set()
    s = start(model, workers=1, queue_limit=20, max_batch=4, max_queue_delay_ms=400)
    assert s.submit(job(1)) is None
    time.sleep(0.05)  # the worker holds query 1 and waits up to 400 ms for more
    assert s.submit(job(2)) is None
    assert s.submit(job(3)) is None
    s.stop()
    assert model.calls == [[1, 2, 3]]


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="discipline"):
        Scheduler({"m": GateModel()}, discipline="lifo")
    with pytest.raises(ValueError, match="admission needs a mean service time"):
        Scheduler({"m": GateModel()}, admission=True)


def test_http_503_carries_the_reason_and_stats_count_it():
    """Through the real aiohttp handlers (in-process server, fake model): queue_full and admission."""
    import asyncio

    from aiohttp.test_utils import TestClient, TestServer

    from testbed.serve.server import InferenceServer

    model = GateModel()
    model.input_shape, model.classes, model.runtime, model.info = (3,), 4, "fake", {"family": "f"}
    srv = InferenceServer({"m": model}, workers=1, queue_limit=1, admission=True, service_ms={"m": 100.0})
    srv.start_workers()

    async def scenario() -> list[tuple[int, dict]]:
        async with TestClient(TestServer(srv.make_app())) as client:
            def post(tag: int, deadline_ms: float | None = None):
                headers = {} if deadline_ms is None else {
                    "X-Testbed-Deadline-Ns": str(time.time_ns() + int(deadline_ms * 1e6))}
                return client.post("/v1/models/m:predict", json={"instances": [[tag, 0, 0]]}, headers=headers)

            first = asyncio.ensure_future(post(0))
            while not model.entered.acquire(timeout=0.01):
                await asyncio.sleep(0.01)
            out = []
            for tag, dl in ((1, 50.0), (2, 10_000.0), (3, None)):  # admission; admitted (waits); queue full
                if tag == 2:
                    second = asyncio.ensure_future(post(tag, dl))
                    while srv.scheduler.queue_len() == 0:
                        await asyncio.sleep(0.01)
                    continue
                resp = await post(tag, dl)
                out.append((resp.status, await resp.json()))
            model.gate.set()
            for fut in (first, second):
                resp = await fut
                out.append((resp.status, await resp.json()))
            stats = await (await client.get("/v1/stats")).json()
            out.append((0, stats))
            return out

    (s1, b1), (s3, b3), (s0, b0), (s2, b2), (_, stats) = asyncio.run(scenario())
    srv.stop_workers()
    assert (s1, b1["reason"]) == (503, "admission") and "after the deadline" in b1["error"]
    assert (s3, b3["reason"]) == (503, "queue_full")
    assert s0 == s2 == 200 and np.argmax(b0["predictions"][0]) == 0 and np.argmax(b2["predictions"][0]) == 2
    assert (stats["served"], stats["dropped"], stats["dropped_admission"], stats["dropped_queue_full"]) == (2, 2, 1, 1)


def test_the_server_command_has_a_help_and_a_usage_error(capsys):
    """Docs/models-and-servers.md gives `python -m testbed.serve.server --help`; it read
    '--help' as the config file's path."""
    from testbed.serve.server import main

    assert main(["--help"]) == 0
    assert "CONFIG.json" in capsys.readouterr().out
    assert main([]) == 2 and "the following arguments are required: CONFIG.json" in capsys.readouterr().err
