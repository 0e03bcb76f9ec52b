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

The parts: this module holds the event loop (:meth:`Simulator.run_until`: dispatch, advance the
clusters, reports, events) and the public API; :mod:`testbed.sim.clusters` the servers
(:class:`~testbed.sim.clusters.Cluster`, :class:`~testbed.sim.clusters.ServiceSampler`);
:mod:`testbed.sim.links` the network part (:class:`~testbed.sim.links.Links`); and
:mod:`testbed.sim.columns` the query columns and what is read out of them (resolved queries,
records, the run directory: :class:`~testbed.sim.columns.RunColumns`). ASET reads the simulator
through :meth:`Simulator.source_view`, :meth:`Simulator.clone` and :meth:`Simulator.reseed` only.
"""

from __future__ import annotations

import copy
import heapq
import math
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from testbed.core.errors import InputError
from testbed.model import policies as pol
from testbed.model import seeds
from testbed.model.dispatch import Dispatcher
from testbed.model.network import TCP_RTO_MIN_MS, p_retransmit, wire_bytes
from testbed.model.service import ServiceFigures
from testbed.plan.build import Plan
from testbed.plan.traces import arrival_process
from testbed.sim.clusters import UP, BatchSamplers, Cluster, ServiceSampler
from testbed.sim.columns import Queries, Resolved, RunColumns
from testbed.sim.links import Links

INF = math.inf


class SimError(InputError):
    """The experiment cannot be simulated (unknown policy or source, bad event); names the item."""


#: What the dispatchers may know of the clusters (:class:`Simulator`'s ``view``).
VIEWS = ("reports", "fresh")
#: How often dispatchers hear the clusters' true state with ``view="fresh"`` (s; our choice: 10 ms,
#: a fraction of the smallest service times, 4-20 ms, so the state is practically current).
FRESH_STEP_S = 0.01


class Simulator(Links, RunColumns):
    """Discrete-event simulator of one planned experiment.

    API (also used by the ASET Gymnasium environment, testbed.aset)::

        sim = Simulator(plan, seed, policies=None, record=False)
        sim.now_s                       # simulated time, s (0 = the load starts)
        sim.run_until(t_s)              # process every event up to t_s
        sim.arrivals_end = t_s          # no query is created at or after t_s (an episode's end)
        sim.set_policy(source, policy)  # for the queries created from now on
        sim.cluster_state(source=None)  # {cluster: {queue_len, busy, workers, utilization 0..1, up}};
                                        # with a source: as that dispatcher last heard it (stale)
        sim.link_utilization()          # {(switch a, switch b): 0..1}, over the last report interval
        sim.path_links(source, cluster) # [(switch a, switch b), ...] of the current route
        sim.drain_resolved()            # [Resolved, ...] since the last call, by resolution time
        sim.drain_created()             # [(source, application), ...] created since the last call
        sim.policy_names                # testbed.model.policies.CATALOGUE (ASET's action space),
                                        # then the plug-ins the sources use
        sim.source_view(source)         # SourceView: what that source's dispatcher knows (read-only)
        sim.clone()                     # an independent copy that continues exactly as this one would
        sim.reseed(salt)                # the future from fresh random streams (common random numbers)
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
        view: what the dispatchers know of the clusters. ``"reports"`` (the system model): the
            report heard every report interval, stale until the next. ``"fresh"`` (a reference, not
            something a deployment has): in addition, every :data:`FRESH_STEP_S` every dispatcher
            hears every cluster's true state (:meth:`testbed.sim.clusters.Cluster.fresh`: queued,
            in handling and on the wire toward it), so no decision is older than that step. The
            dispatch rule is the same in both (:class:`testbed.model.dispatch.Dispatcher`); only what it
            hears differs (Mitzenmacher, "How useful is old information?", IEEE TPDS 2000).

    Raises:
        SimError: an unknown policy or source.
    """

    def __init__(self, plan: Plan, seed: int | None = None, policies: dict[str, str] | None = None,
                 record: bool = False, service: Callable[[str, str], ServiceSampler] | None = None,
                 track_resolved: bool = True, view: str = "reports"):
        if view not in VIEWS:
            raise SimError(f"view {view!r}: one of {', '.join(VIEWS)}")
        self.view = view
        self._view_k = 1
        self.plan = plan
        exp = self.exp = plan.experiment
        self.seed = exp.seed if seed is None else int(seed)
        self.record = record
        self.R = float(exp.report_interval_s)
        self.now_s = 0.0
        self.policy_names: list[str] = list(pol.CATALOGUE)
        #: per policy of :attr:`policy_names` (same index): the decision cost charged (s; td - t0)
        self.decision_s: list[float] = [self._decision_s(p) for p in self.policy_names]
        self.base_dir = Path(plan.base_dir)  # the experiment file's folder: where its traces are read
        self.q = Queries()
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
        self._sent = [[0] * len(self.clusters) for _ in self.sources]  # queries per (source, cluster)
        self.next_report = self.R
        self._window_end = 0.0
        self.arrivals_end = INF  # no query is created at or after this time (s)

    def _init_models(self) -> None:
        self.model_names: list[str] = sorted(self.plan.models)
        self.model_index = {m: i for i, m in enumerate(self.model_names)}
        self.accuracy = [self.plan.models[m].accuracy for m in self.model_names]

    def _init_clusters(self, service: Callable[[str, str], ServiceSampler] | None) -> None:
        plan, mi = self.plan, self.model_index
        self.clusters: list[Cluster] = []
        for ci, h in enumerate(plan.clusters):
            figs = {mi[m]: f for m, f in plan.services[h.name].items()}
            samplers: dict[int, ServiceSampler] = {}
            for m, f in figs.items():
                rng = seeds.service(seeds.run_key(self.seed), ci, m)
                samplers[m] = service(h.name, self.model_names[m]) if service else ServiceSampler.bootstrap(f, rng)
            queue = plan.queue(h.name).server_queue(mi)
            self.clusters.append(Cluster(self.q, self.res_heap, ci, h.name, h.tier or "", queue, figs, samplers,
                                         self._batch_sampler_fn(ci, figs, samplers, service is not None)))
        self.cl_index = {c.name: c.idx for c in self.clusters}

    def _batch_sampler_fn(self, ci: int, figs: dict[int, ServiceFigures], samplers: dict[int, ServiceSampler],
                          hooked: bool) -> BatchSamplers:
        """The samplers of cluster ``ci``'s batched calls (the test hook's, one per model, when ``hooked``)."""
        prefix = seeds.batch_service_prefix(seeds.run_key(self.seed), ci)
        return BatchSamplers(prefix, figs, samplers if hooked else None)

    def _init_arrivals(self) -> None:
        self.streams: list[tuple[int, int, object]] = []  # (source, app, process)
        for wi, w in enumerate(self.exp.workload):
            for s, weight in self.plan.weights[wi].items():
                rng = seeds.arrivals(seeds.run_key(self.seed), wi, self.src_index[s])
                self.streams.append((self.src_index[s], self.app_index[w.application],
                                     arrival_process(w, rng, weight, self.base_dir)))
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
            self.dispatchers.append(Dispatcher(self.plan.options(s), p, seeds.dispatcher(seeds.run_key(self.seed), si)))

    def _init_events(self) -> None:
        self.changes = list(self.plan.changes)
        self._ev_i = 0

    @property
    def src_policy(self) -> list[str]:
        """The policy in force per source (index = source index)."""
        return [d.policy for d in self.dispatchers]

    @property
    def dispatched(self) -> int:
        """Queries created so far."""
        return len(self.q)

    def _check_policy(self, p: str) -> None:
        """``p`` resolves (a registered policy or a plug-in, :data:`testbed.model.policies.REGISTRY`);
        a plug-in joins :attr:`policy_names` (the records' policy column indexes it)."""
        try:
            pol.REGISTRY.resolve(p)
        except InputError as exc:
            raise SimError(str(exc)) from None
        if p not in self.policy_names:
            self.policy_names.append(p)
            self.decision_s.append(self._decision_s(p))

    def _decision_s(self, p: str) -> float:
        """The cost (s) charged to each decision of policy ``p``: the plan's ``decision_ms`` (fixed
        at plan time, so a plan simulated again gives the same run), else the policy's own
        (:attr:`testbed.model.policies.Policy.decision_ms`: 0 for a built-in one)."""
        ms = self.plan.decision_ms.get(p)
        return (pol.REGISTRY.resolve(p).decision_ms if ms is None else ms) / 1e3

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
            NotImplementedError: a cluster batches (the causal planner does not redraw batched calls).
            SimError: arrivals were already drawn beyond now (not at a report boundary).
        """
        if self._window_end > self.now_s + 1e-12:
            raise SimError(f"reseed at {self.now_s:.6f} s: arrivals are drawn up to {self._window_end:.6f} s "
                           "(reseed at a report boundary)")
        base = seeds.reseed_key(self.seed, salt)
        for k, (_, _, proc) in enumerate(self.streams):
            proc.reseed(seeds.reseeded_arrivals(base, k), self.now_s)
        for c in self.clusters:
            if c.queue.max_batch > 1:
                raise NotImplementedError(f"cluster {c.name}: a batching cluster cannot be reseeded")
            for m, smp in c.samplers.items():
                smp.reseed(seeds.service(base, c.idx, m))
        for si, d in enumerate(self.dispatchers):
            d.ctx.rng = seeds.dispatcher(base, si)
        self.loss_rng = [seeds.loss(base, i) for i in range(len(self.sources))]

    def clone(self) -> Simulator:
        """An independent copy of the whole state (queues, queries, reports, random streams) that
        continues exactly as this one would: run both to the same time with the same policies and
        they give the same queries (common random numbers; :meth:`reseed` gives a copy another
        future). What a run never changes (the plan, the service figures, the dispatchers' option
        specs) is shared; the query columns are copied column by column (:class:`Queries`)."""
        memo: dict[int, object] = {id(v): v for v in (self.plan, self.exp, self.apps)}
        for c in self.clusters:
            for f in c.figures.values():
                memo[id(f)] = f
        for d in self.dispatchers:
            memo[id(d.specs)] = d.specs
        return copy.deepcopy(self, memo)

    def source_view(self, source: str) -> SourceView:
        """What ``source``'s dispatcher knows (:class:`SourceView`, read-only, live).

        Raises:
            SimError: unknown source.
        """
        if source not in self.src_index:
            raise SimError(f"unknown source {source!r}; known: {', '.join(self.sources)}")
        return SourceView(self, self.src_index[source])

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

    def run_until(self, t_s: float) -> None:
        """Advance simulated time to ``t_s`` (s), processing every arrival, report and event before it."""
        fresh = self.view == "fresh"
        while self.now_s < t_s:
            stop = min(t_s, self.next_report)
            if fresh:
                stop = min(stop, self._view_k * FRESH_STEP_S)
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
            if fresh and stop >= self._view_k * FRESH_STEP_S - 1e-12:
                self._hear_fresh(stop)
                while self._view_k * FRESH_STEP_S <= stop + 1e-12:
                    self._view_k += 1
            if stop == t_s:
                break

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
        new: list[list[int]] = [[] for _ in range(nC)]
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

    def _dispatch(self, si: int, items: list[tuple[list[float], int]], new: list[list[int]],
                  sent: tuple[np.ndarray, np.ndarray]) -> None:
        """Create the queries of source ``si`` (times, application) and route them to clusters:
        one decision per query, queries with the same decision created together."""
        disp = self.dispatchers[si]
        for t_list, ai in items:
            app = self.apps[ai]
            self._created[(si, ai)] = self._created.get((si, ai), 0) + len(t_list)
            made = disp.decisions_made
            decisions = disp.dispatch_many(app.deadline_ms, app.min_accuracy, len(t_list), app.family, t_list)
            made = disp.decisions_made - made  # the first `made` queries' decisions were made (the rest cached)
            d0 = decisions[0]
            if decisions.count(d0) == len(decisions):  # one decision, made for the first `made` queries
                if made == len(t_list) or made == 0:
                    self._create(si, ai, d0, t_list, new, sent, made > 0)
                else:
                    self._create(si, ai, d0, t_list[:made], new, sent, True)
                    self._create(si, ai, d0, t_list[made:], new, sent, False)
                continue
            groups: dict[tuple[pol.Decision, bool], list[float]] = {}
            for i, (t0, d) in enumerate(zip(t_list, decisions, strict=True)):
                groups.setdefault((d, i < made), []).append(t0)
            for (d, decided), ts in groups.items():
                self._create(si, ai, d, ts, new, sent, decided)

    def _create(self, si: int, ai: int, d: pol.Decision, ts: list[float],
                new: list[list[int]],
                sent: tuple[np.ndarray, np.ndarray], decided: bool = True) -> None:
        """Append the queries created at times ``ts`` by source ``si`` for application ``ai``, all
        sent to the same (cluster, model) ``d``, to the query columns and to the cluster's arrivals.
        ``sent``: (request bytes, queries) per (source, cluster) of this step, for link
        utilization; a query's response is counted with it (our bookkeeping choice). ``decided``:
        the policy made these queries' decisions (else the dispatcher's cache gave them, at no
        cost): each then leaves the source the policy's decision cost after its creation (td)."""
        q = self.q
        k = len(ts)
        ci, m = self.cl_index[d.cluster], self.model_index[d.model]
        dl_s = self.apps[ai].deadline_ms / 1e3
        pi = self.policy_names.index(self.dispatchers[si].policy)
        cost = self.decision_s[pi] if decided else 0.0
        f, bk = self.fwd_app[ai][si][ci] + cost, self.back_s[si][ci]  # the request leaves at td
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
        for col, v in ((q.src, si), (q.app, ai), (q.cl, ci), (q.model, m), (q.pol, pi)):
            col.extend([v] * k)
        q.fb.extend(bytes([int(d.fallback)]) * k)
        q.released.extend(bytes(k))
        nones = [None] * k
        for col in (q.t1h, q.t2, q.t3, q.t3h, q.t4, q.status, q.qlen, q.batch):
            col.extend(nones)
        q.t0.extend(ts)
        q.td.extend([t + cost for t in ts] if cost else ts)
        q.t1.extend(t1)
        q.dl.extend(dls)
        q.back.extend(back)
        if f < INF:
            new[ci].extend(idx)
        sent[0][si, ci] += k * nbytes
        sent[1][si, ci] += k
        self._sent[si][ci] += k
        if self.res_heap is not None:
            push, res = heapq.heappush, self.res_heap
            for t, qi in zip(dls, idx, strict=True):
                push(res, (t, qi))
        if self.record:
            warm = self.warmup_s
            self.queries_recorded.extend(qi for qi, t in zip(idx, ts, strict=True) if t >= warm)

    def _report(self, t: float) -> None:
        """Every report interval: the dispatchers hear each cluster; link utilization is computed."""
        reports = [(c.name, c.snapshot(t, self.R)) for c in self.clusters]
        for d in self.dispatchers:
            d.hear_all(reports)
        self._count_link_bytes(self._resp, wire_bytes(self.resp_bytes, self.net.mss), 1)
        self._resp[:] = 0
        self._link_report(t)

    def _hear_fresh(self, t: float) -> None:
        """``view="fresh"``: every dispatcher hears every cluster's true state now."""
        for d in self.dispatchers:
            d.hear_all([(c.name, c.fresh(t, d.heard[c.name].utilization if c.name in d.heard else 0.0))
                        for c in self.clusters])

    def _apply(self, ch, t: float) -> None:
        """One step of the events' timeline: its kind (:mod:`testbed.model.timeline`) applied to the
        cluster (:class:`_ClusterAt`), or to the network's link, which then reroutes."""
        if ch.entry.target == "cluster":
            ch.entry.apply(ch, _ClusterAt(self, ch, t))
        else:
            self.net.apply(ch)
            self._route()


