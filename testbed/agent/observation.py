"""The plan-based observation of one dispatcher: the vector every selector's
:class:`~testbed.agent.selector.Observation` carries, the input of the ``qnetwork`` checkpoint kind
(the paper's DQN, the rollout regression) and of ``testbed/AsetSim-v0``. The general agent's
features are another observation, :mod:`testbed.agent.features`; both are built from the same raw
window state.

Every engine first reduces its world to the raw *window state* of one source (the simulator:
:class:`testbed.sim.window.SimWindowStates`; the emulation: the source's dispatcher)::

    {"arrivals":  {application: queries created in the window},
     "clusters":  {cluster: {"queue_len", "busy", "workers", "utilization", "up"}}  # as last heard (stale)
     "path_util": {cluster: max link utilization 0..1 on the path source -> cluster},
     "resolved":  [(application, success: bool, t0_s[, cluster, e2e_ms]), ...]   # resolved in the window
     "in_flight": {cluster: this source's queries sent there and not resolved yet},      # optional
     "report_age_s": {cluster: s since that cluster's last report was heard},           # optional
     "policy":    current policy name}

and then call :meth:`SourceObserver.observe`, which keeps the K-window history and returns the
feature vector. Features (``docs/system-model.md``, "ASET"; those marked * go beyond the design
note the project started from), in this order (:func:`observation_layout`), every one clipped to [0, clip]:

=========================================  ==============  =====================================================
feature                                    length          normalisation
=========================================  ==============  =====================================================
arrival rate per app, last K windows       n_apps x K      count / window_s / rate_scale_qps
per cluster: utilization                   n_clusters      as reported, 0..1
per cluster: queue length per worker       n_clusters      queue_len / workers / queue_scale
per cluster: RTT from this source          n_clusters      plan RTT / rtt_scale_ms
per cluster: up                            n_clusters      1 reachable / 0 down (the failure scenarios need it)
per cluster: path link utilization         n_clusters      max over the path's links, 0..1
per cluster: measured latency *            n_clusters      mean e2e / deadline of this source's queries resolved
                                                           there in the window (no answer: 1 + grace / deadline);
                                                           the previous value when none; 0 at the start
per cluster: age of the last report *      n_clusters      report_age_s / window_s
per cluster: in-flight queries *           n_clusters      in_flight / workers / queue_scale
per app: success ratio, last window        n_apps          resolved in the window; the previous value when none
                                                           resolved; 1.0 at the start
current policy, one-hot                    n_policies      -
source identity, one-hot *                 n_sources       1 at this source's index in ``SourceContext.sources``
planned policy, one-hot (with ``plans``) * n_policies      1 at ``SourceContext.plan`` (docs/history.md)
=========================================  ==============  =====================================================

Measured latency is relative to each query's deadline so that one number per cluster covers
applications of different deadlines (our choice); it is what tells a link degradation or a reroute
apart, which the plan RTT (what the static policies use) does not show.

The source identity (without it the shared network, telling the sources apart only through their
plan RTTs, stayed below the best per-source static mix everywhere: docs/history.md, "ASET rounds") is a one-hot over
the experiment's sources in sorted-name order, the order of :func:`testbed.aset.envs.plan_contexts`
and of the exported policy's ``sources``. With it the first layer has one weight column per
source, so ONE shared network can learn a constant per-source assignment (the mix) as a per-source
bias and still share everything else. Our choice against a feature-based identity (the source's
site coordinates or its RTT vector, which the RTT features already are): it is exact for the few
sources of an experiment (4), needs no scale, and the checkpoint is tied to the experiment's names
anyway (its applications and clusters); what it gives up is generalising to a source not trained
on, which no experiment of ours has.

The planned policy (docs/history.md, "ASET rounds"; only when ``ObservationSpec.plans`` is set) is the
source's policy in the scenario's per-source static mix, which the simulator finds before
training (``testbed evaluate --headroom``). With ``AgentSpec.plan_margin`` it is the agent's
default decision (:func:`testbed.agent.npolicy.plan_scores`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from testbed.model.records import GRACE_MS
from testbed.spec.aset import ObservationSpec

#: Per-cluster features, in their order in the vector (see the module table).
CLUSTER_FEATURES: tuple[str, ...] = ("utilization", "queue", "rtt", "up", "path_util", "latency", "report_age",
                                     "in_flight")


@dataclass(frozen=True)
class SourceContext:
    """What is fixed for one dispatcher: names in feature order, its RTT to each cluster (ms) and
    each application's deadline (ms; for the measured-latency feature).

    ``policies`` is the action space: the policy names, in action-index order. ``sources``
    (keyword): every source of the experiment in source-id order (sorted by name); ``source`` is
    one of them and its index is the source-identity one-hot.
    """

    source: str
    applications: tuple[str, ...]
    clusters: tuple[str, ...]
    rtt_ms: tuple[float, ...]
    policies: tuple[str, ...]
    deadline_ms: tuple[float, ...] = ()
    sources: tuple[str, ...] = field(kw_only=True)
    plan: str | None = field(default=None, kw_only=True)

    def __post_init__(self) -> None:
        if self.source not in self.sources or len(set(self.sources)) != len(self.sources):
            raise ValueError(f"source {self.source!r}: not once in the experiment's sources {list(self.sources)} "
                             f"(the source-identity one-hot)")
        if len(self.rtt_ms) != len(self.clusters):
            raise ValueError(f"source {self.source!r}: {len(self.rtt_ms)} RTTs for {len(self.clusters)} clusters")
        if not self.policies:
            raise ValueError(f"source {self.source!r}: empty policy catalogue")
        if self.deadline_ms and len(self.deadline_ms) != len(self.applications):
            raise ValueError(f"source {self.source!r}: {len(self.deadline_ms)} deadlines for "
                             f"{len(self.applications)} applications")
        if self.plan is not None and self.plan not in self.policies:
            raise ValueError(f"source {self.source!r}: planned policy {self.plan!r} is not an action "
                             f"({', '.join(self.policies)})")

    @property
    def source_id(self) -> int:
        """This source's index in ``sources`` (where its identity one-hot is 1)."""
        return self.sources.index(self.source)


