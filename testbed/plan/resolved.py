"""The resolved plan of an experiment: switches, links, hosts, expected paths, models, service
times, events and weights, as a pydantic model (what ``plan.json`` holds, ``Plan.model_dump_json``,
and what every process of a run reads back). :func:`testbed.plan.build.build_plan` makes one.

The plan also gives, built once, what both engines assemble from it: a source's dispatcher
options (:meth:`Plan.options`) and a cluster's server queue (:meth:`Plan.queue`).
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, PrivateAttr

from testbed.core.errors import InputError
from testbed.core.util import write_json_atomic
from testbed.model.dispatch import OptionSpec
from testbed.model.network import NetworkState, RttStep, no_route_spans, rtt_timeline
from testbed.model.queue import ServerQueue
from testbed.model.service import ServiceFigures
from testbed.model.timeline import Change
from testbed.plan.catalog import ModelInfo
from testbed.spec.experiment import ApplicationSpec, ClusterSpec, Experiment


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
    service times there. ``changes``: the events' timeline (:func:`testbed.model.timeline.expand`),
    links named by the plan's switch names. ``weights``: per workload entry, the spatial weight
    of each source it selects (:func:`testbed.plan.traces.source_weights`). ``request_bytes``: per
    application, the request body size (bytes) its queries put on the wire. ``base_dir``: the
    experiment file's folder (trace and demand-matrix
    paths are relative to it); ``zoo_dir`` / ``profiles_dir``: resolved folders. ``clock``:
    ``emulated`` (every figure in the emulated system's time: what ``build_plan`` makes, what both
    engines read) or ``wall`` (the copy the emulation runs on the wall clock under time dilation,
    :func:`testbed.plan.dilation.dilate`; its :attr:`emulated` is the plan it came from).
    ``decision_ms``: per policy the sources use, the cost (ms) the simulator charges each decision it
    makes (td - t0, ``dispatch_ms``; a decision the dispatcher's cache gives costs nothing): 0 for a
    built-in policy, the median of a plug-in's
    plan-time check calls for a plug-in (:func:`testbed.plan.policy_resolution.decision_costs`); fixed here
    so that simulating ``plan.json`` again gives the same run.
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
    clock: Literal["emulated", "wall"] = "emulated"
    decision_ms: dict[str, float] = {}
    _emulated: Plan | None = PrivateAttr(default=None)

    @property
    def time_dilation(self) -> float:
        """k, the emulation's time dilation (``emulation.time_dilation``, >= 1); 1 while it is
        ``auto`` and not chosen yet (:attr:`dilation_auto`: the emulation chooses it before it
        builds anything, :func:`testbed.plan.dilation.dilate` refuses it unchosen)."""
        k = self.experiment.emulation.time_dilation
        return 1.0 if k == "auto" else float(k)

    @property
    def dilation_auto(self) -> bool:
        """Whether ``emulation.time_dilation`` is ``auto``, still to be chosen from a measured
        warm-up (:mod:`testbed.emu.autodilate`)."""
        return self.experiment.emulation.time_dilation == "auto"

    @property
    def emulated(self) -> Plan:
        """The plan in emulated time: this one, or for a ``wall`` plan the one it was dilated from."""
        return self._emulated if self._emulated is not None else self

    def switch(self, name: str) -> Switch:
        """The switch called ``name`` (KeyError if none)."""
        for s in self.switches:
            if s.name == name:
                return s
        raise KeyError(name)

    def cluster_spec(self, name: str) -> ClusterSpec:
        """The experiment's settings of cluster ``name`` as configured (cores, workers, memory,
        models, server): the one lookup by name (KeyError if none)."""
        for c in self.experiment.clusters:
            if c.name == name:
                return c
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

    def served_by(self, app: ApplicationSpec) -> list[tuple[str, str]]:
        """The (cluster, model) pairs that serve ``app``: its family's models of at least its
        minimum accuracy, or every model of its family when none reaches it (the dispatcher's
        fallback), in the order of :attr:`services`."""
        family = [(c, m) for c, by in self.services.items() for m in by if self.models[m].family == app.family]
        return [(c, m) for c, m in family if self.models[m].accuracy >= app.min_accuracy] or family

    def queue(self, cluster: str) -> QueueSettings:
        """The server queue of ``cluster`` (its spec's settings, the plan's busy means; KeyError if none)."""
        spec = self.cluster_spec(cluster)
        srv = spec.server
        return QueueSettings(spec.workers, spec.queue_limit, srv.discipline, srv.admission, srv.max_batch,
                             srv.max_queue_delay_ms,
                             {m: f.busy_mean_ms for m, f in self.services[cluster].items()})

    def network_state(self) -> NetworkState:
        """The model's state of the switch links as planned (delays, capacities, loss, the MTU)."""
        return NetworkState([(lk.a, lk.b, lk.delay_ms, lk.bandwidth_mbps, lk.loss_pct) for lk in self.links],
                            [s.name for s in self.switches], mtu=self.experiment.topology.mtu,
                            dpids={s.name: s.dpid for s in self.switches})

    def no_route_spans(self) -> dict[tuple[str, str], list[tuple[float, float]]]:
        """Per (source, cluster): the spans of the run (s since the load started) in which the
        planned network, with the events' timeline, has no route between them
        (:func:`testbed.model.network.no_route_spans`); both engines classify a query that got no
        answer in such a span as ``unreachable`` (:func:`testbed.model.records.classify`)."""
        sw = {h.name: h.switch for h in self.hosts}
        pairs = {(s.name, c.name): (sw[s.name], sw[c.name]) for s in self.sources for c in self.clusters}
        spans = no_route_spans(self.network_state(), self.changes, pairs.values())
        return {k: spans[p] for k, p in pairs.items()}

    def rtt_timelines(self) -> dict[tuple[str, str], list[RttStep]]:
        """Per (source, cluster): the RTT (ms) of the path in force over the run, with the delays in
        force, as steps ``(from_s, rtt_ms)`` (s since the load started; :func:`testbed.model.network.rtt_timeline`
        over the events' timeline; on this plan's clock). Both engines' ``expected_rtt_ms`` is
        :func:`testbed.model.network.rtt_at` of it at the query's ``td``."""
        sw = {h.name: h.switch for h in self.hosts}
        pairs = {(s.name, c.name): (sw[s.name], sw[c.name]) for s in self.sources for c in self.clusters}
        steps = rtt_timeline(self.network_state(), self.changes, pairs.values())
        return {k: steps[p] for k, p in pairs.items()}

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

    @classmethod
    def from_dict(cls, doc: dict) -> Plan:
        """The plan of a :meth:`to_dict` view (``plan.json``'s object): the fields added for readers of
        the file (each link's ``emu_name``, each path's ``rtt_ms``) are dropped, the rest validated.

        Raises:
            pydantic.ValidationError: ``doc`` is not a plan's view (names the field).
        """
        doc = dict(doc)
        doc["links"] = [{k: v for k, v in row.items() if k != "emu_name"} if isinstance(row, dict) else row
                        for row in doc.get("links") or []]
        doc["paths"] = [{k: v for k, v in row.items() if k != "rtt_ms"} if isinstance(row, dict) else row
                        for row in doc.get("paths") or []]
        return cls.model_validate(doc)


__all__ = ["Host", "Link", "PathInfo", "Plan", "PlanError", "QueueSettings", "Switch"]