class _ClusterAt:
    """A cluster as an event changes it at virtual time ``t`` (the simulator's
    :class:`testbed.model.timeline.ClusterControl`): down until the next change of the timeline that
    brings it back up (a ``stop`` resumes then), or up."""

    def __init__(self, sim: Simulator, ch, t: float):
        self._sim, self._ch, self._t = sim, ch, t

    def set_up(self, up: bool, mode: str) -> None:
        sim, name = self._sim, self._ch.cluster
        cluster = sim.clusters[sim.cl_index[name]]
        if up:
            cluster.up(self._t)
            return
        resume = next((c.t_s for c in sim.changes[sim._ev_i + 1:] if c.cluster == name and c.entry.sets_up), INF)
        cluster.down(self._t, mode, resume)


class SourceView:
    """What one source's dispatcher knows, read-only: :meth:`Simulator.source_view`. A live view:
    each read is of the simulator now."""

    def __init__(self, sim: Simulator, si: int):
        self._sim, self._si = sim, si

    @property
    def name(self) -> str:
        return self._sim.sources[self._si]

    @property
    def policy(self) -> str:
        """The policy in force for the queries this source creates now."""
        return self._sim.dispatchers[self._si].policy

    def heard(self) -> dict[str, dict]:
        """Per cluster ``{queue_len, busy, workers, utilization, up}`` as last heard (the last report)."""
        return self._sim.dispatchers[self._si].heard_state()

    def report_age_s(self) -> dict[str, float]:
        """Per cluster: s since its last report was heard (now, when none was)."""
        now = self._sim.now_s
        return {c: (now - h.at_s if h.at_s is not None else now)
                for c, h in self._sim.dispatchers[self._si].heard.items()}

    def sent(self) -> dict[str, int]:
        """Per cluster: queries this source has sent to it since the start (clusters with none left out)."""
        return {c.name: n for c, n in zip(self._sim.clusters, self._sim._sent[self._si], strict=True) if n}

    def options_for(self, family: str = "") -> list[pol.Option]:
        """The (cluster, model) options of an application of model ``family``, on what was last heard."""
        return self._sim.dispatchers[self._si].options_for(family)

    def would_pick(self, policy: str, deadline_ms: float, min_accuracy: float, family: str = "") -> tuple[str, str]:
        """(cluster, model) ``policy`` would pick now for one query of that application, decided on
        a copy of the dispatcher's context (its random stream and round-robin state are left as they are)."""
        d = self._sim.dispatchers[self._si]
        ctx = copy.deepcopy(d.ctx)
        ctx.now_s = self._sim.now_s
        dec = pol.decide(policy, d.options_for(family), deadline_ms, min_accuracy, ctx)
        return dec.cluster, dec.model


__all__ = ["Resolved", "ServiceSampler", "SimError", "Simulator", "SourceView"]
