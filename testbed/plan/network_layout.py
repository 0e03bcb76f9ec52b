"""The network of a plan: switches (ids, names, DPIDs), links (delays from geography, capacities,
self-loops and parallel links), connectivity, the cloud, the hosts and their addresses, and the
expected paths. The rules are the network rows of :mod:`testbed.plan.build`'s table.

Each step takes the :class:`Network` the earlier steps resolved and adds to it; the order is
:func:`testbed.plan.build.build_plan`'s.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field

import networkx as nx

from testbed.core.util import did_you_mean
from testbed.model.routing import least_delay_paths
from testbed.plan.resolved import Host, Link, PathInfo, PlanError, Switch
from testbed.spec.experiment import Experiment
from testbed.spec.topology import RawLink, RawTopology, great_circle_km

MAX_DPID = 2**64 - 1
NODE_NAME_RE = re.compile(r"^[a-z][a-z0-9]*$")


def check_name(name: str, what: str) -> None:
    """Raises PlanError unless ``name`` is ``[a-z][a-z0-9]*``."""
    if not NODE_NAME_RE.fullmatch(name):
        raise PlanError(f"{what} name {name!r}: use lower-case letters and digits only, starting with a letter")


@dataclass
class _Draft:
    """A switch-switch link before connectivity is checked: its ends, one-way delay (ms) and where
    it comes from, km, capacity (Mbit/s) and loss (%)."""

    a: Switch
    b: Switch
    delay: float
    source: str
    km: float | None
    bw: float
    loss: float


@dataclass
class LinkDrafts:
    """What :func:`read_links` found: the links by node-id pair (first-seen order) and the links
    whose delay needs coordinates an end lacks (an error unless their component is dropped)."""

    merged: dict[frozenset, _Draft] = field(default_factory=dict)
    undelayed: list[tuple[Switch, Switch]] = field(default_factory=list)


@dataclass
class Network:
    """The network resolved so far. ``nodes``: node id -> switch (the kept ones after
    :func:`keep_connected`); ``dropped``: ids and labels of the nodes ``keep_largest_component``
    dropped; ``notes``: what the plan prints."""

    exp: Experiment
    raw: RawTopology
    notes: list[str]
    nodes: dict[str, Switch] = field(default_factory=dict)
    names: set[str] = field(default_factory=set)  # every node's switch name, dropped ones included
    dropped: set[str] = field(default_factory=set)
    switches: list[Switch] = field(default_factory=list)
    links: list[Link] = field(default_factory=list)
    hosts: list[Host] = field(default_factory=list)
    cloud_switch: Switch | None = None

    @property
    def strict(self) -> bool:
        """Our YAML topology (errors) rather than a dataset (dropped or merged, noted)."""
        return self.raw.origin == "yaml"

    def node_of(self, ref: str, item: str) -> Switch:
        """The switch a topology reference (node id or unique label) names.

        Raises:
            PlanError: unknown (with close matches), dropped or ambiguous reference, naming ``item``.
        """
        if ref in self.nodes:
            return self.nodes[ref]
        if ref in self.dropped:
            raise PlanError(f"{item}: node {ref!r} was dropped with its component (topology.keep_largest_component "
                            f"keeps only the largest); connect it, or pick a site in the largest component")
        by_label = [s for s in self.nodes.values() if s.label == ref]
        if len(by_label) == 1:
            return by_label[0]
        if len(by_label) > 1:
            raise PlanError(f"{item}: label {ref!r} names {len(by_label)} nodes; use the node id instead")
        options = list(self.nodes) + [s.label for s in self.nodes.values()]
        why = " (topohub drops nodes that have no coordinates before loading)" if self.raw.origin == "topohub" else ""
        raise PlanError(f"{item}: unknown node {ref!r}{did_you_mean(ref, options)}{why}{self.node_list()}")

    def node_list(self, most: int = 60) -> str:
        """``; the topology's nodes (label, else id): A, B, ...`` (at most ``most`` of them, then how many more)."""
        labels = [s.label for s in self.nodes.values()]
        more = f" ... and {len(labels) - most} more" if len(labels) > most else ""
        return f"; the topology's nodes: {', '.join(map(repr, labels[:most]))}{more}"

    def site_switch(self, site: str, item: str) -> Switch:
        """The switch of a site: ``cloud`` or a node reference (:meth:`node_of`)."""
        if site == "cloud":
            assert self.cloud_switch is not None  # config validation guarantees a cloud section
            return self.cloud_switch
        return self.node_of(site, item)


# --------------------------------------------------------------------------- step: nodes

