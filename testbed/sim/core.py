"""The discrete-event simulator of the testbed's system model (``shared/design/system-model.md``).

Same plan as the emulation (paths, propagation + serialization delays), clusters as multi-worker
queues (FIFO or EDF, queue bound, admission, dynamic batching as :class:`ServerSpec` says), service
times drawn from the profiles (:func:`testbed.inference.profiles.service_time`), the arrival
processes of :mod:`testbed.arrivals`, the policies of :mod:`testbed.policies` deciding on the state
last heard (a snapshot every ``report_interval``), scenario events (link delay, link congestion,
cluster failure / recovery).

How it is fast: between two load reports the dispatchers' view is constant, so the deterministic
policies' decision per (source, application) is computed once per report and reused for every
query; arrivals come in vectorised blocks per report interval; network delays are constants per
(source, cluster) (no per-link events); the only per-query events are the clusters' queue events,
and the clusters are independent between two reports, so each is advanced on its own (a merge of
its arrivals with its workers' completions, no global event heap).
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from testbed import policies as pol
from testbed.arrivals import make_process, source_weights
from testbed.plan import Plan

GRACE_MS = 2000.0  # as testbed.run: a source waits this long past the deadline before giving up
#: Bytes per frame on the wire beyond the payload (Ethernet + IP + TCP headers), and the MSS.
FRAME_OVERHEAD_BYTES, MSS_BYTES = 66, 1448


class SimError(ValueError):
    """The experiment cannot be simulated (unknown model, missing profile, bad event); names the item."""


@dataclass(frozen=True)
class Resolved:
    """A query resolved (completed, dropped, or past its deadline), as :meth:`Simulator.drain_resolved`
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
    """Service times (ms) of one model at one cluster: ``mean_ms``, ``p95_ms``, ``draw() -> ms``.

    Built from a :class:`testbed.inference.profiles.ServiceTime` (bootstrap of the measured samples);
    tests inject :meth:`exponential` or :meth:`deterministic` ones.
    """

    def __init__(self, mean_ms: float, p95_ms: float, sampler, rng: np.random.Generator, block: int = 4096):
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
    def exponential(cls, mean_ms: float, rng: np.random.Generator) -> ServiceSampler:
        """Exponential service of mean ``mean_ms`` (M/M/c checks)."""
        return cls(mean_ms, mean_ms * math.log(20), lambda r, n: r.exponential(mean_ms, n), rng)

    @classmethod
    def deterministic(cls, ms: float, rng: np.random.Generator) -> ServiceSampler:
        """Constant service ``ms`` (M/D/1 checks)."""
        return cls(ms, ms, lambda r, n: np.full(n, ms), rng)


class _Q:
    """One query in flight (internal)."""

    __slots__ = ("qid", "src", "app", "cl", "model", "pol", "fb", "t0", "t1", "dl", "t2", "t3", "t4", "status",
                 "qlen", "back", "done", "released", "acc", "batch")

    def __init__(self, qid, src, app, cl, model, p, fb, t0, t1, dl, back, acc):
        self.qid, self.src, self.app, self.cl, self.model, self.pol, self.fb = qid, src, app, cl, model, p, fb
        self.t0, self.t1, self.dl, self.back, self.acc = t0, t1, dl, back, acc
        self.t2 = self.t3 = self.t4 = None
        self.status = None  # 200, 503, or None (no answer)
        self.qlen = 0
        self.done = False
        self.released = False
        self.batch = 1


