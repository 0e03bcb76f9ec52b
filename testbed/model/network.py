"""The network part of the model: link state, least-delay routes, and the time a message takes.

:class:`NetworkState` holds every switch link's current one-way delay (ms), capacity (Mbit/s),
loss (%), background traffic (Mbit/s, per direction) and whether it is up; :meth:`apply` takes a
:class:`~testbed.model.timeline.Change`, whose kind changes the link through a :class:`LinkView`.
Routes are least one-way delay over the links that are up (the Ryu controller's rule,
:func:`testbed.model.routing.least_delay_paths`): the paths the controller installs, ties included
(least delay, then fewer hops, then the lower DPID).

A message of ``n`` bytes crossing a link direction of capacity C with background traffic r
(our link model, stated; each direction is one FIFO of ``queue_packets`` frames served at C: the
link emulator's shaper, or HTB with its pfifo, see :mod:`testbed.emu.mininet_network`):

* queueing behind background frames, M/D/1 with utilization rho = r / C (Pollaczek-Khinchine):
  ``rho / (2 (1 - rho)) x L / C`` with L one full frame, while rho < 1;
* transfer: then its own frames (``ceil(n / MSS)`` frames of MSS + :data:`FRAME_OVERHEAD_BYTES`,
  MSS from the network's MTU, :func:`mss_of`)
  back to back at the full capacity C: in a FIFO, background frames that arrive meanwhile wait
  behind the message, they do not share the link with it. Along a path the frames are pipelined
  (:func:`pipelined_ms`): each link stores and forwards one frame at a time, so the message pays
  its first frame on every link and the rest once, at the slowest link, not the whole message per
  link;
* at rho >= 1 (the background alone fills the link) the shaper's FIFO is full: every frame waits
  ``queue_packets x L / C`` and the share ``1 - C / r`` of frames is dropped (:meth:`loss`).

Checked against the link emulator's FIFO with Poisson UDP background by
``benchmarks/dynamics_bench.py fifo`` (figures: docs/network-dynamics.md, "The model, checked
against the emulator").

Loss, from ``link_loss`` or an overloaded link, costs a TCP query one retransmission timeout,
:data:`TCP_RTO_MIN_MS` (Linux ``TCP_RTO_MIN``, 200 ms), with probability
``1 - (1 - p)^frames`` per direction (:func:`p_retransmit`).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Mapping, Sequence

from testbed.model.routing import least_delay_paths
from testbed.model.timeline import Change

#: Bytes per frame on the wire beyond the TCP payload (Ethernet 14 + IPv4 20 + TCP 32 with
#: timestamps), and the TCP payload per frame at a 1500-byte MTU (1500 - 20 - 32).
FRAME_OVERHEAD_BYTES, MSS_BYTES = 66, 1448
#: IPv4 + TCP header bytes inside the MTU (20 + 32 with the timestamp option, RFC 7323).
IP_TCP_HEADER_BYTES = 52
#: The default MTU, bytes (Ethernet, RFC 894).
DEFAULT_MTU = 1500
#: A full frame on the wire at the default MTU, bytes (MSS + overhead): the background traffic's
#: frames, whatever the MTU (the background generator sends datagrams of at most 1500 bytes).
FULL_FRAME_BYTES = MSS_BYTES + FRAME_OVERHEAD_BYTES


def mss_of(mtu: int) -> int:
    """TCP payload bytes per frame at an IP MTU of ``mtu`` bytes (``mtu - 52``; 1448 at 1500)."""
    return mtu - IP_TCP_HEADER_BYTES
#: Linux's minimum TCP retransmission timeout, ms (include/net/tcp.h: TCP_RTO_MIN = HZ / 5).
TCP_RTO_MIN_MS = 200.0
#: Frames the FIFO behind each link's shaper holds (the veth's default txqueuelen).
DEFAULT_QUEUE_PACKETS = 1000


def frames(nbytes: int, mss: int = MSS_BYTES) -> int:
    """Frames a TCP message of ``nbytes`` payload bytes takes at ``mss`` bytes per frame (at least one)."""
    return max(1, math.ceil(nbytes / mss))


def wire_bytes(nbytes: int, mss: int = MSS_BYTES) -> int:
    """Bytes on the wire for ``nbytes`` of payload: payload + one header per frame."""
    return nbytes + frames(nbytes, mss) * FRAME_OVERHEAD_BYTES


def transfer_ms(nbytes: int, capacity_mbps: float, mss: int = MSS_BYTES) -> float:
    """Time (ms) to put a message of ``nbytes`` payload bytes on a link of ``capacity_mbps``
    Mbit/s: its frames (:func:`wire_bytes`, ``mss`` bytes each) back to back at the full capacity
    (module doc), without the link's delay or any queueing."""
    return wire_bytes(nbytes, mss) * 8 / (capacity_mbps * 1e3)


