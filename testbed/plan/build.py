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
node w/o coordinates   error naming every node a derived delay        same, with the GraphML advice;
                       needs (give lat/lon or the links' delay)       ``topology.coordinates`` fixes
                                                                      both
link capacity          ``bandwidth`` of the link, else the default    GraphML: LinkSpeedRaw, LinkSpeed,
                                                                      LinkLabel (testbed.spec.topology),
                                                                      noted
disconnected graph     error listing the components, unless           same
                       ``keep_largest_component: true`` (then the
                       smaller components are dropped, noted)
DPIDs                  explicit or 1..N; must be unique and in        generated 1..N
                       [1, 2^64-1]
names                  ``[a-z][a-z0-9]*``; interface names            generated s1..sN
                       (``NAME-ethN``) at most 15 bytes (IFNAMSIZ-1)
unknown site           error (with close matches); a site dropped     same
                       by ``keep_largest_component`` says so
model / family         error unless the catalog (the zoo) has it, and same
                       unless some cluster serves the family
min_accuracy           error unless a served model of the             same
                       application's family reaches it
load bounds            per source rate (after spatial weights) and    same
                       expected queries of the run within
                       testbed.spec.experiment's bounds; traces read here;
                       error when the workload creates no query
bandwidth              error when one request of an application       same
                       takes longer than its deadline to cross a
                       host link or a link of a path it may take
                       (request bytes, the model's transfer time)
run directory paths    every file of a run fits PATH_MAX              same
service-time profile   error unless the catalog has one for the       same
                       model at the cluster's runtime
=====================  =============================================  ===============================

Link delay: the configured one if given, else great-circle km x ms_per_km x route_factor, never
below delay_floor_ms (``docs/system-model.md``, "The system"). RTT of a path = 2 x the sum of its one-way delays.

The plan also fixes, once, every model's accuracy and each cluster's service times
(:class:`testbed.model.service.ServiceFigures`, from one profiles folder): the emulation's servers
and dispatchers and the simulator all take them from here. A plan is a pydantic model; it is what
``plan.json`` holds (``Plan.model_dump_json``) and what every process of a run reads back.
"""

from __future__ import annotations

import difflib
import ipaddress
import math
import os
import re
from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from pathlib import Path

import networkx as nx
from pydantic import BaseModel, ConfigDict

from testbed.core.errors import InputError, naming_file
from testbed.core.util import repo_path, write_json_atomic
from testbed.model.cpu import threads_per_call
from testbed.model.dispatch import OptionSpec
from testbed.model.events import VALUE_FIELD, Change, expand
from testbed.model.network import NetworkState, mss_of, transfer_ms
from testbed.model.queue import ServerQueue
from testbed.model.service import ServiceFigures, service_figures
from testbed.plan.catalog import Catalog, CatalogError, ModelInfo, ZooCatalog
from testbed.spec import experiment as cfg
from testbed.spec.experiment import Experiment
from testbed.spec.topology import RawTopology, TopologyError, great_circle_km, load_topology

IFNAMSIZ = 16  # Linux include/uapi/linux/if.h; names hold at most IFNAMSIZ-1 = 15 bytes
PATH_MAX = 4096  # Linux include/uapi/linux/limits.h, terminating NUL included
MAX_DPID = 2**64 - 1
NODE_NAME_RE = re.compile(r"^[a-z][a-z0-9]*$")


class PlanError(InputError):
    """The experiment cannot be planned; the message names the offending item."""


class _PlanModel(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Switch(_PlanModel):
    """An OpenFlow switch standing for one topology node. ``lat``/``lon`` in degrees."""

    name: str
    dpid: int
    node_id: str
    label: str
    lat: float | None
    lon: float | None


class Link(_PlanModel):
    """An undirected switch-switch link. ``delay_ms`` is one-way (ms), ``bandwidth_mbps`` Mbit/s,
    ``loss_pct`` percent; ``delay_source`` is one of ``config``, ``geo``, ``floor`` (geo below the
    floor), ``cloud``; ``km`` the great-circle length (None when not derived)."""

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


class Host(_PlanModel):
    """A source or cluster host, attached to ``switch`` by a link of ``bandwidth_mbps`` and 0 ms."""

    name: str
    role: str  # "source" | "cluster"
    switch: str
    site: str
    ip: str = ""
    mac: str = ""
    bandwidth_mbps: float
    tier: str | None = None
    cpu_cores: float | None = None
    workers: int | None = None
    models: list[str] = []


class PathInfo(_PlanModel):
    """Expected path from a source host to a cluster host by least one-way delay (ms)."""

    source: str
    cluster: str
    switches: list[str]
    one_way_ms: float

    @property
    def rtt_ms(self) -> float:
        """Expected RTT in ms: 2 x the sum of one-way delays (``docs/system-model.md``)."""
        return 2.0 * self.one_way_ms


@dataclass(frozen=True)
class QueueSettings:
    """One cluster's server queue as the plan fixes it (the arguments of
    :class:`testbed.model.queue.ServerQueue`): ``workers`` W, ``queue_limit`` (most waiting
    queries), ``discipline`` fifo | edf, ``admission``, ``max_batch`` (inputs per call),
    ``max_queue_delay_ms`` (longest a batch waits to fill, ms) and ``mean_service_ms``: model ->
    its mean call time when the cluster is busy (ms; admission's estimate, the plan's
    ``busy_mean_ms``)."""

    workers: int
    queue_limit: int
    discipline: str
    admission: bool
    max_batch: int
    max_queue_delay_ms: float
    mean_service_ms: dict[str, float]

    def server_queue(self, key: Mapping[str, Hashable] | None = None) -> ServerQueue:
        """A fresh :class:`~testbed.model.queue.ServerQueue` with these settings; ``key`` renames
        the models (model name -> the caller's handle, e.g. the simulator's model index).

        Raises:
            ValueError: a setting out of range (from the queue).
        """
        mean_s = {(key[m] if key is not None else m): ms / 1e3 for m, ms in self.mean_service_ms.items()}
        return ServerQueue(self.workers, self.queue_limit, self.discipline, self.admission, self.max_batch,
                           self.max_queue_delay_ms / 1e3, mean_s)


class Plan(_PlanModel):
    """Everything ``testbed run`` and ``testbed simulate`` execute, resolved and validated.

    ``models``: every model variant a cluster serves. ``services``: cluster -> model -> its
    service times there. ``changes``: the events' timeline (:func:`testbed.model.events.expand`),
    links named by the plan's switch names. ``weights``: per workload entry, the spatial weight
    of each source it selects (:func:`testbed.model.arrivals.source_weights`). ``request_bytes``: per
    application, the request body size (bytes) its queries put on the wire. ``base_dir``: the
    experiment file's folder (trace and demand-matrix
    paths are relative to it); ``zoo_dir`` / ``profiles_dir``: resolved folders.
    """

    experiment: Experiment
    topology_name: str
    switches: list[Switch]
    links: list[Link]
    hosts: list[Host]
    paths: list[PathInfo]
    notes: list[str]
    models: dict[str, ModelInfo] = {}
    services: dict[str, dict[str, ServiceFigures]] = {}
    changes: list[Change] = []
    weights: list[dict[str, float]] = []
    request_bytes: dict[str, int] = {}
    base_dir: str = "."
    zoo_dir: str = ""
    profiles_dir: str = ""

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

    def options(self, source: str) -> list[OptionSpec]:
        """The (cluster, model) options of ``source``'s dispatcher, clusters in plan order and each
        cluster's models in its order: the planned RTT, the service times there, the model's
        accuracy and family, the cluster's tier and W (KeyError for an unknown source)."""
        rtt = {p.cluster: p.rtt_ms for p in self.paths if p.source == source}
        if not rtt:
            raise KeyError(source)
        return [OptionSpec(c.name, m, rtt[c.name], f.expected_ms, f.busy_mean_ms, self.models[m].accuracy,
                           c.tier or "", f.workers, self.models[m].family)
                for c in self.clusters for m, f in self.services[c.name].items()]

    def queue(self, cluster: str) -> QueueSettings:
        """The server queue of ``cluster`` (its spec's settings, the plan's busy means; KeyError if none)."""
        spec = next((c for c in self.experiment.clusters if c.name == cluster), None)
        if spec is None:
            raise KeyError(cluster)
        srv = spec.server
        return QueueSettings(spec.workers, spec.queue_limit, srv.discipline, srv.admission, srv.max_batch,
                             srv.max_queue_delay_ms,
                             {m: f.busy_mean_ms for m, f in self.services[cluster].items()})

    def network_state(self) -> NetworkState:
        """The model's state of the switch links as planned (delays, capacities, loss, the MTU)."""
        return NetworkState([(lk.a, lk.b, lk.delay_ms, lk.bandwidth_mbps, lk.loss_pct) for lk in self.links],
                            [s.name for s in self.switches], mtu=self.experiment.topology.mtu)

    def to_dict(self) -> dict:
        """A JSON-serialisable view (``plan.json``), with each link's ``emu_name`` and each
        path's ``rtt_ms`` added for readers of the file."""
        d = self.model_dump(mode="json")
        for lk, row in zip(self.links, d["links"], strict=True):
            row["emu_name"] = lk.emu_name
        for p, row in zip(self.paths, d["paths"], strict=True):
            row["rtt_ms"] = p.rtt_ms
        return d

    def write_json(self, path: Path) -> None:
        """Write :meth:`to_dict` to ``path`` (atomically)."""
        write_json_atomic(path, self.to_dict(), indent=1)


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


