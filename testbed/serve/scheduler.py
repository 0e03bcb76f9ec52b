"""The inference server's queue on the wall clock: the model's :class:`ServerQueue` plus W threads.

Every queue rule (bound, FIFO/EDF order, admission, batching) is
:class:`testbed.model.queue.ServerQueue`'s, the same code the simulator runs on its virtual clock;
this module only adds the wall clock (``time.time()``, s since the epoch: the clock the sources'
deadlines are on), a lock, and worker threads that call the model. A query the queue starts at
once is handed to an idle worker; a worker that finishes takes the next query the queue gives it,
or waits for the batching timer (:meth:`ServerQueue.due`); on stop it serves what is queued
without waiting for batches to fill.
"""

from __future__ import annotations

import math
import random
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from testbed.model import queue as mq
from testbed.model.cpu import call_is_cold
from testbed.model.queue import ADMISSION, QUEUE_FULL, ServerQueue

__all__ = ["ADMISSION", "QUEUE_FULL", "Counters", "Job", "Scheduler"]


@dataclass
class Job:
    """One query: ``x`` float32 [n, *input_shape]; ``deadline_ns`` absolute (epoch ns) or None.

    The worker fills ``t2``/``t3`` (epoch ns: inference start / end), ``batch`` (inputs in the model
    call that served it) and ``result`` (the model's output for these n inputs) or ``error``, then
    calls ``done(job)``.
    """

    model: str
    x: np.ndarray
    deadline_ns: int | None = None
    done: Callable[[Job], None] | None = None
    t1: int = 0
    t2: int = 0
    t3: int = 0
    batch: int = 0
    result: Any = None
    error: str | None = None

    @property
    def size(self) -> int:
        """Inputs in this query."""
        return int(self.x.shape[0])


@dataclass(frozen=True)
class PadOutcome:
    """One timed piece of work (:func:`pad_work`): its CPU time and its wall time before the pad
    (s), and whether it was ``late``: it waited for the CPU (the cluster's quota, or the host's
    other load) more than :data:`LATE_TOLERANCE` of its target time, so it ran that much slower
    than the speed asked before any pad."""

    cpu_s: float
    unpadded_s: float
    late: bool
    #: A paced call's expected CPU time (s): its speed check's bare call, x the profile's cold
    #: factor when cold (:meth:`CallPace.expected_cpu_s`); None: not paced.
    expected_cpu_s: float | None = None
    #: Whether a stall of the cluster's quota was charged to it (:func:`pad_work`).
    stalled: bool = False
    #: What its pad was lengthened by for stalls of the quota during it (s).
    stall_s: float = 0.0

    def count(self, into: dict[str, float]) -> None:
        """Add this outcome to a per-model counter dict (:func:`pad_counters`)."""
        into["timed"] += 1
        into["late"] += int(self.late)
        into["stalled"] += int(self.stalled)
        into["stall_s"] += self.stall_s
        into["cpu_s"] += self.cpu_s
        into["unpadded_s"] += self.unpadded_s
        if self.expected_cpu_s is not None:
            into["paced_cpu_s"] += self.cpu_s
            into["expected_cpu_s"] += self.expected_cpu_s


def pad_counters() -> dict[str, float]:
    """The per-model counters of the calls' speed (``/v1/stats`` ``per_model``): ``timed`` calls,
    ``late`` ones, ``stalled`` ones and what their pads added for stalls (``stall_s``) (:class:`PadOutcome`),
    their CPU and unpadded wall time (``cpu_s``, ``unpadded_s``), and of the paced calls the CPU
    time taken and expected (``paced_cpu_s``, ``expected_cpu_s``: the run's quota follows their
    ratio, :func:`testbed.plan.speeds.followed_quota_factor`)."""
    return {"timed": 0, "late": 0, "stalled": 0, "stall_s": 0.0, "cpu_s": 0.0, "unpadded_s": 0.0, "paced_cpu_s": 0.0,
            "expected_cpu_s": 0.0}


#: Work whose wall time with its pad exceeds its target time by more than this share is late
#: (:func:`pad_work`). Our choice: the speed tests' bound (a call within 10 % of its profile's
#: time); a late median call is beyond it before any pad.
LATE_TOLERANCE = 0.10


#: A paced call's pad is slept in steps of its target / this (at least :data:`PAD_STEP_LEAST_S`),
#: so that a stall of the cluster's quota during the pad is seen within a tenth of the call (our
#: choice: a wake-up costs the quota a few tens of us of CPU).
PAD_STEPS = 10
#: The shortest step (s) of a paced call's pad (our choice: about 20 wake-ups' latency).
PAD_STEP_LEAST_S = 0.001

