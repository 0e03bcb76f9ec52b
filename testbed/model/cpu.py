"""Service time under a fractional CPU share: the CFS bandwidth-control model.

A cluster's share ``cores`` is a CFS quota of ``cores x P`` of CPU time per period ``P`` = 100 ms
(``testbed.core.cgroups``). The kernel's rule (Documentation/scheduler/sched-bwc.rst): within
each period the group's threads run at full speed until the group has consumed its quota; then
they are throttled and do not run again until the next period, when the quota is refilled.

So a call needing ``wall`` ms of unthrottled time (the profile's :func:`~testbed.plan.profiles.cpu_time`,
measured with ``threads`` threads) takes ``wall`` when the quota left covers it, which is the
case at low load (the quota refills while the server idles), and stretches by whole throttled
periods at high load: the mean over many back-to-back calls tends to ``wall x threads / cores``.
A random draw of throttled samples, independent of the load, is not this behaviour: that is why
the simulator applies this model to unthrottled samples instead.

Our choices, stated (each can be checked against the emulation, see benchmarks/cpu_model_bench.py):

* Periods are aligned at t = 0 of the caller's clock (the kernel's period timer has its own
  phase, which we do not know).
* A call consumes quota at ``threads`` CPU-seconds per second of wall time while it runs, a piece
  of the event loop's work at one.
* The jobs that run at once (the workers' calls, the event loop's work) each run at full speed on
  threads of their own and draw on the one quota together, until it is spent; then all of them
  wait for the next period (:meth:`CfsQuota.start`, :meth:`~CfsQuota.ends`). So a job that starts
  later shares what the running ones had not yet spent, and can move their ends: the kernel keeps
  one pool of quota per group and period, "assigned to per-cpu run queues in slices as threads in
  the cgroup become runnable", and throttles them all once it is assigned (sched-bwc.rst; the
  slices, ``sched_cfs_bandwidth_slice_us`` = 5 ms, are not modelled). A model that let the job that started
  first keep everything it needed made a request read wait for the quota a running call had not
  yet used (``benchmarks/quota_server_bench.py`` measures both against the real server).
* The host has a core for every thread of the cluster (the quota, not the host, is the limit);
  other load on the host (the emulation's own processes, other jobs) is not modelled: it stretches
  a thread's run in wall time while its CPU time, which the quota counts, stays the same.

Cold calls (optional, ``cold_factor``; 1.0 = off): a model call that starts at least
``cold_after_s`` after the cgroup's previous model call ended runs ``cold_factor`` x its
unthrottled time. A call after idleness is slower than a back-to-back one (caches and the idle
core cooled down; benchmarks/cpu_model_bench.py, figures in docs/models-and-servers.md, "The CPU a
query costs"), which the plain rule cannot give: it predicts the isolated time as the unthrottled
one. The factor is per model, runtime and host: measured by :mod:`testbed.serve.handling`
(:func:`~testbed.plan.handling_profiles.call_factors`) into ``handling.json``, which the plan reads
(:class:`testbed.plan.catalog.ZooCatalog`).

Request handling (:meth:`CfsQuota.start` with ``call=False``, :meth:`CfsQuota.handle` for a job
alone): the server's event loop, one thread in the same cgroup, reads each request (HTTP, base64,
JPEG decoding) before the query reaches the queue (t1 -> t1h), and writes each answer (encodes it
and hands it to the socket) after its model call (t3 -> t3h), one job at a time; both are charged to
the same quota, beside the running calls (``handling_ms`` per query, ``answer_ms`` of it the
answer's side, measured per model by :mod:`testbed.serve.handling`), one rule for both. Neither
counts as a model call for the cold rule: the profiler's isolated calls had no request handling
around them either.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable

#: CFS period of the cgroups the emulation creates, in s (``cpu.cfs_period_us`` = 100000).
PERIOD_S = 0.1
#: Idle time after which a call counts as cold (s; our choice, benchmarks/cpu_model_bench.py).
COLD_AFTER_S = 0.02


def call_is_cold(start_s: float, last_end_s: float, calls_running: int, cold_after_s: float = COLD_AFTER_S) -> bool:
    """The cold rule (module docstring): a model call that starts at ``start_s`` (s) with no other
    model call of the cgroup running (``calls_running`` 0) and at least ``cold_after_s`` after the
    latest one ended (``last_end_s``, s; ``-inf`` before the first) is cold. The simulator's quota
    and the emulation's servers (:class:`testbed.serve.scheduler.Scheduler`) both ask it."""
    return calls_running == 0 and start_s - last_end_s >= cold_after_s