def pipelined_ms(nbytes: int, capacities_mbps: Iterable[float], mss: int = MSS_BYTES) -> float:
    """Time (ms) for a message of ``nbytes`` payload bytes to cross links of ``capacities_mbps``
    (Mbit/s, in series; infinite ones cost nothing) with no delay or queueing: store-and-forward
    per frame, pipelined, ``sum_i L / C_i + (W - L) / min_i C_i`` with W the message's
    :func:`wire_bytes` and L its first frame's (exact for equal frames in FIFOs without other
    traffic; e.g. Kurose and Ross, "Computer Networking", 1.4.1, store-and-forward transmission
    of P packets over N links). One link: :func:`transfer_ms`."""
    caps = [float(c) for c in capacities_mbps if math.isfinite(c)]
    if not caps:
        return 0.0
    wire = wire_bytes(nbytes, mss)
    first = min(wire, mss + FRAME_OVERHEAD_BYTES)
    return (sum(first * 8 / (c * 1e3) for c in caps) + (wire - first) * 8 / (min(caps) * 1e3))


def p_retransmit(loss_pct: float, nbytes: int, mss: int = MSS_BYTES) -> float:
    """Probability that at least one of the message's frames is lost, at ``loss_pct`` % per frame."""
    if loss_pct <= 0:
        return 0.0
    return 1.0 - (1.0 - min(1.0, loss_pct / 100.0)) ** frames(nbytes, mss)


class LinkState:
    """One switch link (undirected). Delays ms, rates Mbit/s, loss %; background per direction
    (``bg_ab`` from ``a`` to ``b``)."""

    __slots__ = ("a", "b", "delay_ms", "capacity_mbps", "loss_pct", "bg_ab", "bg_ba", "up", "queue_packets", "mss")

    def __init__(self, a: str, b: str, delay_ms: float, capacity_mbps: float, loss_pct: float = 0.0,
                 queue_packets: int = DEFAULT_QUEUE_PACKETS, mss: int = MSS_BYTES):
        self.a, self.b = a, b
        self.mss = mss
        self.delay_ms, self.capacity_mbps, self.loss_pct = float(delay_ms), float(capacity_mbps), float(loss_pct)
        self.bg_ab = self.bg_ba = 0.0
        self.up = True
        self.queue_packets = queue_packets

    def background(self, forward: bool) -> float:
        """Background Mbit/s in the a -> b direction (``forward``) or b -> a."""
        return self.bg_ab if forward else self.bg_ba

    def utilization(self, forward: bool) -> float:
        """Background rate / capacity in one direction (may exceed 1)."""
        return self.background(forward) / self.capacity_mbps

    def loss(self, forward: bool) -> float:
        """Frame loss in % in one direction: configured loss, plus the overflow of an overloaded shaper."""
        rho = self.utilization(forward)
        over = (1.0 - 1.0 / rho) * 100.0 if rho > 1.0 else 0.0
        return 100.0 - (100.0 - self.loss_pct) * (100.0 - over) / 100.0

    def queue_ms(self, forward: bool) -> float:
        """Mean wait (ms) behind background frames in one direction (module doc: M/D/1 while
        rho < 1, the full FIFO at rho >= 1)."""
        rho = self.utilization(forward)
        frame_ms = FULL_FRAME_BYTES * 8 / (self.capacity_mbps * 1e3)
        if rho >= 1.0:
            return self.queue_packets * frame_ms
        return rho / (2 * (1 - rho)) * frame_ms

    def one_way_ms(self, nbytes: int, forward: bool) -> float:
        """Time (ms) for a message of ``nbytes`` payload to cross the link one way (module doc):
        delay, queueing and transfer."""
        return self.delay_ms + self.queue_ms(forward) + transfer_ms(nbytes, self.capacity_mbps, self.mss)


