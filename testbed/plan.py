"""The resolved plan of an experiment: switches, links, hosts and expected paths.

``build_plan`` applies every validation rule *before* anything is built (it needs no root and
touches no network state). The rules, each either an error naming the item or a note the plan
prints:

=====================  =============================================  ===============================
what                   our YAML topology                              topohub / GraphML (not editable)
=====================  =============================================  ===============================
duplicate node id      error                                          error
unknown link endpoint  error (with close matches)                     error
self-loop              error                                          dropped, noted
parallel links         error                                          merged (min delay, summed
                                                                      bandwidth), noted
node w/o coordinates   error if a link of it needs a derived delay    same
disconnected graph     error listing the components, unless           same
                       ``keep_largest_component: true`` (then the
                       smaller components are dropped, noted)
DPIDs                  explicit or 1..N; must be unique and in        generated 1..N
                       [1, 2^64-1]
names                  ``[a-z][a-z0-9]*``; interface names            generated s1..sN
                       (``NAME-ethN``) at most 15 bytes (IFNAMSIZ-1)
unknown site           error (with close matches)                     same
=====================  =============================================  ===============================

Link delay: the configured one if given, else great-circle km x ms_per_km x route_factor, never
below delay_floor_ms (system-model.md). RTT of a path = 2 x the sum of its one-way delays.
"""

from __future__ import annotations

import difflib
import ipaddress
import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

import networkx as nx

from testbed.config import Experiment
from testbed.topology import RawTopology, TopologyError, great_circle_km, load_topology

IFNAMSIZ = 16  # Linux include/uapi/linux/if.h; names hold at most IFNAMSIZ-1 = 15 bytes
MAX_DPID = 2**64 - 1
NODE_NAME_RE = re.compile(r"^[a-z][a-z0-9]*$")


class PlanError(ValueError):
    """The experiment cannot be planned; the message names the offending item."""


@dataclass
class Switch:
    """An OpenFlow switch standing for one topology node. ``lat``/``lon`` in degrees."""

    name: str
    dpid: int
    node_id: str
    label: str
    lat: float | None
    lon: float | None


@dataclass
class Link:
    """An undirected switch-switch link. ``delay_ms`` is one-way; ``delay_source`` is one of
    ``config``, ``geo``, ``floor`` (geo below the floor), ``cloud``."""

    index: int
    a: str
    b: str
    delay_ms: float
    bandwidth_mbps: float
    loss_pct: float
    delay_source: str
    km: float | None

    @property
    def emu_name(self) -> str:
        """Name of the namespace node holding the user-space link emulator for this link."""
        return f"l{self.index}"


@dataclass
class Host:
    """A source or cluster host, attached to ``switch`` by a link of ``bandwidth_mbps`` and 0 ms."""

    name: str
    role: str  # "source" | "cluster"
    switch: str
    site: str
    ip: str
    mac: str
    bandwidth_mbps: float
    tier: str | None = None
    cpu_cores: float | None = None
    workers: int | None = None
    models: list[str] = field(default_factory=list)


@dataclass
class PathInfo:
    """Expected path from a source host to a cluster host by least one-way delay."""

    source: str
    cluster: str
    switches: list[str]
    one_way_ms: float

    @property
    def rtt_ms(self) -> float:
        """Expected RTT in ms: 2 x the sum of one-way delays (system-model.md)."""
        return 2.0 * self.one_way_ms


