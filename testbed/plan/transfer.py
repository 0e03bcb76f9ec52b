"""The planned network time of a query beyond its path's RTT: the transfer of its request and its
answer, as the simulator models it, so that what an emulation measures above it is the host's.

A query's ``network_ms - expected_rtt_ms`` (its network excess) is, in the simulator, the transfer of
the request and of the answer over the switch links of the path and the two host links
(:func:`testbed.model.network.pipelined_ms`, frames pipelined along the path), plus the
experiment's ``simulation.per_hop_ms`` per link and direction and ``simulation.overhead_ms`` per
query (both 0 by default), with no background traffic. In an emulation the same query also pays
the emulator's own forwarding (Open vSwitch, link emulators, the kernel) and its waits for a CPU:
:func:`host_share_ms` is what is left after the planned part, the figure ``auto`` dilation and the
"too small a k" check judge (:mod:`testbed.emu.autodilate`).

Everything here reads a plan as ``plan.json`` holds it (:meth:`testbed.plan.resolved.Plan.to_dict`),
so a finished run directory is enough.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable

from testbed.model.network import DEFAULT_MTU, mss_of, pipelined_ms


class TransferTable:
    """Per (source, cluster) of a plan document: the capacities (Mbit/s) of the planned path's
    switch links and of the two host links, with the MTU and the simulator's per-hop and
    per-query overheads (ms)."""

    def __init__(self, plan_doc: dict):
        exp = plan_doc.get("experiment") or {}
        self.mss = mss_of(int((exp.get("topology") or {}).get("mtu") or DEFAULT_MTU))
        sim = exp.get("simulation") or {}
        self.per_hop_ms = float(sim.get("per_hop_ms") or 0.0)
        self.overhead_ms = float(sim.get("overhead_ms") or 0.0)
        caps = {}
        for lk in plan_doc.get("links") or []:
            caps[(lk["a"], lk["b"])] = caps[(lk["b"], lk["a"])] = float(lk["bandwidth_mbps"])
        hosts = {h["name"]: float(h.get("bandwidth_mbps") or math.inf) for h in plan_doc.get("hosts") or []}
        self.paths: dict[tuple[str, str], tuple[list[float], float, float]] = {}
        for p in plan_doc.get("paths") or []:
            sw = p.get("switches") or []
            links = [caps[(a, b)] for a, b in zip(sw, sw[1:], strict=False) if (a, b) in caps]
            self.paths[(p["source"], p["cluster"])] = (links, hosts.get(p["source"], math.inf),
                                                       hosts.get(p["cluster"], math.inf))

    def hops(self, source: str, cluster: str) -> int | None:
        """Switch links on the planned path (None: no such pair in the plan)."""
        got = self.paths.get((source, cluster))
        return None if got is None else len(got[0])

    def transfer_ms(self, source: str, cluster: str, request_bytes: float, response_bytes: float) -> float:
        """The planned network time (ms) of one query beyond its path's RTT (module docstring); NaN
        for a pair the plan has no path for, or sizes that are not known."""
        got = self.paths.get((source, cluster))
        if got is None or not (request_bytes >= 0 and response_bytes >= 0):  # NaN fails both
            return math.nan
        links, host_s, host_c = got
        total = self.overhead_ms + 2 * len(links) * self.per_hop_ms / 2
        for nbytes in (int(request_bytes), int(response_bytes)):
            total += pipelined_ms(nbytes, (host_s, *links, host_c), self.mss)
        return total


def opened_a_connection(row: dict) -> bool:
    """Whether a record (as a dict) is ``cold``: its query opened a new TCP connection (written as
    1 / 0 or True / False; missing: no)."""
    return str(row.get("cold", "")).strip().lower() in ("1", "1.0", "true")


def _planned_ms(table: TransferTable, r: dict) -> float | None:
    """A record's planned network time (ms): ``expected_rtt_ms`` + :meth:`TransferTable.transfer_ms`;
    None when a figure is missing or not finite."""
    try:
        x = float(r["expected_rtt_ms"]) + table.transfer_ms(str(r["source"]), str(r["cluster"]),
                                                            float(r["request_bytes"]), float(r["response_bytes"]))
    except (KeyError, TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def _shares_and_planned(plan_doc: dict, rows: Iterable[dict]) -> tuple[list[float], list[float]]:
    """(:func:`host_share_ms` of ``rows``, their planned network times), in one pass."""
    table = TransferTable(plan_doc)
    share, planned = [], []
    for r in rows:
        p = _planned_ms(table, r)
        if p is None:
            continue
        planned.append(p)
        if opened_a_connection(r):
            continue
        try:
            x = float(r["network_ms"]) - p
        except (KeyError, TypeError, ValueError):
            continue
        if math.isfinite(x):
            share.append(x)
    return share, planned


def host_share_ms(plan_doc: dict, rows: Iterable[dict]) -> list[float]:
    """Per answered query of ``rows`` (records as dicts: ``source``, ``cluster``, ``network_ms``,
    ``expected_rtt_ms``, ``request_bytes``, ``response_bytes``, ``cold``; ms) on a connection
    already open, the network time above the planned one: ``network_ms - expected_rtt_ms -``
    :meth:`TransferTable.transfer_ms` (ms; the emulator's own share). Rows without those figures
    are left out, and so are cold ones (:func:`opened_a_connection`): a new connection's handshake,
    and its first window for a request of more than 10 segments (RFC 6928), cost round trips that
    the model has not and that no dilation removes (a short warm-up under overload opens many)."""
    return _shares_and_planned(plan_doc, rows)[0]


def dilation_figures(plan_doc: dict, rows: list[dict]) -> tuple[float | None, float | None, int]:
    """(p50 of the host's share of the network time (:func:`host_share_ms`), p50 of the planned
    network time: RTT + the planned transfer, queries the share is over), ms, over the answered
    queries of ``rows`` (records as dicts); None without one. What ``auto`` dilation and the run's
    "too small a k" check judge (:mod:`testbed.emu.autodilate`, :mod:`testbed.results.verdict`)."""
    share, planned = _shares_and_planned(plan_doc, rows)
    return ((float(statistics.median(share)) if share else None),
            (float(statistics.median(planned)) if planned else None), len(share))


def mean_hops(plan_doc: dict, weights: dict[tuple[str, str], float]) -> float:
    """The mean number of switch links on the planned paths, each (source, cluster) pair weighted
    by ``weights`` (e.g. the queries it carried); 0 without any."""
    table = TransferTable(plan_doc)
    total = sum(w for (s, c), w in weights.items() if table.hops(s, c) is not None)
    if total <= 0:
        return 0.0
    return sum(w * (table.hops(s, c) or 0) for (s, c), w in weights.items() if table.hops(s, c) is not None) / total


__all__ = ["TransferTable", "dilation_figures", "host_share_ms", "mean_hops", "opened_a_connection"]