def _read_value_trace(path: Path, column: str, item: str) -> list[tuple[float, float]]:
    """Rows (t_s, value) of an event's trace CSV (columns ``t_s`` and ``column``), t_s >= 0 and
    increasing, values finite and >= 0."""
    import pandas as pd

    try:
        df = pd.read_csv(path)
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        raise PlanError(f"{item}: cannot read trace {str(path)!r}: {exc}") from None
    missing = [c for c in ("t_s", column) if c not in df.columns]
    if missing:
        raise PlanError(f"{item}: trace {str(path)!r} lacks column(s) {missing} (has {list(df.columns)})")
    t = pd.to_numeric(df["t_s"], errors="coerce")
    v = pd.to_numeric(df[column], errors="coerce")
    bad = df.index[t.isna() | v.isna() | (t < 0) | (v < 0) | ~t.apply(math.isfinite) | ~v.apply(math.isfinite)]
    if len(bad):
        raise PlanError(f"{item}: trace {str(path)!r} row {int(bad[0]) + 2}: t_s and {column} must be numbers >= 0")
    if not t.is_monotonic_increasing:
        raise PlanError(f"{item}: trace {str(path)!r}: t_s must increase")
    return list(zip(t.astype(float).tolist(), v.astype(float).tolist(), strict=True))


