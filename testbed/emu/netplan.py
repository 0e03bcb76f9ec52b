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
from dataclasses import dataclass

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
#: Probes per second per target, continuously (a 64-byte UDP datagram each way; testbed.emu.dynamics).
#: While a change is measured, the link's probes run at its kind's ``boost_hz`` for its window.
BASE_HZ = 20.0
#: Kinds whose measurement needs the source -> cluster path probes (kept current with the registry).
PATH_KINDS = EVENT_KINDS.subset(lambda k: bool(getattr(k, "paths", ())))
#: The most packet-hops per wall second the source -> cluster path probes may send in all, at their
#: continuous rate and while a change that moves paths is measured (:func:`path_probe_hz`). A probe
#: and its echo each cross every switch link of the path, an OVS traversal and the link emulator at
#: each. On backbone/americas, 48 paths of 925 switch links in all probed at 20 Hz (37,000
#: packet-hops/s) took 2.65 cores: Open vSwitch 1.8 above its idle 0.56, the link emulators 0.87
#: (``scale_bench.py big experiments/continent-americas.yaml --k 13``, summary.json machine_cpu, and
#: ``scale_bench.py costs topohub:backbone/americas`` for the idle), about 72 us per packet-hop. At
#: 2,000 every other shipped experiment keeps its full rate (1,880 at most), for ~0.15 cores.
PATH_PROBE_BUDGET = 2_000.0
PATH_BOOST_BUDGET = 10_000.0
#: The CPU (us) one probe packet takes per switch link it crosses, as measured above.
PROBE_US_PER_PACKET_HOP = 72.0


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


def path_probe_hops(plan: Plan, sources: set[str] | None = None) -> int:
    """Switch links summed over the planned paths from ``sources`` (None: every source) to every cluster."""
    return sum(len(p.switches) - 1 for p in plan.paths if sources is None or p.source in sources)


def path_probe_hz(plan: Plan, hz: float, budget: float, sources: set[str] | None = None) -> float:
    """The rate (Hz, per path) at which the probes from ``sources`` (None: every source) to every
    cluster are sent: ``hz``, lowered so that the probes and their echoes cross at most ``budget``
    switch links per wall second in all (:data:`PATH_PROBE_BUDGET`, :data:`PATH_BOOST_BUDGET`)."""
    hops = path_probe_hops(plan, sources)
    return min(hz, budget / (2 * hops)) if hops else hz


def path_probe_cores(plan: Plan) -> float:
    """The cores the continuous path probes of ``plan`` take (0 when it has none), at
    :data:`PROBE_US_PER_PACKET_HOP`."""
    if not has_path_probes(plan):
        return 0.0
    hz = path_probe_hz(plan, BASE_HZ, PATH_PROBE_BUDGET)
    return 2 * hz * path_probe_hops(plan) * PROBE_US_PER_PACKET_HOP / 1e6


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
    neighbours tend to share a shard; [] when the system's Open vSwitch serves them all."""
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
    k = SWITCHES_PER_OVS
    return [order[i:i + k] for i in range(0, len(order), k)]


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