class LinkView:
    """One link oriented as a change names it (``ab``: from its first switch to its second): the
    model's :class:`~testbed.model.timeline.LinkControl`, which event kinds change."""

    __slots__ = ("lk", "forward")

    def __init__(self, lk: LinkState, forward: bool):
        self.lk, self.forward = lk, forward

    @property
    def delay_ms(self) -> float:
        return self.lk.delay_ms

    @property
    def capacity_mbps(self) -> float:
        return self.lk.capacity_mbps

    def set_delay(self, delay_ms: float) -> None:
        self.lk.delay_ms = float(delay_ms)

    def set_rate(self, rate_mbps: float) -> None:
        self.lk.capacity_mbps = float(rate_mbps)

    def set_loss(self, loss_pct: float) -> None:
        self.lk.loss_pct = float(loss_pct)

    def set_up(self, up: bool) -> None:
        self.lk.up = bool(up)

    def set_background(self, rate_mbps: float, direction: str, traffic: str) -> None:
        """Background in ``direction`` (both, ab or ba, as oriented); the model ignores ``traffic``."""
        v = float(rate_mbps)
        if direction in ("both", "ab" if self.forward else "ba"):
            self.lk.bg_ab = v
        if direction in ("both", "ba" if self.forward else "ab"):
            self.lk.bg_ba = v


class NetworkState:
    """The switch links of a plan and their state; routes by least one-way delay.

    Args:
        links: ``(a, b, delay_ms, bandwidth_mbps, loss_pct)`` per link (the plan's switch names).
        switches: every switch name (nodes without links are kept in the graph).
        dpids: each switch's DPID, the routes' tie-break (:mod:`testbed.model.routing`); default:
            1, 2, ... in the order of ``switches``. The plan passes its switches' DPIDs
            (:meth:`testbed.plan.resolved.Plan.network_state`).
        mtu: the IP MTU of every link, bytes (sets :attr:`mss`).

    Raises:
        KeyError: a change names a link that is not here.
    """

    def __init__(self, links: Iterable[tuple[str, str, float, float, float]], switches: Sequence[str] = (),
                 mtu: int = DEFAULT_MTU, dpids: Mapping[str, int] | None = None):
        self.mtu, self.mss = mtu, mss_of(mtu)
        self.links: list[LinkState] = [LinkState(a, b, d, bw, loss, mss=self.mss) for a, b, d, bw, loss in links]
        self.index: dict[tuple[str, str], int] = {}
        for i, lk in enumerate(self.links):
            self.index[(lk.a, lk.b)] = self.index[(lk.b, lk.a)] = i
        self.switches = list(switches) or list(dict.fromkeys(n for lk in self.links for n in (lk.a, lk.b)))
        self.dpids: dict[str, int] = dict(dpids) if dpids is not None else \
            {n: i for i, n in enumerate(self.switches, start=1)}
        self.version = 0  # bumped by every change that can move a route or a delay

    def link(self, a: str, b: str) -> LinkState:
        """The link between switches ``a`` and ``b`` (either order)."""
        return self.links[self.index[(a, b)]]

    def control(self, a: str, b: str) -> LinkView:
        """The link between switches ``a`` and ``b`` as an event changes it, oriented ``a`` -> ``b``."""
        lk = self.link(a, b)
        return LinkView(lk, (lk.a, lk.b) == (a, b))

    def apply(self, ch: Change) -> None:
        """Apply one step of the timeline: its kind's :meth:`~testbed.model.timeline.EventKind.apply`
        on the link (cluster changes are not the network's and are ignored)."""
        if ch.link is None:
            return
        ch.entry.apply(ch, self.control(*ch.link))
        self.version += 1

    def routes(self, pairs: Iterable[tuple[str, str]]) -> dict[tuple[str, str], list[str] | None]:
        """Least-delay switch path for every (from switch, to switch) pair over the links that are
        up; None without a route. The one rule, :func:`testbed.model.routing.least_delay_paths`
        (the controller's trees; ties: fewer hops, then the lower DPID of :attr:`dpids`)."""
        return least_delay_paths(((lk.a, lk.b, lk.delay_ms) for lk in self.links if lk.up), pairs, self.dpids)

    def components(self) -> dict[str, str]:
        """Each switch that has a link up -> a representative switch of its connected part over
        the links that are up (union-find): two switches have a route (:meth:`routes`) exactly when
        their representatives are equal."""
        parent: dict[str, str] = {}

        def find(x: str) -> str:
            parent.setdefault(x, x)
            while parent[x] != x:
                parent[x] = parent[parent[x]]
                x = parent[x]
            return x

        for lk in self.links:
            if lk.up:
                ra, rb = find(lk.a), find(lk.b)
                if ra != rb:
                    parent[ra] = rb
        return {x: find(x) for x in parent}

    def path_ms(self, path: Sequence[str], nbytes: int, host_mbps: Iterable[float] = ()) -> float:
        """One-way time (ms) of a message of ``nbytes`` along ``path`` (switch names, in order):
        each link's delay and queueing (:meth:`LinkState.queue_ms`), plus the message's frames
        pipelined over the links and the host links of ``host_mbps`` (Mbit/s; :func:`pipelined_ms`)."""
        total, caps = 0.0, list(host_mbps)
        for a, b in zip(path, path[1:], strict=False):
            lk = self.link(a, b)
            total += lk.delay_ms + lk.queue_ms((lk.a, lk.b) == (a, b))
            caps.append(lk.capacity_mbps)
        return total + pipelined_ms(nbytes, caps, self.mss)

    def path_loss_pct(self, path: Sequence[str]) -> float:
        """Frame loss (%) along ``path``: 1 - prod(1 - loss of each link direction)."""
        keep = 1.0
        for a, b in zip(path, path[1:], strict=False):
            lk = self.link(a, b)
            keep *= 1.0 - lk.loss((lk.a, lk.b) == (a, b)) / 100.0
        return (1.0 - keep) * 100.0