class _Builder:
    """The steps of :func:`build_plan`, in order: nodes, links, connectivity, cloud, hosts,
    names, paths, models. Each step reads what the earlier ones resolved."""

    def __init__(self, exp: Experiment, raw: RawTopology):
        self.exp, self.raw = exp, raw
        self.strict = raw.origin == "yaml"
        self.notes: list[str] = list(raw.notes)
        self.nodes: dict[str, Switch] = {}
        self.seen_names: dict[str, str] = {}
        self.order: list[frozenset] = []
        self.merged: dict[frozenset, dict] = {}
        self.switches: list[Switch] = []
        self.links: list[Link] = []
        self.hosts: list[Host] = []
        self.cloud_switch: Switch | None = None
        self.dropped: set[str] = set()  # ids and labels of nodes keep_largest_component dropped
        self.undelayed: list[tuple[Switch, Switch]] = []  # links whose delay needs missing coordinates

    # -- step 1 --
    def build_nodes(self) -> None:
        """Ids, switch names and DPIDs (unique, in range)."""
        raw = self.raw
        given = dict(self.exp.topology.coordinates)
        for i, n in enumerate(raw.nodes, start=1):
            if not n.id.strip():
                raise PlanError(f"node {i} of topology {raw.name!r} has an empty id (ids name the sites that "
                                f"clusters, sources and links refer to)")
            if n.id in self.nodes:
                raise PlanError(f"node id {n.id!r} appears twice in topology {raw.name!r}")
            name = n.name or f"s{i}"
            _check_name(name, f"switch (node {n.label!r})")
            dpid = n.dpid if n.dpid is not None else i
            if not 1 <= dpid <= MAX_DPID:
                raise PlanError(f"node {n.label!r}: DPID {dpid} out of range [1, 2^64-1] (0 is not a valid DPID)")
            lat, lon = n.lat, n.lon
            ll = given.pop(n.id, None) or given.pop(n.label, None)
            if ll is not None:
                lat, lon = ll
            self.nodes[n.id] = Switch(name=name, dpid=dpid, node_id=n.id, label=n.label, lat=lat, lon=lon)
        if given:
            known = [n.id for n in raw.nodes] + [n.label for n in raw.nodes]
            raise PlanError(f"topology.coordinates: no node {', '.join(map(repr, sorted(given)))} in topology "
                            f"{raw.name!r}{_suggest(sorted(given)[0], known)}")
        seen_dpids: dict[int, str] = {}
        for s in self.nodes.values():
            if s.name in self.seen_names:
                raise PlanError(f"switch name {s.name!r} is used by nodes {self.seen_names[s.name]!r} and {s.label!r}")
            if s.dpid in seen_dpids:
                raise PlanError(f"DPID {s.dpid:#x} is used by nodes {seen_dpids[s.dpid]!r} and {s.label!r}")
            self.seen_names[s.name] = s.label
            seen_dpids[s.dpid] = s.label

    def node_of(self, ref: str, item: str) -> Switch:
        """The switch a topology reference (node id or unique label) names."""
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
        raise PlanError(f"{item}: unknown node {ref!r}{_suggest(ref, options)}{why}")

    # -- step 2 --
    def _link_delay(self, a: Switch, b: Switch, configured: float | None,
                    km: float | None = None) -> tuple[float, str, float | None] | None:
        """The link's one-way delay (ms), its source and km (``km``: the length a planar dataset
        gives); None when an end lacks coordinates and no length is given."""
        if configured is not None:
            return configured, "config", None
        if km is None and any(s.lat is None or s.lon is None for s in (a, b)):
            return None
        t = self.exp.topology
        km = km if km is not None else great_circle_km(a.lat, a.lon, b.lat, b.lon)
        geo = km * t.ms_per_km * t.route_factor
        return (geo, "geo", km) if geo >= t.delay_floor_ms else (t.delay_floor_ms, "floor", km)

    def _no_coordinates(self, missing: dict[str, list[str]]) -> PlanError:
        """The error naming every node without coordinates (label -> its links), with advice that
        works for the topology's origin."""
        names = "; ".join(f"node {lbl!r} has no coordinates (links to {', '.join(map(repr, sorted(set(ends))))})"
                          for lbl, ends in sorted(missing.items()))
        fix = "set topology.coordinates: {NODE: [lat, lon], ...} in the experiment"
        if self.raw.origin == "yaml":
            advice = f"give these nodes lat/lon in the topology file, give their links an explicit delay " \
                     f"(e.g. delay: 5ms), or {fix}"
        elif self.raw.origin == "graphml":
            advice = f"{fix} (nodes by label or id), or add Latitude/Longitude <data> to these nodes in the " \
                     f"GraphML file"
        else:
            advice = fix
        return PlanError(f"{len(missing)} node(s) lack coordinates, so the delay of their links cannot be derived "
                         f"from geography: {names}. To fix: {advice}")

    def _bandwidth(self, lk) -> tuple[float, str]:
        """A link's capacity (Mbit/s) and where it comes from."""
        default = self.exp.topology.bandwidth_mbps
        if lk.bandwidth_mbps is None or (self.raw.origin == "graphml" and not self.exp.topology.dataset_link_speeds):
            return default, "default"
        return lk.bandwidth_mbps, lk.bandwidth_from or "config"

    def _note_bandwidths(self, sources: list[tuple[str, str, str, float]]) -> None:
        """Notes on where the links' capacities come from (GraphML datasets); how the emulation
        shapes each one is the bring-up's report (``network.json``)."""
        if self.raw.origin == "graphml":
            counts: dict[str, int] = {}
            for _a, _b, src, _bw in sources:
                key = src.split(" ")[0]
                counts[key] = counts.get(key, 0) + 1
            default = self.exp.topology.bandwidth_mbps
            how = ", ".join(f"{n} from {k}" if k != "default" else f"{n} not given (topology.bandwidth, {default:g} "
                            f"Mbit/s)" for k, n in sorted(counts.items()))
            off = "" if self.exp.topology.dataset_link_speeds else " (topology.dataset_link_speeds: false)"
            self.notes.append(f"GraphML link capacities{off}: {how}")
            for a, b, src, bw in sources:
                if "range" in src:
                    self.notes.append(f"link {a!r} - {b!r}: {src} -> {bw:g} Mbit/s")

    def build_links(self) -> None:
        """Self-loops, parallel links and each link's delay and bandwidth."""
        sources: list[tuple[str, str, str, float]] = []
        for j, lk in enumerate(self.raw.links):
            item = f"link #{j} ({lk.a} - {lk.b})"
            a, b = self.node_of(lk.a, item), self.node_of(lk.b, item)
            if a.node_id == b.node_id:
                if self.strict:
                    raise PlanError(f"{item}: self-loop on node {a.label!r}; remove it")
                self.notes.append(f"self-loop on {a.label!r} dropped (carries no traffic)")
                continue
            derived = self._link_delay(a, b, lk.delay_ms, lk.km)
            if derived is None:  # an error unless keep_largest_component drops it (check_connectivity)
                self.undelayed.append((a, b))
                continue
            delay, source, km = derived
            bw, bw_from = self._bandwidth(lk)
            sources.append((a.label, b.label, bw_from, bw))
            key = frozenset((a.node_id, b.node_id))
            if key in self.merged:
                self._merge_parallel(key, a, b, delay, source, km, bw, item)
                continue
            self.merged[key] = {"a": a, "b": b, "delay": delay, "source": source, "km": km, "bw": bw,
                                "loss": lk.loss_pct}
            self.order.append(key)
        self._note_bandwidths(sources)

    def _merge_parallel(self, key: frozenset, a: Switch, b: Switch, delay: float, source: str, km: float | None,
                        bw: float, item: str) -> None:
        if self.strict:
            raise PlanError(f"{item}: parallel link between {a.label!r} and {b.label!r}; keep one")
        old = self.merged[key]
        self.notes.append(
            f"parallel links {a.label!r} - {b.label!r} merged into one: delay = min "
            f"({min(old['delay'], delay):.3f} ms), bandwidth = sum ({old['bw'] + bw:g} Mbit/s)"
        )
        if delay < old["delay"]:
            old.update(delay=delay, source=source, km=km)
        old["bw"] += bw

    # -- step 3 --
    def check_connectivity(self) -> None:
        """One component, or the largest kept (``keep_largest_component``), said in the notes."""
        nodes = self.nodes
        g = nx.Graph()
        g.add_nodes_from(nodes)
        g.add_edges_from(tuple(k) for k in self.order)
        g.add_edges_from((a.node_id, b.node_id) for a, b in self.undelayed)
        comps = sorted(nx.connected_components(g), key=lambda c: (-len(c), sorted(c)))
        if len(comps) > 1:
            if not self.exp.topology.keep_largest_component:
                desc = "; ".join(
                    f"{{{', '.join(sorted(nodes[n].label for n in c)[:4])}{', ...' if len(c) > 4 else ''}}}"
                    for c in comps
                )
                raise PlanError(
                    f"topology {self.raw.name!r} is disconnected: {len(comps)} components: {desc}. "
                    f"Connect them, or set topology.keep_largest_component: true"
                )
            dropped = set().union(*comps[1:])
            self.notes.append(
                f"keep_largest_component: dropped {len(dropped)} node(s) outside the largest component: "
                + ", ".join(sorted(nodes[n].label for n in dropped))
            )
            self.dropped = {nodes[n].label for n in dropped} | set(dropped)
            for n in dropped:
                del nodes[n]
            self.order = [k for k in self.order if k <= set(nodes)]
        if not nodes:
            raise PlanError(f"topology {self.raw.name!r} has no nodes")
        missing: dict[str, list[str]] = {}
        for a, b in self.undelayed:
            if a.node_id in nodes:
                for s, other in ((a, b), (b, a)):
                    if s.lat is None or s.lon is None:
                        missing.setdefault(s.label, []).append(other.label)
        if missing:
            raise self._no_coordinates(missing)
        self.switches = list(nodes.values())
        self.links = [Link(index=i, a=self.merged[k]["a"].name, b=self.merged[k]["b"].name,
                           delay_ms=self.merged[k]["delay"], bandwidth_mbps=self.merged[k]["bw"],
                           loss_pct=self.merged[k]["loss"], delay_source=self.merged[k]["source"],
                           km=self.merged[k]["km"])
                      for i, k in enumerate(self.order, start=1)]

    # -- step 4 --
    def add_cloud(self) -> None:
        """The cloud switch and its long link to ``cloud.attach_to``."""
        cloud = self.exp.cloud
        if cloud is None:
            return
        anchor = self.node_of(cloud.attach_to, "cloud.attach_to")
        used = [int(s.name[1:]) for s in self.switches if re.fullmatch(r"s\d+", s.name)]
        name = f"s{max(used, default=0) + 1}"
        dpid = max(s.dpid for s in self.switches) + 1
        if dpid > MAX_DPID or name in self.seen_names:
            raise PlanError("cannot allocate a name/DPID for the cloud switch")
        self.cloud_switch = Switch(name=name, dpid=dpid, node_id="cloud", label="cloud", lat=None, lon=None)
        self.switches.append(self.cloud_switch)
        self.links.append(Link(index=len(self.links) + 1, a=anchor.name, b=name, delay_ms=cloud.delay_ms,
                               bandwidth_mbps=cloud.bandwidth_mbps, loss_pct=0.0, delay_source="cloud", km=None))

    # -- step 5 --
    def _site_switch(self, site: str, item: str) -> Switch:
        if site == "cloud":
            assert self.cloud_switch is not None  # config validation guarantees a cloud section
            return self.cloud_switch
        return self.node_of(site, item)

    def add_hosts(self) -> None:
        """One host per source and cluster, with its IP (10.0.0.k/8) and MAC (00:..:k)."""
        hbw = self.exp.topology.host_bandwidth_mbps
        for src in self.exp.sources:
            sw = self._site_switch(src.site, f"source {src.name!r}")
            self.hosts.append(Host(name=src.name, role="source", switch=sw.name, site=sw.label, bandwidth_mbps=hbw))
        for c in self.exp.clusters:
            sw = self._site_switch(c.site, f"cluster {c.name!r}")
            self.hosts.append(Host(name=c.name, role="cluster", switch=sw.name, site=sw.label, bandwidth_mbps=hbw,
                                   tier=c.tier, cpu_cores=c.cpu_cores, workers=c.workers, models=list(c.models)))
        net = ipaddress.ip_network("10.0.0.0/8")
        for k, h in enumerate(self.hosts, start=1):
            h.ip = str(net.network_address + k)
            h.mac = ":".join(f"{b:02x}" for b in k.to_bytes(6, "big"))

    # -- step 6 --
    def check_names(self) -> None:
        """Node names unique across switches, link emulators and hosts; interface names fit IFNAMSIZ."""
        all_names: dict[str, str] = {s.name: f"switch {s.label!r}" for s in self.switches}
        for lk in self.links:
            if lk.emu_name in all_names:
                raise PlanError(f"switch name {lk.emu_name!r} ({all_names[lk.emu_name]}) is reserved for the link "
                                f"emulator of link #{lk.index}; names l<digits> cannot be switch names")
            all_names[lk.emu_name] = f"link emulator of {lk.a}-{lk.b}"
        for h in self.hosts:
            if h.name in all_names:
                raise PlanError(f"{h.role} name {h.name!r} clashes with {all_names[h.name]}; rename it")
            all_names[h.name] = h.role
            _check_ifname(h.name, 0, h.role)
        ports = {s.name: 0 for s in self.switches}
        for lk in self.links:
            ports[lk.a] += 1
            ports[lk.b] += 1
        for h in self.hosts:
            ports[h.switch] += 1
        for s in self.switches:
            _check_ifname(s.name, ports[s.name], "switch")
        for lk in self.links:
            _check_ifname(lk.emu_name, 1, "link emulator")

    # -- step 7 --
    def expected_paths(self) -> list[PathInfo]:
        """Least one-way delay path of every (source, cluster) pair (ties: the graph's order)."""
        sg = nx.Graph()
        sg.add_nodes_from(s.name for s in self.switches)
        for lk in self.links:
            sg.add_edge(lk.a, lk.b, delay=lk.delay_ms)
        paths = []
        for s in (h for h in self.hosts if h.role == "source"):
            dist, route = nx.single_source_dijkstra(sg, s.switch, weight="delay")
            for c in (h for h in self.hosts if h.role == "cluster"):
                paths.append(PathInfo(source=s.name, cluster=c.name, switches=route[c.switch],
                                      one_way_ms=dist[c.switch]))
        return paths

    # -- step 8 --
    def resolve_events(self, base_dir: Path) -> list[Change]:
        """Each event's link as the plan's (a, b), its trace read, the timeline expanded."""
        exp = self.exp
        clusters = {c.name for c in exp.clusters}
        by_pair = {frozenset((lk.a, lk.b)): (lk.a, lk.b) for lk in self.links}
        links: dict[int, tuple[str, str]] = {}
        traces: dict[int, list[tuple[float, float]]] = {}
        for i, ev in enumerate(exp.events):
            item = f"events.{i} ({ev.kind})"
            if ev.cluster is not None and ev.cluster not in clusters:
                raise PlanError(f"{item}: unknown cluster {ev.cluster!r}; known: {', '.join(sorted(clusters))}")
            if ev.link is not None:
                a = self.cloud_switch if ev.link[0] == "cloud" else self.node_of(ev.link[0], f"{item}.link")
                b = self.cloud_switch if ev.link[1] == "cloud" else self.node_of(ev.link[1], f"{item}.link")
                pair = by_pair.get(frozenset((a.name, b.name))) if a and b else None
                if pair is None:
                    raise PlanError(f"{item}: no link between {ev.link[0]!r} and {ev.link[1]!r} in the topology")
                links[i] = (a.name, b.name)
            if ev.trace is not None:
                traces[i] = _read_value_trace(repo_path(ev.trace, Path(base_dir)), VALUE_FIELD[ev.kind], item)
        initial = {(lk.a, lk.b): {"delay_ms": lk.delay_ms, "bandwidth_mbps": lk.bandwidth_mbps,
                                  "loss_pct": lk.loss_pct, "background_mbps": 0.0} for lk in self.links}
        initial |= {(b, a): v for (a, b), v in initial.items()}
        try:
            return expand(exp.events, links, initial, traces)
        except ValueError as exc:
            raise PlanError(str(exc)) from None

    # -- step 9 --
    def resolve_workload(self, base_dir: Path) -> list[dict[str, float]]:
        """Per workload entry, the weight of every source it selects (demand matrices read here)."""
        from testbed.model.arrivals import ArrivalError, source_weights

        site_names = {h.name: (h.site, next(s.node_id for s in self.switches if s.name == h.switch))
                      for h in self.hosts if h.role == "source"}
        out = []
        for i, w in enumerate(self.exp.workload):
            sel = [s.name for s in self.exp.sources if w.sources == "all" or s.name in w.sources]
            try:
                out.append(source_weights(w, [(n, site_names[n]) for n in sel], Path(base_dir)))
            except ArrivalError as exc:
                raise PlanError(f"workload.{i}: {exc}") from None
        return out

    # -- step 10 --
    def resolve_models(self, catalog: Catalog) -> tuple[dict[str, ModelInfo], dict[str, dict[str, ServiceFigures]]]:
        """Every served model and application family from the catalog; each cluster's service times."""
        exp = self.exp
        families = set(catalog.families())
        for a in exp.applications:
            if a.family not in families:
                raise PlanError(f"application {a.name!r}: family {a.family!r} is not in the model zoo "
                                f"(has: {', '.join(sorted(families))})")
        models: dict[str, ModelInfo] = {}
        services: dict[str, dict[str, ServiceFigures]] = {}
        for c in exp.clusters:
            threads = threads_per_call(c.cpu_cores, c.workers)
            services[c.name] = {}
            for m in c.models:
                try:
                    models[m] = catalog.model(m)
                    rt = c.server.runtime_of(m)
                    smp = catalog.samples(m, rt, threads)
                except CatalogError as exc:
                    raise PlanError(f"cluster {c.name!r}: {exc}") from None
                if smp.note and smp.note not in self.notes:  # said once, however many clusters serve it
                    self.notes.append(smp.note)
                services[c.name][m] = service_figures(m, rt, c.cpu_cores, c.workers, threads, smp.samples_ms,
                                                      smp.batch_mean_ms, smp.source, smp.handling_ms,
                                                      smp.cold_factor)
        served = {info.family for info in models.values()}
        for a in exp.applications:
            if a.family not in served:
                raise PlanError(f"application {a.name!r}: no cluster serves a model of its family {a.family!r} "
                                f"(the clusters serve: {', '.join(sorted(served))}); add one to a cluster's models")
            best = max((m for m in models.values() if m.family == a.family), key=lambda m: m.accuracy)
            if best.accuracy < a.min_accuracy:
                raise PlanError(f"application {a.name!r}: min_accuracy {a.min_accuracy:g} is above every model of its "
                                f"family {a.family!r} the clusters serve (the best: {best.name} {best.accuracy:g}), so "
                                f"every query would fail 'accuracy'; lower min_accuracy or serve a better model")
        return models, services

    # -- step 11 --
    def check_load(self, weights: list[dict[str, float]], duration_s: float, base_dir: Path) -> None:
        """The load within what the engines execute (:mod:`testbed.spec.experiment` bounds); traces read."""
        check_load_bounds(self.exp, weights, duration_s, base_dir)

    # -- step 12 --
    def check_transfers(self, paths: list[PathInfo], models: dict[str, ModelInfo],
                        request_bytes: dict[str, int]) -> None:
        """One request of each application must cross every link it may take within its deadline:
        the host links of the sources that send it and of the clusters that serve its family, and
        the links of the expected paths between them. Time per link: the model's
        :func:`testbed.model.network.transfer_ms` of the plan's request bytes at the link's
        planned capacity and the network's MSS (events may lower a capacity later: that is a
        scenario, not checked here).

        Raises:
            PlanError: naming the application, the link (``topology.host_bandwidth`` for a host
                link) and the times.
        """
        exp = self.exp
        mss = mss_of(exp.topology.mtu)
        by_pair = {frozenset((lk.a, lk.b)): lk for lk in self.links}
        labels = {s.name: s.label for s in self.switches}
        for a in exp.applications:
            sources, clusters = (set(x) for x in senders_and_servers(exp, models, a))
            crossed: dict[str, float] = {}  # item -> capacity (Mbit/s)
            for h in self.hosts:
                if h.name in sources or h.name in clusters:
                    crossed[f"topology.host_bandwidth (the host link of {h.role} {h.name!r})"] = h.bandwidth_mbps
            for p in paths:
                if p.source in sources and p.cluster in clusters:
                    for x, y in zip(p.switches, p.switches[1:], strict=False):
                        lk = by_pair[frozenset((x, y))]
                        crossed[f"link {labels[lk.a]!r} - {labels[lk.b]!r} ({lk.emu_name}, on the path "
                                f"{p.source} -> {p.cluster})"] = lk.bandwidth_mbps
            nbytes = request_bytes[a.name]
            for item, mbps in crossed.items():
                t = transfer_ms(nbytes, mbps, mss)
                if t > a.deadline_ms:
                    took = f"{t / 1e3:.4g} s" if t >= 1e3 else f"{t:.4g} ms"
                    raise PlanError(f"{item}: {mbps:g} Mbit/s: one request of application {a.name!r} "
                                    f"({nbytes:,} bytes) takes {took} to cross it, over its deadline of "
                                    f"{a.deadline_ms:g} ms, so no such query could succeed; raise the bandwidth")

    def request_sizes(self, catalog: Catalog) -> dict[str, int]:
        """Request body bytes per application: ``simulation.request_bytes`` if set, else the mean
        size of the catalog's request bodies for the application's family."""
        fixed = self.exp.simulation.request_bytes
        return {a.name: int(fixed or catalog.request_bytes(a.family)) for a in self.exp.applications}