@dataclass
class Plan:
    """Everything ``testbed run`` will build, resolved and validated."""

    experiment: Experiment
    topology_name: str
    switches: list[Switch]
    links: list[Link]
    hosts: list[Host]
    paths: list[PathInfo]
    notes: list[str]

    def switch(self, name: str) -> Switch:
        """The switch called ``name`` (KeyError if none)."""
        for s in self.switches:
            if s.name == name:
                return s
        raise KeyError(name)

    def host(self, name: str) -> Host:
        """The host called ``name`` (KeyError if none)."""
        for h in self.hosts:
            if h.name == name:
                return h
        raise KeyError(name)

    @property
    def sources(self) -> list[Host]:
        return [h for h in self.hosts if h.role == "source"]

    @property
    def clusters(self) -> list[Host]:
        return [h for h in self.hosts if h.role == "cluster"]

    def rtt_ms(self, source: str, cluster: str) -> float:
        """Expected RTT in ms between a source and a cluster host."""
        for p in self.paths:
            if p.source == source and p.cluster == cluster:
                return p.rtt_ms
        raise KeyError((source, cluster))

    def to_dict(self) -> dict:
        """A JSON-serialisable view (written to ``plan.json`` in the run directory)."""
        return {
            "experiment": self.experiment.model_dump(),
            "topology": self.topology_name,
            "switches": [asdict(s) for s in self.switches],
            "links": [asdict(lk) | {"emu_name": lk.emu_name} for lk in self.links],
            "hosts": [asdict(h) for h in self.hosts],
            "paths": [asdict(p) | {"rtt_ms": p.rtt_ms} for p in self.paths],
            "notes": self.notes,
        }

    def write_json(self, path: Path) -> None:
        path.write_text(json.dumps(self.to_dict(), indent=2))


def _suggest(name: str, options: list[str]) -> str:
    close = difflib.get_close_matches(name, options, n=3, cutoff=0.5)
    return f" (did you mean {', '.join(repr(c) for c in close)}?)" if close else ""


def _check_ifname(node: str, ports: int, what: str) -> None:
    longest = f"{node}-eth{max(ports, 0)}"
    if len(longest.encode()) > IFNAMSIZ - 1:
        raise PlanError(
            f"{what} {node!r}: interface name {longest!r} is {len(longest.encode())} bytes, "
            f"over the Linux limit of {IFNAMSIZ - 1}; use a shorter name"
        )


def _check_name(name: str, what: str) -> None:
    if not NODE_NAME_RE.fullmatch(name):
        raise PlanError(f"{what} name {name!r}: use lower-case letters and digits only, starting with a letter")


