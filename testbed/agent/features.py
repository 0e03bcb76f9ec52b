"""The general agent's features: local features of one dispatcher and, per policy, features of what
that policy would do now, from the raw window state of :mod:`testbed.agent.observation` (the
general agent's selector builds them in every engine: :mod:`testbed.agent.general`).

The plan-based observation (:mod:`testbed.agent.observation`) is a vector laid out by the
experiment's names (a block per cluster, a block per application, a one-hot per source), so a
checkpoint fits only the experiment it was trained on. This one has no block per name: it is

- ``local``: :data:`LOCAL_FEATURES`, one vector per (source, window) whatever the number of
  clusters, applications or sources;
- ``per_policy``: :data:`POLICY_FEATURES` for each policy p of the checkpoint's list, one row per
  policy: what p would do for this source's next window. The source's dispatcher
  (:class:`testbed.model.dispatch.Dispatcher`, the same class both engines dispatch with) is
  rebuilt from the source's (cluster, model) options and the load it last heard, and the window's
  expected queries (the arrival rate of the last ``history_windows`` windows, at most
  :data:`PROBE_QUERIES`, at least one per application) are dispatched with p on that copy: the
  load-aware policies see their own sends, ``random`` draws from a generator seeded 0. Each probe
  query contributes what its pick would give (expected RTT, service time, heard queue wait, all
  over the deadline; whether it is expected late; the report age, in-flight queries, path
  utilization, reported utilization and recently measured latency at the picked cluster; its
  tier), averaged over the probe, plus how p spreads the probe (the largest share on one cluster,
  the number of clusters used, the highest projected load) and whether p is in force now.

A scorer (:class:`testbed.agent.general.GeneralPolicy`) maps ``[local, row_p, row_p - mean_q row_q]``
to Q(s, p) with one network shared by every policy: no identity one-hot, no lookup by name. The
names of sources, clusters and applications enter only where the policies themselves use them
(their tie-breaks by cluster name, ``round_robin``'s order), never as features.

Window state (the dict of :mod:`testbed.agent.observation`; the same keys)::

    {"arrivals": {application: n}, "clusters": {cluster: {queue_len, busy, workers, utilization, up}},
     "path_util": {cluster: 0..1}, "resolved": [(application, success, t0_s[, cluster, e2e_ms]), ...],
     "in_flight": {cluster: n}, "report_age_s": {cluster: s}, "policy": name}

Bounds (:data:`MAX_CLUSTERS`, :data:`MAX_APPLICATIONS`, :data:`MAX_POLICIES`): checked by
:class:`FeatureContext`; any number of sources (each source is one row of decisions).
Normalisation: rates by ``ObservationSpec.rate_scale_qps``, queues per worker by ``queue_scale``,
report ages by the window; every feature is clipped to [-clip, clip] (``ObservationSpec.clip``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from testbed.model.dispatch import Dispatcher, Heard, OptionSpec
from testbed.model.policies import REGISTRY
from testbed.model.records import GRACE_MS
from testbed.spec.aset import ObservationSpec

#: Largest number of clusters, applications (per source) and policies the general observation takes.
#: Our bounds: the probe's cost grows with them (a window's features of 8 sources x 7 policies take
#: a few ms on one core at these sizes), not a limit of the features' shapes.
MAX_CLUSTERS = 64
MAX_APPLICATIONS = 16
MAX_POLICIES = 32
#: Most queries dispatched on the copy per (source, window, policy); each application gets at least one.
PROBE_QUERIES = 24

LOCAL_FEATURES: tuple[str, ...] = (
    "rate",           # queries created in the last window / window_s / rate_scale_qps
    "rate_mean",      # the same, mean over the last history_windows windows
    "rate_trend",     # rate - rate_mean (signed)
    "own_load",       # rate (q/s) / the clusters' capacity (sum of workers x 1000 / fastest service ms)
    "success",        # success ratio of this source's queries resolved in the last window (previous if none)
    "success_min",    # the lowest per-application success ratio, same window
    "up_share",       # share of the clusters heard up
    "util_mean",      # reported utilization, mean over the clusters heard up
    "util_max",       # ... and the highest
    "queue_mean",     # reported queue + busy per worker / queue_scale, mean over clusters up
    "path_util_max",  # highest path utilization to any cluster
    "measured_mean",  # mean measured latency (e2e / deadline) over the clusters with one
    "in_flight",      # this source's queries in flight / all workers / queue_scale
)

POLICY_FEATURES: tuple[str, ...] = (
    "e2e",              # (RTT + heard queue wait + service) / deadline of the pick, probe mean
    "rtt",              # RTT / deadline
    "service",          # expected service time / deadline
    "wait",             # expected queue wait / deadline (from the last report and the probe's own sends)
    "late",             # share of the probe expected past its deadline
    "fallback",         # share where the policy found no feasible pair
    "accuracy_margin",  # accuracy - minimum accuracy of the pick
    "target_up",        # share sent to clusters heard up
    "report_age",       # age of the picked cluster's report / window
    "in_flight",        # this source's in-flight queries at the pick, per worker / queue_scale
    "path_util",        # path utilization to the pick
    "measured",         # latency measured there recently (e2e / deadline), 0 when none
    "measured_known",   # share of the probe sent where a latency was measured
    "utilization",      # reported utilization of the pick
    "cloud",            # share of the probe sent to the cloud tier
    "near_edge",        # ... near edge
    "far_edge",         # ... far edge
    "concentration",    # largest share of the probe on one cluster
    "spread",           # clusters used / clusters up
    "end_load",         # highest projected queries per worker at a used cluster after the probe / queue_scale
    "current",          # 1 when the policy is the one in force
)


@dataclass(frozen=True)
class AppView:
    """An application as a dispatcher serves it: deadline D_a (ms), minimum accuracy A_a, model family."""

    name: str
    deadline_ms: float
    min_accuracy: float
    family: str = ""


@dataclass(frozen=True)
class FeatureContext:
    """What is fixed for one dispatcher: its (cluster, model) options (:class:`OptionSpec`, the
    plan's: both engines have them), the applications it creates queries of, and the policy list
    (the checkpoint's, in score order).

    Raises:
        ValueError: no option, no application, fewer than 2 or unknown policies, or beyond a bound
            (:data:`MAX_CLUSTERS`, :data:`MAX_APPLICATIONS`, :data:`MAX_POLICIES`), naming the source.
    """

    source: str
    options: tuple[OptionSpec, ...]
    applications: tuple[AppView, ...]
    policies: tuple[str, ...]

    def __post_init__(self) -> None:
        where = f"source {self.source!r}"
        if not self.options:
            raise ValueError(f"{where}: no (cluster, model) option")
        if not self.applications:
            raise ValueError(f"{where}: no application")
        n_c = len(self.clusters)
        if n_c > MAX_CLUSTERS:
            raise ValueError(f"{where}: {n_c} clusters, the general observation takes at most {MAX_CLUSTERS}")
        if len(self.applications) > MAX_APPLICATIONS:
            raise ValueError(f"{where}: {len(self.applications)} applications, the general observation takes at "
                             f"most {MAX_APPLICATIONS}")
        if not 2 <= len(self.policies) <= MAX_POLICIES:
            raise ValueError(f"{where}: {len(self.policies)} policies, need 2 to {MAX_POLICIES}")
        for p in self.policies:
            REGISTRY.resolve(p, f"{where}: policy")

    @property
    def clusters(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(o.cluster for o in self.options))


def probe_counts(expected: Sequence[float], cap: int = PROBE_QUERIES) -> list[int]:
    """Probe queries per application: the expected queries of the next window (``expected``, one
    per application) rounded, at least 1 each, scaled down to ``cap`` in all when above it."""
    n = [max(1, int(round(x))) for x in expected]
    total = sum(n)
    if total > cap:
        n = [max(1, int(x * cap / total)) for x in n]
    return n


class PolicyFeaturizer:
    """Turns one dispatcher's window states into ``(local, per_policy)`` (module docstring); keeps
    the history (arrival counts, success ratios, measured latency per cluster)."""

    def __init__(self, ctx: FeatureContext, spec: ObservationSpec):
        self.ctx, self.spec = ctx, spec
        self.window_s = spec.window_ms / 1e3
        self.clusters = ctx.clusters
        self.workers = {o.cluster: max(1, o.workers) for o in ctx.options}
        self.tier = {o.cluster: o.tier for o in ctx.options}
        fastest: dict[str, float] = {}
        for o in ctx.options:
            fastest[o.cluster] = min(fastest.get(o.cluster, float("inf")), max(o.service_ms, 1e-3))
        self.capacity_qps = sum(self.workers[c] * 1e3 / fastest[c] for c in self.clusters)
        # Applications in probe order: by deadline and accuracy (the name breaks exact ties only).
        self.apps = sorted(ctx.applications, key=lambda a: (a.deadline_ms, a.min_accuracy, a.name))
        self._deadline = {a.name: a.deadline_ms for a in ctx.applications}
        self.reset()

    def reset(self) -> None:
        """Forget the history (start of an episode)."""
        k = self.spec.history_windows
        self.counts = {a.name: deque([0.0] * k, maxlen=k) for a in self.apps}
        self.success = {a.name: 1.0 for a in self.apps}
        self.measured: dict[str, float] = {}

    # -- history -------------------------------------------------------------------------------
    def _absorb(self, state: Mapping) -> float:
        arrivals = state.get("arrivals") or {}
        for a in self.apps:
            self.counts[a.name].append(float(arrivals.get(a.name, 0) or 0))
        done: dict[str, list[int]] = {}
        late: dict[str, list[float]] = {}
        ok_all = n_all = 0
        for r in state.get("resolved") or ():
            app, ok = r[0], bool(r[1])
            if app in self.success:
                done.setdefault(app, [0, 0])
                done[app][0] += ok
                done[app][1] += 1
                ok_all, n_all = ok_all + ok, n_all + 1
            d = self._deadline.get(app)
            if len(r) >= 5 and d and r[3] in self.workers:
                late.setdefault(r[3], []).append((d + GRACE_MS) / d if r[4] is None else float(r[4]) / d)
        for app, (ok, n) in done.items():
            self.success[app] = ok / n
        for c, xs in late.items():
            self.measured[c] = sum(xs) / len(xs)
        return ok_all / n_all if n_all else float("nan")

    # -- features ------------------------------------------------------------------------------
    def observe(self, state: Mapping) -> tuple[np.ndarray, np.ndarray]:
        """Push one window state into the history; return the features.

        Returns:
            ``local`` float32 (len(LOCAL_FEATURES),) and ``per_policy`` float32 (n_policies,
            len(POLICY_FEATURES)), every value in [-clip, clip]. Unknown applications and
            clusters in ``state`` are ignored; a cluster missing from ``state["clusters"]`` counts
            as down; a missing ``in_flight`` / ``report_age_s`` / ``path_util`` counts as 0.
        """
        overall = self._absorb(state)
        local = self._local(state, overall)
        rows = np.stack([self._policy_row(p, state) for p in self.ctx.policies])
        c = float(self.spec.clip)
        return np.clip(local, -c, c).astype(np.float32), np.clip(rows, -c, c).astype(np.float32)

    def _local(self, state: Mapping, overall: float) -> np.ndarray:
        spec, ws = self.spec, self.window_s
        last = sum(q[-1] for q in self.counts.values())
        mean = sum(sum(q) / len(q) for q in self.counts.values())
        heard = state.get("clusters") or {}
        ups = [c for c in self.clusters if c in heard and bool(heard[c].get("up", True))]
        util = [float(heard[c].get("utilization", 0.0) or 0.0) for c in ups]
        queue = [(float(heard[c].get("queue_len", 0) or 0) + float(heard[c].get("busy", 0) or 0))
                 / max(1.0, float(heard[c].get("workers", 1) or 1)) for c in ups]
        path = state.get("path_util") or {}
        in_flight = state.get("in_flight") or {}
        if overall != overall:  # NaN: nothing resolved in the window
            overall = getattr(self, "_overall", 1.0)
        self._overall = overall
        measured = [self.measured[c] for c in self.clusters if c in self.measured]
        return np.array([
            last / ws / spec.rate_scale_qps, mean / ws / spec.rate_scale_qps, (last - mean) / ws / spec.rate_scale_qps,
            (last / ws) / self.capacity_qps if self.capacity_qps > 0 else 0.0,
            overall, min(self.success.values()), len(ups) / len(self.clusters),
            float(np.mean(util)) if util else 0.0, max(util, default=0.0),
            float(np.mean(queue)) / spec.queue_scale if queue else 0.0,
            max((float(path.get(c, 0.0) or 0.0) for c in self.clusters), default=0.0),
            float(np.mean(measured)) if measured else 0.0,
            sum(float(in_flight.get(c, 0) or 0) for c in self.clusters) / sum(self.workers.values()) / spec.queue_scale,
        ], dtype=np.float64)

    def _probe(self, policy: str, heard: Mapping) -> list[tuple]:
        """The probe of ``policy`` (module docstring): (application, option at decision, fallback) per query."""
        disp = Dispatcher(self.ctx.options, policy, np.random.default_rng(0))
        disp.hear_all((c, Heard.of(heard.get(c), self.workers[c])) for c in self.clusters)
        k = self.spec.history_windows
        counts = probe_counts([sum(self.counts[a.name]) / k for a in self.apps])
        order = [a for i in range(max(counts)) for a, n in zip(self.apps, counts, strict=True) if i < n]
        out = []
        for a in order:
            d = disp.decide(a.deadline_ms, a.min_accuracy, a.family)
            opt = next(o for o in disp.options_for(a.family) if o.cluster == d.cluster and o.model == d.model)
            disp.note_sent(d.cluster)
            out.append((a, opt, d.fallback))
        self._end_load = {c: (disp.heard[c].queue_len + disp.heard[c].busy + disp.sent[c]) / self.workers[c]
                          for c in self.clusters}
        return out

    def _policy_row(self, policy: str, state: Mapping) -> np.ndarray:
        spec, ws = self.spec, self.window_s
        heard = state.get("clusters") or {}
        age, path = state.get("report_age_s") or {}, state.get("path_util") or {}
        in_flight = state.get("in_flight") or {}
        probe = self._probe(policy, heard)
        x = np.zeros((len(probe), 17))
        used: dict[str, int] = {}
        for i, (a, o, fb) in enumerate(probe):
            d = max(a.deadline_ms, 1e-3)
            e2e = (o.rtt_ms + o.queue_wait_ms + o.service_ms) / d
            c = o.cluster
            h = heard.get(c) or {}
            m = self.measured.get(c)
            x[i] = (e2e, o.rtt_ms / d, o.service_ms / d, o.queue_wait_ms / d, float(e2e > 1.0), float(fb),
                    o.accuracy - a.min_accuracy, float(o.up), float(age.get(c, 0.0) or 0.0) / ws,
                    float(in_flight.get(c, 0) or 0) / self.workers[c] / spec.queue_scale,
                    float(path.get(c, 0.0) or 0.0), m or 0.0, float(m is not None),
                    float(h.get("utilization", 0.0) or 0.0) if o.up else 0.0,
                    float(o.tier == "cloud"), float(o.tier == "near_edge"), float(o.tier == "far_edge"))
            used[c] = used.get(c, 0) + 1
        n_up = sum(1 for c in self.clusters if c in heard and bool(heard[c].get("up", True))) or 1
        tail = [max(used.values()) / len(probe), len(used) / n_up,
                max(self._end_load[c] for c in used) / spec.queue_scale, float(policy == state.get("policy"))]
        return np.concatenate([x.mean(axis=0), tail])


def scorer_input(local: np.ndarray, per_policy: np.ndarray) -> np.ndarray:
    """The scorer's input rows, one per policy: ``[local, row_p, row_p - mean over policies]``.

    Args:
        local: (L,) or (B, L). per_policy: (P, F) or (B, P, F).

    Returns:
        (P, L + 2F) or (B, P, L + 2F) float32.
    """
    loc = np.asarray(local, np.float32)
    pp = np.asarray(per_policy, np.float32)
    rel = pp - pp.mean(axis=-2, keepdims=True)
    rep = np.repeat(loc[..., None, :], pp.shape[-2], axis=-2)
    return np.concatenate([rep, pp, rel], axis=-1)


#: Width of a scorer input row.
INPUT_SIZE = len(LOCAL_FEATURES) + 2 * len(POLICY_FEATURES)

__all__ = ["INPUT_SIZE", "LOCAL_FEATURES", "MAX_APPLICATIONS", "MAX_CLUSTERS", "MAX_POLICIES", "POLICY_FEATURES",
           "PROBE_QUERIES", "AppView", "FeatureContext", "PolicyFeaturizer", "probe_counts", "scorer_input"]