def _peak_rate_qps(w) -> float:
    """The highest rate (q/s, before spatial weights) a workload entry asks of one source."""
    if w.process == "mmpp":
        return max(w.rates_qps)
    if w.process == "step":
        return max(s.rate_qps for s in w.steps)
    if w.process == "diurnal":
        return w.rate_qps * (1 + w.amplitude)
    return w.rate_qps or 0.0


def check_load_bounds(exp: Experiment, weights: list[dict[str, float]], duration_s: float,
                      base_dir: Path = Path(".")) -> int:
    """Check a load of ``duration_s`` s against the bounds of :mod:`testbed.spec.experiment` (also when a
    command overrides the duration): each source's peak rate after its spatial weight, the
    expected queries of the run, the report intervals, MMPP state changes. Trace files are read
    (and so validated) here. Returns the expected number of queries.

    Raises:
        PlanError: a bound is exceeded or a trace cannot be read (names the workload entry); the
            workload creates no query at all in ``duration_s`` (every entry's rates are 0, or its
            trace has no arrival before the end: the run would measure nothing, exit 5, after the
            emulation was built; names every entry), or fewer than 1 query expected in all.
    """
    from testbed.model.arrivals import ArrivalError, read_trace

    if not 0 < duration_s <= cfg.MAX_DURATION_S:
        raise PlanError(f"duration {duration_s:g} s: must be in (0, {cfg.MAX_DURATION_S:g}] s")
    problem = cfg.windows_problem(duration_s, exp.report_interval_s, [a.deadline_ms for a in exp.applications])
    if problem:
        raise PlanError(problem)
    expected = 0.0
    silent: list[str] = []  # the entries that create no query
    for i, (w, ws) in enumerate(zip(exp.workload, weights, strict=True)):
        item = f"workload.{i} ({w.application})"
        if w.process == "trace":
            try:
                t = read_trace(repo_path(w.trace, Path(base_dir)))
            except ArrivalError as exc:
                raise PlanError(f"{item}: {exc}") from None
            expected += float((t < duration_s).sum()) * len(ws)
            if not (t < duration_s).any():
                silent.append(f"{item}: its trace has no arrival before {duration_s:g} s")
            continue
        peak = _peak_rate_qps(w)
        if peak * sum(ws.values()) <= 0:
            silent.append(f"{item}: its {w.process} rates are 0 q/s" if peak <= 0 else
                          f"{item}: its sources' spatial weights are all 0")
        for src, weight in ws.items():
            if peak * weight > cfg.MAX_RATE_QPS:
                raise PlanError(f"{item}: source {src!r} would get {peak:g} q/s x spatial weight {weight:.3g} = "
                                f"{peak * weight:g} q/s, over the bound of {cfg.MAX_RATE_QPS:g} q/s per source")
        expected += peak * duration_s * len(ws)
        if w.process == "mmpp" and duration_s / min(w.dwell_s) > cfg.MAX_STATE_CHANGES:
            raise PlanError(f"{item}: mmpp dwell {min(w.dwell_s):g} s over {duration_s:g} s is about "
                            f"{duration_s / min(w.dwell_s):.3g} state changes per source, over the bound of "
                            f"{cfg.MAX_STATE_CHANGES:.0e}")
    if len(silent) == len(exp.workload):
        raise PlanError(f"the workload creates no query in {duration_s:g} s ({'; '.join(silent)}): the run would "
                        f"measure nothing; give some entry a rate above 0")
    if expected < 1:
        raise PlanError(f"the workload expects {expected:.3g} queries in {duration_s:g} s (peak rates x sources x "
                        f"duration, fewer than 1): the run would most likely measure nothing; lengthen the "
                        f"duration or raise a rate")
    if expected > cfg.MAX_EXPECTED_QUERIES:
        raise PlanError(f"the workload asks for about {expected:.3g} queries in {duration_s:g} s (peak rates x sources "
                        f"x duration), over the bound of {cfg.MAX_EXPECTED_QUERIES:,} per run (the simulator holds "
                        f"every query in memory, ~2.5 KB each); lower the rates or the duration")
    return int(expected)


