"""The emulated network's names, addresses and OVS shards, from the plan: nothing is built here.

Which links get probe hosts (:func:`probed_links`, :class:`ProbeHost`), how links are grouped over
link-emulator processes (:func:`emulator_groups`) and switches over OVS shards (:func:`ovs_shards`),
the names of switch ports and control veths (Linux's 15-byte limit: :func:`check_interface_names`)
and the shards' control addresses. :mod:`testbed.emu.mininet_network` builds the network from these.
"""

from __future__ import annotations

import hashlib
import ipaddress
import os
from collections import Counter
from dataclasses import dataclass

from testbed.core.clock import EmulatedClock
from testbed.core.errors import RunFailure
from testbed.model.timeline import EVENT_KINDS
from testbed.plan.build import Plan

#: Links served by one link-emulator process (one epoll loop, one timer);
#: ``$TESTBED_LINKS_PER_EMULATOR`` overrides it (benchmarks).
LINKS_PER_EMULATOR = int(os.environ.get("TESTBED_LINKS_PER_EMULATOR", "64"))
#: Switches per OVS shard, and the network size from which shards are used (userspace datapath).
#: Measured on Gabriel 100 under SCHED_FIFO, RTT self-check error median: 4.1 ms with 10 per shard,
#: 3.1-3.5 with 5, 3.2-3.3 with 3 (and more processes). ``$TESTBED_SWITCHES_PER_OVS`` /
#: ``$TESTBED_SHARD_ABOVE`` override them (benchmarks).
SWITCHES_PER_OVS = int(os.environ.get("TESTBED_SWITCHES_PER_OVS", "5"))
SHARD_ABOVE_SWITCHES = int(os.environ.get("TESTBED_SHARD_ABOVE", "16"))
#: ryu-manager's OpenFlow address when shards are used (a /32 in the root namespace), and the
#: /22 the shards' control veths are numbered from (root side .2k, shard side .2k+1).
CONTROLLER_IP = "169.254.255.254"
CONTROL_NET = "169.254.252.0"
#: Probes per second of emulated time per target, continuously (a 64-byte UDP datagram each way;
#: testbed.emu.dynamics; under time dilation k, BASE_HZ / k a wall second). While a change is
#: measured, the link's probes run at its kind's ``boost_hz`` (wall clock) for its window.
BASE_HZ = 20.0
#: Kinds whose measurement needs the source -> cluster path probes (kept current with the registry).
PATH_KINDS = EVENT_KINDS.subset(lambda k: bool(getattr(k, "paths", ())))
#: The CPU (cores) the source -> cluster path probes may take in all, at their continuous rate and
#: while a change that moves paths is measured (:func:`path_probe_hz`): 2,000 and 10,000
#: packet-hops a second at :data:`PROBE_US_PER_PACKET_HOP`. At 2,000 every other shipped
#: experiment keeps its full rate (1,880 at most), for ~0.15 cores.
PATH_PROBE_BUDGET = 2_000 * 72e-6
PATH_BOOST_BUDGET = 10_000 * 72e-6
#: The CPU (us) one probe packet takes per switch link it crosses (an OVS traversal and the link
#: emulator): on backbone/americas, 48 paths of 925 switch links in all probed at 20 Hz (37,000
#: packet-hops/s) took 2.65 cores: Open vSwitch 1.8 above its idle 0.56, the link emulators 0.87
#: (``scale_bench.py big experiments/continent-americas.yaml --k 13``, summary.json machine_cpu, and
#: ``scale_bench.py costs topohub:backbone/americas`` for the idle), about 72 us per packet-hop, its
#: OVS processes serving 15 ports on average.
PROBE_US_PER_PACKET_HOP = 72.0
#: And per port beyond :data:`SHARD_MAX_PORTS` of the Open vSwitch process serving a switch it
#: traverses (a hub alone in its shard): that process wakes at the packet and polls every one of its
#: ports (a ``recvmmsg`` and 32 packet buffers allocated and freed per port: half of its CPU in
#: malloc / free, ``perf record`` of the hub's shard). On experiments/isp-att.yaml at 20 Hz, the
#: shard of 531 ports (a 449-port hub) took 1.85 ms per traversal (0.67 cores for 360 traversals a
#: second, per-shard CPU from /proc over 15 s): (1,850 - 68) / 516 us per port beyond americas' 15.
PROBE_US_PER_OVS_PORT = 3.45
#: Ports at most per OVS shard (with at most :data:`SWITCHES_PER_OVS` switches); a switch with more
#: ports than this has a shard of its own, so that its neighbours' packets do not poll its ports.
SHARD_MAX_PORTS = int(os.environ.get("TESTBED_SHARD_MAX_PORTS", "60"))


class EmulationError(RunFailure):
    """The emulated network could not be built, a change could not be applied, or a self-check failed."""


# --------------------------------------------------------------------------- names and addresses

