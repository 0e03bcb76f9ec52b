"""The discrete-event simulator: the system model on a virtual clock.

Every rule comes from :mod:`testbed.model`, the same code the emulation runs on the wall clock:
the server queue (:class:`~testbed.model.queue.ServerQueue`), the CPU share
(:class:`~testbed.model.cpu.CfsQuota`), the dispatcher step (:class:`~testbed.model.dispatch.Dispatcher`
with :mod:`testbed.model.policies`), the network (:class:`~testbed.model.network.NetworkState`), the
events' timeline (``plan.changes``) and the record with its outcome rule
(:func:`~testbed.model.records.make_record`). What the simulator adds is only the clock and the
bookkeeping: arrivals from :mod:`testbed.model.arrivals` (the same seeds as the emulation's sources),
service times drawn from the plan's unthrottled samples, and messages that take the time the
network model says.

How it is fast: queries live in columns (one list per field, indexed by query number), not in
objects; between two load reports the dispatchers' view is constant, so deterministic policies
decide once per (source, application) and report (the dispatcher caches it); arrivals come in
vectorised blocks per report interval; clusters are independent between two reports, so each is
advanced on its own (a merge of its arrivals with its workers' completions, no global event heap).
"""

from __future__ import annotations

import heapq
import itertools
import math
import operator
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy import sparse

from testbed.core.errors import InputError
from testbed.model import policies as pol
from testbed.model import queue as mq
from testbed.model.arrivals import make_process
from testbed.model.cpu import CfsQuota
from testbed.model.dispatch import Dispatcher, Heard, OptionSpec
from testbed.model.network import TCP_RTO_MIN_MS, p_retransmit, transfer_ms, wire_bytes
from testbed.model.records import CONNECTION_REFUSED, RECORD_FIELDS, classify, make_record
from testbed.model.service import ServiceFigures, batch_scale
from testbed.plan.build import Plan

INF = math.inf


class SimError(InputError):
    """The experiment cannot be simulated (unknown policy or source, bad event); names the item."""


@dataclass(frozen=True)
class Resolved:
    """A query resolved (answered, refused, or past its deadline), as :meth:`Simulator.drain_resolved`
    returns it. Times in s of simulated time; ``e2e_ms`` None when no answer came."""

    source: str
    application: str
    policy: str
    cluster: str
    model: str
    t0_s: float
    resolved_s: float
    success: bool
    failure_cause: str
    e2e_ms: float | None


class ServiceSampler:
    """Unthrottled service times (ms) of one model at one cluster: ``mean_ms``, ``p95_ms``,
    ``draw() -> ms``. Built from the plan's samples (bootstrap); tests inject :meth:`exponential`
    or :meth:`deterministic` ones."""

    def __init__(self, mean_ms: float, p95_ms: float, sampler: Callable, rng: np.random.Generator, block: int = 4096):
        self.mean_ms, self.p95_ms = float(mean_ms), float(p95_ms)
        self._sampler, self._rng, self._block = sampler, rng, block
        self._buf: list[float] = []
        self._i = 0

    def draw(self) -> float:
        """One service time, ms."""
        if self._i >= len(self._buf):
            self._buf = np.asarray(self._sampler(self._rng, self._block), dtype=float).tolist()
            self._i = 0
        v = self._buf[self._i]
        self._i += 1
        return v

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


class _Queries:
    """Every query of a run, one list per field (index = query number).

    An answered query has ``t2``/``t3`` (start / end of its model call) and nothing in
    ``status``/``t4``, which :meth:`status_of` and :meth:`t4_of` derive (HTTP 200, t3 + the
    response's way back); a query refused or lost has ``status`` (503 or connection refused) and
    ``t4`` (when the refusal reached the source); ``batch`` is set for batches of more than one.
    """

    __slots__ = ("src", "app", "cl", "model", "pol", "fb", "t0", "t1", "dl", "back", "t2", "t3", "t4", "status",
                 "qlen", "batch", "reason", "released", "recorded")

    def __init__(self) -> None:
        for f in self.__slots__:
            setattr(self, f, [])
        self.fb = bytearray()  # 0/1 per query
        self.released = bytearray()  # 1 once drain_resolved reported it
        self.reason: dict[int, str] = {}  # drop reason of refused queries only

    def __len__(self) -> int:
        return len(self.t0)

    def status_of(self, qi: int) -> int | None:
        """HTTP status as the source sees it (None: no answer yet)."""
        return 200 if self.t2[qi] is not None else self.status[qi]

    def t4_of(self, qi: int) -> float | None:
        """When the answer or the refusal reached the source (s; None: not yet)."""
        t3 = self.t3[qi]
        return t3 + self.back[qi] if t3 is not None and self.t2[qi] is not None else self.t4[qi]


UP, KILLED, STOPPED = 0, 1, 2