def observation_layout(n_apps: int, n_clusters: int, n_policies: int, history_windows: int,
                       n_sources: int, planned: bool = False) -> dict[str, slice]:
    """Where each block of the module table lies in the feature vector, in order: ``rates``, one
    block per :data:`CLUSTER_FEATURES` name, ``success``, ``policy``, ``source_id`` and, when
    ``planned``, ``plan`` (the last ``n_policies`` features)."""
    widths = [("rates", n_apps * history_windows), *((f, n_clusters) for f in CLUSTER_FEATURES),
              ("success", n_apps), ("policy", n_policies), ("source_id", n_sources)]
    if planned:
        widths.append(("plan", n_policies))
    out, at = {}, 0
    for name, width in widths:
        out[name] = slice(at, at + width)
        at += width
    return out


def observation_size(n_apps: int, n_clusters: int, n_policies: int, history_windows: int, n_sources: int,
                     planned: bool = False) -> int:
    """Length of the feature vector (see the module table)."""
    layout = observation_layout(n_apps, n_clusters, n_policies, history_windows, n_sources, planned)
    return max(s.stop for s in layout.values())


def context_size(ctx: SourceContext, spec: ObservationSpec) -> int:
    """Length of the feature vector of the source ``ctx`` under ``spec``."""
    return observation_size(len(ctx.applications), len(ctx.clusters), len(ctx.policies), spec.history_windows,
                            len(ctx.sources), spec.plans is not None)


def _num(d: Mapping | None, key: str, default: float) -> float:
    v = (d or {}).get(key, default)
    try:
        return float(v)
    except (TypeError, ValueError):
        return default


