"""The raw window state of a simulated source (:mod:`testbed.agent.observation`): ONE construction
for the ASET environments (:class:`testbed.aset.envs.WindowView`) and for a selector driving
``testbed simulate`` (:func:`testbed.sim.run.simulate`)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence


class SimWindowStates:
    """Builds each source's raw window state from a simulator: arrivals (``drain_created``), what
    the dispatcher last heard (``cluster_state(source)``) and how old it is, path utilization, the
    queries resolved in the window (with cluster and e2e), and the queries each source has in
    flight per cluster (sent, from ``Simulator.source_view``, minus resolved). A simulator without
    ``source_view`` (a test's fake) gives no report ages and no in-flight counts.

    Args:
        sim: the simulator (subclasses may instead override the :attr:`sim` property).
        sources: the source names, in row order.
        clusters: per source, the clusters whose path utilization its state carries.
    """

    def __init__(self, sim, sources: Sequence[str], clusters: Sequence[Sequence[str]]):
        self._sim = sim
        self.source_names = list(sources)
        self.cluster_names = [tuple(c) for c in clusters]
        self.index = {s: i for i, s in enumerate(self.source_names)}
        n = len(self.source_names)
        self.arrivals: list[dict[str, int]] = [defaultdict(int) for _ in range(n)]
        self.resolved: list[list[tuple]] = [[] for _ in range(n)]
        self.in_flight: list[dict[str, int]] = [defaultdict(int) for _ in range(n)]
        self._sent_seen: list[dict[str, int]] = [{} for _ in range(n)]
        sim = self.sim
        self.views = [sim.source_view(s) for s in self.source_names] if hasattr(sim, "source_view") else None

    @property
    def sim(self):
        """The simulator read."""
        return self._sim

    def absorb(self, resolved: list) -> None:
        """Take in one window: the queries created (and where they went) and ``resolved``, the
        queries resolved in it (``Simulator.drain_resolved``)."""
        sim = self.sim
        self.arrivals = [defaultdict(int) for _ in self.source_names]
        for src, app in sim.drain_created() if hasattr(sim, "drain_created") else ():
            i = self.index.get(src)
            if i is not None:
                self.arrivals[i][app] += 1
        if self.views is not None:
            for i, view in enumerate(self.views):
                sent, seen = view.sent(), self._sent_seen[i]
                for c, n in sent.items():
                    if n > seen.get(c, 0):
                        self.in_flight[i][c] += n - seen.get(c, 0)
                self._sent_seen[i] = sent
        self.resolved = [[] for _ in self.source_names]
        for r in resolved:
            i = self.index.get(r.source)
            if i is None:
                continue
            cluster = getattr(r, "cluster", None)
            if cluster is None:
                self.resolved[i].append((r.application, bool(r.success), r.t0_s))
                continue
            self.resolved[i].append((r.application, bool(r.success), r.t0_s, cluster, r.e2e_ms))
            if self.views is not None:
                self.in_flight[i][cluster] -= 1

    def state(self, i: int, policy: str) -> dict:
        """The raw window state of row ``i`` (:mod:`testbed.agent.observation`), ``policy`` the one
        in force."""
        source, sim = self.source_names[i], self.sim
        heard = sim.cluster_state(source)
        lu = sim.link_utilization()
        path_util = {c: max((lu.get((a, b), lu.get((b, a), 0.0)) for a, b in sim.path_links(source, c)),
                            default=0.0) for c in self.cluster_names[i]}
        age = self.views[i].report_age_s() if self.views is not None else {}
        return {"arrivals": dict(self.arrivals[i]), "clusters": heard, "path_util": path_util,
                "resolved": self.resolved[i], "in_flight": dict(self.in_flight[i]), "report_age_s": age,
                "policy": policy}


__all__ = ["SimWindowStates"]
