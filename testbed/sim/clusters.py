"""A cluster's server on the virtual clock: the model's queue and CPU quota, its workers'
completions, outages, and the unthrottled service-time draws (:class:`ServiceSampler`).

A cluster is advanced on its own between two load reports (:meth:`Cluster.advance`): a merge of
its arrivals with its workers' completions, no global event heap.
"""

from __future__ import annotations

import copy
import heapq
import math
import operator
from collections import deque
from collections.abc import Callable, Iterator

import numpy as np

from testbed.model import queue as mq
from testbed.model import seeds
from testbed.model.cpu import CfsQuota
from testbed.model.dispatch import Heard
from testbed.model.records import CONNECTION_REFUSED
from testbed.model.service import ServiceFigures, batch_scale
from testbed.sim.columns import Queries

INF = math.inf


class ServiceSampler:
    """Unthrottled service times (ms) of one model at one cluster: ``mean_ms``, ``p95_ms``,
    ``draw() -> ms``. Built from the plan's samples (bootstrap); tests inject :meth:`exponential`
    or :meth:`deterministic` ones."""

    def __init__(self, mean_ms: float, p95_ms: float, sampler: Callable, rng: np.random.Generator, block: int = 4096):
        self.mean_ms, self.p95_ms = float(mean_ms), float(p95_ms)
        self._sampler, self._rng, self._block = sampler, rng, block
        #: the drawn block's times not yet used (a list iterator: its copy goes on from the same place)
        self._left: Iterator[float] = iter(())

    def draw(self) -> float:
        """One service time, ms."""
        try:
            return next(self._left)
        except StopIteration:
            self._left = iter(np.asarray(self._sampler(self._rng, self._block), dtype=float).tolist())
            return next(self._left)

    def reseed(self, rng: np.random.Generator) -> None:
        """Draw the times not yet drawn from ``rng`` (the block drawn so far is dropped)."""
        self._rng, self._left = rng, iter(())

    def __deepcopy__(self, memo: dict) -> ServiceSampler:
        """A copy with its own generator that goes on from the same place of the drawn block
        (shared: replaced, never mutated)."""
        new = copy.copy(self)
        new._rng = copy.deepcopy(self._rng, memo)
        new._left = copy.copy(self._left)
        memo[id(self)] = new
        return new

    @classmethod
    def bootstrap(cls, fig: ServiceFigures, rng: np.random.Generator, scale: float = 1.0) -> ServiceSampler:
        """Draws from ``fig.samples_ms`` x ``scale`` (uniform with replacement)."""
        arr = np.asarray(fig.samples_ms, dtype=float) * scale
        return cls(float(arr.mean()), float(np.percentile(arr, 95)), lambda r, n: r.choice(arr, size=n), rng)

    @classmethod
    def exponential(cls, mean_ms: float, rng: np.random.Generator) -> ServiceSampler:
        """Exponential service of mean ``mean_ms`` (M/M/c checks)."""
        return cls(mean_ms, mean_ms * math.log(20), lambda r, n: r.exponential(mean_ms, n), rng)

    @classmethod
    def deterministic(cls, ms: float, rng: np.random.Generator) -> ServiceSampler:
        """Constant service ``ms`` (M/D/1 checks)."""
        return cls(ms, ms, lambda r, n: np.full(n, ms), rng)


class BatchSamplers:
    """``(model, batch) -> ServiceSampler`` of one cluster's model calls of ``batch`` inputs: the
    unthrottled samples x :func:`~testbed.model.service.batch_scale`, each from its own generator
    seeded ``(*prefix, model, batch)``, made on first use. ``hooked``: the test hook's samplers,
    one per model whatever the batch."""

    def __init__(self, prefix: list[int], figures: dict[int, ServiceFigures],
                 hooked: dict[int, ServiceSampler] | None = None):
        self.prefix, self.figures, self.hooked = list(prefix), figures, hooked
        self.cache: dict[tuple[int, int], ServiceSampler] = {}

    def __call__(self, model: int, b: int) -> ServiceSampler:
        key = (model, b)
        smp = self.cache.get(key)
        if smp is None:
            if self.hooked is not None:
                smp = self.hooked[model]
            else:
                fig = self.figures[model]
                smp = ServiceSampler.bootstrap(fig, seeds.batch_service(self.prefix, model, b),
                                               batch_scale(fig, b))
            self.cache[key] = smp
        return smp


