"""The network on the simulator's virtual clock: routes, one-way message times, link bytes and
utilization (the model's :class:`~testbed.model.network.NetworkState`; routes recomputed after
every network event)."""

from __future__ import annotations

import math

import numpy as np
from scipy import sparse

from testbed.model import seeds
from testbed.model.network import message_ms

INF = math.inf


class Links:
    """The :class:`~testbed.sim.engine.Simulator`'s network part: ``fwd_app[a][s][c]`` request
    and ``back_s[s][c]`` response one-way times (s), loss per path, link bytes and utilization."""

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
        steps = plan.rtt_timelines()  # the model's rule for expected_rtt_ms: the path in force at td
        self.rtt_steps = [[steps[(s, c.name)] for c in self.clusters] for s in self.sources]
        self._link_bits = np.zeros((len(self.link_keys), 2))
        self._resp = np.zeros((len(self.sources), len(plan.clusters)))  # responses per (source, cluster)
        self._util_max, self._util_dict = np.zeros(len(self.link_keys)), None
        self._cap_version = -1  # the net's version the capacity and background arrays are of
        self.loss_rng = [seeds.loss(seeds.run_key(self.seed), i) for i in range(len(self.sources))]
        spans = plan.no_route_spans()  # the model's rule for an unanswered query's cause (unreachable)
        self.no_route = [[spans[(s, c.name)] for c in self.clusters] for s in self.sources]
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
                for a, b in zip(path, path[1:], strict=False):
                    li = lidx[(a, b)]
                    rows.append(si * nC + ci)
                    cols.append(li)
                    ab.append(self.link_keys[li] == (a, b))
                    self.path_li[si][ci].append(li)
                self.loss_pct[si, ci] = self.net.path_loss_pct(path)
                back[si, ci] = message_ms(self.net, path[::-1], self.resp_bytes, (hc, hs), self.per_hop_ms) / 1e3
                for ai, nb in enumerate(self.req_bytes_app):
                    fwd[ai][si, ci] = message_ms(self.net, path, nb, (hs, hc), self.per_hop_ms) / 1e3 + self.overhead_s
        self.back_s = back.tolist()
        self.fwd_app = [f.tolist() for f in fwd]
        # link x (source, cluster) incidence per direction of traversal, sparse (a few hops per
        # path): the transpose of the (source, cluster) x link one, kept so that a count per
        # (source, cluster) gives its per-link sum without a transpose per call
        ab_arr, r, c = np.array(ab, dtype=bool), np.array(rows, dtype=np.int64), np.array(cols, dtype=np.int64)
        self._inc_dir_t = tuple(sparse.csr_array((np.ones(int(m.sum())), (r[m], c[m])), shape=(nS * nC, nL)).T
                                for m in (ab_arr, ~ab_arr))

    def _count_link_bytes(self, counts: np.ndarray, nbytes: int, direction: int) -> None:
        if not counts.any():
            return
        c = counts.ravel()
        along, against = (m @ c for m in self._inc_dir_t)  # per link, traversed a -> b / b -> a
        per_link, per_link_rev = (along, against) if direction == 0 else (against, along)
        self._link_bits[:, 0] += per_link * nbytes * 8
        self._link_bits[:, 1] += per_link_rev * nbytes * 8

    def _link_report(self, t: float) -> None:
        links = self.net.links
        if self._cap_version != self.net.version:  # capacities and background change only by events
            self._cap_bits = np.array([lk.capacity_mbps for lk in links]) * 1e6 * self.R
            self._bg_bits = np.array([[lk.bg_ab, lk.bg_ba] for lk in links]) * 1e6 * self.R
            self._cap_version = self.net.version
        bits = self._link_bits + self._bg_bits
        util = np.minimum(1.0, bits / self._cap_bits[:, None])
        self._util_max, self._util_dict = util.max(axis=1), None  # the dict is made when asked for
        if self.record:
            for (a, b), lk, u, bt in zip(self.link_keys, links, util, bits, strict=True):
                self.link_rows.append({"t": round(t, 6), "a": a, "b": b, "kind": "switch",
                                       "capacity_mbps": lk.capacity_mbps, "rate_mbps_ab": bt[0] / self.R / 1e6,
                                       "rate_mbps_ba": bt[1] / self.R / 1e6, "util_ab": float(u[0]),
                                       "util_ba": float(u[1]), "drops_ab": 0, "drops_ba": 0, "drops_total": 0})
        self._link_bits[:] = 0

    @property
    def link_util(self) -> dict[tuple[str, str], float]:
        """Per link (switch a, switch b): the busier direction's utilization over the last report
        interval (0 before the first report); made from the report's array when first read."""
        if self._util_dict is None:
            self._util_dict = dict(zip(self.link_keys, self._util_max.tolist(), strict=True))
        return self._util_dict

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


__all__ = ["Links"]