def run_dir_limit_problem(runs_dir: Path, plan: Plan) -> str | None:
    """Why a run of ``plan`` under ``runs_dir`` could not create its files (a path over PATH_MAX,
    or a file name over NAME_MAX), or None. The longest names are the records and logs of the
    longest host name and the link emulators' files, plus room for temporary suffixes."""
    run_id = f"YYYYmmdd-HHMMSS-{plan.experiment.name}"
    longest_host = max((h.name for h in plan.hosts), key=len, default="")
    rel = max((f"sources/{longest_host}.records.csv", f"clusters/{longest_host}.server.json",
               f"logs/source-{longest_host}.log", f"logs/linkemu-l{len(plan.links)}.log"), key=len)
    path = f"{Path(runs_dir).resolve()}/{run_id}/.{rel}.{2**22}.tmp"
    if len(path.encode()) > PATH_MAX - 1:
        return (f"the run's files would have paths of {len(path.encode())} bytes under {runs_dir}, over the "
                f"Linux limit of {PATH_MAX - 1}; choose a shorter runs_dir or experiment name")
    return None


def runs_dir_problem(runs_dir: Path) -> str | None:
    """Why no run directory can be written under ``runs_dir``, or None: something that is not a
    directory is in the way, a missing folder of it cannot be created, or it is not writable. Tried
    for real (what is missing is created, a temporary file written in it), then what the check
    created is removed again: a command that fails later leaves no empty folder behind."""
    import tempfile

    runs_dir = Path(runs_dir)
    if runs_dir.exists() and not runs_dir.is_dir():
        return f"{runs_dir} exists and is not a directory"
    missing = [d for d in (runs_dir, *runs_dir.parents) if not d.exists()]
    created: list[Path] = []
    try:
        for d in reversed(missing):
            try:
                d.mkdir()
            except FileExistsError:
                continue
            except OSError as exc:
                return f"cannot create {d}: {exc.strerror or exc}"
            created.append(d)
        try:
            with tempfile.TemporaryFile(dir=runs_dir):
                pass
        except OSError as exc:
            return f"{runs_dir} is not writable: {exc.strerror or exc}"
    finally:
        for d in reversed(created):
            try:
                d.rmdir()
            except OSError:
                pass
    return None