def build_plan(exp: Experiment, raw: RawTopology | None = None, base_dir: Path = Path(".")) -> Plan:
    """Resolve and validate an experiment into a :class:`Plan`. Builds nothing; needs no root.

    Args:
        exp: the validated experiment file.
        raw: the loaded topology; loaded from ``exp.topology.source`` when None.
        base_dir: folder against which a relative topology path is resolved.

    Raises:
        PlanError: any rule of this module's table is violated; the message names the item.
        TopologyError: the topology cannot be loaded.
    """
    if raw is None:
        raw = load_topology(exp.topology.source, base_dir)
    strict = raw.origin == "yaml"
    tspec = exp.topology
    notes = list(raw.notes)

    # --- nodes: ids, names, DPIDs ---
    nodes: dict[str, Switch] = {}
    for i, n in enumerate(raw.nodes, start=1):
        if n.id in nodes:
            raise PlanError(f"node id {n.id!r} appears twice in topology {raw.name!r}")
        name = n.name or f"s{i}"
        _check_name(name, f"switch (node {n.label!r})")
        dpid = n.dpid if n.dpid is not None else i
        if not 1 <= dpid <= MAX_DPID:
            raise PlanError(f"node {n.label!r}: DPID {dpid} out of range [1, 2^64-1] (0 is not a valid DPID)")
        nodes[n.id] = Switch(name, dpid, n.id, n.label, n.lat, n.lon)
    seen_names: dict[str, str] = {}
    seen_dpids: dict[int, str] = {}
    for s in nodes.values():
        if s.name in seen_names:
            raise PlanError(f"switch name {s.name!r} is used by nodes {seen_names[s.name]!r} and {s.label!r}")
        if s.dpid in seen_dpids:
            raise PlanError(f"DPID {s.dpid:#x} is used by nodes {seen_dpids[s.dpid]!r} and {s.label!r}")
        seen_names[s.name] = s.label
        seen_dpids[s.dpid] = s.label

    def node_of(ref: str, item: str) -> Switch:
        if ref in nodes:
            return nodes[ref]
        by_label = [s for s in nodes.values() if s.label == ref]
        if len(by_label) == 1:
            return by_label[0]
        if len(by_label) > 1:
            raise PlanError(f"{item}: label {ref!r} names {len(by_label)} nodes; use the node id instead")
        options = list(nodes) + [s.label for s in nodes.values()]
        raise PlanError(f"{item}: unknown node {ref!r}{_suggest(ref, options)}")

    # --- links: self-loops, parallel links, delays ---
    merged: dict[frozenset, dict] = {}
    order: list[frozenset] = []
    for j, lk in enumerate(raw.links):
        item = f"link #{j} ({lk.a} - {lk.b})"
        a, b = node_of(lk.a, item), node_of(lk.b, item)
        if a.node_id == b.node_id:
            if strict:
                raise PlanError(f"{item}: self-loop on node {a.label!r}; remove it")
            notes.append(f"self-loop on {a.label!r} dropped (carries no traffic)")
            continue
        if lk.delay_ms is not None:
            delay, source, km = lk.delay_ms, "config", None
        else:
            missing = [s.label for s in (a, b) if s.lat is None or s.lon is None]
            if missing:
                raise PlanError(
                    f"{item}: node {missing[0]!r} has no coordinates, so the link delay cannot be "
                    f"derived from geography; give the link an explicit delay (e.g. delay: 5ms)"
                )
            km = great_circle_km(a.lat, a.lon, b.lat, b.lon)
            geo = km * tspec.ms_per_km * tspec.route_factor
            delay, source = (geo, "geo") if geo >= tspec.delay_floor_ms else (tspec.delay_floor_ms, "floor")
        bw = lk.bandwidth_mbps if lk.bandwidth_mbps is not None else tspec.bandwidth_mbps
        key = frozenset((a.node_id, b.node_id))
        entry = {"a": a, "b": b, "delay": delay, "source": source, "km": km, "bw": bw, "loss": lk.loss_pct}
        if key in merged:
            if strict:
                raise PlanError(f"{item}: parallel link between {a.label!r} and {b.label!r}; keep one")
            old = merged[key]
            notes.append(
                f"parallel links {a.label!r} - {b.label!r} merged into one: delay = min "
                f"({min(old['delay'], delay):.3f} ms), bandwidth = sum ({old['bw'] + bw:g} Mbit/s)"
            )
            if delay < old["delay"]:
                old.update(delay=delay, source=source, km=km)
            old["bw"] += bw
            continue
        merged[key] = entry
        order.append(key)

    # --- connectivity ---
    g = nx.Graph()
    g.add_nodes_from(nodes)
    g.add_edges_from(tuple(k) for k in order)
    comps = sorted(nx.connected_components(g), key=lambda c: (-len(c), sorted(c)))
    if len(comps) > 1:
        if not tspec.keep_largest_component:
            desc = "; ".join(
                f"{{{', '.join(sorted(nodes[n].label for n in c)[:4])}{', ...' if len(c) > 4 else ''}}}"
                for c in comps
            )
            raise PlanError(
                f"topology {raw.name!r} is disconnected: {len(comps)} components: {desc}. "
                f"Connect them, or set topology.keep_largest_component: true"
            )
        dropped = set().union(*comps[1:])
        notes.append(
            f"keep_largest_component: dropped {len(dropped)} node(s) outside the largest component: "
            + ", ".join(sorted(nodes[n].label for n in dropped))
        )
        for n in dropped:
            del nodes[n]
        order = [k for k in order if k <= set(nodes)]
    if not nodes:
        raise PlanError(f"topology {raw.name!r} has no nodes")

    switches = list(nodes.values())
    links = [
        Link(i, merged[k]["a"].name, merged[k]["b"].name, merged[k]["delay"], merged[k]["bw"],
             merged[k]["loss"], merged[k]["source"], merged[k]["km"])
        for i, k in enumerate(order, start=1)
    ]

    # --- the cloud ---
    cloud_switch: Switch | None = None
    if exp.cloud is not None:
        anchor = node_of(exp.cloud.attach_to, "cloud.attach_to")
        used = [int(s.name[1:]) for s in switches if re.fullmatch(r"s\d+", s.name)]
        name = f"s{max(used, default=0) + 1}"
        dpid = max(s.dpid for s in switches) + 1
        if dpid > MAX_DPID or name in seen_names:
            raise PlanError("cannot allocate a name/DPID for the cloud switch")
        cloud_switch = Switch(name, dpid, "cloud", "cloud", None, None)
        switches.append(cloud_switch)
        links.append(Link(len(links) + 1, anchor.name, name, exp.cloud.delay_ms,
                          exp.cloud.bandwidth_mbps, 0.0, "cloud", None))

    # --- hosts ---
    hosts: list[Host] = []
    net = ipaddress.ip_network("10.0.0.0/8")

    def site_switch(site: str, item: str) -> Switch:
        if site == "cloud":
            assert cloud_switch is not None  # config validation guarantees a cloud section
            return cloud_switch
        sw = node_of(site, item)
        if sw.node_id not in nodes:
            raise PlanError(f"{item}: site {site!r} was dropped with its component (keep_largest_component)")
        return sw

    for src in exp.sources:
        sw = site_switch(src.site, f"source {src.name!r}")
        hosts.append(Host(src.name, "source", sw.name, sw.label, "", "", tspec.host_bandwidth_mbps))
    for c in exp.clusters:
        sw = site_switch(c.site, f"cluster {c.name!r}")
        hosts.append(Host(c.name, "cluster", sw.name, sw.label, "", "", tspec.host_bandwidth_mbps,
                          c.tier, c.cpu_cores, c.workers, list(c.models)))
    for k, h in enumerate(hosts, start=1):
        h.ip = str(net.network_address + k)
        h.mac = ":".join(f"{b:02x}" for b in k.to_bytes(6, "big"))

    # --- names and interface lengths ---
    all_names: dict[str, str] = {s.name: f"switch {s.label!r}" for s in switches}
    for lk in links:
        if lk.emu_name in all_names:
            raise PlanError(f"switch name {lk.emu_name!r} ({all_names[lk.emu_name]}) is reserved for the link "
                            f"emulator of link #{lk.index}; names l<digits> cannot be switch names")
        all_names[lk.emu_name] = f"link emulator of {lk.a}-{lk.b}"
    for h in hosts:
        if h.name in all_names:
            raise PlanError(f"{h.role} name {h.name!r} clashes with {all_names[h.name]}; rename it")
        all_names[h.name] = h.role
        _check_ifname(h.name, 0, h.role)
    ports = {s.name: 0 for s in switches}
    for lk in links:
        ports[lk.a] += 1
        ports[lk.b] += 1
    for h in hosts:
        ports[h.switch] += 1
    for s in switches:
        _check_ifname(s.name, ports[s.name], "switch")
    for lk in links:
        _check_ifname(lk.emu_name, 1, "link emulator")

    # --- expected paths (least one-way delay; ties broken by the switch graph's order) ---
    sg = nx.Graph()
    sg.add_nodes_from(s.name for s in switches)
    for lk in links:
        sg.add_edge(lk.a, lk.b, delay=lk.delay_ms)
    paths = []
    for s in (h for h in hosts if h.role == "source"):
        dist, route = nx.single_source_dijkstra(sg, s.switch, weight="delay")
        for c in (h for h in hosts if h.role == "cluster"):
            paths.append(PathInfo(s.name, c.name, route[c.switch], dist[c.switch]))

    return Plan(exp, raw.name, switches, links, hosts, paths, notes)


def plan_experiment(path: str | Path) -> Plan:
    """Load an experiment file and plan it (see :func:`build_plan`).

    Raises:
        ConfigError, PlanError, TopologyError: with a message naming the offending item.
    """
    from testbed.config import load_experiment

    path = Path(path)
    exp = load_experiment(path)
    return build_plan(exp, base_dir=path.parent)


__all__ = ["Plan", "PlanError", "TopologyError", "build_plan", "plan_experiment"]
