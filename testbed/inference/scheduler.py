"""The inference server's queue: bounded, FIFO or EDF, admission control, dynamic batching, W workers.

Pure logic plus threads (no HTTP): :class:`Scheduler` holds the waiting queries, decides at arrival
whether a query is admitted, and hands batches to worker threads, which call the model. The
semantics are those of :class:`testbed.inference.spec.ServerSpec` (the simulator models the same):

* Bounded queue: at most ``queue_limit`` queries wait (queries in service or being batched by a
  worker do not count); one more is refused with reason ``queue_full``.
* Discipline: ``fifo`` serves in arrival order; ``edf`` serves the earliest absolute deadline first
  (ties and queries without a deadline: arrival order; no deadline counts as +infinity).
* Admission (``admission=True``, only for queries that carry a deadline): at arrival, ``ahead`` =
  the waiting queries that would be served before it (all of them under FIFO; under EDF those with
  a deadline <= its own) + the busy workers; its expected completion is
  ``now + (ahead / workers + 1) x mean service time`` of its model (batch 1, from the profile at the
  server's CPU share and runtime); if that is later than its deadline it is refused with reason
  ``admission``. Admitted queries are never dropped later, even if EDF lets later arrivals overtake.
* Batching (``max_batch`` > 1): a free worker takes the first query in discipline order, then
  every waiting query for the same model in discipline order while the batch holds at most
  ``max_batch`` inputs; if it is not full, it waits for more until ``max_queue_delay_ms`` after the
  first query's arrival at the queue, then runs the whole batch as one model call. All queries of a
  batch share the inference start and end times. ``max_batch`` 1: one query per call, no waiting.
"""

from __future__ import annotations

import heapq
import itertools
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

#: Reasons a query is refused at arrival (the 503 body's ``reason``).
QUEUE_FULL = "queue_full"
ADMISSION = "admission"


@dataclass
class Job:
    """One query: ``x`` float32 [n, *input_shape]; ``deadline_ns`` absolute (epoch ns) or None.

    The worker fills ``t2``/``t3`` (epoch ns: inference start / end), ``batch`` (inputs in the model
    call that served it) and ``result`` [n, classes] or ``error``, then calls ``done(job)``.
    """

    model: str
    x: np.ndarray
    deadline_ns: int | None = None
    done: Callable[[Job], None] | None = None
    t1: int = 0
    enqueued: float = 0.0
    t2: int = 0
    t3: int = 0
    batch: int = 0
    result: np.ndarray | None = None
    error: str | None = None
    seq: int = 0

    @property
    def size(self) -> int:
        """Inputs in this query."""
        return int(self.x.shape[0])


@dataclass
class Counters:
    """Totals since start (read under the scheduler's lock)."""

    served: int = 0
    dropped_queue_full: int = 0
    dropped_admission: int = 0
    errors: int = 0
    batches: int = 0
    busy_workers: int = 0
    busy_s: float = 0.0
    per_model: dict[str, dict[str, float]] = field(default_factory=dict)