class _Cluster:
    """A cluster's server on the virtual clock: the model's queue and CPU quota, its workers'
    completions, and what an outage does (``kill``: refused; ``stop``: frozen until resumed)."""

    def __init__(self, sim: Simulator, idx: int, name: str, tier: str, spec, figures: dict[int, ServiceFigures],
                 samplers: dict[int, ServiceSampler], batch_sampler: Callable[[int, int], ServiceSampler]):
        self.sim, self.idx, self.name, self.tier = sim, idx, name, tier
        self.figures, self.samplers, self.batch_sampler = figures, samplers, batch_sampler
        fig0 = next(iter(figures.values()))
        self.workers = fig0.workers
        self.queue = mq.ServerQueue(fig0.workers, spec.queue_limit, spec.server.discipline, spec.server.admission,
                                    spec.server.max_batch, spec.server.max_queue_delay_ms / 1e3,
                                    {m: f.busy_mean_ms / 1e3 for m, f in figures.items()})
        #: request handling (s of CPU per request, per model) and cold-call factors: the model's
        #: CPU rules (:mod:`testbed.model.cpu`); handling runs on one thread, in arrival order
        self.handling_s = {m: f.handling_ms / 1e3 for m, f in figures.items()}
        #: None when no model has cold calls: the quota then skips its idleness tracking per call
        self.cold = {m: f.cold_factor for m, f in figures.items()} \
            if any(f.cold_factor != 1.0 for f in figures.values()) else None
        self.handles = any(h > 0 for h in self.handling_s.values())
        self.quota = CfsQuota(fig0.cores, fig0.threads, fig0.workers, handling=self.handles)
        #: the request being handled (t1, query, model, deadline) and when its handling ends (INF:
        #: none), and those waiting for the event loop behind it
        self.h_cur: tuple[float, int, int, float] | None = None
        self.h_end = INF
        self.h_wait: deque[tuple[float, int, int, float]] = deque()
        #: arrivals (t1, query, model, deadline) sorted by t1, processed up to pi (what the loop
        #: needs of a query travels with it: fewer column lookups on the hot path)
        self.pending: list[tuple[float, int, int, float]] = []
        self.pi = 0
        #: model calls in progress: (end, first query, queries, start); a query starts at most once,
        #: so its number breaks ties between equal ends
        self.comp: list[tuple[float, int, list[int], float]] = []
        self.state = UP
        self.floor_s = 0.0  # nothing happens before this time (a stopped server resumes then)
        self.t_last = 0.0
        self.busy_started = 0.0  # total duration of started model calls, s
        self.served = self.dropped = self.lost = 0
        self._busy_mark = 0.0

    # -- state --
    def cum_busy(self, t: float) -> float:
        """Worker-seconds of model calls done up to ``t`` (started minus the unserved remainder)."""
        return self.busy_started - sum(e - max(t, s) for e, _, _, s in self.comp if e > t)

    def mean_wait_s(self) -> float:
        """Mean t2 - t1 (s) of the queries this cluster started (queueing-theory checks)."""
        q = self.sim.q
        waits = [t2 - t1 for c, t1, t2 in zip(q.cl, q.t1, q.t2, strict=True) if c == self.idx and t2 is not None]
        return sum(waits) / len(waits) if waits else 0.0

    def snapshot(self, t: float, interval_s: float) -> Heard:
        """The report a dispatcher hears (stale until the next report); down while not UP."""
        cb = self.cum_busy(t)
        util = (cb - self._busy_mark) / (interval_s * self.workers) if interval_s > 0 else 0.0
        self._busy_mark = cb
        return Heard(len(self.queue), self.queue.busy, self.workers, min(1.0, max(0.0, util)), self.state == UP, t)

    def add(self, items: list[tuple[float, int, int, float]]) -> None:
        """New arrivals (t1, query, model, deadline), any order."""
        if self.pi:
            del self.pending[: self.pi]
            self.pi = 0
        self.pending.extend(items)
        self.pending.sort(key=_first)

    # -- service --
    def _refuse(self, qi: int, status: int, reason: str, t: float) -> None:
        """``qi`` is answered at once without service: 503 (``reason``) or refused (server down)."""
        q = self.sim.q
        q.status[qi] = status
        if reason:
            q.reason[qi] = reason
        q.t4[qi] = t4 = t + q.back[qi]
        res = self.sim.res_heap
        if res is not None and t4 < q.dl[qi]:
            heapq.heappush(res, (t4, qi))

    def advance(self, until: float) -> None:
        """Process every completion, batch start and arrival before ``until`` (s), in time order
        (at equal times: completions, then batch starts, then arrivals). The queue's rules are the
        model's (:class:`ServerQueue`); here only the clock and the bookkeeping: a started call's
        end comes from the CPU quota (:class:`CfsQuota`) and a drawn unthrottled service time.
        With request handling, an arrival first waits for the one event-loop thread, whose
        handling the quota also pays (:meth:`CfsQuota.handle`), and reaches the queue when it
        ends (at equal times: completions, batch starts, handling ends, arrivals)."""
        q, queue = self.sim.q, self.queue
        pend, comp, heap = self.pending, self.comp, queue.heap
        i, n = self.pi, len(pend)
        batching = queue.max_batch > 1
        arrive, complete, due, take = queue.arrive, queue.complete, queue.due, queue.take
        run, samplers, batch_sampler = self.quota.run, self.samplers, self.batch_sampler
        handles, cold = self.handles, self.cold
        models, dls, qlens, t1s, t2s, t3s, batch, back = q.model, q.dl, q.qlen, q.t1, q.t2, q.t3, q.batch, q.back
        res, push, pop = self.sim.res_heap, heapq.heappush, heapq.heappop
        killed, started, waiting = self.state == KILLED, mq.STARTED, mq.WAITING
        t_last, floor = self.t_last, self.floor_s
        busy, served = 0.0, 0
        while True:
            ta = pend[i][0] if i < n else INF
            late = ta < floor  # came while the server was stopped: read when it resumes
            if late:
                ta = floor
            tc = comp[0][0] if comp else INF
            tb = max(due(t_last), floor) if batching else INF
            th = self.h_end
            if tc <= ta and tc <= tb and tc <= th:  # a worker finishes; without batching it takes the next query
                if tc >= until:
                    break
                t = t_last = tc
                pop(comp)
                items = complete(tc)
                if items is None:
                    continue
                model = models[items[0]]
            elif tb <= ta and tb <= th:  # a batch is due
                if tb >= until:
                    break
                t = t_last = tb
                _, items = take(tb)
                model = models[items[0]]
            else:
                if th <= ta:  # a request's handling ends: it reaches the queue
                    if th >= until:
                        break
                    t = t_last = th
                    _, qi, model, dl = self.h_cur
                    self._next_handling(th)
                else:  # an arrival
                    if ta >= until:
                        break
                    item = pend[i]
                    _, qi, model, dl = item
                    i += 1
                    t = t_last = ta
                    if late:
                        t1s[qi] = ta
                    if killed:
                        self.lost += 1
                        self._refuse(qi, CONNECTION_REFUSED, "", ta)
                        continue
                    if handles:
                        self._begin_handling(ta, item)
                        continue
                qlens[qi] = len(heap)
                code = arrive(qi, model, t, dl)
                if code != started:
                    if code != waiting:
                        self.dropped += 1
                        self._refuse(qi, 503, mq.REASONS[code], t)
                    continue
                items = [qi]
            # a worker starts one model call for `items` at t
            k = len(items)
            wall = (samplers[model] if k == 1 else batch_sampler(model, k)).draw() / 1e3
            end = run(t, wall, cold[model]) if cold is not None else run(t, wall)
            push(comp, (end, items[0], items, t))
            busy += end - t
            served += k
            for qi in items:
                t2s[qi] = t
                t3s[qi] = end
                if k > 1:
                    batch[qi] = k
                if res is not None and end + back[qi] < dls[qi]:
                    push(res, (end + back[qi], qi))
        self.pi, self.t_last = i, t_last
        self.busy_started += busy
        self.served += served

    def _begin_handling(self, t: float, item: tuple[float, int, int, float]) -> None:
        """``item`` arrives at ``t``: handled now if the event loop is free, else after those before it."""
        if self.h_cur is None:
            self.h_cur = item
            self.h_end = self.quota.handle(t, self.handling_s[item[2]])
        else:
            self.h_wait.append(item)

    def _next_handling(self, t: float) -> None:
        """The current request's handling ended at ``t``: the loop takes the next one waiting."""
        if self.h_wait:
            self.h_cur = item = self.h_wait.popleft()
            self.h_end = self.quota.handle(t, self.handling_s[item[2]])
        else:
            self.h_cur, self.h_end = None, INF

    # -- outages --
    def down(self, t: float, mode: str, resume_s: float) -> None:
        """The server goes down at ``t``: ``kill`` (what it holds gets connection resets, arrivals
        are refused) or ``stop`` (frozen until ``resume_s``; model calls in progress end that much
        later)."""
        if self.state != UP:
            return
        q = self.sim.q
        if mode == "stop":
            self.state, self.floor_s = STOPPED, resume_s
            shift = resume_s - t
            moved = []
            for end, seq, items, start in self.comp:
                if end > t:
                    end += shift
                    for qi in items:
                        q.t3[qi] = end
                        a4 = end + q.back[qi]
                        if self.sim.res_heap is not None and a4 < q.dl[qi]:
                            heapq.heappush(self.sim.res_heap, (a4, qi))
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
        for _, qi, _, _ in held:
            self.lost += 1
            self._refuse(qi, CONNECTION_REFUSED, "", t)
        for qi in self.queue.clear():
            self.lost += 1
            self._refuse(qi, CONNECTION_REFUSED, "", t)
        for end, _, items, start in self.comp:
            if end > t:
                self.busy_started -= end - max(t, start)
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