def add_nodes(net: Network) -> None:
    """Ids, switch names and DPIDs (unique, in range), coordinates (``topology.coordinates`` win)."""
    raw = net.raw
    given = dict(net.exp.topology.coordinates)
    for i, n in enumerate(raw.nodes, start=1):
        if not n.id.strip():
            raise PlanError(f"node {i} of topology {raw.name!r} has an empty id (ids name the sites that "
                            f"clusters, sources and links refer to)")
        if n.id in net.nodes:
            raise PlanError(f"node id {n.id!r} appears twice in topology {raw.name!r}")
        name = n.name or f"s{i}"
        check_name(name, f"switch (node {n.label!r})")
        dpid = n.dpid if n.dpid is not None else i
        if not 1 <= dpid <= MAX_DPID:
            raise PlanError(f"node {n.label!r}: DPID {dpid} out of range [1, 2^64-1] (0 is not a valid DPID)")
        lat, lon = n.lat, n.lon
        ll = given.pop(n.id, None) or given.pop(n.label, None)
        if ll is not None:
            lat, lon = ll
        net.nodes[n.id] = Switch(name=name, dpid=dpid, node_id=n.id, label=n.label, lat=lat, lon=lon)
    if given:
        known = [n.id for n in raw.nodes] + [n.label for n in raw.nodes]
        raise PlanError(f"topology.coordinates: no node {', '.join(map(repr, sorted(given)))} in topology "
                        f"{raw.name!r}{did_you_mean(sorted(given)[0], known)}")
    _check_unique(net)


def _check_unique(net: Network) -> None:
    """Switch names and DPIDs used once (:attr:`Network.names` records the names)."""
    names: dict[str, str] = {}
    dpids: dict[int, str] = {}
    for s in net.nodes.values():
        if s.name in names:
            raise PlanError(f"switch name {s.name!r} is used by nodes {names[s.name]!r} and {s.label!r}")
        if s.dpid in dpids:
            raise PlanError(f"DPID {s.dpid:#x} is used by nodes {dpids[s.dpid]!r} and {s.label!r}")
        names[s.name] = s.label
        dpids[s.dpid] = s.label
    net.names = set(names)


# --------------------------------------------------------------------------- step: links

def link_delay(exp: Experiment, a: Switch, b: Switch, configured: float | None,
               km: float | None = None) -> tuple[float, str, float | None] | None:
    """A link's one-way delay (ms), its source (``config``, ``geo``, ``floor``) and km (``km``:
    the length a planar dataset gives): the configured one, else great-circle km x ms_per_km x
    route_factor, never below delay_floor_ms. None when an end lacks coordinates and no length
    is given."""
    if configured is not None:
        return configured, "config", None
    if km is None and any(s.lat is None or s.lon is None for s in (a, b)):
        return None
    t = exp.topology
    km = km if km is not None else great_circle_km(a.lat, a.lon, b.lat, b.lon)
    geo = km * t.ms_per_km * t.route_factor
    return (geo, "geo", km) if geo >= t.delay_floor_ms else (t.delay_floor_ms, "floor", km)


def _bandwidth(net: Network, lk: RawLink) -> tuple[float, str]:
    """A link's capacity (Mbit/s) and where it comes from."""
    default = net.exp.topology.bandwidth_mbps
    if lk.bandwidth_mbps is None or (net.raw.origin == "graphml" and not net.exp.topology.dataset_link_speeds):
        return default, "default"
    return lk.bandwidth_mbps, lk.bandwidth_from or "config"


def _note_bandwidths(net: Network, sources: list[tuple[str, str, str, float]]) -> None:
    """Notes on where the links' capacities come from (GraphML datasets); how the emulation
    shapes each one is the bring-up's report (``network.json``)."""
    if net.raw.origin != "graphml":
        return
    counts: dict[str, int] = {}
    for _a, _b, src, _bw in sources:
        key = src.split(" ")[0]
        counts[key] = counts.get(key, 0) + 1
    default = net.exp.topology.bandwidth_mbps
    how = ", ".join(f"{n} from {k}" if k != "default" else f"{n} not given (topology.bandwidth, {default:g} "
                    f"Mbit/s)" for k, n in sorted(counts.items()))
    off = "" if net.exp.topology.dataset_link_speeds else " (topology.dataset_link_speeds: false)"
    net.notes.append(f"GraphML link capacities{off}: {how}")
    for a, b, src, bw in sources:
        if "range" in src:
            net.notes.append(f"link {a!r} - {b!r}: {src} -> {bw:g} Mbit/s")