def probed_links(plan: Plan) -> list[int]:
    """Indices (``Link.index``) of the links that scenario events change, sorted."""
    pairs = {frozenset(c.link) for c in plan.changes if c.link is not None}
    return sorted(lk.index for lk in plan.links if frozenset((lk.a, lk.b)) in pairs)


def has_path_probes(plan: Plan) -> bool:
    """Whether a run of ``plan`` probes its source -> cluster paths (a change of a :data:`PATH_KINDS` kind)."""
    return any(c.kind in PATH_KINDS for c in plan.changes)


def ovs_ports(plan: Plan, datapath: str) -> dict[str, int]:
    """Per switch, the ports of the Open vSwitch process that serves it: its shard's
    (:func:`ovs_shards`), or every switch port when the system's Open vSwitch serves them all in
    userspace; 0 with the kernel datapath, which polls no port."""
    if datapath != "user":
        return {sw.name: 0 for sw in plan.switches}
    own = Counter(sw for sw, _ in _port_order(plan))
    shards = ovs_shards(plan, datapath) or [[sw.name for sw in plan.switches]]
    return {sw: sum(own[x] for x in group) for group in shards for sw in group}


def path_probe_us(plan: Plan, sources: set[str] | None = None, datapath: str = "user",
                  ports: dict[str, int] | None = None) -> float:
    """The CPU (us) one probe packet takes along every planned path from ``sources`` (None: every
    source) to every cluster, summed: :data:`PROBE_US_PER_PACKET_HOP` per switch link, and
    :data:`PROBE_US_PER_OVS_PORT` per port beyond :data:`SHARD_MAX_PORTS` of the Open vSwitch
    process of each switch traversed (``ports``: :func:`ovs_ports` of ``datapath``, computed when None)."""
    ports = ovs_ports(plan, datapath) if ports is None else ports
    paths = [p for p in plan.paths if sources is None or p.source in sources]
    return sum(PROBE_US_PER_PACKET_HOP * (len(p.switches) - 1)
               + PROBE_US_PER_OVS_PORT * sum(max(0, ports[sw] - SHARD_MAX_PORTS) for sw in p.switches)
               for p in paths)


def path_probe_hz(plan: Plan, hz: float, budget: float, sources: set[str] | None = None,
                  datapath: str = "user", ports: dict[str, int] | None = None) -> float:
    """The rate (Hz, per path) at which the probes from ``sources`` (None: every source) to every
    cluster are sent: ``hz``, lowered so that the probes and their echoes take at most ``budget``
    cores in all (:data:`PATH_PROBE_BUDGET`, :data:`PATH_BOOST_BUDGET`; cost :func:`path_probe_us`)."""
    us = path_probe_us(plan, sources, datapath, ports)
    return min(hz, budget * 1e6 / (2 * us)) if us else hz


def continuous_probe_hz(plan: Plan, ports: dict[str, int] | None = None, datapath: str = "user") -> tuple[float, float]:
    """The continuous probes' rates of a run of ``plan`` on the wall clock (Hz per target): a link's
    probes, and a source -> cluster path's (:func:`path_probe_hz` within :data:`PATH_PROBE_BUDGET`).
    Both are :data:`BASE_HZ` of emulated time: under time dilation k (``plan.time_dilation``),
    ``BASE_HZ / k`` a wall second, as every other rate of the emulated system."""
    hz = EmulatedClock(plan.time_dilation).wall_rate(BASE_HZ)
    return hz, path_probe_hz(plan, hz, PATH_PROBE_BUDGET, datapath=datapath, ports=ports)


def path_probe_cores(plan: Plan, datapath: str = "user") -> float:
    """The cores the continuous path probes of ``plan`` take at its time dilation (their wall-clock
    rate, :func:`continuous_probe_hz`, at :func:`path_probe_us` each; 0 when it has none)."""
    if not has_path_probes(plan):
        return 0.0
    ports = ovs_ports(plan, datapath)
    hz = continuous_probe_hz(plan, ports, datapath)[1]
    return 2 * hz * path_probe_us(plan, ports=ports) / 1e6


@dataclass(frozen=True)
class ProbeHost:
    """A probe host at one end (``side`` a or b) of link ``link`` (its ``Link.index``), attached to
    ``switch``; ``peer`` is the probe host at the other end."""

    name: str
    link: int
    side: str
    switch: str
    ip: str
    mac: str
    peer: str


def probe_hosts(plan: Plan) -> list[ProbeHost]:
    """The probe hosts of the plan (two per probed link), in build order."""
    out = []
    by_index = {lk.index: lk for lk in plan.links}
    for i in probed_links(plan):
        lk = by_index[i]
        for side, sw, other in (("a", lk.a, "b"), ("b", lk.b, "a")):
            k = 250 if side == "a" else 251
            out.append(ProbeHost(name=f"P{i}{side}", link=i, side=side, switch=sw,
                                 ip=f"10.{k}.{(i + 1) >> 8 & 255}.{(i + 1) & 255}",
                                 mac=f"02:7e:{k - 250:02x}:{(i + 1) >> 16 & 255:02x}:{(i + 1) >> 8 & 255:02x}:"
                                     f"{(i + 1) & 255:02x}", peer=f"P{i}{other}"))
    return out