def threads_per_call(cores: float, workers: int) -> int:
    """Threads one model call runs on at a cluster of ``cores`` cores and ``workers`` workers (our
    choice): ``max(1, ceil(cores / workers))``, so that the workers' calls together can use the
    share and no more. The server sets its runtimes so (LiteRT: that many threads per worker's
    interpreter; TensorFlow: an intra-op pool of workers x that many), and the profile used is the
    one measured at that many threads."""
    return max(1, math.ceil(cores / workers - 1e-9))


class CfsQuota:
    """The CPU quota of one cluster's cgroup, as the threads of its server consume it.

    The rule (module doc): every job (a model call on ``threads`` threads, or a piece of the event
    loop's work on one) runs at full speed on threads of its own, all of them drawing on the one
    quota of the current period at once, until the quota is spent; then every job waits for the
    next period. A job that starts later therefore shortens the period's run of the jobs already
    running (they share what is left), and the end of a job is known only until the next one
    starts: :meth:`start`, :meth:`finish` and :meth:`ends` (or :meth:`next_ends`, the first of them,
    which is what the simulator's clusters read, and :attr:`version`, which changes when they may
    have moved) keep that state; :meth:`run` and :meth:`handle` book a job that runs alone (no other job of the
    quota overlaps it), which is all a sequence of calls one after the other needs.

    Args:
        cores: the share (cores, > 0): quota = cores x period per period.
        threads: threads a model call runs on (CPU-s consumed per s of wall time, >= 1).
        workers: calls that may run at once (the server's workers, >= 1); when even all of them
            cannot exceed the quota (``workers x threads <= cores``) nothing is ever throttled.
        period_s: the CFS period (s).
        cold_factor: a cold call's unthrottled time over a warm one's (>= 1; 1.0: no cold calls).
        cold_after_s: idle time of the cgroup after which a call is cold (s).
        handling: whether requests are also handled in the cgroup (:meth:`handle`, one thread beside
            the workers): then nothing is unlimited unless ``workers x threads + 1 <= cores``.

    Raises:
        ValueError: ``cores`` <= 0, ``threads`` or ``workers`` < 1, ``period_s`` <= 0, or
            ``cold_factor`` < 1.
    """

    __slots__ = ("cores", "threads", "period", "quota", "unlimited", "cold_factor", "cold_after", "_cold",
                 "_last_end", "_rem", "_tau", "_call", "_calls", "_t", "_k", "_left", "_ends", "_next", "_reach",
                 "version")

    def __init__(self, cores: float, threads: int = 1, workers: int = 1, period_s: float = PERIOD_S,
                 cold_factor: float = 1.0, cold_after_s: float = COLD_AFTER_S, handling: bool = False):
        if not cores > 0 or threads < 1 or workers < 1 or not period_s > 0 or not cold_factor >= 1.0:
            raise ValueError(f"cores must be > 0, threads and workers >= 1, period > 0, cold_factor >= 1 "
                             f"(got {cores}, {threads}, {workers}, {period_s}, {cold_factor})")
        self.cores, self.threads, self.period = float(cores), int(threads), float(period_s)
        self.quota = self.cores * self.period  # CPU-s per period
        self.unlimited = workers * threads + (1 if handling else 0) <= self.cores
        self.cold_factor, self.cold_after = float(cold_factor), float(cold_after_s)
        self._cold = self.cold_factor != 1.0
        self.reset()

    def reset(self) -> None:
        """Forget the jobs and the consumption (a server restarted)."""
        #: running jobs: key -> CPU-s still needed, threads (CPU-s per s), is a model call
        self._rem: dict[int, float] = {}
        self._tau: dict[int, int] = {}
        self._call: dict[int, bool] = {}
        #: counts the changes of the running jobs (start, finish, pause, reset): the ends cached by a
        #: driver are those of :meth:`next_ends` as long as it is the same
        self.version = getattr(self, "version", 0) + 1
        self._calls = 0  # model calls among them
        self._last_end = -math.inf  # end of the latest model call (s)
        self._t, self._k, self._left = 0.0, -1, self.quota  # the state's time, its period, quota left in it
        self._ends: dict[int, float] | None = {}
        self._next: dict[int, float] | None = {}  # next_ends(), None: not known
        #: the state next_ends() reached (time, period, quota left, CPU-s each job still needs): the
        #: state at that time, which a finish then takes instead of running the flow again
        self._reach: tuple[float, int, float, dict[int, float]] | None = None

    # -- jobs that overlap --
    def start(self, key: int, t: float, wall_s: float, call: bool = True, cold_factor: float | None = None) -> None:
        """Job ``key`` starts at ``t`` (s, not before the latest start or finish): a model call
        (``call``: on ``threads`` threads, cold rule applied: a call that starts with no other call
        running, ``cold_after_s`` or more after the latest call ended, needs ``cold_factor`` (this
        call's model's, else the quota's) x ``wall_s``), or ``wall_s`` s of the event loop's work
        (one thread, not a model call for the cold rule). Its end: :meth:`ends`.

        Raises:
            ValueError: ``key`` is already running.
        """
        if key in self._rem:
            raise ValueError(f"job {key} is already running")
        if t > self._t:
            self._advance(t)
        if call:
            if self._cold or cold_factor is not None:
                wall_s *= self._cold_of(t, cold_factor)
            self._calls += 1
        tau = self.threads if call else 1
        self._rem[key], self._tau[key], self._call[key] = wall_s * tau, tau, call
        self._ends = self._next = None
        self.version += 1

    def finish(self, key: int, t: float) -> None:
        """Job ``key`` ended at ``t`` (its :meth:`ends` value): it stops drawing on the quota."""
        if t > self._t:
            self._advance(t)
        del self._rem[key], self._tau[key]
        if self._call.pop(key):
            self._calls -= 1
            if t > self._last_end:
                self._last_end = t
        self._ends = self._next = None
        self.version += 1

    def ends(self) -> dict[int, float]:
        """When each running job ends (s) if no other job starts meanwhile (the same dict until the
        next :meth:`start`, :meth:`finish` or :meth:`pause`; do not change it)."""
        if self._ends is None:
            out: dict[int, float] = {}
            self._flow(self._t, self._k, self._left, dict(self._rem), self._tau, math.inf, out)
            self._ends = out
        return self._ends

    def next_ends(self) -> dict[int, float]:
        """The running jobs that end first, and when (s), if no other job starts meanwhile: those of
        :meth:`ends` with the earliest end (several when they end together), the same values; every
        other job ends strictly later. Cheaper than :meth:`ends` (the flow stops there, and a
        :meth:`finish` at that time takes the state it reached instead of running it again), which
        is all a driver that finishes the first job before it needs the next end (the simulator's
        clusters) uses. The same dict until the next :meth:`start`, :meth:`finish` or :meth:`pause`;
        do not change it."""
        if self._next is None:
            rem = dict(self._rem)
            out: dict[int, float] = {}
            t, k, left = self._flow(self._t, self._k, self._left, rem, self._tau, math.inf, out, True)
            self._next, self._reach = out, (t, k, left, rem)
        return self._next

    def pause(self, t: float, until: float) -> None:
        """The server is frozen from ``t`` to ``until`` (s): its jobs neither run nor draw on the quota."""
        self._advance(t)
        if until > self._t:
            self._t = until
        self._ends = self._next = None
        self.version += 1

    # -- a job alone --
    def run(self, start_s: float, wall_s: float, cold_factor: float | None = None) -> float:
        """A model call starting at ``start_s`` that needs ``wall_s`` s unthrottled, with no other job
        of the quota overlapping it; return its end (s). Calls are booked in order of their start
        times. With cold calls on (``cold_factor`` of the quota, or of this call's model when given),
        a call after ``cold_after_s`` of idleness needs that factor x ``wall_s``.
        """
        if self.unlimited:  # nothing is throttled: no state but the cold rule's
            end = start_s + wall_s * self._cold_of(start_s, cold_factor)
            if end > self._last_end:
                self._last_end = end
            return end
        return self._alone(start_s, wall_s, True, cold_factor)

    def runner(self, cold: bool) -> Callable[..., float]:
        """:meth:`run`, or the same rule's shortcut when nothing is throttled and no call can be
        cold (``cold``: the caller passes per-model cold factors): a call's end is then
        ``start_s + wall_s`` (``operator.add``; the latest end, which :meth:`run` keeps, is read
        by the cold rule alone). For a driver that books many calls (:mod:`testbed.sim.clusters`)."""
        if self.unlimited and not self._cold and not cold:
            return operator.add
        return self.run

    def handle(self, start_s: float, cpu_s: float) -> float:
        """``cpu_s`` s of the event loop's work (reading a request or writing an answer, one thread)
        starting at ``start_s``, no other job of the quota overlapping it; return its end (s), quota
        waits included. Not a model call for the cold rule."""
        if cpu_s <= 0:
            return start_s
        if self.unlimited:
            return start_s + cpu_s
        return self._alone(start_s, cpu_s, False, None)

    def _alone(self, start_s: float, wall_s: float, call: bool, cold_factor: float | None) -> float:
        self.start(-1, start_s, wall_s, call, cold_factor)
        end = self.next_ends()[-1]
        self.finish(-1, end)
        return end

    def _cold_of(self, t: float, cold_factor: float | None) -> float:
        if (self._cold or cold_factor is not None) and call_is_cold(t, self._last_end, self._calls, self.cold_after):
            return self.cold_factor if cold_factor is None else cold_factor
        return 1.0

    # -- the flow of CPU --
    def _advance(self, t: float) -> None:
        """Bring the state to ``t``: every running job draws on the quota from the state's time."""
        if t <= self._t:
            return
        reach, self._reach = self._reach, None
        if reach is not None and reach[0] == t:  # the flow to t is the one next_ends() ran: its state
            self._t, self._k, self._left, self._rem = reach
        elif self._rem:
            rem = dict(self._rem)
            self._t, self._k, self._left = self._flow(self._t, self._k, self._left, rem, self._tau, t, None)
            self._rem = rem
        else:  # nothing runs: the flow would only move the time
            self._t = t

    def _flow(self, now: float, k: int, left: float, rem: dict[int, float], taus: dict[int, int], until: float,
              ends: dict[int, float] | None, first: bool = False) -> tuple[float, int, float]:
        """Run the jobs (``rem``: CPU-s still needed, ``taus``: their threads) from ``now`` (period
        ``k``, ``left`` CPU-s of its quota left) to ``until``, or with ``ends`` until every job is
        done (``first``: until the first is), noting there when each ends. Changes ``rem``; returns
        (time, period, quota left).

        A flow to ``until`` takes the same steps as one to the first end as long as they lead to
        ``until`` or before (each step goes to the earliest of ``until``, the period's end, the
        quota's end and the jobs' ends), so stopping at the first end reaches the state a flow to
        that time reaches, bit for bit (:meth:`next_ends`, :meth:`_advance`)."""
        period, quota = self.period, self.quota
        jobs = []  # the jobs still running: [key, CPU-s still needed, threads]
        rate = 0  # CPU-s per s they draw together
        for key, r in rem.items():
            if r > _EPS:
                tau = taus[key]
                jobs.append([key, r, tau])
                rate += tau
            else:
                rem[key] = 0.0
                if ends is not None:
                    ends[key] = now
        if first and ends:
            return now, k, left
        while jobs and now < until:
            p1 = (k + 1) * period
            if now >= p1:  # a new period: the quota is refilled
                k = max(k + 1, int(now // period))
                p1 = (k + 1) * period
                if now >= p1:  # floor division rounded down at a boundary
                    k += 1
                    p1 = (k + 1) * period
                left = quota
            if left <= _EPS:  # throttled: nothing runs until the next period
                now = until if until < p1 else p1
                continue
            # the step: to the earliest of until, the period's end, the quota's and the jobs' ends
            h = now + left / rate
            if p1 < h:
                h = p1
            if until < h:
                h = until
            for _, r, tau in jobs:
                x = now + r / tau
                if x < h:
                    h = x
            dt = h - now
            left -= rate * dt
            if not left > 0.0:
                left = 0.0
            now = h
            done = False
            for job in jobs:
                r = job[1] - job[2] * dt
                if r <= _EPS:
                    r = 0.0
                    done = True
                    if ends is not None:
                        ends[job[0]] = now
                job[1] = r
            if done:  # the jobs that ended leave the flow
                if first:
                    break
                for key, r, _ in jobs:
                    if r == 0.0:
                        rem[key] = 0.0
                jobs = [job for job in jobs if job[1] != 0.0]
                rate = sum(job[2] for job in jobs)
        for key, r, _ in jobs:
            rem[key] = r
        if not jobs and ends is None and now < until:
            now = until
        return now, k, left

    def isolated_s(self, wall_s: float) -> float:
        """End - start of a call that starts at a period boundary with the whole quota (low load)."""
        need = wall_s * self.threads
        if self.unlimited or need <= self.quota:
            return wall_s
        full = math.ceil(need / self.quota) - 1  # periods used up to the end of their quota
        return full * self.period + (need - full * self.quota) / self.threads

    def saturated_s(self, wall_s: float, workers: int = 1, handling_s: float = 0.0) -> float:
        """Mean time per call of each of ``workers`` workers all busy back to back (high load):
        the quota is the bottleneck once the CPU per query (``wall_s x threads`` plus
        ``handling_s`` of request handling) of ``workers`` queries at once exceeds ``cores``."""
        if self.unlimited:
            return wall_s
        return max(wall_s, (wall_s * self.threads + handling_s) * workers / self.cores)


#: CPU-s below which a job's need or a period's quota counts as spent (rounding).
_EPS = 1e-12


__all__ = ["COLD_AFTER_S", "PERIOD_S", "CfsQuota", "call_is_cold"]
