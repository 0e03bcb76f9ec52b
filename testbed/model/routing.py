"""The one least-delay routing rule, and the counter logic of the testbed's Ryu controller (no Ryu imports).

Routing: a message from switch s to switch d follows the tree rooted at d
(:func:`shortest_path_tree`): the Ryu controller installs exactly these trees
(``eth_dst = host MAC -> port toward the next hop``), and :func:`least_delay_paths` reads the
same trees for the plan's expected paths (:func:`testbed.plan.network_layout.expected_paths`) and the
model's routes (:meth:`testbed.model.network.NetworkState.routes`, which the simulator and the
emulation's event checks use). So the planned, simulated and installed paths agree by construction,
ties included.

The tie-break: least one-way delay (ms, compared after rounding to :data:`DELAY_DECIMALS`), then
fewer hops, then the parent with the lower DPID. Why: a DPID is the one name of a switch that the
controller, the plan and the model all share, and it does not depend on the order in which a graph
was built (a graph's insertion order, which networkx's Dijkstra falls back to, differs between the
controller, which learns links as LLDP finds them, and the plan, which reads them from the
topology file); the hop count keeps trees loop-free with zero-delay links; the rounding keeps 2.0 +
3.0 and 5.0 (or 0.1 + 0.2 and 0.3) equal so that the tie-break, not float noise, decides.

Everything here is deterministic and testable without a network:

* :func:`build_graph` turns ``(a, b, delay_ms)`` switch links into an undirected
  :class:`SwitchGraph` whose edges carry ``delay_ms`` (``networkx.Graph(g.adj)`` is the same graph
  in networkx; networkx itself is not imported: it is 0.12 s of the controller's start).
* :func:`shortest_path_tree` computes, for one destination switch, the next hop of every other
  switch on its least-delay path toward the destination (Dijkstra on ``(delay, hops)``
  lexicographically; remaining ties go to the lower DPID). A destination tree is loop-free by
  construction, so installing ``eth_dst=MAC -> port toward next hop`` on every switch gives
  loop-free forwarding on any mesh.
* :func:`tree_path` / :func:`path_delay_ms` reconstruct the switch sequence and its one-way delay.
* :func:`least_delay_paths`: the path of every (from, to) pair of switches named any way (names,
  DPIDs) given each switch's DPID: the trees above, followed from ``from``.
* :func:`counter_delta`, :func:`port_delta`, :func:`rate_mbps`, :func:`utilization` turn two
  OpenFlow port-stats samples into Mbit/s, utilization and drop counts, surviving counter resets
  (a switch or port that restarted) and counters the switch does not support (all ones).

Units: delays in milliseconds, rates in Mbit/s (10^6 bit/s), byte counters in bytes, times in
seconds.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Hashable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TypeVar

from testbed.core.errors import RunFailure

N = TypeVar("N", bound=Hashable)

#: OpenFlow reports an unsupported 64-bit counter as all ones.
COUNTER_UNSUPPORTED = 2**64 - 1

#: Delays are compared after rounding to this many decimals (ms), so that 2.0 + 3.0 and 5.0, or
#: 0.1 + 0.2 and 0.3, count as equal and the deterministic tie-break decides.
DELAY_DECIMALS = 9


class NoRouteError(RunFailure, LookupError):
    """No path between two switches in the current tree (disconnected or unknown DPID)."""


class SwitchGraph:
    """An undirected graph of switches: ``adj[u][v]`` is the attribute dict of edge u-v (shared by
    both directions), as in networkx, whose ``Graph(g.adj)`` makes the same graph."""

    def __init__(self) -> None:
        self.adj: dict[int, dict[int, dict]] = {}

    def add_node(self, n: int) -> None:
        self.adj.setdefault(n, {})

    def add_edge(self, a: int, b: int, **attrs) -> None:
        self.add_node(a)
        self.add_node(b)
        data = self.adj[a].get(b, {})
        data.update(attrs)
        self.adj[a][b] = self.adj[b][a] = data

    def has_edge(self, a: int, b: int) -> bool:
        return b in self.adj.get(a, {})

    def edge(self, a: int, b: int) -> dict:
        """The attributes of edge a-b (KeyError when there is none)."""
        return self.adj[a][b]

    @property
    def nodes(self) -> list[int]:
        return list(self.adj)

    def __contains__(self, n: object) -> bool:
        return n in self.adj

    def __iter__(self) -> Iterator[int]:
        return iter(self.adj)

    def __len__(self) -> int:
        return len(self.adj)


def build_graph(links: Iterable[tuple[int, int, float]], nodes: Iterable[int] = ()) -> SwitchGraph:
    """Undirected switch graph with an edge attribute ``delay_ms``.

    Args:
        links: ``(a_dpid, b_dpid, delay_ms)`` per undirected link; delay in ms, >= 0.
        nodes: extra DPIDs to include even without links (isolated switches).

    Returns:
        A :class:`SwitchGraph`; nodes are DPIDs (int).

    Raises:
        ValueError: a self-loop, a negative or non-finite delay, or the same pair given twice.
    """
    g = SwitchGraph()
    for n in nodes:
        g.add_node(int(n))
    for a, b, delay in links:
        a, b, delay = int(a), int(b), float(delay)
        if a == b:
            raise ValueError(f"link {a}-{b} is a self-loop")
        if not math.isfinite(delay) or delay < 0:
            raise ValueError(f"link {a}-{b}: delay_ms must be finite and >= 0, got {delay!r}")
        if g.has_edge(a, b):
            raise ValueError(f"link {a}-{b} given twice (parallel links are not supported)")
        g.add_edge(a, b, delay_ms=delay)
    return g


def shortest_path_tree(graph: SwitchGraph, root: int) -> dict[int, int]:
    """Next hop toward ``root`` for every switch that can reach it.

    Dijkstra from ``root`` with the lexicographic cost ``(sum of delay_ms, hop count)``; when two
    neighbours give the same cost the lower DPID becomes the parent. Because the cost strictly
    increases along every tree edge (hop count), the result is a tree even with zero delays.

    Args:
        graph: from :func:`build_graph` (edge attribute ``delay_ms``, ms).
        root: destination switch DPID.

    Returns:
        ``{dpid: next_hop_dpid}`` for every reachable switch except ``root`` (unreachable switches
        are absent).

    Raises:
        NoRouteError: ``root`` is not in the graph.
    """
    if root not in graph:
        raise NoRouteError(f"switch {root} is not in the topology")
    best: dict[int, tuple[float, int, int]] = {root: (0.0, 0, -1)}
    done: set[int] = set()
    heap: list[tuple[float, int, int, int]] = [(0.0, 0, -1, root)]
    adj, pop, push = graph.adj, heapq.heappop, heapq.heappush  # the hot loop of every plan and controller
    while heap:
        d, h, parent, u = pop(heap)
        if u in done:
            continue
        done.add(u)
        h += 1
        for v, attrs in adj[u].items():
            if v in done:
                continue
            cand = (round(d + attrs["delay_ms"], DELAY_DECIMALS), h, u)  # delays are floats (build_graph)
            old = best.get(v)
            if old is None or cand < old:
                best[v] = cand
                push(heap, (*cand, v))
    return {v: lab[2] for v, lab in best.items() if v != root}


def all_trees(graph: SwitchGraph, roots: Iterable[int]) -> dict[int, dict[int, int]]:
    """:func:`shortest_path_tree` for each distinct root DPID (roots not in the graph give ``{}``)."""
    out: dict[int, dict[int, int]] = {}
    for r in roots:
        if r not in out:
            out[r] = shortest_path_tree(graph, r) if r in graph else {}
    return out


def tree_path(tree: Mapping[int, int], src: int, dst: int) -> list[int]:
    """Switch DPIDs from ``src`` to ``dst`` following ``tree`` (the tree rooted at ``dst``).

    Args:
        tree: ``{dpid: next_hop}`` toward ``dst`` (from :func:`shortest_path_tree`).
        src: first switch. dst: the tree's root.

    Returns:
        ``[src, ..., dst]`` (``[dst]`` when ``src == dst``).

    Raises:
        NoRouteError: ``src`` has no next hop, or the table loops (would be a bug upstream).
    """
    path = [src]
    seen = {src}
    u = src
    while u != dst:
        if u not in tree:
            raise NoRouteError(f"no route from switch {src} to switch {dst} (stuck at {u})")
        u = tree[u]
        if u in seen:
            raise NoRouteError(f"forwarding loop toward switch {dst}: {path + [u]}")
        seen.add(u)
        path.append(u)
    return path


def least_delay_paths(links: Iterable[tuple[N, N, float]], pairs: Iterable[tuple[N, N]],
                      dpid: Mapping[N, int]) -> dict[tuple[N, N], list[N] | None]:
    """The least-delay switch path of every ``(from, to)`` pair: the path the controller installs.

    Each path follows the tree rooted at ``to`` (:func:`shortest_path_tree`: least delay, then
    fewer hops, then the lower-DPID parent), so it is the controller's forwarding path toward
    ``to``'s hosts, whatever the order ``links`` come in.

    Args:
        links: ``(a, b, delay_ms)`` per undirected link that is up (switch names or DPIDs; delay in
            ms, >= 0; a pair at most once).
        pairs: ``(from, to)`` switch pairs.
        dpid: each switch's DPID (the tie-break); every switch of ``links`` and ``pairs`` needs one.

    Returns:
        ``{(from, to): [from, ..., to]}``; ``[to]`` when ``from == to``; None when ``to`` cannot be
        reached from ``from``.

    Raises:
        KeyError: a switch without a DPID.
        ValueError: a bad link (as :func:`build_graph`) or two switches with one DPID.
    """
    name = {d: n for n, d in dpid.items()}
    if len(name) != len(dpid):
        raise ValueError("two switches have the same DPID")
    pairs = list(pairs)
    graph = build_graph(((dpid[a], dpid[b], delay) for a, b, delay in links),
                        nodes=[dpid[n] for pair in pairs for n in pair])
    trees = all_trees(graph, sorted({dpid[d] for _, d in pairs}))
    out: dict[tuple[N, N], list[N] | None] = {}
    for s, d in pairs:
        try:
            out[(s, d)] = [name[x] for x in tree_path(trees[dpid[d]], dpid[s], dpid[d])]
        except NoRouteError:
            out[(s, d)] = None
    return out


def is_loop_free(tree: Mapping[int, int], root: int) -> bool:
    """True when following ``tree`` from every switch ends at ``root`` without revisiting a switch."""
    for start in tree:
        try:
            tree_path(tree, start, root)
        except NoRouteError:
            return False
    return True


def path_delay_ms(graph: SwitchGraph, dpids: list[int]) -> float:
    """One-way delay in ms of consecutive switch links along ``dpids`` (0 for a single switch).

    Raises:
        NoRouteError: two consecutive DPIDs are not linked in ``graph``.
    """
    total = 0.0
    for a, b in zip(dpids, dpids[1:], strict=False):
        if not graph.has_edge(a, b):
            raise NoRouteError(f"switches {a} and {b} are not linked")
        total += float(graph.edge(a, b)["delay_ms"])
    return total


# --------------------------------------------------------------------------- counters and rates


def counter_delta(prev: int | None, cur: int | None) -> int:
    """Increase of a monotonic OpenFlow counter between two samples.

    * ``prev`` or ``cur`` missing, or either equal to :data:`COUNTER_UNSUPPORTED`: 0.
    * ``cur >= prev``: ``cur - prev``.
    * ``cur < prev``: the counter was reset (switch/port restarted, counters cleared); it counted
      up from 0 since, so the delta is ``cur``.
    """
    if prev is None or cur is None or prev == COUNTER_UNSUPPORTED or cur == COUNTER_UNSUPPORTED:
        return 0
    return cur - prev if cur >= prev else cur


def rate_mbps(delta_bytes: int, dt_s: float) -> float:
    """``delta_bytes`` over ``dt_s`` seconds in Mbit/s (10^6 bit/s); 0.0 when ``dt_s <= 0``."""
    if dt_s <= 0:
        return 0.0
    return delta_bytes * 8.0 / dt_s / 1e6


def utilization(rate: float, capacity_mbps: float | None) -> float | None:
    """``rate / capacity`` (both Mbit/s); ``None`` when the capacity is unknown or not positive."""
    if capacity_mbps is None or capacity_mbps <= 0:
        return None
    return rate / capacity_mbps


@dataclass(frozen=True)
class PortSample:
    """One OpenFlow port-stats entry.

    Attributes:
        t: receipt time, unix seconds.
        duration_s: port uptime reported by the switch, seconds (``None`` if not reported).
        tx_bytes, rx_bytes: byte counters. tx_dropped, rx_dropped, tx_errors, rx_errors: packets.
    """

    t: float
    duration_s: float | None
    tx_bytes: int
    rx_bytes: int
    tx_dropped: int = 0
    rx_dropped: int = 0
    tx_errors: int = 0
    rx_errors: int = 0


@dataclass(frozen=True)
class PortDelta:
    """What happened on a port between two samples.

    Attributes:
        t: time of the newer sample (unix s). dt_s: interval used for the rates (s).
        tx_mbps, rx_mbps: rates (Mbit/s). tx_drops: tx_dropped + tx_errors increase (packets).
        rx_drops: rx_dropped + rx_errors increase (packets). reset: a counter went backwards.
    """

    t: float
    dt_s: float
    tx_mbps: float
    rx_mbps: float
    tx_drops: int
    rx_drops: int
    reset: bool


def port_delta(prev: PortSample, cur: PortSample) -> PortDelta:
    """Rates and drop increases between two samples of the same port.

    The interval is the difference of the switch-reported port uptimes when both exist and grow
    (switch-side timing, immune to controller scheduling jitter), else the difference of receipt
    times. Counter resets are handled by :func:`counter_delta`; after a reset the uptime restarts
    too, so the receipt-time interval is used.
    """
    reset = any(
        c < p and COUNTER_UNSUPPORTED not in (p, c)
        for p, c in ((prev.tx_bytes, cur.tx_bytes), (prev.rx_bytes, cur.rx_bytes))
    )
    if prev.duration_s is not None and cur.duration_s is not None and cur.duration_s > prev.duration_s and not reset:
        dt = cur.duration_s - prev.duration_s
    else:
        dt = cur.t - prev.t
    return PortDelta(
        t=cur.t,
        dt_s=dt,
        tx_mbps=rate_mbps(counter_delta(prev.tx_bytes, cur.tx_bytes), dt),
        rx_mbps=rate_mbps(counter_delta(prev.rx_bytes, cur.rx_bytes), dt),
        tx_drops=counter_delta(prev.tx_dropped, cur.tx_dropped) + counter_delta(prev.tx_errors, cur.tx_errors),
        rx_drops=counter_delta(prev.rx_dropped, cur.rx_dropped) + counter_delta(prev.rx_errors, cur.rx_errors),
        reset=reset,
    )


def carried(sent: PortDelta | None, received: PortDelta | None) -> tuple[float, int, float | None]:
    """What one direction of a link carried over the last stats interval: ``(rate Mbit/s, drops,
    t)``. The rate is the bytes received at the far end's port (``received``), after the link's
    shaper and emulator; the bytes the near end's port sent into the link (``sent``: the offered
    load, before the shaper, above the capacity when the link is overloaded) only while the far
    end's port is not known yet. Drops: packets dropped or in error at either port; t: the newer
    sample (unix s), None without one."""
    if received is not None:
        rate = received.rx_mbps
    elif sent is not None:
        rate = sent.tx_mbps
    else:
        rate = 0.0
    drops = (sent.tx_drops if sent is not None else 0) + (received.rx_drops if received is not None else 0)
    ts = [d.t for d in (sent, received) if d is not None]
    return rate, drops, (max(ts) if ts else None)