def read_links(net: Network) -> LinkDrafts:
    """Self-loops, parallel links and each link's delay and bandwidth."""
    drafts = LinkDrafts()
    sources: list[tuple[str, str, str, float]] = []
    for j, lk in enumerate(net.raw.links):
        item = f"link #{j} ({lk.a} - {lk.b})"
        a, b = net.node_of(lk.a, item), net.node_of(lk.b, item)
        if a.node_id == b.node_id:
            if net.strict:
                raise PlanError(f"{item}: self-loop on node {a.label!r}; remove it")
            net.notes.append(f"self-loop on {a.label!r} dropped (carries no traffic)")
            continue
        derived = link_delay(net.exp, a, b, lk.delay_ms, lk.km)
        if derived is None:  # an error unless keep_largest_component drops it (keep_connected)
            drafts.undelayed.append((a, b))
            continue
        delay, source, km = derived
        bw, bw_from = _bandwidth(net, lk)
        sources.append((a.label, b.label, bw_from, bw))
        new = _Draft(a, b, delay, source, km, bw, lk.loss_pct)
        key = frozenset((a.node_id, b.node_id))
        if key in drafts.merged:
            _merge_parallel(net, drafts.merged[key], new, item)
        else:
            drafts.merged[key] = new
    _note_bandwidths(net, sources)
    return drafts


def _merge_parallel(net: Network, old: _Draft, new: _Draft, item: str) -> None:
    """A parallel link: an error in our YAML, else merged into ``old`` (min delay, summed bandwidth)."""
    if net.strict:
        raise PlanError(f"{item}: parallel link between {new.a.label!r} and {new.b.label!r}; keep one")
    net.notes.append(
        f"parallel links {new.a.label!r} - {new.b.label!r} merged into one: delay = min "
        f"({min(old.delay, new.delay):.3f} ms), bandwidth = sum ({old.bw + new.bw:g} Mbit/s)"
    )
    if new.delay < old.delay:
        old.delay, old.source, old.km = new.delay, new.source, new.km
    old.bw += new.bw


# --------------------------------------------------------------------------- step: connectivity

def keep_connected(net: Network, drafts: LinkDrafts) -> None:
    """One component, or the largest kept (``keep_largest_component``), said in the notes; then
    every kept link's delay derivable; then the switches and numbered links of the plan."""
    _drop_small_components(net, drafts)
    if not net.nodes:
        raise PlanError(f"topology {net.raw.name!r} has no nodes")
    _check_coordinates(net, drafts)
    net.switches = list(net.nodes.values())
    net.links = [Link(index=i, a=d.a.name, b=d.b.name, delay_ms=d.delay, bandwidth_mbps=d.bw, loss_pct=d.loss,
                      delay_source=d.source, km=d.km)
                 for i, d in enumerate(drafts.merged.values(), start=1)]


def _drop_small_components(net: Network, drafts: LinkDrafts) -> None:
    nodes = net.nodes
    g = nx.Graph()
    g.add_nodes_from(nodes)
    g.add_edges_from(tuple(k) for k in drafts.merged)
    g.add_edges_from((a.node_id, b.node_id) for a, b in drafts.undelayed)
    comps = sorted(nx.connected_components(g), key=lambda c: (-len(c), sorted(c)))
    if len(comps) <= 1:
        return
    if not net.exp.topology.keep_largest_component:
        desc = "; ".join(f"{{{', '.join(sorted(nodes[n].label for n in c)[:4])}{', ...' if len(c) > 4 else ''}}}"
                         for c in comps)
        raise PlanError(f"topology {net.raw.name!r} is disconnected: {len(comps)} components: {desc}. "
                        f"Connect them, or set topology.keep_largest_component: true")
    dropped = set().union(*comps[1:])
    net.notes.append(f"keep_largest_component: dropped {len(dropped)} node(s) outside the largest component: "
                     + ", ".join(sorted(nodes[n].label for n in dropped)))
    net.dropped = {nodes[n].label for n in dropped} | set(dropped)
    for n in dropped:
        del nodes[n]
    drafts.merged = {k: d for k, d in drafts.merged.items() if k <= set(nodes)}


