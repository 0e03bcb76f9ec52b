"""Where clusters and sources can sit so that queries can meet their deadlines: the zero-load
end-to-end time between one fixed node and every other node of a planned network, and a greedy
placement of clusters that brings every source within reach (``testbed new-experiment``).

The times are the plan's own figures, as :func:`testbed.plan.checks.zero_load_feasibility` takes
them for the pairs a plan has: the least-delay route (the tree of
:func:`testbed.model.routing.shortest_path_tree`, rooted at the fixed node), the request's and the
answer's one-way times along it (:func:`testbed.model.network.message_ms`) and a model's
``expected_ms`` at a cluster's share. A route read from the tree rooted at the fixed node has the
least delay and the fewest hops; where several routes tie, the plan's own path may differ (and
with unequal capacities its transfer time too): the plan's check, run on the placement, decides.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from testbed.model.network import NetworkState, message_ms
from testbed.model.routing import build_graph, shortest_path_tree, tree_path
from testbed.plan.resolved import Plan


@dataclass(frozen=True)
class Demand:
    """One application as placement sees it: ``deadline_ms``, its ``request_bytes``, and
    ``service_ms``: the expected time (ms) of its fastest accurate-enough model at a cluster."""

    name: str
    deadline_ms: float
    request_bytes: int
    service_ms: float


def zero_load_from(plan: Plan, fixed: str, fixed_is_source: bool, demands: Sequence[Demand],
                   host_mbps: float) -> dict[str, dict[str, float]]:
    """Per switch reachable from switch ``fixed``: per application, the zero-load end-to-end time
    (ms) of a query between a host at ``fixed`` and a host at that switch (``fixed_is_source``:
    the query starts at ``fixed``, else it is served there). Host links of ``host_mbps`` Mbit/s;
    answers of ``simulation.response_bytes``; links as planned."""
    net: NetworkState = plan.network_state()
    dpid = {s.name: s.dpid for s in plan.switches}
    name = {d: n for n, d in dpid.items()}
    graph = build_graph(((dpid[lk.a], dpid[lk.b], lk.delay_ms) for lk in plan.links), dpid.values())
    tree = shortest_path_tree(graph, dpid[fixed])
    resp = plan.experiment.simulation.response_bytes
    hosts = (host_mbps, host_mbps)
    out: dict[str, dict[str, float]] = {}
    for d in [dpid[fixed], *tree]:
        toward = [name[x] for x in tree_path(tree, d, dpid[fixed])]  # other -> fixed
        away = toward[::-1]  # fixed -> other
        req_path, resp_path = (away, toward) if fixed_is_source else (toward, away)
        back = message_ms(net, resp_path, resp, hosts)
        out[name[d]] = {a.name: message_ms(net, req_path, a.request_bytes, hosts) + back + a.service_ms
                        for a in demands}
    return out


def covers(times: Mapping[str, float], demands: Sequence[Demand]) -> bool:
    """Every application meets its deadline at these zero-load times (ms, per application)."""
    return all(times[a.name] <= a.deadline_ms for a in demands)


def slack_ms(times: Mapping[str, float], demands: Sequence[Demand]) -> float:
    """How far the tightest application's zero-load time is over its deadline (ms; <= 0: every
    application meets it)."""
    return max(times[a.name] - a.deadline_ms for a in demands)


def cover_sources(reach: Mapping[str, Mapping[str, Mapping[str, float]]], demands: Sequence[Demand],
                  candidates: Sequence[str], n: int) -> tuple[list[str], set[str]]:
    """``n`` cluster switches, picked greedily: each pick the candidate that leaves the fewest
    sources out of reach of every deadline, then the least total :func:`slack_ms` over the
    sources (each source counted at its nearest pick: clusters beyond those needed bring the
    sources further within their deadlines), ties to the earlier candidate (e.g. the more
    central). ``reach``: source switch -> candidate switch -> application -> zero-load ms.
    Returns (the picks, the sources no pick brings within every deadline)."""
    import numpy as np

    srcs = list(reach)
    cand = [c for c in candidates if all(c in reach[s] for s in srcs)]
    score = np.array([[slack_ms(reach[s][c], demands) for s in srcs] for c in cand])  # candidate x source
    best = np.full(len(srcs), np.inf)
    picks: list[int] = []
    for _ in range(min(n, len(cand))):
        after = np.minimum(score, best)  # each candidate added: each source's best
        missed = (after > 0).sum(axis=1)
        total = np.where(np.isfinite(after), after, 1e12).sum(axis=1)
        total[picks] = np.inf
        order = np.lexsort((np.arange(len(cand)), total, missed))
        pick = int(next(i for i in order if i not in picks))
        picks.append(pick)
        best = after[pick]
    return [cand[i] for i in picks], {s for s, b in zip(srcs, best, strict=True) if b > 0}


__all__ = ["Demand", "cover_sources", "covers", "slack_ms", "zero_load_from"]