#: CPU an emulation needs beside the clusters' shares (cores): what the default experiment's 1.5 cores
#: of shares leave on the 2-core build machine (our choice of bound; its servers then ran with their
#: whole quota, throttled by it, not starved by the machine: docs/trustworthy-runs.md).
CPU_HEADROOM_CORES = 0.5


def events_after_end(changes: list[Change], duration_s: float) -> str | None:
    """A note on the event steps at or after the end of a ``duration_s`` load (they never happen),
    or None when there are none."""
    late = [c for c in changes if c.t_s >= duration_s]
    if not late:
        return None
    return (f"{len(late)} event step(s) at or after the end of the load ({duration_s:g} s) do not happen "
            f"(first: events.{late[0].event} {late[0].kind} at {late[0].t_s:g} s)")


def build_plan(exp: Experiment, raw: RawTopology | None = None, base_dir: Path = Path("."),
               catalog: Catalog | None = None) -> Plan:
    """Resolve and validate an experiment into a :class:`Plan`. Builds nothing; needs no root.

    Args:
        exp: the validated experiment file.
        raw: the loaded topology; loaded from ``exp.topology.source`` when None.
        base_dir: the experiment file's folder: a relative topology, trace or demand-matrix path is
            resolved against it.
        catalog: where models come from; default the zoo and profiles folders of the experiment
            (``zoo_dir``, ``profiles_dir``, relative to the repository).

    Raises:
        PlanError: any rule of this module's table is violated; the message names the item.
        TopologyError: the topology cannot be loaded.
        testbed.plan.catalog.CatalogError: the model zoo cannot be read.
    """
    if raw is None:
        raw = load_topology(exp.topology.source, base_dir)
    zoo_dir, profiles_dir = repo_path(exp.zoo_dir), repo_path(exp.profiles_dir)
    b = _Builder(exp, raw)
    b.build_nodes()
    b.build_links()
    b.check_connectivity()
    b.add_cloud()
    b.add_hosts()
    b.check_names()
    paths = b.expected_paths()
    changes = b.resolve_events(Path(base_dir))
    weights = b.resolve_workload(Path(base_dir))
    b.check_load(weights, exp.duration_s, Path(base_dir))
    catalog = catalog if catalog is not None else ZooCatalog(zoo_dir, profiles_dir)
    models, services = b.resolve_models(catalog)
    request_bytes = b.request_sizes(catalog)
    b.check_transfers(paths, models, request_bytes)
    plan = Plan(experiment=exp, topology_name=raw.name, switches=b.switches, links=b.links, hosts=b.hosts,
                paths=paths, notes=b.notes, models=models, services=services, changes=changes,
                weights=weights, request_bytes=request_bytes, base_dir=str(Path(base_dir).resolve()),
                zoo_dir=str(zoo_dir), profiles_dir=str(profiles_dir))
    problem = run_dir_limit_problem(repo_path(exp.runs_dir), plan)
    if problem:
        raise PlanError(f"runs_dir: {problem}")
    from testbed.emu.capture import validate_capture  # imports the plan: not at module level

    validate_capture(plan)  # a capture point that is not in the network: refused before anything is built
    cores, cpus = sum(c.cpu_cores for c in exp.clusters), os.cpu_count() or 1
    if cores > cpus - CPU_HEADROOM_CORES:
        plan.notes.append(f"the clusters' CPU shares add up to {cores:g} cores on a machine with {cpus}: an emulation "
                          f"needs about {CPU_HEADROOM_CORES:g} core for the sources, the network and the controller, "
                          f"or the servers do not get their shares (the summary's service check says so)")
    late = events_after_end(changes, exp.duration_s)
    if late:
        plan.notes.append(late)
    plan.notes += deadlines_below_rtt(plan)
    return plan


