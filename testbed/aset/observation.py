"""The per-window observation of one dispatcher: ONE construction for simulator and emulation.

Both Gymnasium environments and the live selector first reduce their world to the same raw
*window state* of one source (the dict the emulation's dispatcher passes every window)::

    {"arrivals":  {application: queries created in the window},
     "clusters":  {cluster: {"queue_len", "busy", "workers", "utilization", "up"}}  # as last heard (stale)
     "path_util": {cluster: max link utilization 0..1 on the path source -> cluster},
     "resolved":  [(application, success: bool[, t0_s]), ...]   # resolved during the window
     "policy":    current policy name}

and then call :meth:`SourceObserver.observe`, which keeps the K-window history and returns the
feature vector. Features (system-model.md, "ASET"), in this order, every one clipped to
[0, clip]:

====================================  ===================  ==========================================
feature                               length               normalisation
====================================  ===================  ==========================================
arrival rate per app, last K windows  n_apps x K           count / window_s / rate_scale_qps
per cluster: utilization              n_clusters           as reported, 0..1
per cluster: queue length per worker  n_clusters           queue_len / workers / queue_scale
per cluster: RTT from this source     n_clusters           rtt_ms / rtt_scale_ms
per cluster: up                       n_clusters           1 reachable / 0 down (our addition: the
                                                           cluster-failure scenario needs it)
per app: success ratio, last window   n_apps               resolved in the window; the previous value
                                                           when none resolved; 1.0 at the start
per cluster: path link utilization    n_clusters           max over the path's links, 0..1
current policy, one-hot               n_policies           -
====================================  ===================  ==========================================
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from testbed.aset.config import ObservationSpec


@dataclass(frozen=True)
class SourceContext:
    """What is fixed for one dispatcher: names in feature order and its RTT to each cluster (ms).

    ``policies`` is the action space: the policy catalogue in its fixed order.
    """

    source: str
    applications: tuple[str, ...]
    clusters: tuple[str, ...]
    rtt_ms: tuple[float, ...]
    policies: tuple[str, ...]

    def __post_init__(self) -> None:
        if len(self.rtt_ms) != len(self.clusters):
            raise ValueError(f"source {self.source!r}: {len(self.rtt_ms)} RTTs for {len(self.clusters)} clusters")
        if not self.policies:
            raise ValueError(f"source {self.source!r}: empty policy catalogue")


def observation_size(n_apps: int, n_clusters: int, n_policies: int, history_windows: int) -> int:
    """Length of the feature vector (see the module table)."""
    return n_apps * history_windows + 5 * n_clusters + n_apps + n_policies


def _num(d: Mapping, key: str, default: float) -> float:
    v = d.get(key, default)
    try:
        return float(v)
    except (TypeError, ValueError):
        return default


class SourceObserver:
    """Turns the window states of one source into observations (keeps the K-window history)."""

    def __init__(self, ctx: SourceContext, spec: ObservationSpec):
        self.ctx = ctx
        self.spec = spec
        self.size = observation_size(len(ctx.applications), len(ctx.clusters), len(ctx.policies),
                                     spec.history_windows)
        self.reset()

    def reset(self) -> None:
        """Forget the history (start of an episode): zero rates, success ratio 1.0."""
        k = self.spec.history_windows
        self.rates = {a: deque([0.0] * k, maxlen=k) for a in self.ctx.applications}
        self.success = {a: 1.0 for a in self.ctx.applications}

    def observe(self, state: Mapping) -> np.ndarray:
        """Push one window state (module docstring) into the history; return the observation.

        Returns:
            float32 array of shape (size,), every value in [0, spec.clip]. Unknown applications,
            clusters or policies in ``state`` are ignored; a missing cluster counts as down.
        """
        spec, ctx = self.spec, self.ctx
        window_s = spec.window_ms / 1e3
        arrivals = state.get("arrivals") or {}
        for a in ctx.applications:
            self.rates[a].append(float(arrivals.get(a, 0)) / window_s / spec.rate_scale_qps)
        done: dict[str, list[int]] = {}
        for r in state.get("resolved") or ():
            app, ok = r[0], r[1]  # (application, success[, t0_s, ...])
            if app in self.success:
                done.setdefault(app, [0, 0])
                done[app][0] += int(bool(ok))
                done[app][1] += 1
        for app, (ok, n) in done.items():
            self.success[app] = ok / n
        clusters = state.get("clusters") or {}
        path_util = state.get("path_util") or {}
        util, qpw, rtt, up, putil = [], [], [], [], []
        for c, r in zip(ctx.clusters, ctx.rtt_ms, strict=True):
            cs = clusters.get(c)
            alive = cs is not None and bool(cs.get("up", True))
            workers = max(1.0, _num(cs or {}, "workers", 1.0))
            util.append(_num(cs, "utilization", 0.0) if alive else 0.0)
            qpw.append(_num(cs, "queue_len", 0.0) / workers / spec.queue_scale if alive else 0.0)
            rtt.append(r / spec.rtt_scale_ms)
            up.append(1.0 if alive else 0.0)
            putil.append(_num(path_util, c, 0.0))
        onehot = [1.0 if p == state.get("policy") else 0.0 for p in ctx.policies]
        feats = [x for a in ctx.applications for x in self.rates[a]]
        feats += util + qpw + rtt + up + [self.success[a] for a in ctx.applications] + putil + onehot
        return np.clip(np.asarray(feats, dtype=np.float32), 0.0, spec.clip)


def contexts_from_live_cfg(cfg: Mapping, policies: Sequence[str]) -> SourceContext:
    """The :class:`SourceContext` of the emulation's source config (the JSON ``testbed.run``
    writes): ``source``, ``applications`` [{name, ...}], ``options`` [{cluster, model, rtt_ms, ...}].
    The RTT of a cluster is the smallest over its options. Clusters sort by name."""
    rtt: dict[str, float] = {}
    for o in cfg["options"]:
        rtt[o["cluster"]] = min(rtt.get(o["cluster"], float("inf")), float(o["rtt_ms"]))
    clusters = tuple(sorted(rtt))
    return SourceContext(cfg["source"], tuple(sorted(a["name"] for a in cfg["applications"])), clusters,
                         tuple(rtt[c] for c in clusters), tuple(policies))