def _check_coordinates(net: Network, drafts: LinkDrafts) -> None:
    """Raises the error naming every kept node without coordinates that a derived delay needs."""
    missing: dict[str, list[str]] = {}
    for a, b in drafts.undelayed:
        if a.node_id in net.nodes:
            for s, other in ((a, b), (b, a)):
                if s.lat is None or s.lon is None:
                    missing.setdefault(s.label, []).append(other.label)
    if not missing:
        return
    names = "; ".join(f"node {lbl!r} has no coordinates (links to {', '.join(map(repr, sorted(set(ends))))})"
                      for lbl, ends in sorted(missing.items()))
    fix = "set topology.coordinates: {NODE: [lat, lon], ...} in the experiment"
    if net.raw.origin == "yaml":
        advice = f"give these nodes lat/lon in the topology file, give their links an explicit delay " \
                 f"(e.g. delay: 5ms), or {fix}"
    elif net.raw.origin == "graphml":
        advice = f"{fix} (nodes by label or id), or add Latitude/Longitude <data> to these nodes in the " \
                 f"GraphML file"
    else:
        advice = fix
    raise PlanError(f"{len(missing)} node(s) lack coordinates, so the delay of their links cannot be derived "
                    f"from geography: {names}. To fix: {advice}")


# --------------------------------------------------------------------------- steps: cloud, hosts, paths

def add_cloud(net: Network) -> None:
    """The cloud switch and its long link to ``cloud.attach_to``."""
    cloud = net.exp.cloud
    if cloud is None:
        return
    anchor = net.node_of(cloud.attach_to, "cloud.attach_to")
    used = [int(s.name[1:]) for s in net.switches if re.fullmatch(r"s\d+", s.name)]
    name = f"s{max(used, default=0) + 1}"
    dpid = max(s.dpid for s in net.switches) + 1
    if dpid > MAX_DPID or name in net.names:
        raise PlanError("cannot allocate a name/DPID for the cloud switch")
    net.cloud_switch = Switch(name=name, dpid=dpid, node_id="cloud", label="cloud", lat=None, lon=None)
    net.switches.append(net.cloud_switch)
    net.links.append(Link(index=len(net.links) + 1, a=anchor.name, b=name, delay_ms=cloud.delay_ms,
                          bandwidth_mbps=cloud.bandwidth_mbps, loss_pct=0.0, delay_source="cloud", km=None))


def add_hosts(net: Network) -> None:
    """One host per source and cluster, with its IP (10.0.0.k/8) and MAC (00:..:k)."""
    hbw = net.exp.topology.host_bandwidth_mbps
    for i, src in enumerate(net.exp.sources):
        sw = net.site_switch(src.site, f"sources.{i}.site: source {src.name!r}")
        net.hosts.append(Host(name=src.name, role="source", switch=sw.name, site=sw.label, bandwidth_mbps=hbw))
    for i, c in enumerate(net.exp.clusters):
        sw = net.site_switch(c.site, f"clusters.{i}.site: cluster {c.name!r}")
        net.hosts.append(Host(name=c.name, role="cluster", switch=sw.name, site=sw.label, bandwidth_mbps=hbw,
                              tier=c.tier, cpu_cores=c.cpu_cores, workers=c.workers, models=list(c.models)))
    addresses = ipaddress.ip_network("10.0.0.0/8")
    for k, h in enumerate(net.hosts, start=1):
        h.ip = str(addresses.network_address + k)
        h.mac = ":".join(f"{b:02x}" for b in k.to_bytes(6, "big"))


def expected_paths(net: Network) -> list[PathInfo]:
    """Least one-way delay path of every (source, cluster) pair: the controller's path, by the one
    rule :func:`testbed.model.routing.least_delay_paths` (ties: fewer hops, then the lower DPID);
    ``one_way_ms`` the sum of its links' delays from the source."""
    sources = [h for h in net.hosts if h.role == "source"]
    clusters = [h for h in net.hosts if h.role == "cluster"]
    delay = {frozenset((lk.a, lk.b)): lk.delay_ms for lk in net.links}
    routes = least_delay_paths(((lk.a, lk.b, lk.delay_ms) for lk in net.links),
                               [(s.switch, c.switch) for s in sources for c in clusters],
                               {sw.name: sw.dpid for sw in net.switches})
    paths = []
    for s in sources:
        for c in clusters:
            route = routes[(s.switch, c.switch)]
            if route is None:  # keep_connected leaves one component: not expected
                raise PlanError(f"no path from source {s.name!r} to cluster {c.name!r}")
            one_way = 0.0
            for a, b in zip(route, route[1:], strict=False):
                one_way += delay[frozenset((a, b))]
            paths.append(PathInfo(source=s.name, cluster=c.name, switches=route, one_way_ms=one_way))
    return paths


__all__ = ["MAX_DPID", "LinkDrafts", "Network", "add_cloud", "add_hosts", "add_nodes", "check_name",
           "expected_paths", "keep_connected", "link_delay", "read_links"]