class Simulator:
    """Discrete-event simulator of one planned experiment.

    API (also used by the ASET Gymnasium environment, testbed.aset)::

        sim = Simulator(plan, seed, policies=None, record=False)
        sim.now_s                       # simulated time, s (0 = the load starts)
        sim.run_until(t_s)              # process every event up to t_s
        sim.set_policy(source, policy)  # for the queries created from now on
        sim.cluster_state(source=None)  # {cluster: {queue_len, busy, workers, utilization 0..1, up}};
                                        # with a source: as that dispatcher last heard it (stale)
        sim.link_utilization()          # {(switch a, switch b): 0..1}, over the last report interval
        sim.path_links(source, cluster) # [(switch a, switch b), ...] of the current route
        sim.drain_resolved()            # [Resolved, ...] since the last call, by resolution time
        sim.drain_created()             # [(source, application), ...] created since the last call
        sim.policy_names                # testbed.model.policies.CATALOGUE (ASET's action space)
        sim.write_run(run_dir)          # records + run.json in the emulation's layout (record=True)

    Args:
        plan: from :func:`testbed.plan.build.build_plan` / :func:`testbed.plan.build.plan_experiment` (models,
            service times, weights, events and request sizes all come from it).
        seed: every random stream (arrivals per (source, application), service per (cluster, model),
            the random policy per source, loss per source) derives from it: the same seed, the same run.
        policies: per-source policy override (source name -> a name of ``CATALOGUE``).
        record: keep every query for :meth:`records` / :meth:`write_run`.
        service: test hook, ``(cluster, model) -> ServiceSampler`` of unthrottled times; default:
            the plan's samples.
        track_resolved: keep the resolution queue behind :meth:`drain_resolved` (off: faster, and
            drain_resolved returns nothing).

    Raises:
        SimError: an unknown policy or source.
    """

    def __init__(self, plan: Plan, seed: int | None = None, policies: dict[str, str] | None = None,
                 record: bool = False, service: Callable[[str, str], ServiceSampler] | None = None,
                 track_resolved: bool = True, base_dir: str | Path | None = None):
        self.plan = plan
        exp = self.exp = plan.experiment
        self.seed = exp.seed if seed is None else int(seed)
        self.record = record
        self.R = float(exp.report_interval_s)
        self.now_s = 0.0
        self.policy_names: list[str] = list(pol.CATALOGUE)
        self.base_dir = Path(base_dir) if base_dir is not None else Path(plan.base_dir)
        self.q = _Queries()
        self.res_heap: list[tuple[float, int]] | None = [] if track_resolved else None
        self.track_resolved = track_resolved
        self.sources = [h.name for h in plan.sources]
        self.src_index = {s: i for i, s in enumerate(self.sources)}
        self.apps = list(exp.applications)
        self.app_index = {a.name: i for i, a in enumerate(self.apps)}
        self._init_models()
        self._init_clusters(service)
        self._init_network()
        self._init_arrivals()
        self._init_dispatchers(policies or {})
        self._init_events()
        self.queries_recorded: list[int] = []
        self.link_rows: list[dict] = []
        self._created: dict[tuple[int, int], int] = {}
        self.next_report = self.R
        self._window_end = 0.0
        self.arrivals_end = INF  # no query is created at or after this time (s)

    # ------------------------------------------------------------------ setup steps
    def _init_models(self) -> None:
        self.model_names: list[str] = sorted(self.plan.models)
        self.model_index = {m: i for i, m in enumerate(self.model_names)}
        self.accuracy = [self.plan.models[m].accuracy for m in self.model_names]

    def _init_clusters(self, service: Callable[[str, str], ServiceSampler] | None) -> None:
        plan, mi = self.plan, self.model_index
        specs = {c.name: c for c in self.exp.clusters}
        self.clusters: list[_Cluster] = []
        for ci, h in enumerate(plan.clusters):
            figs = {mi[m]: f for m, f in plan.services[h.name].items()}
            samplers: dict[int, ServiceSampler] = {}
            for m, f in figs.items():
                rng = np.random.default_rng([self.seed, 2, ci, m])
                samplers[m] = service(h.name, self.model_names[m]) if service else ServiceSampler.bootstrap(f, rng)
            self.clusters.append(_Cluster(self, ci, h.name, h.tier or "", specs[h.name], figs, samplers,
                                          self._batch_sampler_fn(ci, figs, samplers, service is not None)))
        self.cl_index = {c.name: c.idx for c in self.clusters}

    def _batch_sampler_fn(self, ci: int, figs: dict[int, ServiceFigures], samplers: dict[int, ServiceSampler],
                          hooked: bool) -> Callable[[int, int], ServiceSampler]:
        cache: dict[tuple[int, int], ServiceSampler] = {}

        def get(model: int, b: int) -> ServiceSampler:
            key = (model, b)
            if key not in cache:
                if hooked:  # the test hook gives one sampler whatever the batch
                    cache[key] = samplers[model]
                else:
                    rng = np.random.default_rng([self.seed, 4, ci, model, b])
                    cache[key] = ServiceSampler.bootstrap(figs[model], rng, batch_scale(figs[model], b))
            return cache[key]
        return get

    def _init_network(self) -> None:
        plan = self.plan
        self.net = plan.network_state()
        self.link_keys = [(lk.a, lk.b) for lk in plan.links]
        self.src_switch = [plan.host(s).switch for s in self.sources]
        self.cl_switch = [plan.host(c.name).switch for c in self.clusters]
        self.host_bw = {h.name: h.bandwidth_mbps for h in plan.hosts}
        self.req_bytes_app = [plan.request_bytes[a.name] for a in self.apps]
        self.resp_bytes = self.exp.simulation.response_bytes
        self.overhead_s = self.exp.simulation.overhead_ms / 1e3
        self.per_hop_ms = self.exp.simulation.per_hop_ms
        self.warmup_s = self.exp.simulation.warmup_s
        self.rtt_plan = np.array([[plan.rtt_ms(s, c.name) for c in self.clusters] for s in self.sources])
        self._link_bits = np.zeros((len(self.link_keys), 2))
        self._resp = np.zeros((len(self.sources), len(plan.clusters)))  # responses per (source, cluster)
        self.link_util: dict[tuple[str, str], float] = dict.fromkeys(self.link_keys, 0.0)
        self.loss_rng = [np.random.default_rng([self.seed, 5, i]) for i in range(len(self.sources))]
        self._route()

    def _route(self) -> None:
        """Routes (least delay over links that are up) and the one-way times along them, after
        any network change: ``fwd_app[a][s][c]`` request time (s), ``back_s[s][c]`` response time."""
        nS, nC, nL = len(self.sources), len(self.clusters), len(self.link_keys)
        pairs = {(self.src_switch[si], self.cl_switch[ci]) for si in range(nS) for ci in range(nC)}
        routes = self.net.routes(pairs)
        lidx = {k: i for i, k in enumerate(self.link_keys)} | {(b, a): i for i, (a, b) in enumerate(self.link_keys)}
        rows: list[int] = []  # (source x nC + cluster) of each link traversal
        cols: list[int] = []  # its link
        ab: list[bool] = []  # traversed a -> b (else b -> a)
        self.path_li: list[list[list[int]]] = [[[] for _ in range(nC)] for _ in range(nS)]
        self.paths: list[list[list[str] | None]] = [[None] * nC for _ in range(nS)]
        self.loss_pct = np.zeros((nS, nC))
        back = np.full((nS, nC), INF)
        fwd = [np.full((nS, nC), INF) for _ in self.apps]
        for si in range(nS):
            hs = self.host_bw[self.sources[si]]
            for ci in range(nC):
                path = routes[(self.src_switch[si], self.cl_switch[ci])]
                self.paths[si][ci] = path
                if path is None:
                    continue
                hc = self.host_bw[self.clusters[ci].name]
                hops = len(path) - 1
                for a, b in zip(path, path[1:], strict=False):
                    li = lidx[(a, b)]
                    rows.append(si * nC + ci)
                    cols.append(li)
                    ab.append(self.link_keys[li] == (a, b))
                    self.path_li[si][ci].append(li)
                self.loss_pct[si, ci] = self.net.path_loss_pct(path)
                extra = hops * self.per_hop_ms / 2
                back[si, ci] = (self.net.path_ms(path[::-1], self.resp_bytes)
                                + _host_ms(self.resp_bytes, hs, hc, self.net.mss) + extra) / 1e3
                for ai, nb in enumerate(self.req_bytes_app):
                    fwd[ai][si, ci] = (self.net.path_ms(path, nb) + _host_ms(nb, hs, hc, self.net.mss) + extra) / 1e3 \
                        + self.overhead_s
        self.back_s = back.tolist()
        self.fwd_app = [f.tolist() for f in fwd]
        # (source, cluster) x link incidence per direction of traversal, sparse: a few hops per path
        ab_arr, r, c = np.array(ab, dtype=bool), np.array(rows, dtype=np.int64), np.array(cols, dtype=np.int64)
        self._inc_dir = tuple(sparse.csr_array((np.ones(int(m.sum())), (r[m], c[m])), shape=(nS * nC, nL))
                              for m in (ab_arr, ~ab_arr))

    def _init_arrivals(self) -> None:
        self.streams: list[tuple[int, int, object]] = []  # (source, app, process)
        for wi, w in enumerate(self.exp.workload):
            for s, weight in self.plan.weights[wi].items():
                rng = np.random.default_rng([self.seed, 1, wi, self.src_index[s]])
                self.streams.append((self.src_index[s], self.app_index[w.application],
                                     make_process(w, rng, weight, self.base_dir)))
        self._buf: list[list[tuple[np.ndarray, int]]] = [[] for _ in self.sources]

    def _init_dispatchers(self, policies: dict[str, str]) -> None:
        for s in policies:
            if s not in self.src_index:
                raise SimError(f"policies: unknown source {s!r}; known: {', '.join(self.sources)}")
        specs_of = {c.name: c for c in self.exp.sources}
        self.dispatchers: list[Dispatcher] = []
        for si, s in enumerate(self.sources):
            p = policies.get(s, specs_of[s].policy or self.exp.policy)
            if p == "aset":
                p = "closest"  # the live agent replaces it per window; a plain simulation starts with closest
            self._check_policy(p)
            opts = [OptionSpec(c.name, self.model_names[m], float(self.rtt_plan[si, c.idx]), f.expected_ms,
                               f.busy_mean_ms, self.accuracy[m], c.tier, f.workers,
                               self.plan.models[self.model_names[m]].family)
                    for c in self.clusters for m, f in c.figures.items()]
            self.dispatchers.append(Dispatcher(opts, p, np.random.default_rng([self.seed, 3, si])))

    def _init_events(self) -> None:
        self.changes = list(self.plan.changes)
        self._ev_i = 0

    # ------------------------------------------------------------------ public API
    @property
    def src_policy(self) -> list[str]:
        """The policy in force per source (index = source index)."""
        return [d.policy for d in self.dispatchers]

    @property
    def dispatched(self) -> int:
        """Queries created so far."""
        return len(self.q)

    def _check_policy(self, p: str) -> None:
        if p not in pol.POLICIES:
            raise SimError(f"unknown policy {p!r}; known: {', '.join(pol.CATALOGUE)}")

    def set_policy(self, source: str, policy: str) -> None:
        """Apply ``policy`` to the queries ``source`` creates from now on.

        Raises:
            SimError: unknown source or policy.
        """
        if source not in self.src_index:
            raise SimError(f"unknown source {source!r}; known: {', '.join(self.sources)}")
        self._check_policy(policy)
        self.dispatchers[self.src_index[source]].policy = policy

    def reseed(self, salt: Sequence[int]) -> None:
        """Draw the future from fresh random streams: arrivals after now, service times not yet
        drawn, the ``random`` policy's picks and the loss draws, each from a generator seeded by
        ``(seed, 9, *salt, stream)``. The present is kept (queues, queries in flight, reports, an
        MMPP's state); what it did not yet fix is redrawn. Used at a window's start (a whole
        report interval, so no arrival after now was drawn yet) by the causal planner of
        :mod:`testbed.aset.headroom`, on a clone: the same salt gives every candidate the same
        sampled future (common random numbers).

        Raises:
            NotImplementedError: a cluster batches (its batch samplers live in a closure).
            SimError: arrivals were already drawn beyond now (not at a report boundary).
        """
        if self._window_end > self.now_s + 1e-12:
            raise SimError(f"reseed at {self.now_s:.6f} s: arrivals are drawn up to {self._window_end:.6f} s "
                           "(reseed at a report boundary)")
        base = [self.seed, 9, *(int(x) for x in salt)]
        for k, (_, _, proc) in enumerate(self.streams):
            proc.reseed(np.random.default_rng([*base, 1, k]), self.now_s)
        for c in self.clusters:
            if getattr(c.queue, "max_batch", 1) > 1:
                raise NotImplementedError(f"cluster {c.name}: a batching cluster cannot be reseeded")
            for m, smp in c.samplers.items():
                smp._rng, smp._buf, smp._i = np.random.default_rng([*base, 2, c.idx, m]), [], 0
        for si, d in enumerate(self.dispatchers):
            d.ctx.rng = np.random.default_rng([*base, 3, si])
        self.loss_rng = [np.random.default_rng([*base, 5, i]) for i in range(len(self.sources))]

    def cluster_state(self, source: str | None = None) -> dict[str, dict]:
        """Per cluster ``{queue_len, busy, workers, utilization, up}``: now (``source`` None) or as
        ``source``'s dispatcher last heard it (the last report)."""
        if source is not None:
            if source not in self.src_index:
                raise SimError(f"unknown source {source!r}")
            return self.dispatchers[self.src_index[source]].heard_state()
        out = {}
        for c in self.clusters:
            heard = self.dispatchers[0].heard.get(c.name) if self.dispatchers else None
            out[c.name] = {"queue_len": len(c.queue), "busy": c.queue.busy, "workers": c.workers,
                           "utilization": heard.utilization if heard else 0.0, "up": c.state == UP}
        return out

    def link_utilization(self) -> dict[tuple[str, str], float]:
        """Per link (switch a, switch b): utilization 0..1 over the last report interval (the busier
        direction; query bytes + background traffic)."""
        return dict(self.link_util)

    def path_links(self, source: str, cluster: str) -> list[tuple[str, str]]:
        """The links (switch pairs, as in :meth:`link_utilization`) of the current source -> cluster route."""
        si, ci = self.src_index[source], self.cl_index[cluster]
        return [self.link_keys[i] for i in sorted(self.path_li[si][ci])]

    def path_rtt_ms(self, source: str, cluster: str) -> float:
        """The plan's RTT (ms) source -> cluster (what the dispatchers assume)."""
        return float(self.rtt_plan[self.src_index[source], self.cl_index[cluster]])

    def _outcome(self, qi: int) -> tuple[str, str, float | None]:
        q = self.q
        a = self.apps[q.app[qi]]
        t4 = q.t4_of(qi)
        e2e = None if t4 is None else (t4 - q.t0[qi]) * 1e3
        outcome, cause = classify(q.status_of(qi), e2e, a.deadline_ms, self.accuracy[q.model[qi]], a.min_accuracy)
        return outcome, cause, e2e

    def drain_resolved(self) -> list[Resolved]:
        """Queries resolved since the last call (answered or refused by their deadline, or past
        their deadline), in order of resolution time."""
        out: list[Resolved] = []
        h = self.res_heap
        if h is None:
            return out
        q, now = self.q, self.now_s
        while h and h[0][0] <= now:
            t, qi = heapq.heappop(h)
            if q.released[qi]:
                continue
            t4 = q.t4_of(qi)
            if t < q.dl[qi] and (t4 is None or t4 != t):
                continue  # an answer that moved (the server froze): its deadline entry settles it
            q.released[qi] = 1
            outcome, cause, e2e = self._outcome(qi)
            if e2e is not None and t4 > t:
                e2e = None  # not answered by the time it was settled
            out.append(Resolved(self.sources[q.src[qi]], self.apps[q.app[qi]].name, self.policy_names[q.pol[qi]],
                                self.clusters[q.cl[qi]].name, self.model_names[q.model[qi]], q.t0[qi], t,
                                outcome == "success", cause, e2e))
        return out

    def drain_created(self) -> list[tuple[str, str]]:
        """(source, application) of every query created since the last call (one tuple per query,
        grouped by source and application; for arrival-rate features)."""
        out = []
        for (si, ai), n in self._created.items():
            out += [(self.sources[si], self.apps[ai].name)] * n
        self._created = {}
        return out

    def run_until(self, t_s: float) -> None:
        """Advance simulated time to ``t_s`` (s), processing every arrival, report and event before it."""
        while self.now_s < t_s:
            stop = min(t_s, self.next_report)
            if self._ev_i < len(self.changes):
                stop = min(stop, max(self.now_s, self.changes[self._ev_i].t_s))
            self._step(self.now_s, stop)
            self.now_s = stop
            while self._ev_i < len(self.changes) and self.changes[self._ev_i].t_s <= stop:
                self._apply(self.changes[self._ev_i], stop)
                self._ev_i += 1
            if stop >= self.next_report:
                self._report(stop)
                self.next_report += self.R
            if stop == t_s:
                break

    # ------------------------------------------------------------------ the step
    def _generate(self, end: float) -> None:
        """Arrivals of every stream up to ``end`` (whole report intervals: rng use does not depend on
        how run_until is called)."""
        while self._window_end < end:
            a, b = self._window_end, self._window_end + self.R
            for si, ai, proc in self.streams:
                ts = proc.times(a, b)
                if b > self.arrivals_end:
                    ts = ts[ts < self.arrivals_end]
                if ts.size:
                    self._buf[si].append((ts, ai))
            self._window_end = b

    def _take_arrivals(self, si: int, b: float) -> list[tuple[list[float], int]]:
        rest, items = [], []
        for ts, ai in self._buf[si]:
            k = int(np.searchsorted(ts, b, side="left"))
            if k:
                items.append((ts[:k].tolist(), ai))
            if k < ts.size:
                rest.append((ts[k:], ai))
        self._buf[si] = rest
        return items

    def _step(self, a: float, b: float) -> None:
        """Dispatch the queries created in [a, b), then advance every cluster to b."""
        self._generate(b)
        nC = len(self.clusters)
        new: list[list[tuple[float, int, int, float]]] = [[] for _ in range(nC)]
        sent = np.zeros((len(self.sources), nC))
        sent_n = np.zeros((len(self.sources), nC))
        for si in range(len(self.sources)):
            items = self._take_arrivals(si, b)
            if items:
                self._dispatch(si, items, new, (sent, sent_n))
        self._count_link_bytes(sent, 1, 0)
        self._resp += sent_n
        for c in self.clusters:
            if new[c.idx]:
                c.add(new[c.idx])
            c.advance(b)

    def _dispatch(self, si: int, items: list[tuple[list[float], int]], new: list[list[tuple[float, int, int, float]]],
                  sent: tuple[np.ndarray, np.ndarray]) -> None:
        """Create the queries of source ``si`` (times, application) and route them to clusters:
        one decision per query, queries with the same decision created together."""
        disp = self.dispatchers[si]
        for t_list, ai in items:
            app = self.apps[ai]
            self._created[(si, ai)] = self._created.get((si, ai), 0) + len(t_list)
            decisions = disp.dispatch_many(app.deadline_ms, app.min_accuracy, len(t_list), app.family)
            if decisions.count(decisions[0]) == len(decisions):
                groups = {decisions[0]: t_list}
            else:
                groups: dict[pol.Decision, list[float]] = {}
                for t0, d in zip(t_list, decisions, strict=True):
                    groups.setdefault(d, []).append(t0)
            for d, ts in groups.items():
                self._create(si, ai, d, ts, new, sent)

    def _create(self, si: int, ai: int, d: pol.Decision, ts: list[float],
                new: list[list[tuple[float, int, int, float]]],
                sent: tuple[np.ndarray, np.ndarray]) -> None:
        """Append the queries created at times ``ts`` by source ``si`` for application ``ai``, all
        sent to the same (cluster, model) ``d``, to the query columns and to the cluster's arrivals.
        ``sent``: (request bytes, queries) per (source, cluster) of this step, for link
        utilization; a query's response is counted with it (our bookkeeping choice)."""
        q = self.q
        k = len(ts)
        ci, m = self.cl_index[d.cluster], self.model_index[d.model]
        dl_s = self.apps[ai].deadline_ms / 1e3
        f, bk = self.fwd_app[ai][si][ci], self.back_s[si][ci]
        nbytes = self.req_bytes_app[ai]
        loss = self.loss_pct[si, ci]
        if loss > 0:  # one retransmission timeout per direction that loses a frame (model.network)
            rng, rto = self.loss_rng[si], TCP_RTO_MIN_MS / 1e3
            t1 = (np.asarray(ts) + f + rto * (rng.random(k) < p_retransmit(loss, nbytes, self.net.mss))).tolist()
            back = (bk + rto * (rng.random(k) < p_retransmit(loss, self.resp_bytes, self.net.mss))).tolist()
        else:
            t1 = [t + f for t in ts]
            back = [bk] * k
        base = len(q.t0)
        idx = range(base, base + k)
        dls = [t + dl_s for t in ts]
        for col, v in ((q.src, si), (q.app, ai), (q.cl, ci), (q.model, m),
                       (q.pol, self.policy_names.index(self.dispatchers[si].policy))):
            col.extend([v] * k)
        q.fb.extend(bytes([int(d.fallback)]) * k)
        q.released.extend(bytes(k))
        for col in (q.t2, q.t3, q.t4, q.status, q.qlen, q.batch):
            col.extend([None] * k)
        q.t0.extend(ts)
        q.t1.extend(t1)
        q.dl.extend(dls)
        q.back.extend(back)
        if f < INF:
            new[ci].extend(zip(t1, idx, itertools.repeat(m), dls))  # noqa: B905 - same lengths by construction
        sent[0][si, ci] += k * nbytes
        sent[1][si, ci] += k
        if self.res_heap is not None:
            push, res = heapq.heappush, self.res_heap
            for t, qi in zip(dls, idx, strict=True):
                push(res, (t, qi))
        if self.record:
            warm = self.warmup_s
            self.queries_recorded.extend(qi for qi, t in zip(idx, ts, strict=True) if t >= warm)

    def _count_link_bytes(self, counts: np.ndarray, nbytes: int, direction: int) -> None:
        if not counts.any():
            return
        c = counts.ravel()
        along, against = (c @ m for m in self._inc_dir)  # per link, traversed a -> b / b -> a
        per_link, per_link_rev = (along, against) if direction == 0 else (against, along)
        self._link_bits[:, 0] += per_link * nbytes * 8
        self._link_bits[:, 1] += per_link_rev * nbytes * 8

    def _report(self, t: float) -> None:
        """Every report interval: the dispatchers hear each cluster; link utilization is computed."""
        reports = [(c.name, c.snapshot(t, self.R)) for c in self.clusters]
        for d in self.dispatchers:
            d.hear_all(reports)
        self._count_link_bytes(self._resp, wire_bytes(self.resp_bytes, self.net.mss), 1)
        self._resp[:] = 0
        self._link_report(t)

    def _link_report(self, t: float) -> None:
        links = self.net.links
        cap = np.array([lk.capacity_mbps for lk in links]) * 1e6 * self.R
        bg = np.array([[lk.bg_ab, lk.bg_ba] for lk in links]) * 1e6 * self.R
        bits = self._link_bits + bg
        util = np.minimum(1.0, bits / cap[:, None])
        self.link_util = {k: float(max(u)) for k, u in zip(self.link_keys, util, strict=True)}
        if self.record:
            for (a, b), lk, u, bt in zip(self.link_keys, links, util, bits, strict=True):
                self.link_rows.append({"t": round(t, 6), "a": a, "b": b, "kind": "switch",
                                       "capacity_mbps": lk.capacity_mbps, "rate_mbps_ab": bt[0] / self.R / 1e6,
                                       "rate_mbps_ba": bt[1] / self.R / 1e6, "util_ab": float(u[0]),
                                       "util_ba": float(u[1]), "drops_ab": 0, "drops_ba": 0, "drops_total": 0})
        self._link_bits[:] = 0

    def _apply(self, ch, t: float) -> None:
        """One step of the events' timeline (:mod:`testbed.model.events`)."""
        if ch.kind == "cluster_down":
            resume = next((c.t_s for c in self.changes[self._ev_i + 1:]
                           if c.kind == "cluster_up" and c.cluster == ch.cluster), INF)
            self.clusters[self.cl_index[ch.cluster]].down(t, ch.mode, resume)
        elif ch.kind == "cluster_up":
            self.clusters[self.cl_index[ch.cluster]].up(t)
        else:
            self.net.apply(ch)
            self._route()

    # ------------------------------------------------------------------ results
    def records(self) -> list[dict]:
        """One row per recorded query (``record=True``), keys :data:`testbed.model.records.RECORD_FIELDS`;
        times in ns since the virtual epoch 0 = the load starts. A query answered later than
        deadline + grace counts as unanswered, as in the emulation."""
        q = self.q
        rows = []
        seq = [0] * len(self.sources)  # ids <source>-1, -2, ... in creation order, as the emulated sources give
        for qi in sorted(self.queries_recorded, key=lambda i: (q.t0[i], i)):
            seq[q.src[qi]] += 1
            a = self.apps[q.app[qi]]
            ci = q.cl[qi]

            def ns(v: float | None) -> int | None:
                return None if v is None else int(round(v * 1e9))

            st = q.status_of(qi)
            rows.append(make_record(
                query_id=f"{self.sources[q.src[qi]]}-{seq[q.src[qi]]}", source=self.sources[q.src[qi]],
                application=a.name,
                cluster=self.clusters[ci].name, model=self.model_names[q.model[qi]],
                policy=self.policy_names[q.pol[qi]], fallback=q.fb[qi], deadline_ms=a.deadline_ms,
                min_accuracy=a.min_accuracy, model_accuracy=self.accuracy[q.model[qi]],
                expected_rtt_ms=float(self.rtt_plan[q.src[qi], ci]), t0_ns=ns(q.t0[qi]), status=st,
                t1_ns=ns(q.t1[qi]) if st == 200 else None, t2_ns=ns(q.t2[qi]), t3_ns=ns(q.t3[qi]),
                t4_ns=ns(q.t4_of(qi)), batch=q.batch[qi] or 1, request_bytes=self.req_bytes_app[q.app[qi]],
                response_bytes=self.resp_bytes if st == 200 else 0, queue_len_at_arrival=q.qlen[qi],
                drop_reason=q.reason.get(qi, "")))
        return rows

    def query_table(self):
        """Every query so far as a ``pandas.DataFrame``, one row per query (recorded or not): source,
        application, cluster, model, policy, t0_s .. t4_s (s of simulated time; NaN when not reached),
        status (200, 503, -1 refused; NaN: no answer yet), batch (inputs in its model call),
        queue_len_at_arrival. For analysis and tests; :meth:`records` is the run's record schema."""
        import pandas as pd

        q = self.q
        n = len(q)
        return pd.DataFrame({
            "source": [self.sources[i] for i in q.src], "application": [self.apps[i].name for i in q.app],
            "cluster": [self.clusters[i].name for i in q.cl], "model": [self.model_names[i] for i in q.model],
            "policy": [self.policy_names[i] for i in q.pol], "t0_s": q.t0, "t1_s": q.t1,
            "t2_s": pd.array(q.t2, dtype="Float64"), "t3_s": pd.array(q.t3, dtype="Float64"),
            "t4_s": pd.array([q.t4_of(i) for i in range(n)], dtype="Float64"),
            "status": pd.array([q.status_of(i) for i in range(n)], dtype="Int64"),
            "batch": [(b or 1) if t2 is not None else None for b, t2 in zip(q.batch, q.t2, strict=True)],
            "queue_len_at_arrival": pd.array(q.qlen, dtype="Int64")})

    def cluster_stats(self) -> dict[str, dict]:
        """Server counters per cluster, as the emulation's ``clusters/<name>.stats.json``."""
        t = self.now_s
        out = {}
        for c in self.clusters:
            up = max(t, 1e-9)
            out[c.name] = {"queue_len": len(c.queue), "busy_workers": c.queue.busy, "workers": c.workers,
                           "queue_limit": c.queue.limit, "served": c.served, "dropped": c.dropped, "lost": c.lost,
                           "busy_s": round(c.cum_busy(t), 6), "uptime_s": round(t, 6),
                           "utilization": round(c.cum_busy(t) / (up * c.workers), 6)}
        return out

    def write_run(self, run_dir: Path, extra: dict | None = None) -> None:
        """Write the run directory in the emulation's layout: ``sources/<source>.records.csv``
        (:data:`RECORD_FIELDS`) and its tally (:class:`testbed.plan.boundaries.SourceTally`),
        ``clusters/<name>.stats.json``, ``link_stats.csv``, ``plan.json``
        and ``run.json`` (``{"mode": "simulation", ...}``)."""
        import csv

        from testbed.core.util import provenance, write_json_atomic
        from testbed.plan.boundaries import SourceTally, tally_path

        run_dir = Path(run_dir)
        for sub in ("sources", "clusters"):
            (run_dir / sub).mkdir(parents=True, exist_ok=True)
        by_src: dict[str, list[dict]] = {s: [] for s in self.sources}
        for r in self.records():
            by_src[r["source"]].append(r)
        for s, rs in by_src.items():  # every query the simulator created is a row: created = rows
            path = run_dir / "sources" / f"{s}.records.csv"
            with open(path, "w", newline="") as f:
                w = csv.DictWriter(f, fieldnames=RECORD_FIELDS)
                w.writeheader()
                w.writerows(rs)
            write_json_atomic(tally_path(path), SourceTally(source=s, created=len(rs), written=len(rs),
                                                            unwritten=0, failed=0))
        for name, st in self.cluster_stats().items():
            write_json_atomic(run_dir / "clusters" / f"{name}.stats.json", st)
        if self.link_rows:
            with open(run_dir / "link_stats.csv", "w", newline="") as f:
                w = csv.DictWriter(f, fieldnames=list(self.link_rows[0]))
                w.writeheader()
                w.writerows(self.link_rows)
        self.plan.write_json(run_dir / "plan.json")
        info = {"mode": "simulation", "seed": self.seed, "duration_s": self.now_s,
                "report_interval_s": self.R, "policies": dict(zip(self.sources, self.src_policy, strict=True)),
                "request_bytes": dict(zip([a.name for a in self.apps], self.req_bytes_app, strict=True)),
                "response_bytes": self.resp_bytes,
                "warmup_s": self.warmup_s, "epoch": "t_ns = 0 when the load starts (virtual)",
                "provenance": provenance()}
        write_json_atomic(run_dir / "run.json", info | (extra or {}))


_first = operator.itemgetter(0)


def _host_ms(nbytes: int, mbps_source: float, mbps_cluster: float, mss: int) -> float:
    """Transfer time (ms) of a message on the two host links (0 ms delay each), ``mss`` bytes per frame."""
    return transfer_ms(nbytes, mbps_source, mss) + transfer_ms(nbytes, mbps_cluster, mss)


__all__ = ["Resolved", "ServiceSampler", "SimError", "Simulator"]