def message_ms(net: NetworkState, path: Sequence[str], nbytes: int, host_mbps: tuple[float, float],
               per_hop_ms: float = 0.0) -> float:
    """One-way time (ms) of a message of ``nbytes`` payload bytes from a host at ``path[0]`` to a
    host at ``path[-1]`` (switch names, in order): the switch links as they are now and the two
    host links of ``host_mbps`` (Mbit/s, first host then last; 0 ms delay), by
    :meth:`NetworkState.path_ms` (delays, queueing behind background, the frames pipelined), plus
    ``per_hop_ms / 2`` per switch link (the simulator's calibration knob, 0 in the model).
    The one formula of a query's network time: the simulator's per-message times and the plan's
    zero-load feasibility (:func:`testbed.plan.checks.zero_load_feasibility`) both call it; the
    planned transfer the emulation's excess is judged against (:mod:`testbed.plan.transfer`, from
    a plan document, without link state) calls its transfer part, :func:`pipelined_ms`."""
    return net.path_ms(path, nbytes, host_mbps) + (len(path) - 1) * per_hop_ms / 2


#: A span of a run without a route, (from_s, to_s), s since the load started; to_s may be inf.
Span = tuple[float, float]


def no_route_spans(net: NetworkState, changes: Sequence[Change],
                   pairs: Iterable[tuple[str, str]]) -> dict[tuple[str, str], list[Span]]:
    """When the network has no route between each pair of switches, over a run's timeline: the
    routes of ``net`` (changed in place: pass a fresh one) at the start and after each
    ``link_down`` / ``link_up`` step of ``changes`` (the ones that can remove or restore a route).

    Args:
        net: the planned network (:meth:`testbed.plan.resolved.Plan.network_state`).
        changes: the events' timeline (:func:`testbed.model.timeline.expand`), sorted by ``t_s``.
        pairs: (from switch, to switch) pairs.

    Returns:
        Per pair, its spans without a route in time order, s since the load started (the last
        one ends at ``inf`` when no later step restores it); pairs always connected map to ``[]``.
    """
    pairs = list(dict.fromkeys(pairs))
    spans: dict[tuple[str, str], list[Span]] = {p: [] for p in pairs}
    since: dict[tuple[str, str], float] = {}

    def look(t: float) -> None:
        part = net.components()  # a route exists exactly where the two switches are connected
        for p in pairs:
            cut = p[0] != p[1] and (p[0] not in part or part.get(p[0]) != part.get(p[1]))
            if cut and p not in since:
                since[p] = t
            elif not cut and p in since:
                spans[p].append((since.pop(p), t))

    look(0.0)
    steps = [ch for ch in changes if ch.link is not None and ch.entry.sets_up is not None]
    for i, ch in enumerate(steps):
        net.apply(ch)
        if i + 1 == len(steps) or steps[i + 1].t_s != ch.t_s:  # steps at the same instant: one look
            look(ch.t_s)
    for p, t in since.items():
        spans[p].append((t, math.inf))
    return spans