#: A group's throttling counters (:class:`testbed.core.cgroups.ThrottleCounters`), None: unread.
Counters = tuple[int, float] | None
#: What reads them.
ThrottleState = Callable[[], Counters]


def pad_work(cpu_pad: float, cpu_s: float, elapsed_s: float, sleep: Callable[[float], None] = time.sleep,
             target_s: float | None = None, throttles: tuple[Counters, Counters] | None = None,
             state: ThrottleState | None = None, clock: Callable[[], float] = time.perf_counter) -> PadOutcome:
    """Pad a piece of work that took ``cpu_s`` of CPU and ``elapsed_s`` of wall time (s) with a
    sleep, the CPU made 1 + ``cpu_pad`` times slower (a time-dilated cluster below one core, or a
    host faster than the profile, :mod:`testbed.plan.speeds`), and time it.

    Without a target the sleep is ``cpu_pad`` x ``cpu_s``, added to the work's wall time, waits
    included: a wait for the cluster's CFS quota (throttling) is part of the emulated system's
    time, as the simulator charges it, and a wait for the host's other load cannot be told from
    it here; its target is ``(1 + cpu_pad) x cpu_s``. With a target ``target_s`` (a model call of
    one input: the profile's call, warm or cold, at this run's speed, :class:`CallPace`) padded
    work (``cpu_pad`` > 0) sleeps until its wall time reaches the target, ``max(0, target_s -
    elapsed_s)``, as the simulator charges the profile's call: CPU this host spent beyond its
    speed check's bare call (the other threads' CPU in a TensorFlow process's clock, a busy
    machine's caches, a call after idleness) and wall time beyond its CPU time (the runtime's
    thread hand-offs) are the host's, not the profile's, and are not scaled by k / s.

    Stalls of the cluster's quota are charged as the model charges them
    (:class:`testbed.model.cpu.CfsQuota`): a call of t runs at full speed while the quota lasts;
    when any of the cluster's work spends it, at x, the call waits until the period's end E, and
    ends at its unthrottled end + E - x. A padded call spends its CPU first and sleeps after, so:

    * ``throttles``, the group's counters (:class:`testbed.core.cgroups.ThrottleCounters`) before
      and after the call's CPU: a call that began while the quota was spent (only the wait's
      counter moved) waited from its start to E and sleeps its whole target after; one whose quota
      ran out while it ran (the periods' counter moved) waited from near its start, where the
      model has it run a share f of t first, unknown: f taken as uniform over what the stall
      allows, [0, min(1, elapsed / target)] (our assumption), it sleeps ``target_s -
      min(target_s, elapsed_s) / 2``;
    * ``state``, the same counters read through the pad, which is slept in steps of ``target_s``
      / :data:`PAD_STEPS`: a step that wakes late while the counters moved woke into a stall of
      the quota (the thread cannot run before E), and the pad is lengthened by that lateness (the
      stall from the step's end, at most a step after x, to E).

    Sleeping only to the target would drop every stall shorter than the pad (tens of ms of emulated
    time, most of the model's). Work whose padded wall time exceeds its target by more than
    :data:`LATE_TOLERANCE` is ``late``: it ran slower than the speed asked, because it waited for
    the CPU (a throttled quota, or a busy host) or because the host ran it slower than its target.
    With ``cpu_pad`` 0 nothing is slept; the work is timed all the same.
    """
    paced = cpu_pad > 0 and target_s is not None
    began, ran = _cpu_stall(throttles) if paced else (False, False)
    if cpu_pad <= 0:
        pad_s = 0.0
    elif target_s is None:
        pad_s = cpu_pad * cpu_s
    elif began:
        pad_s = target_s
    elif ran:
        pad_s = target_s - min(target_s, elapsed_s) / 2.0
    else:
        pad_s = max(0.0, target_s - elapsed_s)
    stall_s = 0.0
    if pad_s > 0 and paced and state is not None:
        stall_s = _sleep_through_stalls(pad_s, max(PAD_STEP_LEAST_S, target_s / PAD_STEPS), sleep, clock, state,
                                        throttles[1] if throttles else None)
    elif pad_s > 0:
        sleep(pad_s)
    target = (1.0 + cpu_pad) * cpu_s if target_s is None else target_s
    return PadOutcome(cpu_s, elapsed_s, elapsed_s + pad_s + stall_s > (1.0 + LATE_TOLERANCE) * target,
                      stalled=began or ran or stall_s > 0, stall_s=stall_s)