def senders_and_servers(exp: Experiment, models: dict[str, ModelInfo], app) -> tuple[list[str], list[str]]:
    """(the sources a workload entry makes send application ``app``, the clusters that serve a
    model of its family), each sorted by name."""
    senders = sorted({s.name for w in exp.workload if w.application == app.name for s in exp.sources
                      if w.sources == "all" or s.name in w.sources})
    servers = sorted(c.name for c in exp.clusters if any(models[m].family == app.family for m in c.models))
    return senders, servers


def deadlines_below_rtt(plan: Plan) -> list[str]:
    """A note per application whose deadline is below the planned RTT from a source that sends it
    to every cluster that serves its family: those queries miss their deadline before any service
    time (a valid scenario, e.g. a test of deadline misses, so a note, not an error)."""
    rtt = {(p.source, p.cluster): p.rtt_ms for p in plan.paths}
    out = []
    for a in plan.experiment.applications:
        senders, servers = senders_and_servers(plan.experiment, plan.models, a)
        if not servers:
            continue
        shortest = {src: min((rtt[src, c], c) for c in servers) for src in senders}
        late = {src: best for src, best in shortest.items() if best[0] > a.deadline_ms}
        if late:
            who = "every source that sends it" if len(late) == len(senders) else "source(s) " + ", ".join(late)
            src, (ms, cl) = min(late.items(), key=lambda kv: kv[1][0])
            out.append(f"application {a.name!r}: its deadline of {a.deadline_ms:g} ms is below the planned RTT "
                       f"from {who} to every cluster that serves it (the shortest: {ms:.3g} ms, {src} -> {cl}): "
                       f"those queries will all miss their deadline")
    return out


def plan_experiment(path: str | Path, catalog: Catalog | None = None) -> Plan:
    """Load an experiment file and plan it (see :func:`build_plan`).

    Raises:
        ConfigError, PlanError, TopologyError, CatalogError: with a message naming the file and the
            offending item.
    """
    from testbed.spec.experiment import load_experiment

    path = Path(path)
    exp = load_experiment(path)
    try:
        return build_plan(exp, base_dir=path.parent, catalog=catalog)
    except InputError as exc:
        raise naming_file(exc, path) from None


__all__ = ["Host", "Link", "PathInfo", "Plan", "PlanError", "QueueSettings", "Switch", "TopologyError", "build_plan",
           "check_load_bounds", "events_after_end", "plan_experiment", "run_dir_limit_problem",
           "runs_dir_problem"]