class _Cluster:
    """A cluster's server: ``workers`` workers, a bounded queue, FIFO/EDF, admission, batching.

    Semantics (testbed.inference.spec.ServerSpec): ``queue_limit`` bounds the queries waiting (not
    in service); beyond it a query is dropped (HTTP 503). Admission (when on) drops a query whose
    expected completion, t1 + (queries ahead / workers + 1) x mean service, is after its deadline.
    EDF orders the queue by absolute deadline t0 + D_a. Batching: a free worker takes up to
    ``max_batch`` queued queries for the head query's model, waiting at most ``max_queue_delay``
    after the oldest of them arrived for the batch to fill.
    """

    def __init__(self, idx: int, name: str, tier: str, workers: int, queue_limit: int, discipline: str,
                 admission: bool, max_batch: int, max_queue_delay_s: float, services: dict[int, ServiceSampler],
                 batch_services, n_sources: int):
        self.idx, self.name, self.tier = idx, name, tier
        self.c, self.limit = workers, queue_limit
        self.edf = discipline == "edf"
        self.admission, self.max_batch, self.max_delay = admission, max_batch, max_queue_delay_s
        self.services = services  # model index -> sampler (batch 1)
        self.batch_services = batch_services  # (model, b) -> sampler
        self.up = True
        self.pending: list = []  # (t1, seq, q) sorted by t1; processed up to self.pi
        self.pi = 0
        self.simple = max_batch == 1 and not self.edf
        self.waiting = deque() if self.simple else []  # (key, seq, q): FIFO deque, or a heap by key
        self.free = [0.0] * workers  # time each worker becomes free
        self.running: list[list[_Q]] = [[] for _ in range(workers)]
        self.busy_started = 0.0  # total service time of started batches, s
        self.served = self.dropped = 0
        self.lost = 0
        self.wait_sum = 0.0  # sum of t2 - t1 over started queries, s (queueing-theory checks)
        self._busy_mark = 0.0  # cumulative busy at the last report
        self.seq = 0
        self.resp = [0] * n_sources  # responses per source since the last report (link bytes)
        self.res_heap: list | None = None  # the simulator's resolution heap (None: not tracked)

    # -- state ---------------------------------------------------------------------------------
    def cum_busy(self, t: float) -> float:
        """Worker-seconds of service done up to ``t`` (exact: started minus the unserved remainder)."""
        return self.busy_started - sum(f - t for f in self.free if f > t)

    def busy_at(self, t: float) -> int:
        return sum(1 for f in self.free if f > t)

    def snapshot(self, t: float, interval_s: float) -> dict:
        cb = self.cum_busy(t)
        util = (cb - self._busy_mark) / (interval_s * self.c) if interval_s > 0 else 0.0
        self._busy_mark = cb
        return {"queue_len": len(self.waiting), "busy": self.busy_at(t), "workers": self.c,
                "utilization": min(1.0, max(0.0, util)), "up": self.up}

    def add(self, items: list) -> None:
        """New arrivals (t1, seq, q), any order."""
        if self.pi:
            del self.pending[: self.pi]
            self.pi = 0
        self.pending.extend(items)
        self.pending.sort(key=_t1_key)

    # -- events --------------------------------------------------------------------------------
    def _serve(self, batch: list, w: int, t: float) -> None:
        n = len(batch)
        head = batch[0]
        s = (self.services[head.model] if n == 1 else self.batch_services(head.model, n)).draw() / 1e3
        end = t + s
        self.free[w] = end
        self.running[w] = batch
        self.busy_started += s
        h = self.res_heap
        resp = self.resp
        for q in batch:
            self.wait_sum += t - q.t1
            q.t2 = t
            q.t3 = end
            q.status = 200
            q.batch = n
            q.t4 = t4 = end + q.back
            q.done = True
            resp[q.src] += 1
            if h is not None and t4 < q.dl:
                heapq.heappush(h, (t4, q.qid, q))
        self.served += n

    def _pop_batch(self) -> list:
        if self.simple:
            return [self.waiting.popleft()[2]]
        _, _, head = heapq.heappop(self.waiting)
        batch = [head]
        if self.max_batch > 1:
            same = sorted(e for e in self.waiting if e[2].model == head.model)[: self.max_batch - 1]
            if same:
                ids = {id(e[2]) for e in same}
                self.waiting = [e for e in self.waiting if id(e[2]) not in ids]
                heapq.heapify(self.waiting)
                batch += [e[2] for e in same]
        return batch

    def _next_start(self) -> tuple[float, int]:
        """Earliest time a worker can start the head of the queue (inf if nothing waits), and which."""
        if not self.waiting:
            return math.inf, -1
        t = min(self.free)
        w = self.free.index(t)
        if self.max_batch > 1:
            head = self.waiting[0][2]
            same = [e[2].t1 for e in self.waiting if e[2].model == head.model]
            if len(same) < self.max_batch:
                t = max(t, min(same) + self.max_delay)
        return t, w

    def _advance_simple(self, until: float, drop) -> None:
        """:meth:`advance` for FIFO without batching, inlined (the hot path: no per-event calls
        beyond the service draw)."""
        pend = self.pending
        i, n = self.pi, len(pend)
        free = self.free
        waiting = self.waiting
        popleft, append = waiting.popleft, waiting.append
        services = self.services
        h = self.res_heap
        resp = self.resp
        running = self.running
        limit, c1, admission = self.limit, self.c == 1, self.admission
        inf = math.inf
        wait_sum = busy = 0.0
        served = 0
        push = heapq.heappush
        while True:
            ta = pend[i][0] if i < n else inf
            if waiting:
                if c1:
                    ts, w = free[0], 0
                else:
                    ts = min(free)
                    w = free.index(ts)
                if ts <= ta and ts < until:
                    q = popleft()[2]
                    t = ts
                elif ta >= until:
                    break
                else:
                    q = None
            elif ta >= until:
                break
            else:
                q = None
            if q is None:  # an arrival at ta
                q = pend[i][2]
                i += 1
                t = ta
                if not self.up:
                    self.lost += 1
                    drop(q, None)
                    continue
                q.qlen = len(waiting)
                if not waiting:
                    if c1:
                        m, w = free[0], 0
                    else:
                        m = min(free)
                        w = free.index(m)
                    if m > t:
                        append((t, 0, q))
                        continue
                else:
                    if len(waiting) >= limit:
                        self.dropped += 1
                        drop(q, 503)
                        continue
                    if admission:
                        ahead = len(waiting) + self.busy_at(t)
                        if t + (ahead / self.c + 1) * services[q.model].mean_ms / 1e3 > q.dl:
                            self.dropped += 1
                            drop(q, 503)
                            continue
                    append((t, 0, q))
                    continue
            # q starts service on worker w at t
            s = services[q.model].draw() / 1e3
            end = t + s
            free[w] = end
            running[w] = (q,)
            busy += s
            wait_sum += t - q.t1
            q.t2 = t
            q.t3 = end
            q.status = 200
            q.t4 = t4 = end + q.back
            q.done = True
            resp[q.src] += 1
            served += 1
            if h is not None and t4 < q.dl:
                push(h, (t4, q.qid, q))
        self.pi = i
        self.served += served
        self.busy_started += busy
        self.wait_sum += wait_sum

    def advance(self, until: float, drop) -> None:
        """Process every arrival and service start before ``until`` (s)."""
        if self.simple:
            self._advance_simple(until, drop)
            return
        pend = self.pending
        i, n = self.pi, len(self.pending)
        free = self.free
        inf = math.inf
        while True:
            ta = pend[i][0] if i < n else inf
            if self.waiting:
                ts, w = self._next_start()
                if ts <= ta and ts < until:
                    self._serve(self._pop_batch(), w, ts)
                    continue
            if ta >= until:
                break
            q = pend[i][2]
            i += 1
            t = ta
            if not self.up:
                self.lost += 1
                drop(q, None)
                continue
            waiting = self.waiting
            q.qlen = len(waiting)
            if not waiting and self.max_batch == 1:
                m = min(free)
                if m <= t:
                    self._serve([q], free.index(m), t)
                    continue
            if len(waiting) >= self.limit:
                self.dropped += 1
                drop(q, 503)
                continue
            if self.admission:
                ahead = len(waiting) + self.busy_at(t)
                if t + (ahead / self.c + 1) * self.services[q.model].mean_ms / 1e3 > q.dl:
                    self.dropped += 1
                    drop(q, 503)
                    continue
            self.seq += 1
            if self.simple:
                waiting.append((t, self.seq, q))
            else:
                heapq.heappush(waiting, (q.dl if self.edf else t, self.seq, q))
        self.pi = i

    def fail(self, t: float, drop) -> None:
        """The cluster fails at ``t``: queued and running queries get no answer."""
        self.up = False
        for _, _, q in self.waiting:
            self.lost += 1
            drop(q, None)
        self.waiting = deque() if self.simple else []
        for w in range(self.c):
            if self.free[w] > t:
                self.busy_started -= self.free[w] - t
                for q in self.running[w]:
                    q.t2 = q.t3 = q.t4 = None
                    q.status = None
                    self.served -= 1
                    self.lost += 1
                    drop(q, None)
                self.free[w] = t
            self.running[w] = []

    def recover(self, t: float) -> None:
        self.up = True
        self.free = [max(f, t) for f in self.free]