def _cpu_stall(throttles: tuple[Counters, Counters] | None) -> tuple[bool, bool]:
    """(the call began in a stall, the quota ran out while it ran), from the throttle counters
    before and after its CPU (:func:`pad_work`)."""
    before, after = throttles or (None, None)
    if before is None or after is None:
        return False, False
    return before[0] == after[0] and before[1] != after[1], before[0] != after[0]


def _sleep_through_stalls(pad_s: float, step_s: float, sleep: Callable[[float], None], clock: Callable[[], float],
                          state: ThrottleState, last: Counters) -> float:
    """Sleep ``pad_s`` in steps of ``step_s``; a step that wakes late while the throttle counters
    (``state()``, last read ``last``) moved lengthens the pad by its lateness. Returns what it
    added (s)."""
    added = 0.0
    deadline = clock() + pad_s
    while (now := clock()) < deadline:
        step = min(step_s, deadline - now)
        sleep(step)
        late = clock() - now - step
        seen = state()
        if late > 0 and seen is not None and last is not None and seen != last:
            deadline += late
            added += late
        last = seen
    return added


@dataclass(frozen=True)
class CallPace:
    """How a model's call of one input is paced and judged (:func:`pad_work`), from the server's
    speed check at start-up (:mod:`testbed.serve.speed`, :class:`testbed.plan.speeds.ClusterSpeed`):
    the time (ms) the call should take, warm (``target_ms``: the bare call x k / s) and cold
    (``cold_target_ms``: x the profile's cold factor too; :func:`testbed.model.cpu.call_is_cold`),
    ``slowdown`` k / s (:attr:`testbed.plan.speeds.ClusterSpeed.slowdown`), and the ``draws`` a
    call's target is multiplied by, one drawn at random per call (the simulator's samples of the
    call over the profile's median, :attr:`testbed.plan.speeds.SpeedTarget.draws`: so that the
    calls' times are distributed as the simulator's, mean and tail included; empty: 1)."""

    target_ms: float
    cold_target_ms: float
    slowdown: float = 1.0
    draws: tuple[float, ...] = ()

    def draw(self, rng: random.Random) -> float:
        """One call's draw (1.0 without draws)."""
        return rng.choice(self.draws) if self.draws else 1.0

    def target_s(self, cold: bool, draw: float = 1.0) -> float:
        """The target (s) of a call, cold or not, of draw ``draw``."""
        return (self.cold_target_ms if cold else self.target_ms) * draw / 1e3

    def expected_cpu_s(self, cold: bool, draw: float = 1.0) -> float:
        """The CPU time (s) the cluster's quota expects of a call, cold or not, of draw ``draw``:
        its target / (k / s), the speed check's bare call (x the profile's cold factor when cold)
        x the draw, as the simulator's quota is charged the drawn call."""
        return self.target_s(cold, draw) / self.slowdown


@dataclass
class Counters:
    """Totals since start (read under the scheduler's lock)."""

    served: int = 0
    dropped_queue_full: int = 0
    dropped_admission: int = 0
    errors: int = 0
    batches: int = 0
    busy_s: float = 0.0
    per_model: dict[str, dict[str, float]] = field(default_factory=dict)


def _slice(result: Any, i: int, n: int) -> Any:
    """Rows i..i+n of a model output (an array, or a dict of named arrays)."""
    if isinstance(result, dict):
        return {k: v[i:i + n] for k, v in result.items()}
    return result[i:i + n]


def _concat(xs: list[np.ndarray]) -> np.ndarray:
    return xs[0] if len(xs) == 1 else np.concatenate(xs)