class Scheduler:
    """Waiting queries and the worker threads that serve them (see the module doc for the rules)."""

    def __init__(self, models: dict[str, Any], workers: int = 1, queue_limit: int = 64, discipline: str = "fifo",
                 admission: bool = False, max_batch: int = 1, max_queue_delay_ms: float = 0.0,
                 service_ms: dict[str, float] | None = None):
        """``models``: name -> object with ``predict(x) -> probabilities``; ``service_ms``: name -> mean
        batch-1 service time [ms] (needed for every model when ``admission``).

        Raises:
            ValueError: a bad setting (names it).
        """
        if workers < 1 or queue_limit < 1 or max_batch < 1 or max_queue_delay_ms < 0:
            raise ValueError(f"workers, queue_limit, max_batch must be >= 1 and max_queue_delay_ms >= 0 "
                             f"(got {workers}, {queue_limit}, {max_batch}, {max_queue_delay_ms})")
        if discipline not in ("fifo", "edf"):
            raise ValueError(f"discipline must be 'fifo' or 'edf', got {discipline!r}")
        self.service_ms = dict(service_ms or {})
        if admission:
            missing = [m for m in models if not self.service_ms.get(m, 0) > 0]
            if missing:
                raise ValueError(f"admission needs a mean service time for models {missing}")
        self.models = models
        self.workers = workers
        self.queue_limit = queue_limit
        self.discipline = discipline
        self.admission = admission
        self.max_batch = max_batch
        self.max_queue_delay_s = max_queue_delay_ms / 1e3
        self.counters = Counters(per_model={m: {"served": 0, "busy_s": 0.0} for m in models})
        self.cond = threading.Condition()
        self._heap: list[tuple[tuple[float, int], Job]] = []
        self._seq = itertools.count()
        self._stopping = False
        self._threads: list[threading.Thread] = []
        self.started = time.monotonic()

    # -- queue ---------------------------------------------------------------------------
    def _key(self, job: Job) -> tuple[float, int]:
        if self.discipline == "edf":
            return (float(job.deadline_ns) if job.deadline_ns is not None else math.inf, job.seq)
        return (0.0, job.seq)

    def queue_len(self) -> int:
        """Queries waiting now (not in service, not held by a worker forming a batch)."""
        with self.cond:
            return len(self._heap)

    def submit(self, job: Job) -> tuple[str, str] | None:
        """Queue ``job`` (sets ``seq``, ``t1`` if unset, ``enqueued``); None if admitted, else (reason, message)."""
        with self.cond:
            job.seq = next(self._seq)
            job.t1 = job.t1 or time.time_ns()
            if len(self._heap) >= self.queue_limit:
                self.counters.dropped_queue_full += 1
                return QUEUE_FULL, f"queue full ({len(self._heap)} waiting, limit {self.queue_limit})"
            key = self._key(job)
            if self.admission and job.deadline_ns is not None:
                ahead = sum(1 for k, _ in self._heap if k < key) + self.counters.busy_workers
                expected_ns = time.time_ns() + (ahead / self.workers + 1) * self.service_ms[job.model] * 1e6
                if expected_ns > job.deadline_ns:
                    self.counters.dropped_admission += 1
                    return ADMISSION, (f"admission: expected completion {(expected_ns - job.deadline_ns) / 1e6:.2f} ms "
                                       f"after the deadline ({ahead} queries ahead, {self.workers} workers, "
                                       f"{self.service_ms[job.model]:.3f} ms each)")
            job.enqueued = time.monotonic()
            heapq.heappush(self._heap, (key, job))
            self.cond.notify()
            return None

    def _take_matching(self, model: str, room: int) -> list[Job]:
        """Pop waiting jobs for ``model`` in discipline order while they fit in ``room`` inputs."""
        taken, kept = [], []
        while self._heap and room > 0:
            item = heapq.heappop(self._heap)
            if item[1].model == model and item[1].size <= room:
                taken.append(item[1])
                room -= item[1].size
            else:
                kept.append(item)
        for item in kept:
            heapq.heappush(self._heap, item)
        return taken

    def next_batch(self) -> list[Job] | None:
        """Block until a batch is ready for a worker (see the module doc); None when stopping."""
        with self.cond:
            while not self._heap:
                if self._stopping:
                    return None
                self.cond.wait()
            head = heapq.heappop(self._heap)[1]
            batch = [head]
            if self.max_batch > 1:
                room = self.max_batch - head.size
                batch += self._take_matching(head.model, room)
                until = head.enqueued + self.max_queue_delay_s
                while sum(j.size for j in batch) < self.max_batch and not self._stopping:
                    left = until - time.monotonic()
                    if left <= 0:
                        break
                    self.cond.wait(left)
                    batch += self._take_matching(head.model, self.max_batch - sum(j.size for j in batch))
            self.counters.busy_workers += 1
            return batch

    # -- workers -------------------------------------------------------------------------
    def run_batch(self, batch: list[Job]) -> None:
        """Serve ``batch`` with one model call, fill each job, call its ``done``."""
        model = batch[0].model
        x = batch[0].x if len(batch) == 1 else np.concatenate([j.x for j in batch])
        t2 = time.time_ns()
        result, error = None, None
        try:
            result = self.models[model].predict(x)
        except Exception as exc:  # noqa: BLE001 - reported to the client as a 500
            error = f"{type(exc).__name__}: {exc}"
        t3 = time.time_ns()
        busy = (t3 - t2) / 1e9
        with self.cond:
            c = self.counters
            c.busy_workers -= 1
            c.busy_s += busy
            c.batches += 1
            c.per_model[model]["busy_s"] += busy
            if error is None:
                c.served += len(batch)
                c.per_model[model]["served"] += len(batch)
            else:
                c.errors += len(batch)
        i = 0
        for j in batch:
            j.t2, j.t3, j.batch, j.error = t2, t3, int(x.shape[0]), error
            if result is not None:
                j.result = result[i:i + j.size]
            i += j.size
            if j.done is not None:
                j.done(j)

    def _worker(self) -> None:
        while True:
            batch = self.next_batch()
            if batch is None:
                return
            self.run_batch(batch)

    def start(self) -> None:
        """Start the worker threads; counters' clock (uptime, utilization) starts here."""
        self.started = time.monotonic()
        for i in range(self.workers):
            t = threading.Thread(target=self._worker, name=f"inference-{i}", daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self, timeout_s: float = 5.0) -> None:
        """Serve what is queued, then stop the workers (waits at most ``timeout_s``)."""
        deadline = time.monotonic() + timeout_s
        with self.cond:
            self._stopping = True
            self.cond.notify_all()
        for t in self._threads:
            t.join(timeout=max(0.01, deadline - time.monotonic()))

    def snapshot(self) -> dict[str, Any]:
        """Stats: queue_len, busy_workers, served, dropped (+ by reason), errors, batches, mean batch,
        busy_s (sum of model-call time [s]), uptime_s, utilization = busy_s / (uptime_s x workers)."""
        with self.cond:
            c = self.counters
            uptime = max(time.monotonic() - self.started, 1e-9)
            return {"queue_len": len(self._heap), "busy_workers": c.busy_workers, "workers": self.workers,
                    "queue_limit": self.queue_limit, "discipline": self.discipline, "admission": self.admission,
                    "max_batch": self.max_batch, "served": c.served,
                    "dropped": c.dropped_queue_full + c.dropped_admission,
                    "dropped_queue_full": c.dropped_queue_full, "dropped_admission": c.dropped_admission,
                    "errors": c.errors, "batches": c.batches,
                    "mean_batch": round(c.served / c.batches, 3) if c.batches else 0.0,
                    "busy_s": round(c.busy_s, 6), "uptime_s": round(uptime, 3),
                    "utilization": round(c.busy_s / (uptime * self.workers), 6),
                    "per_model": {k: dict(v) for k, v in c.per_model.items()}}