class SourceObserver:
    """Turns the window states of one source into observations (keeps the K-window history and
    the last measured latency per cluster and success ratio per application)."""

    def __init__(self, ctx: SourceContext, spec: ObservationSpec):
        self.ctx = ctx
        self.spec = spec
        self.size = context_size(ctx, spec)
        self._source_onehot = [1.0 if s == ctx.source else 0.0 for s in ctx.sources]
        if spec.plans is not None and ctx.plan is None:
            raise ValueError(f"source {ctx.source!r}: the observation has a plan block (observation.plans) but "
                             f"this source has no planned policy")
        self._plan_onehot = [1.0 if p == ctx.plan else 0.0 for p in ctx.policies] if spec.plans is not None else []
        self._deadline = dict(zip(ctx.applications, ctx.deadline_ms, strict=True)) if ctx.deadline_ms else {}
        self.reset()

    def reset(self) -> None:
        """Forget the history (start of an episode): zero rates and latencies, success ratio 1.0."""
        k = self.spec.history_windows
        self.rates = {a: deque([0.0] * k, maxlen=k) for a in self.ctx.applications}
        self.success = {a: 1.0 for a in self.ctx.applications}
        self.latency = {c: 0.0 for c in self.ctx.clusters}

    def _lateness(self, app: str, e2e_ms: float | None) -> float | None:
        d = self._deadline.get(app)
        if not d:
            return None
        return (d + GRACE_MS) / d if e2e_ms is None else float(e2e_ms) / d

    def _absorb_resolved(self, resolved: Sequence) -> None:
        done: dict[str, list[int]] = {}
        late: dict[str, list[float]] = {}
        for r in resolved or ():
            app, ok = r[0], r[1]
            if app in self.success:
                done.setdefault(app, [0, 0])
                done[app][0] += int(bool(ok))
                done[app][1] += 1
            if len(r) >= 5 and r[3] in self.latency:
                x = self._lateness(app, r[4])
                if x is not None:
                    late.setdefault(r[3], []).append(x)
        for app, (ok, n) in done.items():
            self.success[app] = ok / n
        for c, xs in late.items():
            self.latency[c] = sum(xs) / len(xs)

    def observe(self, state: Mapping) -> np.ndarray:
        """Push one window state (module docstring) into the history; return the observation.

        Returns:
            float32 array of shape (size,), every value in [0, spec.clip]. Unknown applications,
            clusters or policies in ``state`` are ignored; a missing cluster counts as down; a
            missing ``in_flight`` / ``report_age_s`` counts as 0.
        """
        spec, ctx = self.spec, self.ctx
        window_s = spec.window_ms / 1e3
        arrivals = state.get("arrivals") or {}
        for a in ctx.applications:
            self.rates[a].append(float(arrivals.get(a, 0)) / window_s / spec.rate_scale_qps)
        self._absorb_resolved(state.get("resolved") or ())
        clusters = state.get("clusters") or {}
        path_util = state.get("path_util") or {}
        in_flight = state.get("in_flight") or {}
        age = state.get("report_age_s") or {}
        cols: dict[str, list[float]] = {f: [] for f in CLUSTER_FEATURES}
        for c, r in zip(ctx.clusters, ctx.rtt_ms, strict=True):
            cs = clusters.get(c)
            alive = cs is not None and bool(cs.get("up", True))
            workers = max(1.0, _num(cs, "workers", 1.0))
            cols["utilization"].append(_num(cs, "utilization", 0.0) if alive else 0.0)
            cols["queue"].append(_num(cs, "queue_len", 0.0) / workers / spec.queue_scale if alive else 0.0)
            cols["rtt"].append(r / spec.rtt_scale_ms)
            cols["up"].append(1.0 if alive else 0.0)
            cols["path_util"].append(_num(path_util, c, 0.0))
            cols["latency"].append(self.latency[c])
            cols["report_age"].append(_num(age, c, 0.0) / window_s)
            cols["in_flight"].append(_num(in_flight, c, 0.0) / workers / spec.queue_scale)
        onehot = [1.0 if p == state.get("policy") else 0.0 for p in ctx.policies]
        feats = [x for a in ctx.applications for x in self.rates[a]]
        for f in CLUSTER_FEATURES:
            feats += cols[f]
        feats += [self.success[a] for a in ctx.applications] + onehot + self._source_onehot + self._plan_onehot
        return np.clip(np.asarray(feats, dtype=np.float32), 0.0, spec.clip)


__all__ = ["CLUSTER_FEATURES", "SourceContext", "SourceObserver", "context_size", "observation_layout",
           "observation_size"]