class Scheduler:
    """Waiting queries and the worker threads that serve them (module docstring).

    Args:
        models: name -> object with ``predict(x) -> output``.
        workers, queue_limit, discipline, admission, max_batch: as :class:`ServerQueue`.
        max_queue_delay_ms: the batching delay (ms).
        service_ms: name -> mean service time per call when busy (ms); needed for every model
            when ``admission`` is on (the plan's ``ServiceFigures.busy_mean_ms``).
        clock_ns: the wall clock, ns since the epoch (``time.time_ns``; the parity test passes a
            scripted one). The queue's rules get it in s.
        cpu_pad: after each model call the worker sleeps ``cpu_pad`` x the call's CPU time before
            the call counts as ended (:func:`pad_work`, which also times it): a time-dilated cluster
            below one core (``ServerConfig.cpu_pad``), or a host faster than the profile; 0: no pad.
            The CPU time is the worker thread's (``time.thread_time``), or for a TensorFlow model
            (``runtime`` ``tensorflow``: its ops run on TensorFlow's pool threads)
            the process's (``time.process_time``; exact with one worker, which the plan requires).
        paces: model -> its :class:`CallPace`, for its calls of one input: a padded call ends at
            its target, cold (the model's rule, :func:`testbed.model.cpu.call_is_cold`, on this
            server's calls) or warm, and is late when it took longer (:func:`pad_work`); absent:
            the pad x its CPU time, and only its waits count.
        throttles: reads the throttling counters of the cluster's CFS quota
            (:class:`testbed.core.cgroups.ThrottleCounters`), around each paced call's CPU and
            through its pad, which charge the quota's stalls as the model does (:func:`pad_work`);
            None: no stall is charged beyond the call's own wait.

    Raises:
        ValueError: a bad setting (names it).
    """

    def __init__(self, models: dict[str, Any], workers: int = 1, queue_limit: int = 64, discipline: str = "fifo",
                 admission: bool = False, max_batch: int = 1, max_queue_delay_ms: float = 0.0,
                 service_ms: dict[str, float] | None = None,
                 clock_ns: Callable[[], int] = time.time_ns, cpu_pad: float = 0.0,
                 paces: dict[str, CallPace] | None = None, seed: int = 0,
                 throttles: ThrottleState | None = None):
        service_ms = dict(service_ms or {})
        if admission:
            missing = [m for m in models if not service_ms.get(m, 0) > 0]
            if missing:
                raise ValueError(f"admission needs a mean service time for models {missing}")
        self.queue = ServerQueue(workers, queue_limit, discipline, admission, max_batch, max_queue_delay_ms / 1e3,
                                 {m: v / 1e3 for m, v in service_ms.items()})
        self.models = models
        self.service_ms = service_ms
        self.workers, self.queue_limit, self.discipline = workers, queue_limit, discipline
        self.admission, self.max_batch = admission, max_batch
        self.counters = Counters(per_model={m: {"served": 0, "busy_s": 0.0, **pad_counters()} for m in models})
        self.clock_ns = clock_ns
        self.cpu_pad = cpu_pad
        self.paces = dict(paces or {})
        self.throttles = throttles
        self._rng = random.Random(seed)  # the paced calls' draws (worker threads, under the GIL)
        self._pace_lock = threading.Lock()
        self._calls_running = 0
        self._last_call_end = -math.inf  # time.perf_counter() (s) when the latest model call ended, pad included
        self.cond = threading.Condition()
        self.idle = 0  # workers waiting for work (the parity test watches it)
        self._ready: deque[list[Job]] = deque()  # batches the queue started, for an idle worker
        self._stopping = False
        self._threads: list[threading.Thread] = []
        self.started = time.monotonic()

    # -- queue -----------------------------------------------------------------------------
    def queue_len(self) -> int:
        """Queries waiting now (not in service)."""
        with self.cond:
            return len(self.queue)

    def submit(self, job: Job) -> tuple[str, str] | None:
        """A query arrives: None if admitted (it waits or starts), else ``(reason, message)``."""
        with self.cond:
            now = self.clock_ns() / 1e9
            deadline = None if job.deadline_ns is None else job.deadline_ns / 1e9
            q = self.queue
            ahead, waiting = q.ahead(deadline), len(q)
            code = q.arrive(job, job.model, now, deadline, job.size)
            if code == mq.REFUSED_FULL:
                self.counters.dropped_queue_full += 1
                return QUEUE_FULL, f"queue full ({waiting} waiting, limit {q.limit})"
            if code == mq.REFUSED_ADMISSION:
                self.counters.dropped_admission += 1
                late_ms = (q.expected_completion(job.model, now, deadline) - deadline) * 1e3
                return ADMISSION, (f"admission: expected completion {late_ms:.2f} ms after the deadline "
                                   f"({ahead} queries ahead, {q.workers} workers, "
                                   f"{self.service_ms[job.model]:.3f} ms each)")
            if code == mq.STARTED:
                self._ready.append([job])
            self.cond.notify()
            return None

    def next_batch(self) -> list[Job] | None:
        """Block until this worker has a batch to serve; None when stopping and nothing is left."""
        with self.cond:
            while True:
                if self._ready:
                    return self._ready.popleft()
                now = self.clock_ns() / 1e9
                got = self.queue.take(now, force=self._stopping)
                if got is not None:
                    return got[1]
                if self._stopping and not len(self.queue):
                    return None
                due = self.queue.due(now)
                self.idle += 1
                self.cond.wait(None if due == mq.INF else max(0.0, due - now))
                self.idle -= 1

    def _finished(self, batch: list[Job], busy: float, error: str | None, pad: PadOutcome | None = None
                  ) -> list[Job] | None:
        """Count a served batch; the queue may hand this worker the next query at once."""
        with self.cond:
            c = self.counters
            c.busy_s += busy
            c.batches += 1
            c.per_model[batch[0].model]["busy_s"] += busy
            if pad is not None:
                pad.count(c.per_model[batch[0].model])
            if error is None:
                c.served += len(batch)
                c.per_model[batch[0].model]["served"] += len(batch)
            else:
                c.errors += len(batch)
            nxt = self.queue.complete(self.clock_ns() / 1e9)
            self.cond.notify()  # the batching timer may be due now for another worker
            return nxt

    # -- workers ---------------------------------------------------------------------------
    def run_batch(self, batch: list[Job]) -> list[Job] | None:
        """Serve ``batch`` with one model call, fill each job, call its ``done``; returns the next
        batch the queue gives this worker (None: go back to waiting)."""
        model = batch[0].model
        x = _concat([j.x for j in batch])
        t2, wall0 = self.clock_ns(), time.perf_counter()  # the pad counts the call's time from T2
        tf = getattr(self.models[model], "runtime", "") == "tensorflow"
        cpu_clock = time.process_time if tf else time.thread_time
        with self._pace_lock:
            cold = call_is_cold(time.perf_counter(), self._last_call_end, self._calls_running)
            self._calls_running += 1
        pace = self.paces.get(model) if x.shape[0] == 1 else None
        draw = pace.draw(self._rng) if pace is not None else 1.0
        target_s = pace.target_s(cold, draw) if pace is not None else None
        state = self.throttles if target_s is not None and self.cpu_pad > 0 else None
        s0 = state() if state is not None else None
        cpu0 = cpu_clock()
        result, error = None, None
        try:
            result = self.models[model].predict(x)
        except Exception as exc:  # noqa: BLE001 - reported to the client as a 500
            error = f"{type(exc).__name__}: {exc}"
        cpu_s, elapsed_s = cpu_clock() - cpu0, time.perf_counter() - wall0
        s1 = state() if state is not None else None
        pad = pad_work(self.cpu_pad, cpu_s, elapsed_s, target_s=target_s,
                       throttles=(s0, s1) if state is not None else None, state=state)
        if pace is not None:
            pad = replace(pad, expected_cpu_s=pace.expected_cpu_s(cold, draw))
        with self._pace_lock:
            self._calls_running -= 1
            self._last_call_end = max(self._last_call_end, time.perf_counter())
        t3 = self.clock_ns()
        # The bookkeeping (counters, the queue's completion at T3) before the answers: a client
        # that reads /v1/stats after its answer, or a query that arrives right after it, sees the
        # queue as the model has it at T3 (answering first was within noise, and raced both).
        nxt = self._finished(batch, (t3 - t2) / 1e9, error, pad)
        i = 0
        for j in batch:
            j.t2, j.t3, j.batch, j.error = t2, t3, int(x.shape[0]), error
            if result is not None:
                j.result = _slice(result, i, j.size)
            i += j.size
            if j.done is not None:
                j.done(j)
        return nxt

    def _worker(self) -> None:
        while (batch := self.next_batch()) is not None:
            while batch is not None:
                batch = self.run_batch(batch)

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
        """Stats: queue_len, busy, served, dropped (+ by reason), errors, batches, mean batch,
        busy_s (sum of model-call time [s]), uptime_s, utilization = busy_s / (uptime_s x workers)."""
        with self.cond:
            c = self.counters
            uptime = max(time.monotonic() - self.started, 1e-9)
            return {"queue_len": len(self.queue), "busy": self.queue.busy, "workers": self.workers,
                    "queue_limit": self.queue_limit, "discipline": self.discipline, "admission": self.admission,
                    "max_batch": self.max_batch, "served": c.served,
                    "dropped": c.dropped_queue_full + c.dropped_admission,
                    "dropped_queue_full": c.dropped_queue_full, "dropped_admission": c.dropped_admission,
                    "errors": c.errors, "batches": c.batches,
                    "mean_batch": round(c.served / c.batches, 3) if c.batches else 0.0,
                    "busy_s": round(c.busy_s, 6), "uptime_s": round(uptime, 3),
                    "utilization": round(c.busy_s / (uptime * self.workers), 6),
                    "per_model": {k: dict(v) for k, v in c.per_model.items()}}