#: One step of a path's RTT over a run: (from_s, rtt_ms), s since the load started; the RTT holds
#: until the next step (``inf``: no route).
RttStep = tuple[float, float]


def path_rtt_ms(net: NetworkState, path: Sequence[str] | None) -> float:
    """The RTT (ms) of ``path`` (switch names) with the delays of ``net`` now: 2 x the sum of its
    links' one-way delays (``docs/system-model.md``: the host links have none); ``inf`` for None."""
    if path is None:
        return math.inf
    return 2.0 * sum(net.link(a, b).delay_ms for a, b in zip(path, path[1:], strict=False))


def rtt_timeline(net: NetworkState, changes: Sequence[Change],
                 pairs: Iterable[tuple[str, str]]) -> dict[tuple[str, str], list[RttStep]]:
    """The RTT of the path in force between each pair of switches over a run's timeline, with the
    delays in force: the route :meth:`NetworkState.routes` chooses (the controller's rule) and
    :func:`path_rtt_ms` of it, at the start and after every network step of ``changes`` (a
    ``link_down`` reroutes, a ``link_delay`` slows a path; steps at one instant are one look).
    ``net`` is changed in place: pass a fresh one. The one rule of ``expected_rtt_ms`` in both
    engines (:func:`rtt_at`).

    Args:
        net: the planned network (:meth:`testbed.plan.resolved.Plan.network_state`).
        changes: the events' timeline (:func:`testbed.model.timeline.expand`), sorted by ``t_s``.
        pairs: (from switch, to switch) pairs.

    Returns:
        Per pair, its steps ``(from_s, rtt_ms)`` in time order, the first at 0; a step is added
        only when the RTT changes.
    """
    pairs = list(dict.fromkeys(pairs))
    out: dict[tuple[str, str], list[RttStep]] = {p: [] for p in pairs}

    def look(t: float) -> None:
        routes = net.routes(pairs)
        for p in pairs:
            rtt = path_rtt_ms(net, routes[p])
            if not out[p] or out[p][-1][1] != rtt:
                out[p].append((t, rtt))

    look(0.0)
    steps = [ch for ch in changes if ch.link is not None]
    for i, ch in enumerate(steps):
        net.apply(ch)
        if i + 1 == len(steps) or steps[i + 1].t_s != ch.t_s:
            look(ch.t_s)
    return out


def rtt_at(steps: Sequence[RttStep], t_s: float) -> float:
    """The RTT (ms) in force at ``t_s`` (s since the load started) of a pair's :func:`rtt_timeline`
    (the last step at or before ``t_s``; the first step before it; ``inf`` for no steps)."""
    if not steps:
        return math.inf
    i = bisect.bisect_right(steps, t_s, key=lambda st: st[0])
    return steps[max(0, i - 1)][1]


def path_cut(spans: Sequence[Span], t_from_s: float, t_to_s: float) -> bool:
    """Whether the life of a query, [``t_from_s``, ``t_to_s``] (s since the load started: its
    creation to its deadline plus the grace), meets a span without a route (:func:`no_route_spans`)."""
    return any(a <= t_to_s and b > t_from_s for a, b in spans)


__all__ = ["DEFAULT_MTU", "DEFAULT_QUEUE_PACKETS", "FRAME_OVERHEAD_BYTES", "FULL_FRAME_BYTES", "IP_TCP_HEADER_BYTES",
           "MSS_BYTES", "TCP_RTO_MIN_MS", "LinkState", "LinkView", "NetworkState", "Span", "frames", "mss_of",
           "RttStep", "message_ms", "no_route_spans", "p_retransmit", "pipelined_ms", "path_cut", "path_rtt_ms",
           "rtt_at", "rtt_timeline", "transfer_ms", "wire_bytes"]