def emulator_groups(plan: Plan) -> dict[str, list[int]]:
    """Emulator node (and process) name ``E<g>`` -> the link indices it serves (userspace mode)."""
    idx = [lk.index for lk in plan.links]
    return {f"E{k}": idx[i:i + LINKS_PER_EMULATOR] for k, i in enumerate(range(0, len(idx), LINKS_PER_EMULATOR))}


def ovs_shards(plan: Plan, datapath: str) -> list[list[str]]:
    """Switch names per OVS shard (module doc), breadth-first from the first switch so that
    neighbours tend to share a shard, at most :data:`SWITCHES_PER_OVS` switches and
    :data:`SHARD_MAX_PORTS` ports each (a switch with more alone); [] when the system's Open
    vSwitch serves them all."""
    if datapath != "user" or len(plan.switches) <= SHARD_ABOVE_SWITCHES:
        return []
    adj: dict[str, list[str]] = {s.name: [] for s in plan.switches}
    for lk in plan.links:
        adj[lk.a].append(lk.b)
        adj[lk.b].append(lk.a)
    order: list[str] = []
    seen: set[str] = set()
    for start in adj:
        if start in seen:
            continue
        seen.add(start)
        queue = [start]
        while queue:
            u = queue.pop(0)
            order.append(u)
            for v in adj[u]:
                if v not in seen:
                    seen.add(v)
                    queue.append(v)
    own = Counter(sw for sw, _ in _port_order(plan))
    shards: list[list[str]] = []
    ports = 0
    for sw in order:
        if not shards or len(shards[-1]) >= SWITCHES_PER_OVS or ports + own[sw] > SHARD_MAX_PORTS:
            shards.append([])
            ports = 0
        shards[-1].append(sw)
        ports += own[sw]
    return shards


def control_veth(run_id: str, k: int) -> str:
    """Root-namespace name of shard ``k``'s control veth (unique per run, <= 15 bytes)."""
    return f"tbc{hashlib.sha1(run_id.encode()).hexdigest()[:5]}{k}"


def _port_order(plan: Plan) -> list[tuple[str, str]]:
    """(switch, what) for every switch port in the order the build creates them (Mininet numbers
    a switch's ports 1, 2, ... in that order)."""
    order = []
    for lk in plan.links:
        order += [(lk.a, f"link{lk.index}"), (lk.b, f"link{lk.index}")]
    order += [(h.switch, h.name) for h in plan.hosts]
    order += [(p.switch, p.name) for p in probe_hosts(plan)]
    return order


def switch_port_names(plan: Plan) -> list[str]:
    """Root-namespace interface names of every switch port, in build order."""
    count = {s.name: 0 for s in plan.switches}
    names = []
    for sw, _ in _port_order(plan):
        count[sw] += 1
        names.append(f"{sw}-eth{count[sw]}")
    return names


def host_port_numbers(plan: Plan) -> dict[str, int]:
    """Host (and probe host) -> its switch's OpenFlow port number (known before the build)."""
    hosts = {h.name for h in plan.hosts} | {p.name for p in probe_hosts(plan)}
    return {what: int(name.rsplit("-eth", 1)[1]) for (_, what), name in zip(_port_order(plan), switch_port_names(plan),
                                                                           strict=True) if what in hosts}


def planned_root_interfaces(plan: Plan, link_emulator: str, datapath: str = "kernel", run_id: str = "") -> list[str]:
    """Names of the root-namespace interfaces the build will create, for cleanup: the switch ports,
    or, with OVS shards (whose namespaces hold the ports), the shards' control veths."""
    shards = ovs_shards(plan, datapath)
    if shards:
        return [control_veth(run_id, k) for k in range(len(shards))]
    return switch_port_names(plan)


def check_interface_names(plan: Plan) -> None:
    """Every switch port name fits Linux's 15 bytes once probe hosts are added.

    Raises:
        EmulationError: naming the switch and the name.
    """
    for name in switch_port_names(plan):
        if len(name.encode()) > 15:
            raise EmulationError(f"switch port {name!r} is {len(name.encode())} bytes, over Linux's 15 (the "
                                 f"probe hosts of the scenario's link events add ports): use a shorter switch name")


def control_addresses(k: int) -> tuple[str, str]:
    """(root side, shard side) addresses of shard ``k``'s control veth, a /31 each."""
    base = int(ipaddress.ip_address(CONTROL_NET)) + 2 * k
    return str(ipaddress.ip_address(base)), str(ipaddress.ip_address(base + 1))