def _t1_key(item: tuple) -> float:
    return item[0]


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
        sim.path_links(source, cluster) # [(switch a, switch b), ...]
        sim.drain_resolved()            # [Resolved, ...] since the last call, by resolution time
        sim.drain_created()             # [(source, application), ...] created since the last call
        sim.policy_names                # testbed.policies.CATALOGUE (ASET's action space)
        sim.write_run(run_dir)          # records + run.json in the emulation's layout (record=True)

    Args:
        plan: from :func:`testbed.plan.build_plan` / :func:`testbed.plan.plan_experiment`.
        seed: every random stream (arrivals per (source, application), service per (cluster, model),
            the random policy per source) derives from it: the same seed, the same run.
        policies: per-source policy override (source name -> a name of ``CATALOGUE``).
        record: keep every query for :meth:`records` / :meth:`write_run` (memory: ~200 bytes/query).
        base_dir: folder against which trace / demand-matrix paths are resolved.
        accuracy: model variant -> accuracy; default: the zoo manifest's.
        service: test hook, ``(cluster, model) -> ServiceSampler``; default: the profiles.
        request_bytes: bytes per request; default ``simulation.request_bytes`` or the zoo's mean.
        track_resolved: keep the resolution queue behind :meth:`drain_resolved` (off: faster, and
            drain_resolved returns nothing).

    Raises:
        SimError: an unknown model/profile, an unknown policy or source, an event naming an unknown
            link or cluster.
    """

    def __init__(self, plan: Plan, seed: int | None = None, policies: dict[str, str] | None = None,
                 record: bool = False, base_dir: Path | str = ".", accuracy: dict[str, float] | None = None,
                 service=None, request_bytes: int | None = None, track_resolved: bool = True):
        from testbed.inference import profiles, zoo

        self.plan = plan
        exp = self.exp = plan.experiment
        self.seed = exp.seed if seed is None else int(seed)
        self.record = record
        self.R = float(exp.report_interval_s)
        self.now_s = 0.0
        self.policy_names: list[str] = list(pol.CATALOGUE)
        repo = Path(__file__).resolve().parents[2]

        def repo_path(p: str) -> Path:
            return Path(p) if Path(p).is_absolute() else repo / p

        # --- models: accuracy and service times ---
        self.model_names: list[str] = sorted({m for c in plan.clusters for m in c.models})
        if accuracy is None:
            try:
                variants = zoo.load_manifest(repo_path(exp.zoo_dir))["variants"]
            except zoo.ZooError as exc:
                raise SimError(f"cannot read the model zoo: {exc}") from None
            accuracy = {}
            for m in self.model_names:
                if m not in variants:
                    raise SimError(f"model {m!r} is not in the zoo ({', '.join(variants)})")
                accuracy[m] = float(variants[m]["accuracy"])
        self.accuracy = accuracy
        mi = {m: i for i, m in enumerate(self.model_names)}
        self.clusters: list[_Cluster] = []
        cl_specs = {c.name: c for c in exp.clusters}
        for ci, h in enumerate(plan.clusters):
            spec = cl_specs[h.name].server
            svc: dict[int, ServiceSampler] = {}
            for m in h.models:
                rng = np.random.default_rng([self.seed, 2, ci, mi[m]])
                if service is not None:
                    svc[mi[m]] = service(h.name, m)
                else:
                    try:
                        st = profiles.service_time(repo_path(exp.profiles_dir), m, h.cpu_cores,
                                                   runtime=spec.runtime_of(m))
                    except (zoo.ZooError, ValueError) as exc:
                        raise SimError(f"cluster {h.name!r}: no service time for model {m!r}: {exc}") from None
                    svc[mi[m]] = ServiceSampler(st.mean_ms, st.p95_ms, st.sample, rng)
            self.clusters.append(_Cluster(ci, h.name, h.tier, h.workers or 1, cl_specs[h.name].queue_limit,
                                          spec.discipline, spec.admission, spec.max_batch,
                                          spec.max_queue_delay_ms / 1e3, svc,
                                          self._batch_service_fn(h, ci, service, repo_path, mi),
                                          len(plan.sources)))
        self.cl_index = {c.name: c.idx for c in self.clusters}

        # --- network: per (source, cluster) one-way delays from the plan's paths ---
        self.sources = [h.name for h in plan.sources]
        self.src_index = {s: i for i, s in enumerate(self.sources)}
        self.link_keys = [(lk.a, lk.b) for lk in plan.links]
        self.link_idx = {k: i for i, k in enumerate(self.link_keys)}
        self.link_idx |= {(b, a): i for i, (a, b) in enumerate(self.link_keys)}
        self.prop_ms = np.array([lk.delay_ms for lk in plan.links], dtype=float)
        self.bw_mbps = np.array([lk.bandwidth_mbps for lk in plan.links], dtype=float)
        self.bg_mbps = np.zeros(len(plan.links))
        sim = exp.simulation
        fixed = request_bytes or sim.request_bytes
        self.req_bytes_app = [fixed or self._zoo_request_bytes(repo_path(exp.zoo_dir), a.family)
                              for a in exp.applications]
        self.req_bytes = self.req_bytes_app[0]
        self.resp_bytes = sim.response_bytes
        self.overhead_s = sim.overhead_ms / 1e3
        self.per_hop_ms = sim.per_hop_ms
        self.warmup_s = sim.warmup_s
        nS, nC, nL = len(self.sources), len(self.clusters), len(plan.links)
        self.inc = np.zeros((nS, nC, nL))  # path-link incidence
        self.dir_ab = np.zeros((nS, nC, nL))  # 1 where the request goes a->b on that link
        self.host_bw = {h.name: h.bandwidth_mbps for h in plan.hosts}
        self.rtt_plan = np.zeros((nS, nC))
        for p in plan.paths:
            si, ci = self.src_index[p.source], self.cl_index[p.cluster]
            self.rtt_plan[si, ci] = p.rtt_ms
            for a, b in zip(p.switches, p.switches[1:], strict=False):
                li = self.link_idx[(a, b)]
                self.inc[si, ci, li] = 1
                self.dir_ab[si, ci, li] = 1 if self.link_keys[li] == (a, b) else 0
        self._recompute_delays()

        # --- applications and arrivals ---
        self.apps = list(exp.applications)
        self.app_index = {a.name: i for i, a in enumerate(self.apps)}
        base = Path(base_dir)
        self.streams: list[tuple[int, int, object]] = []  # (source, app, process)
        site_names = {h.name: (h.site, self._node_id(h.switch)) for h in plan.sources}
        for wi, w in enumerate(exp.workload):
            sel = [s for s in self.sources if w.sources == "all" or s in w.sources]
            weights = source_weights(w, [(s, site_names[s]) for s in sel], base)
            for s in sel:
                rng = np.random.default_rng([self.seed, 1, wi, self.src_index[s]])
                self.streams.append((self.src_index[s], self.app_index[w.application],
                                     make_process(w, rng, weights[s], base)))

        # --- policies ---
        default = exp.policy
        self.src_policy: list[str] = []
        for h in plan.sources:
            sp = next(x for x in exp.sources if x.name == h.name).policy
            p = (policies or {}).get(h.name, sp or default)
            if p == "aset":
                p = "closest"  # the live agent replaces it per window; a plain simulation starts with closest
            self._check_policy(p)
            self.src_policy.append(p)
        for s in policies or {}:
            if s not in self.src_index:
                raise SimError(f"policies: unknown source {s!r}; known: {', '.join(self.sources)}")
        self.ctx = [pol.Context(rng=np.random.default_rng([self.seed, 3, i])) for i in range(nS)]
        self._cache: dict = {}

        # --- events ---
        self.events = sorted(((ev.at_s, k, ev) for k, ev in enumerate(exp.events)), key=lambda e: (e[0], e[1]))
        for _, k, ev in self.events:
            if ev.link is not None:
                self._resolve_link(ev.link, f"events.{k}.link")
        self._ev_i = 0

        # --- state ---
        self._window_end = 0.0  # arrivals generated up to here
        self.arrivals_end = math.inf  # no query is created at or after this time (s)
        self._buf: list[list[tuple[np.ndarray, int]]] = [[] for _ in range(nS)]  # per source: (times, app)
        self.next_report = self.R
        self.snap = {c.name: {"queue_len": 0, "busy": 0, "workers": c.c, "utilization": 0.0, "up": True}
                     for c in self.clusters}
        self.heard = self.snap
        self._link_bits = np.zeros((nL, 2))
        self.link_util: dict[tuple[str, str], float] = dict.fromkeys(self.link_keys, 0.0)
        self._options = self._build_options()
        self._res_heap: list = []
        self.track_resolved = track_resolved
        for c in self.clusters:
            c.res_heap = self._res_heap if track_resolved else None
        self.dispatched = 0  # queries created so far
        self._created: dict[tuple[int, int], int] = {}  # (source, app) -> created since drain_created
        self._seq = 0
        self.queries: list[_Q] = []
        self.link_rows: list[dict] = []

    # ------------------------------------------------------------------ setup helpers
    def _batch_service_fn(self, h, ci, service, repo_path, mi):
        cache: dict = {}
        names = self.model_names

        def get(model_idx: int, b: int) -> ServiceSampler:
            key = (model_idx, b)
            if key not in cache:
                from testbed.inference import profiles

                rng = np.random.default_rng([self.seed, 4, ci, model_idx, b])
                if service is not None:
                    base = service(h.name, names[model_idx])
                    cache[key] = base  # the test hook gives one sampler whatever the batch
                else:
                    spec = next(x for x in self.exp.clusters if x.name == h.name).server
                    st = profiles.service_time(repo_path(self.exp.profiles_dir), names[model_idx], h.cpu_cores,
                                               batch=b, runtime=spec.runtime_of(names[model_idx]))
                    cache[key] = ServiceSampler(st.mean_ms, st.p95_ms, st.sample, rng)
            return cache[key]
        return get

    def _node_id(self, switch: str) -> str:
        return self.plan.switch(switch).node_id

    @staticmethod
    def _zoo_request_bytes(zoo_dir: Path, family: str) -> int:
        try:
            from testbed.inference.zoo import request_bodies

            bodies, _ = request_bodies(zoo_dir, family, n=16)
            return int(np.mean([len(b) for b in bodies]))
        except Exception:  # noqa: BLE001 - no zoo: a documented default
            return 20000

    def _check_policy(self, p: str) -> None:
        if p not in pol.POLICIES:
            raise SimError(f"unknown policy {p!r}; known: {', '.join(pol.CATALOGUE)}")

    def _resolve_link(self, ends: list[str], item: str) -> int:
        def sw(ref: str) -> str:
            for s in self.plan.switches:
                if ref in (s.name, s.label, s.node_id):
                    return s.name
            raise SimError(f"{item}: unknown node {ref!r}")
        a, b = sw(ends[0]), sw(ends[1])
        if (a, b) not in self.link_idx:
            raise SimError(f"{item}: no link between {ends[0]!r} and {ends[1]!r}")
        return self.link_idx[(a, b)]

    def _recompute_delays(self) -> None:
        """One-way delays (s) per (application, source, cluster): propagation + serialization of the
        request (response) on every link of the path at its bandwidth left by background traffic
        (processor-sharing approximation), plus the two host links, plus the calibration knobs
        ``simulation.per_hop_ms`` (per link, split over both directions) and ``overhead_ms``."""
        avail = np.maximum(self.bw_mbps - self.bg_mbps, 0.01 * self.bw_mbps)

        def ser_ms(nbytes: int, mbps) -> np.ndarray:
            frames = math.ceil(nbytes / MSS_BYTES)
            return (nbytes + frames * FRAME_OVERHEAD_BYTES) * 8 / (np.asarray(mbps) * 1e3)

        hops = self.inc.sum(axis=2)
        host_s = np.array([self.host_bw[s] for s in self.sources])[:, None]
        host_c = np.array([self.host_bw[c.name] for c in self.clusters])[None, :]
        back = self.inc @ (self.prop_ms + ser_ms(self.resp_bytes, avail)) + hops * self.per_hop_ms / 2
        back += ser_ms(self.resp_bytes, host_s) + ser_ms(self.resp_bytes, host_c)
        self.back_s = (back / 1e3).tolist()
        self.fwd_app = []
        for nbytes in self.req_bytes_app:
            fwd = self.inc @ (self.prop_ms + ser_ms(nbytes, avail)) + hops * self.per_hop_ms / 2
            fwd += ser_ms(nbytes, host_s) + ser_ms(nbytes, host_c)
            self.fwd_app.append((fwd / 1e3 + self.overhead_s).tolist())
        self.fwd_s = self.fwd_app[0]

    def _build_options(self) -> list[list[pol.Option]]:
        out = []
        for si in range(len(self.sources)):
            opts = []
            for c in self.clusters:
                st = self.heard[c.name]
                load = (st["queue_len"] + st["busy"]) / st["workers"]
                for m, svc in c.services.items():
                    wait = pol.expected_wait_ms(st["queue_len"], st["busy"], st["workers"], svc.mean_ms)
                    opts.append(pol.Option(c.name, self.model_names[m], float(self.rtt_plan[si, c.idx]),
                                           svc.p95_ms, self.accuracy[self.model_names[m]], wait, load, c.tier,
                                           st["up"]))
            out.append(opts)
        return out

    # ------------------------------------------------------------------ public API
    def set_policy(self, source: str, policy: str) -> None:
        """Apply ``policy`` to the queries ``source`` creates from now on.

        Raises:
            SimError: unknown source or policy.
        """
        if source not in self.src_index:
            raise SimError(f"unknown source {source!r}; known: {', '.join(self.sources)}")
        self._check_policy(policy)
        self.src_policy[self.src_index[source]] = policy

    def cluster_state(self, source: str | None = None) -> dict[str, dict]:
        """Per cluster ``{queue_len, busy, workers, utilization, up}``: now (``source`` None) or as
        ``source``'s dispatcher last heard it (the last report)."""
        if source is not None:
            if source not in self.src_index:
                raise SimError(f"unknown source {source!r}")
            return {k: dict(v) for k, v in self.heard.items()}
        t = self.now_s
        return {c.name: {"queue_len": len(c.waiting), "busy": c.busy_at(t), "workers": c.c,
                         "utilization": self.snap[c.name]["utilization"], "up": c.up} for c in self.clusters}

    def link_utilization(self) -> dict[tuple[str, str], float]:
        """Per link (switch a, switch b): utilization 0..1 over the last report interval (the busier
        direction; query bytes + background traffic)."""
        return dict(self.link_util)

    def path_links(self, source: str, cluster: str) -> list[tuple[str, str]]:
        """The links (switch pairs, as in :meth:`link_utilization`) of the source -> cluster path."""
        si, ci = self.src_index[source], self.cl_index[cluster]
        return [self.link_keys[i] for i in np.flatnonzero(self.inc[si, ci])]

    def path_rtt_ms(self, source: str, cluster: str) -> float:
        """The plan's RTT (ms) source -> cluster (what the dispatchers assume)."""
        return float(self.rtt_plan[self.src_index[source], self.cl_index[cluster]])

    def drain_resolved(self) -> list[Resolved]:
        """Queries resolved since the last call (completed with an answer by their deadline,
        dropped, or past their deadline), in order of resolution time."""
        out = []
        h = self._res_heap
        now = self.now_s
        while h and h[0][0] <= now:
            t, _, q = heapq.heappop(h)
            if q.released or (q.status is None and t < q.dl):
                continue
            q.released = True
            ok, cause = self._outcome(q)
            e2e = None if q.t4 is None else (q.t4 - q.t0) * 1e3
            out.append(Resolved(self.sources[q.src], self.apps[q.app].name, q.pol, self.clusters[q.cl].name,
                                self.model_names[q.model], q.t0, t, ok, cause, e2e))
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
            if self._ev_i < len(self.events):
                stop = min(stop, max(self.now_s, self.events[self._ev_i][0]))
            self._step(self.now_s, stop)
            self.now_s = stop
            while self._ev_i < len(self.events) and self.events[self._ev_i][0] <= stop:
                self._apply_event(self.events[self._ev_i][2], stop)
                self._ev_i += 1
            if stop >= self.next_report:
                self._report(stop)
                self.next_report += self.R
            if stop == t_s:
                break

    # ------------------------------------------------------------------ internals
    def _outcome(self, q: _Q) -> tuple[bool, str]:
        a = self.apps[q.app]
        if q.status == 503:
            return False, "dropped"
        if q.status is None or q.t4 is None:
            return False, "deadline_miss"
        if q.acc < a.min_accuracy:
            return False, "accuracy"
        if q.t4 > q.dl + 1e-12:
            return False, "deadline_miss"
        return True, ""

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

    def _decide(self, si: int, ai: int) -> tuple[pol.Decision, str]:
        p = self.src_policy[si]
        app = self.apps[ai]
        if p in pol.DETERMINISTIC:
            key = (si, ai, p)
            d = self._cache.get(key)
            if d is None:
                d = self._cache[key] = pol.POLICIES[p](self._options[si], app.deadline_ms, app.min_accuracy, None)
            return d, p
        return pol.POLICIES[p](self._options[si], app.deadline_ms, app.min_accuracy, self.ctx[si]), p

    def _step(self, a: float, b: float) -> None:
        """Dispatch the queries created in [a, b), then advance every cluster to b.

        Deterministic policies decide once per (source, application) and report interval (the
        state they see is constant in between); random and round_robin decide per query."""
        self._generate(b)
        names = self.model_names
        mi = {m: i for i, m in enumerate(names)}
        ci_of = self.cl_index
        nC = len(self.clusters)
        new: list[list] = [[] for _ in range(nC)]
        sent = np.zeros((len(self.sources), nC))
        track = self.track_resolved
        res = self._res_heap
        keep = self.record
        warm = self.warmup_s
        seq = self._seq
        push = heapq.heappush
        created = self._created
        for si in range(len(self.sources)):
            rest = []
            items = []
            for ts, ai in self._buf[si]:
                k = int(np.searchsorted(ts, b, side="left"))
                if k:
                    items.append((ts[:k].tolist(), ai))
                if k < ts.size:
                    rest.append((ts[k:], ai))
            self._buf[si] = rest
            if not items:
                continue
            back = self.back_s[si]
            pname = self.src_policy[si]
            const = pname in pol.DETERMINISTIC
            for t_list, ai in items:
                app = self.apps[ai]
                dl_s = app.deadline_ms / 1e3
                fwd = self.fwd_app[ai][si]
                nbytes = self.req_bytes_app[ai]
                if const:
                    d, _ = self._decide(si, ai)
                    ci, m, fb, acc = ci_of[d.cluster], mi[d.model], d.fallback, self.accuracy[d.model]
                    f, bk = fwd[ci], back[ci]
                    out = new[ci]
                    for t0 in t_list:
                        seq += 1
                        q = _Q(seq, si, ai, ci, m, pname, fb, t0, t0 + f, t0 + dl_s, bk, acc)
                        out.append((q.t1, seq, q))
                        if track:
                            push(res, (q.dl, seq, q))
                        if keep and t0 >= warm:
                            self.queries.append(q)
                    sent[si, ci] += len(t_list) * nbytes
                    created[(si, ai)] = created.get((si, ai), 0) + len(t_list)
                else:
                    created[(si, ai)] = created.get((si, ai), 0) + len(t_list)
                    many = pol.decide_many(pname, self._options[si], app.deadline_ms, app.min_accuracy, len(t_list),
                                           self.ctx[si])
                    for t0, d in zip(t_list, many, strict=True):
                        ci = ci_of[d.cluster]
                        seq += 1
                        q = _Q(seq, si, ai, ci, mi[d.model], pname, d.fallback, t0, t0 + fwd[ci], t0 + dl_s, back[ci],
                               self.accuracy[d.model])
                        new[ci].append((q.t1, seq, q))
                        sent[si, ci] += nbytes
                        if track:
                            push(res, (q.dl, seq, q))
                        if keep and t0 >= warm:
                            self.queries.append(q)
        self.dispatched += seq - self._seq
        self._seq = seq
        self._count_link_bytes(sent, 1, 0)
        for c in self.clusters:
            if new[c.idx]:
                c.add(new[c.idx])
            c.advance(b, self._on_drop)

    def _count_link_bytes(self, counts: np.ndarray, nbytes: int, direction: int) -> None:
        if not counts.any():
            return
        per_link = np.einsum("sc,scl->l", counts, self.inc * (self.dir_ab if direction == 0 else 1 - self.dir_ab))
        per_link_rev = np.einsum("sc,scl->l", counts, self.inc * ((1 - self.dir_ab) if direction == 0 else self.dir_ab))
        self._link_bits[:, 0] += per_link * nbytes * 8
        self._link_bits[:, 1] += per_link_rev * nbytes * 8

    def _on_drop(self, q: _Q, status: int | None) -> None:
        q.status = status
        q.done = True
        if status == 503:
            q.t4 = q.t1 + q.back
            if q.t4 < q.dl and self.track_resolved:
                heapq.heappush(self._res_heap, (q.t4, q.qid, q))

    def _report(self, t: float) -> None:
        for c in self.clusters:
            self.snap[c.name] = c.snapshot(t, self.R)
        self.heard = {k: dict(v) for k, v in self.snap.items()}
        resp = np.array([c.resp for c in self.clusters], dtype=float).T
        for c in self.clusters:
            c.resp = [0] * len(self.sources)
        self._count_link_bytes(resp, self.resp_bytes, 1)
        cap = self.bw_mbps * 1e6 * self.R
        util = np.maximum(self._link_bits[:, 0], self._link_bits[:, 1]) / cap + self.bg_mbps / self.bw_mbps
        self.link_util = {k: float(min(1.0, u)) for k, u in zip(self.link_keys, util, strict=False)}
        if self.record:
            for (a, b), li in zip(self.link_keys, range(len(self.link_keys)), strict=False):
                ua, ub = self._link_bits[li] / cap[li] + self.bg_mbps[li] / self.bw_mbps[li]
                self.link_rows.append({"t": round(t, 6), "a": a, "b": b, "kind": "switch",
                                       "capacity_mbps": self.bw_mbps[li], "rate_mbps_ab": ua * self.bw_mbps[li],
                                       "rate_mbps_ba": ub * self.bw_mbps[li], "util_ab": min(1.0, ua),
                                       "util_ba": min(1.0, ub), "drops_ab": 0, "drops_ba": 0, "drops_total": 0})
        self._link_bits[:] = 0
        self._options = self._build_options()
        self._cache.clear()

    def _apply_event(self, ev, t: float) -> None:
        if ev.kind == "cluster_down":
            self.clusters[self.cl_index[ev.cluster]].fail(t, self._on_drop)
        elif ev.kind == "cluster_up":
            self.clusters[self.cl_index[ev.cluster]].recover(t)
        elif ev.kind == "link_delay":
            self.prop_ms[self._resolve_link(ev.link, "event")] = ev.delay_ms
            self._recompute_delays()
        elif ev.kind == "link_congestion":
            self.bg_mbps[self._resolve_link(ev.link, "event")] = ev.background_mbps
            self._recompute_delays()

    # ------------------------------------------------------------------ results
    def records(self) -> list[dict]:
        """One dict per recorded query (``record=True``), keys :data:`testbed.workload.RECORD_FIELDS`;
        times in ns since the virtual epoch 0 = the load starts. A query answered later than
        deadline + grace counts as unanswered, as in the emulation."""
        rows = []
        grace = GRACE_MS / 1e3
        for q in self.queries:
            a = self.apps[q.app]
            c = self.clusters[q.cl]
            status = q.status if q.done else None
            if status == 200 and q.t4 - q.t0 > a.deadline_ms / 1e3 + grace:
                status = None  # answered after the source gave up
            ok, cause = (False, "deadline_miss") if status is None else self._outcome(q)
            row = {"query_id": f"{self.sources[q.src]}-{q.qid}", "source": self.sources[q.src],
                   "application": a.name, "cluster": c.name, "model": self.model_names[q.model],
                   "policy": q.pol, "fallback": int(q.fb), "deadline_ms": a.deadline_ms,
                   "min_accuracy": a.min_accuracy, "model_accuracy": q.acc,
                   "expected_rtt_ms": round(float(self.rtt_plan[q.src, q.cl]), 3),
                   "t0_ns": int(round(q.t0 * 1e9)), "request_bytes": self.req_bytes_app[q.app],
                   "outcome": "success" if ok else "failure", "failure_cause": cause}
            if status is not None:
                t4 = q.t4
                row.update(t4_ns=int(round(t4 * 1e9)), e2e_ms=round((t4 - q.t0) * 1e3, 3), http_status=status)
                if status == 200:
                    row.update(t1_ns=int(round(q.t1 * 1e9)), t2_ns=int(round(q.t2 * 1e9)),
                               t3_ns=int(round(q.t3 * 1e9)),
                               network_ms=round(((q.t1 - q.t0) + (t4 - q.t3)) * 1e3, 3),
                               queueing_ms=round((q.t2 - q.t1) * 1e3, 3),
                               inference_ms=round((q.t3 - q.t2) * 1e3, 3), queue_len_at_arrival=q.qlen,
                               response_bytes=self.resp_bytes)
            rows.append(row)
        return rows

    def cluster_stats(self) -> dict[str, dict]:
        """Server counters per cluster, as the emulation's ``clusters/<name>.stats.json``."""
        t = self.now_s
        out = {}
        for c in self.clusters:
            up = max(t, 1e-9)
            out[c.name] = {"queue_len": len(c.waiting), "busy_workers": c.busy_at(t), "workers": c.c,
                           "queue_limit": c.limit, "served": c.served, "dropped": c.dropped, "lost": c.lost,
                           "busy_s": round(c.cum_busy(t), 6), "uptime_s": round(t, 6),
                           "utilization": round(c.cum_busy(t) / (up * c.c), 6)}
        return out

    def write_run(self, run_dir: Path, extra: dict | None = None) -> None:
        """Write the run directory in the emulation's layout: ``sources/<source>.records.csv``
        (:data:`testbed.workload.RECORD_FIELDS`), ``clusters/<name>.stats.json``, ``link_stats.csv``,
        ``plan.json`` and ``run.json`` (``{"mode": "simulation", ...}``)."""
        import csv
        import json

        from testbed.workload import RECORD_FIELDS

        run_dir = Path(run_dir)
        for sub in ("sources", "clusters"):
            (run_dir / sub).mkdir(parents=True, exist_ok=True)
        rows = self.records()
        by_src: dict[str, list[dict]] = {s: [] for s in self.sources}
        for r in rows:
            by_src[r["source"]].append(r)
        for s, rs in by_src.items():
            with open(run_dir / "sources" / f"{s}.records.csv", "w", newline="") as f:
                w = csv.DictWriter(f, fieldnames=RECORD_FIELDS)
                w.writeheader()
                w.writerows(rs)
        for name, st in self.cluster_stats().items():
            (run_dir / "clusters" / f"{name}.stats.json").write_text(json.dumps(st, indent=1))
        if self.link_rows:
            with open(run_dir / "link_stats.csv", "w", newline="") as f:
                w = csv.DictWriter(f, fieldnames=list(self.link_rows[0]))
                w.writeheader()
                w.writerows(self.link_rows)
        self.plan.write_json(run_dir / "plan.json")
        info = {"mode": "simulation", "seed": self.seed, "duration_s": self.now_s,
                "report_interval_s": self.R, "policies": dict(zip(self.sources, self.src_policy, strict=False)),
                "request_bytes": dict(zip([a.name for a in self.apps], self.req_bytes_app, strict=True)),
                "response_bytes": self.resp_bytes,
                "warmup_s": self.warmup_s, "epoch": "t_ns = 0 when the load starts (virtual)"}
        (run_dir / "run.json").write_text(json.dumps(info | (extra or {}), indent=1))
