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
* A call consumes quota at ``threads`` CPU-seconds per second of wall time while it runs.
* Concurrent workers share the one quota in the order their calls start: a call books the quota
  it uses, period by period, and a later call gets what is left (exact for one worker).
* Other load on the host (the emulation's own processes) is not modelled.

Cold calls (optional, ``cold_factor``; 1.0 = off): a model call that starts at least
``cold_after_s`` after the cgroup's previous model call ended runs ``cold_factor`` x its
unthrottled time. A call after idleness is slower than a back-to-back one (caches and the idle
core cooled down; benchmarks/cpu_model_bench.py, figures in docs/models-and-servers.md, "The CPU a
query costs"), which the plain rule cannot give: it predicts the isolated time as the unthrottled
one. The factor is per model, runtime and host: measured by :mod:`testbed.serve.handling`
(:func:`~testbed.plan.handling.call_factors`) into ``handling.json``, which the plan reads
(:class:`testbed.plan.catalog.ZooCatalog`).

Request handling (:meth:`CfsQuota.handle`): the server's event loop, one thread in the same
cgroup, reads each request (HTTP, base64, JPEG decoding) before the query reaches the queue
(t1 -> t1h), and writes each answer (encodes it and hands it to the socket) after its model call
(t3 -> t3h); both are charged to the same quota (``handling_ms`` per query, ``answer_ms`` of it the
answer's side, measured per model by :mod:`testbed.serve.handling`), one rule for both. Neither
counts as a model call for the cold rule: the profiler's isolated calls had no request handling
around them either.
"""

from __future__ import annotations

import math

#: CFS period of the cgroups the emulation creates, in s (``cpu.cfs_period_us`` = 100000).
PERIOD_S = 0.1
#: Idle time after which a call counts as cold (s; our choice, benchmarks/cpu_model_bench.py).
COLD_AFTER_S = 0.02


def threads_per_call(cores: float, workers: int) -> int:
    """Threads one model call runs on at a cluster of ``cores`` cores and ``workers`` workers (our
    choice): ``max(1, ceil(cores / workers))``, so that the workers' calls together can use the
    share and no more. The server sets its runtimes so (LiteRT: that many threads per worker's
    interpreter; TensorFlow: an intra-op pool of workers x that many), and the profile used is the
    one measured at that many threads."""
    return max(1, math.ceil(cores / workers - 1e-9))


class CfsQuota:
    """The CPU quota of one cluster's cgroup, as the calls of its workers consume it.

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

    __slots__ = ("cores", "threads", "period", "quota", "unlimited", "_k", "_p1", "_cur", "_later",
                 "cold_factor", "cold_after", "_cold", "_last_end")

    def __init__(self, cores: float, threads: int = 1, workers: int = 1, period_s: float = PERIOD_S,
                 cold_factor: float = 1.0, cold_after_s: float = COLD_AFTER_S, handling: bool = False):
        if not cores > 0 or threads < 1 or workers < 1 or not period_s > 0 or not cold_factor >= 1.0:
            raise ValueError(f"cores must be > 0, threads and workers >= 1, period > 0, cold_factor >= 1 "
                             f"(got {cores}, {threads}, {workers}, {period_s}, {cold_factor})")
        self.cores, self.threads, self.period = float(cores), int(threads), float(period_s)
        self.quota = self.cores * self.period  # CPU-s per period
        self.unlimited = workers * threads + (1 if handling else 0) <= self.cores
        self._k, self._p1 = -1, -1.0  # the current period (the latest booking's start) and its end, s
        self._cur = self.quota  # CPU-s of quota the current period has left
        self._later: dict[int, float] = {}  # later period -> CPU-s left (absent: all of it)
        self.cold_factor, self.cold_after = float(cold_factor), float(cold_after_s)
        self._cold = self.cold_factor != 1.0
        self._last_end = -float("inf")  # end of the latest call booked (s)

    def run(self, start_s: float, wall_s: float, cold_factor: float | None = None) -> float:
        """Book a call starting at ``start_s`` that needs ``wall_s`` s unthrottled; return its end (s).

        Calls must be booked in order of their start times (the engines do). The quota left in
        the current period is kept, and that of later periods a long call already reached. With
        cold calls on (``cold_factor`` of the quota, or of this call's model when given), a call
        after ``cold_after_s`` of idleness needs that factor x ``wall_s`` (give a per-call factor
        for every call of the quota or for none: idleness is tracked only while cold calls are on).
        """
        if self._cold or cold_factor is not None:
            if start_s - self._last_end >= self.cold_after:
                wall_s *= self.cold_factor if cold_factor is None else cold_factor
            end = self._run(start_s, wall_s, self.threads)
            if end > self._last_end:
                self._last_end = end
            return end
        return self._run(start_s, wall_s, self.threads)

    def handle(self, start_s: float, cpu_s: float) -> float:
        """Book ``cpu_s`` s of the event loop's work (reading a request or writing an answer, one
        thread) starting at ``start_s``; return its end (s), quota waits included. Booked in start
        order with the calls (:meth:`run`); not a model call for the cold rule."""
        if cpu_s <= 0:
            return start_s
        return self._run(start_s, cpu_s, 1)

    def _run(self, start_s: float, wall_s: float, tau: int) -> float:
        if self.unlimited:
            return start_s + wall_s
        if start_s >= self._p1:  # a later period: no booking can reach back before it
            self._enter(start_s)
        need = wall_s * tau
        end = start_s + wall_s
        left = self._cur
        if need <= left and end <= self._p1:  # fits in what this period has left
            self._cur = left - need
            return end
        return self._book_across(start_s, need, tau)

    def _enter(self, t: float) -> None:
        k = int(t // self.period)
        self._k, self._p1 = k, (k + 1) * self.period
        later = self._later
        self._cur = later.pop(k, self.quota)
        for old in [x for x in later if x < k]:
            del later[old]

    def _book_across(self, t: float, need: float, tau: int) -> float:
        """The slow path of :meth:`run`: the call is throttled or crosses period boundaries."""
        period, quota, later = self.period, self.quota, self._later
        k, boundary, left = self._k, self._p1, self._cur
        first = True
        while True:
            can = (boundary - t) * tau
            if left < can:
                can = left
            if need <= can:
                left -= need
                t += need / tau
                break
            need -= can
            left -= can
            if first:
                self._cur, first = left, False
            else:
                later[k] = left
            k += 1
            t, boundary = boundary, boundary + period
            left = later.get(k, quota)
        if first:
            self._cur = left
        else:
            later[k] = left
        return t

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

    def reset(self) -> None:
        """Forget the consumption (a server restarted)."""
        self._k, self._p1, self._cur = -1, -1.0, self.quota
        self._later.clear()
        self._last_end = -float("inf")


__all__ = ["COLD_AFTER_S", "PERIOD_S", "CfsQuota"]