UP, KILLED, STOPPED = 0, 1, 2
#: The event loop's two kinds of job: reading a request (t1 -> t1h), writing an answer (t3 -> t3h).
REQUEST, ANSWER = 0, 1
#: The event loop's job among the quota's jobs (a model call's key is its first query's number, >= 0).
LOOP = -2


class Cluster:
    """A cluster's server on the virtual clock: the model's queue and CPU quota, its workers'
    completions, and what an outage does (``kill``: refused; ``stop``: frozen until resumed)."""

    def __init__(self, q: Queries, res: list[tuple[float, int]] | None, idx: int, name: str, tier: str,
                 queue: mq.ServerQueue,
                 figures: dict[int, ServiceFigures],
                 samplers: dict[int, ServiceSampler], batch_sampler: Callable[[int, int], ServiceSampler]):
        self.q, self.res, self.idx, self.name, self.tier = q, res, idx, name, tier
        self.figures, self.samplers, self.batch_sampler = figures, samplers, batch_sampler
        fig0 = next(iter(figures.values()))
        self.workers = fig0.workers
        self.queue = queue  # the plan's settings (testbed.plan.build.Plan.queue), models by index
        #: the event loop's CPU per query, per model (s): reading the request (before the queue) and
        #: writing the answer (after the call), and cold-call factors: the model's CPU rules
        #: (:mod:`testbed.model.cpu`); the loop is one thread, its jobs served in the order they come
        self.request_s = {m: f.request_ms / 1e3 for m, f in figures.items()}
        self.answer_s = {m: f.answer_ms / 1e3 for m, f in figures.items()}
        #: None when no model has cold calls: the quota then skips its idleness tracking per call
        self.cold = {m: f.cold_factor for m, f in figures.items()} \
            if any(f.cold_factor != 1.0 for f in figures.values()) else None
        self.handles = any(f.handling_ms > 0 for f in figures.values())
        self.quota = CfsQuota(fig0.cores, fig0.threads, fig0.workers, handling=self.handles)
        #: whether a job's end can move when another starts (the jobs share a quota that can run
        #: out): then every start and end reschedules the running jobs (:meth:`_reschedule`, when
        #: the quota's version is not the one ``comp`` and ``h_end`` hold)
        self.shared = not self.quota.unlimited
        #: the event loop's job in progress (t, query, model, deadline, ANSWER or REQUEST) and when it
        #: ends (INF: none), the jobs waiting behind it, and how many of all these are requests
        self.h_cur: tuple[float, int, int, float, int] | None = None
        self.h_end = INF
        self.h_wait: deque[tuple[float, int, int, float, int]] = deque()
        self.h_requests = 0
        self.h_quota = False  # the job in progress draws on the shared quota (it has CPU to spend)
        #: arrivals (query numbers) sorted by their t1 (in the order they came at equal t1s),
        #: processed up to pi
        self.pending: list[int] = []
        self.pi = 0
        #: model calls in progress: (end, first query, queries, start); a query starts at most once,
        #: so its number breaks ties between equal ends
        self.comp: list[tuple[float, int, list[int], float]] = []
        self.state = UP
        self.floor_s = 0.0  # nothing happens before this time (a stopped server resumes then)
        self.t_last = 0.0
        self.busy_done = 0.0  # total duration of the model calls that ended, s
        #: the quota's :attr:`~CfsQuota.version` whose :meth:`~CfsQuota.next_ends` ``comp`` and ``h_end``
        #: hold (shared quota)
        self.version = -1
        self.served = self.dropped = self.lost = 0
        self._busy_mark = 0.0

    # -- state --
    def cum_busy(self, t: float) -> float:
        """Worker-seconds of model calls done up to ``t`` (those ended, and the running ones' part)."""
        return self.busy_done + sum(min(t, e) - s for e, _, _, s in self.comp if t > s)

    def mean_wait_s(self) -> float:
        """Mean t2 - t1 (s) of the queries this cluster started (queueing-theory checks)."""
        q = self.q
        waits = [t2 - t1 for c, t1, t2 in zip(q.cl, q.t1, q.t2, strict=True) if c == self.idx and t2 is not None]
        return sum(waits) / len(waits) if waits else 0.0

    def snapshot(self, t: float, interval_s: float) -> Heard:
        """The report a dispatcher hears (stale until the next report); down while not UP."""
        cb = self.cum_busy(t)
        util = (cb - self._busy_mark) / (interval_s * self.workers) if interval_s > 0 else 0.0
        self._busy_mark = cb
        return Heard.of({"queue_len": len(self.queue), "busy": self.queue.busy, "utilization": util,
                         "up": self.state == UP}, self.workers, t)

    def fresh(self, t: float, utilization: float) -> Heard:
        """The cluster's true state at ``t``, as a dispatcher with fresh information hears it (the
        simulator's ``view="fresh"``): waiting = queued + in request handling + dispatched and not
        yet arrived (on the wire: what the queue will hold once they arrive); busy workers now;
        ``utilization`` as last reported (a rate over an interval, not a state)."""
        waiting = len(self.queue) + (len(self.pending) - self.pi) + self.h_requests
        return Heard.of({"queue_len": waiting, "busy": self.queue.busy, "utilization": utilization,
                         "up": self.state == UP}, self.workers, t)

    def add(self, items: list[int]) -> None:
        """New arrivals (query numbers; their t1 in the query columns), any order."""
        if self.pi:
            del self.pending[: self.pi]
            self.pi = 0
        self.pending.extend(items)
        self.pending.sort(key=self.q.t1.__getitem__)

    # -- service --
    def _refuse(self, qi: int, status: int, reason: str, t: float) -> None:
        """``qi`` is answered at once without service: 503 (``reason``) or refused (server down)."""
        q = self.q
        q.status[qi] = status
        if reason:
            q.reason[qi] = reason
        q.t4[qi] = t4 = t + q.back[qi]
        res = self.res
        if res is not None and t4 < q.dl[qi]:
            heapq.heappush(res, (t4, qi))

    def advance(self, until: float) -> None:
        """Process every completion, batch start and arrival before ``until`` (s), in time order
        (at equal times: completions, then batch starts, then arrivals). The queue's rules are the
        model's (:class:`ServerQueue`); here only the clock and the bookkeeping: a started call's
        end comes from the CPU quota (:class:`CfsQuota`) and a drawn unthrottled service time.
        With request handling, an arrival first waits for the one event-loop thread, whose
        reading of it the quota also pays (:meth:`CfsQuota.handle`), and reaches the queue when it
        ends (t1h); a finished call's answer waits for the same thread, which writes it (t3h) on
        the same quota (at equal times: completions, batch starts, loop jobs' ends, arrivals)."""
        q, queue = self.q, self.queue
        pend, comp, heap = self.pending, self.comp, queue.heap
        i, n = self.pi, len(pend)
        batching = queue.max_batch > 1
        arrive, complete, due, take = queue.arrive, queue.complete, queue.due, queue.take
        run, samplers, batch_sampler = self.quota.runner(self.cold is not None), self.samplers, self.batch_sampler
        plain = run is operator.add  # the quota's rule says a call ends its time after it starts: no call needed
        handles, cold = self.handles, self.cold
        models, dls, qlens, t1s, t2s, t3s, batch, back = q.model, q.dl, q.qlen, q.t1, q.t2, q.t3, q.batch, q.back
        t1hs, t3hs = q.t1h, q.t3h
        res, push, pop = self.res, heapq.heappush, heapq.heappop
        shared, quota = self.shared, self.quota
        killed, started, waiting = self.state == KILLED, mq.STARTED, mq.WAITING
        t_last, floor = self.t_last, self.floor_s
        busy, served = 0.0, 0
        # the next arrival: when it came (t1), when it is read (not before floor: one that came while the
        # server was stopped is read when it resumes) and whether it came while stopped
        came = ta = t1s[pend[i]] if i < n else INF
        late = ta < floor
        if late:
            ta = floor
        while True:
            if shared and quota.version != self.version:  # a job of the shared quota started or ended
                self._reschedule()
            tc = comp[0][0] if comp else INF
            tb = max(due(t_last), floor) if batching else INF
            th = self.h_end
            if tc <= ta and tc <= tb and tc <= th:  # a worker finishes; without batching it takes the next query
                if tc >= until:
                    break
                t = t_last = tc
                _, key, done, start = pop(comp)
                busy += tc - start
                if shared:  # its end is known now: the quota's other jobs may have moved it
                    quota.finish(key, tc)
                    for qi in done:
                        t3s[qi] = tc
                        if not handles:
                            t3hs[qi] = tc
                            if res is not None and tc + back[qi] < dls[qi]:
                                push(res, (tc + back[qi], qi))
                if handles:  # the answers wait for the event loop, which writes them
                    for qi in done:
                        self._begin_loop_job((tc, qi, models[qi], dls[qi], ANSWER))
                items = complete(tc)
                if items is None:
                    continue
                qi, k = items[0], len(items)
                model = models[qi]
            elif tb <= ta and tb <= th:  # a batch is due
                if tb >= until:
                    break
                t = t_last = tb
                _, items = take(tb)
                qi, k = items[0], len(items)
                model = models[qi]
            else:
                if th <= ta:  # the event loop's job ends: a request read reaches the queue, an answer is written
                    if th >= until:
                        break
                    t = t_last = th
                    _, qi, model, dl, kind = self.h_cur
                    self._next_loop_job(th)
                    if kind == ANSWER:
                        t3hs[qi] = th
                        if res is not None and th + back[qi] < dls[qi]:
                            push(res, (th + back[qi], qi))
                        continue
                    t1hs[qi] = th
                else:  # an arrival
                    if ta >= until:
                        break
                    qi = pend[i]
                    t = t_last = ta
                    if late:
                        t1s[qi] = ta
                    i += 1
                    came_qi = came
                    came = ta = t1s[pend[i]] if i < n else INF
                    late = ta < floor
                    if late:
                        ta = floor
                    if killed:
                        self.lost += 1
                        self._refuse(qi, CONNECTION_REFUSED, "", t)
                        continue
                    model = models[qi]
                    if handles:
                        self._begin_loop_job((came_qi, qi, model, dls[qi], REQUEST))
                        continue
                    t1hs[qi] = t
                    dl = dls[qi]
                qlens[qi] = len(heap)
                code = arrive(qi, model, t, dl)
                if code != started:
                    if code != waiting:
                        self.dropped += 1
                        self._refuse(qi, 503, mq.REASONS[code], t)
                    continue
                items, k = (qi,), 1
            # a worker starts one model call for the k queries `items` (the first: qi) at t
            if k == 1:
                wall = samplers[model].draw() / 1e3
                t2s[qi] = t
            else:
                wall = batch_sampler(model, k).draw() / 1e3
                for qb in items:
                    t2s[qb] = t
                    batch[qb] = k
            served += k
            if shared:  # its end, and the running jobs', come from the shared quota: t3 once it ends
                quota.start(qi, t, wall, True, cold[model] if cold is not None else None)
                comp.append((t, qi, items, t))
                continue
            end = t + wall if plain else run(t, wall, cold[model]) if cold is not None else run(t, wall)
            push(comp, (end, qi, items, t))
            if handles:  # the event loop writes the answer once the call ends
                for qb in items:
                    t3s[qb] = end
            elif k == 1:  # no event loop modelled: the answer leaves as the call ends
                t3s[qi] = t3hs[qi] = end
                if res is not None and end + back[qi] < dls[qi]:
                    push(res, (end + back[qi], qi))
            else:
                for qb in items:
                    t3s[qb] = t3hs[qb] = end
                    if res is not None and end + back[qb] < dls[qb]:
                        push(res, (end + back[qb], qb))
        self.pi, self.t_last = i, t_last
        self.busy_done += busy
        self.served += served

    def _loop_cpu_s(self, job: tuple[float, int, int, float, int]) -> float:
        return (self.answer_s if job[4] == ANSWER else self.request_s)[job[2]]

    def _begin_loop_job(self, job: tuple[float, int, int, float, int]) -> None:
        """``job`` (a request read or an answer write, ready at ``job[0]``) comes to the event loop:
        done now if the loop is free, else after the jobs before it."""
        if job[4] == REQUEST:
            self.h_requests += 1
        if self.h_cur is None:
            self.h_cur = job
            self._loop_start(job[0], job)
        else:
            self.h_wait.append(job)

    def _next_loop_job(self, t: float) -> None:
        """The loop's current job ended at ``t``: it takes the next one waiting."""
        if self.h_cur is not None and self.h_cur[4] == REQUEST:
            self.h_requests -= 1
        if self.h_quota:
            self.quota.finish(LOOP, t)
            self.h_quota = False
        if self.h_wait:
            self.h_cur = job = self.h_wait.popleft()
            self._loop_start(t, job)
        else:
            self.h_cur, self.h_end = None, INF

    def _loop_start(self, t: float, job: tuple[float, int, int, float, int]) -> None:
        """The event loop starts ``job`` at ``t``: its end from the quota (shared: it may move the
        running calls' ends, and theirs its own)."""
        cpu = self._loop_cpu_s(job)
        if not self.shared or cpu <= 0:
            self.h_end = self.quota.handle(t, cpu)
            return
        self.quota.start(LOOP, t, cpu, call=False)
        self.h_quota = True
        self.h_end = -INF  # until the loop's next turn reschedules it

    def _reschedule(self) -> None:
        """The running jobs' ends after a job of the shared quota started or ended: the calls'
        (``comp``, kept a heap in place) and the event loop's (``h_end``).

        Only the jobs that end first get their end (:meth:`CfsQuota.next_ends`); the others get INF,
        which stands for "strictly later": the next event is the earliest of that end and the
        arrivals and batches, and the job that ends first finishes (which changes the quota's
        version) before any other can, so every choice and every time is the one the ends of all
        jobs would give. (:meth:`cum_busy` and :meth:`down` read the ends at a time the cluster has
        been advanced to, not after any running call's end: INF compares there as the true end.)"""
        quota = self.quota
        if quota.version == self.version:
            return
        self.version = quota.version
        e = quota.next_ends()
        comp = self.comp
        if comp:
            get = e.get
            comp[:] = [(get(key, INF), key, items, s) for _, key, items, s in comp]
            if len(comp) > 1:
                heapq.heapify(comp)
        if self.h_quota:
            self.h_end = e.get(LOOP, INF)

    # -- outages --
    def down(self, t: float, mode: str, resume_s: float) -> None:
        """The server goes down at ``t``: ``kill`` (what it holds gets connection resets, arrivals
        are refused) or ``stop`` (frozen until ``resume_s``; model calls in progress end that much
        later)."""
        if self.state != UP:
            return
        q = self.q
        if mode == "stop":
            self.state, self.floor_s = STOPPED, resume_s
            if self.shared:  # the quota's jobs are frozen with it: their ends follow from its state
                self.quota.pause(t, resume_s)
                self._reschedule()
                return
            shift = resume_s - t
            moved = []
            for end, seq, items, start in self.comp:
                if end > t:
                    end += shift
                    for qi in items:
                        q.t3[qi] = end
                        if self.handles:  # its answer is written by the event loop once it ends
                            continue
                        q.t3h[qi] = end
                        a4 = end + q.back[qi]
                        if self.res is not None and a4 < q.dl[qi]:
                            heapq.heappush(self.res, (a4, qi))
                moved.append((end, seq, items, start))
            self.comp = moved
            heapq.heapify(self.comp)
            if self.h_cur is not None and self.h_end > t:
                self.h_end += shift
            return
        self.state = KILLED
        held = ([self.h_cur] if self.h_cur is not None else []) + list(self.h_wait)
        self.h_cur, self.h_end = None, INF
        self.h_wait.clear()
        self.h_requests = 0
        self.h_quota = False
        for _, qi, _, _, kind in held:  # read, or answered but not written: the connection is reset
            if kind == ANSWER:
                q.t2[qi] = q.t3[qi] = None
                self.served -= 1
            self.lost += 1
            self._refuse(qi, CONNECTION_REFUSED, "", t)
        for qi in self.queue.clear():
            self.lost += 1
            self._refuse(qi, CONNECTION_REFUSED, "", t)
        for end, _, items, start in self.comp:
            if end > t:
                self.busy_done += max(t, start) - start
                self.served -= len(items)
                for qi in items:
                    q.t2[qi] = q.t3[qi] = None
                    self.lost += 1
                    self._refuse(qi, CONNECTION_REFUSED, "", t)
        self.comp = []  # calls that ended by t have answered already; the rest were lost above
        self.quota.reset()

    def up(self, t: float) -> None:
        """The server is back at ``t`` (restarted after a kill, or resumed after a stop)."""
        if self.state == STOPPED:
            self.floor_s = max(self.t_last, t)
        self.state = UP


__all__ = ["ANSWER", "KILLED", "REQUEST", "STOPPED", "UP", "BatchSamplers", "Cluster", "ServiceSampler"]
