"""What a run hands to each process it starts: one pydantic model per kind of child process.

The run (:mod:`testbed.emu.lifecycle`) builds each from the plan (``from_plan``), writes it with
``model_dump_json`` into the run directory, and the child reads it back with
``model_validate_json`` (:func:`read_config`). No child states a default of its own: every
setting comes from the experiment through the plan.

=====================  ============================================  ======================================
model                  read by                                       file
=====================  ============================================  ======================================
:class:`ServerConfig`  ``python -m testbed.serve.server FILE``   ``clusters/<cluster>.server.json``
:class:`SourceConfig`  ``python -m testbed.emu.source FILE``           ``sources/<source>.json``
:class:`ControllerConfig` the Ryu app (``$TESTBED_CONTROLLER_CONFIG``)  ``controller.json``
=====================  ============================================  ======================================
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from testbed.core.clock import EmulatedClock
from testbed.core.errors import InputError
from testbed.core.util import REPO_ROOT
from testbed.model.cpu import threads_per_call
from testbed.model.dispatch import OptionSpec
from testbed.model.network import RttStep
from testbed.model.policies import CATALOGUE, plugin_origins
from testbed.model.records import GRACE_MS
from testbed.plan.dilation import cpu_pad, wall_clock
from testbed.plan.resolved import Plan
from testbed.plan.speeds import SpeedTarget
from testbed.spec.experiment import AsetSpec, WorkloadSpec, format_validation_error
from testbed.spec.serving import Runtime

MAC_RE = re.compile(r"^[0-9a-f]{2}(:[0-9a-f]{2}){5}$")
M = TypeVar("M", bound=BaseModel)


class _Boundary(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


# --------------------------------------------------------------------------- inference server

class ServerConfig(_Boundary):
    """One cluster's inference server (:mod:`testbed.serve.server`).

    ``port`` 0 picks a free port (reported in the ready file). ``threads``: per model call
    (:func:`testbed.model.cpu.threads_per_call`). ``mean_service_ms``: per model, the mean call
    time when busy at this share (admission's estimate; the plan's ``busy_mean_ms``).
    ``warmup_calls``: calls per model at batch 1 (and at ``max_batch`` when batching) before ready.
    Files: ``stats_file`` rewritten every ``stats_interval_s`` s, ``ready_file`` written once warm.
    ``cpu_pad``: under time dilation k of a cluster below one core, k - 1: each model call and each
    request's handling is followed by a sleep of ``cpu_pad`` x its CPU time
    (:func:`testbed.plan.dilation.nested_cpu` says why); 0 otherwise. ``speed``: the speed check
    the server makes at start-up and the scale it applies (:mod:`testbed.plan.speeds`; its pad
    then replaces ``cpu_pad``); None (a server outside a run): none. ``cpu_stat_file``: the
    ``cpu.stat`` of the cgroup the server runs in, whose throttling counters tell a paced call the
    quota stalled (:func:`testbed.serve.scheduler.pad_work`); None: none is told.
    """

    cluster: str
    host: str = "0.0.0.0"
    port: int = Field(ge=0, le=65535)
    zoo_dir: str
    models: list[str] = Field(min_length=1)
    runtimes: dict[str, Runtime]
    workers: int = Field(ge=1)
    threads: int = Field(ge=1)
    queue_limit: int = Field(ge=1)
    discipline: Literal["fifo", "edf"] = "fifo"
    admission: bool = False
    max_batch: int = Field(1, ge=1, le=256)
    max_queue_delay_ms: float = Field(0.0, ge=0)
    warmup_calls: int = Field(20, ge=0)
    cpu_cores: float = Field(gt=0)
    mean_service_ms: dict[str, float] = {}
    stats_file: str | None = None
    ready_file: str | None = None
    stats_interval_s: float = Field(1.0, gt=0)
    cpu_pad: float = Field(0.0, ge=0)
    speed: SpeedTarget | None = None
    cpu_stat_file: str | None = None

    @model_validator(mode="after")
    def _consistent(self) -> ServerConfig:
        missing = [m for m in self.models if m not in self.runtimes]
        if missing:
            raise ValueError(f"models {missing} have no runtime")
        if self.admission and any(not self.mean_service_ms.get(m, 0) > 0 for m in self.models):
            raise ValueError("admission needs mean_service_ms > 0 for every model")
        return self

    @classmethod
    def from_plan(cls, plan: Plan, cluster: str, port: int, run_dir: Path | None = None,
                  speed: SpeedTarget | None = None, cpu_stat_file: Path | None = None) -> ServerConfig:
        """The server of ``cluster`` as the plan has it (files in ``run_dir/clusters/``), with the
        speed check ``speed`` (:func:`testbed.plan.speeds.speed_target`; None: none) and the
        ``cpu.stat`` of the cgroup it runs in (``cpu_stat_file``; None: none).

        Raises:
            PlanError: a dilated experiment's plan not yet on the wall clock.
        """
        wall_clock(plan)
        spec = plan.cluster_spec(cluster)
        q = plan.queue(cluster)
        files = {} if run_dir is None else {
            "stats_file": str(Path(run_dir) / "clusters" / f"{cluster}.stats.json"),
            "ready_file": str(Path(run_dir) / "clusters" / f"{cluster}.ready.json")}
        return cls(cluster=cluster, port=port, zoo_dir=plan.zoo_dir, models=list(spec.models),
                   runtimes={m: spec.server.runtime_of(m) for m in spec.models}, workers=q.workers,
                   threads=threads_per_call(spec.cpu_cores, spec.workers), queue_limit=q.queue_limit,
                   discipline=q.discipline, admission=q.admission, max_batch=q.max_batch,
                   max_queue_delay_ms=q.max_queue_delay_ms, warmup_calls=spec.server.warmup_calls,
                   cpu_cores=spec.cpu_cores, mean_service_ms=dict(q.mean_service_ms),
                   stats_interval_s=plan.experiment.emulation.stats_interval_s,
                   cpu_pad=cpu_pad(plan, spec.cpu_cores), speed=speed,
                   cpu_stat_file=None if cpu_stat_file is None else str(cpu_stat_file), **files)


# --------------------------------------------------------------------------- query source

class AppInfo(_Boundary):
    """An application as a source needs it: deadline D_a (ms), minimum accuracy A_a, family."""

    name: str
    family: str
    deadline_ms: float
    min_accuracy: float


class StreamConfig(_Boundary):
    """One workload entry at this source: its index in ``experiment.workload`` (seeds), its spec
    and this source's spatial weight."""

    index: int
    spec: WorkloadSpec
    weight: float


class SourceOption(_Boundary):
    """A (cluster, model) option of this source with the cluster's address."""

    option: OptionSpec
    ip: str


#: The end of a span without a route that nothing restores, s: a finite "never" for the JSON file.
NO_ROUTE_END_S = 1e12


class SelectorContext(_Boundary):
    """What a selector's observation (:mod:`testbed.agent.selector`) is built from for one source:
    the experiment's ``applications`` (sorted by name) with their ``deadlines_ms``, its
    ``clusters`` (sorted) with this source's planned ``rtt_ms`` to each (emulated time), its
    ``sources`` (sorted; ``source`` is one: the identity one-hot) and the action space
    ``policies`` (action-index order). The same lists, in the same order, as a row of
    ``testbed/AsetSim-v0`` (:func:`testbed.aset.envs.plan_contexts`), so that a model trained
    there reads the same features in both engines."""

    source: str
    applications: list[str]
    deadlines_ms: list[float]
    clusters: list[str]
    rtt_ms: list[float]
    sources: list[str]
    policies: list[str] = Field(min_length=2)

    @classmethod
    def from_plan(cls, plan: Plan, source: str) -> SelectorContext:
        """The context of ``source``. ``policies``: ``aset.selector.policies``, default every
        built-in policy (:data:`testbed.model.policies.CATALOGUE`); a checkpoint puts its own in
        their place (:func:`testbed.agent.live.resolve_agent`)."""
        exp = plan.experiment
        chosen = exp.aset.selector.policies if exp.aset is not None and exp.aset.selector is not None else None
        clock = wall_clock(plan)
        apps = sorted(exp.applications, key=lambda a: a.name)
        clusters = sorted(c.name for c in plan.clusters)
        return cls(source=source, applications=[a.name for a in apps],
                   deadlines_ms=[float(a.deadline_ms) for a in apps], clusters=clusters,
                   rtt_ms=[clock.emulated(plan.rtt_ms(source, c)) for c in clusters],
                   sources=sorted(h.name for h in plan.sources),
                   policies=list(chosen or CATALOGUE))


class SourceConfig(_Boundary):
    """One query source (workload generator + dispatcher, :mod:`testbed.emu.source`).

    ``start_ns``: when the load starts (epoch ns, the clock all emulated hosts share);
    ``duration_s``: how long queries are created; ``grace_ms``: how long past a deadline an
    answer is still waited for; ``report_interval_s``: how often each cluster's ``/v1/stats`` is
    polled; ``path_links``: per cluster, the (switch, switch) links of the planned path (for the
    path utilization ASET observes); ``link_util_file``: where the run publishes link
    utilization; ``records``: the CSV this source appends one row per query to; ``experiment``:
    the experiment's name (an ASET checkpoint with plans looks its planned policy up by it).
    ``ready_file`` / ``go_file`` (the run's start barrier): when set, the source creates
    ``ready_file`` once it can send (imports done, request bodies built, a connection open to every
    cluster) and waits for ``go_file``, a JSON ``{"start_ns": N}`` the run writes once every
    source is ready; ``start_ns`` is then replaced by N (the value here is only a fallback).
    ``go_timeout_s``: how long (wall s) it waits for ``go_file`` at most; the run sets it past its
    own wait for every source to be ready (:func:`testbed.emu.load.sources_ready_timeout_s`), so
    that the run, not one early source, says which source was late.
    ``no_route``: per cluster, the spans of the run (s since the load started, on the wall clock) in
    which the planned network has no route to it (:meth:`testbed.plan.resolved.Plan.no_route_spans`;
    an open span ends at :data:`NO_ROUTE_END_S`): a query that got no answer in one is ``unreachable``.
    ``rtt_steps``: per cluster, the RTT of the path in force over the run as steps ``(from_s,
    rtt_ms)`` (wall clock; :meth:`testbed.plan.resolved.Plan.rtt_timelines`; None: no route): a
    record's ``expected_rtt_ms`` is the step in force at its ``td``.
    ``time_dilation`` k: every time constant here is already on the wall clock (dilated by
    :func:`testbed.plan.dilation.dilate`), except the streams' arrival processes, which the source
    draws in emulated time and stretches (:class:`testbed.plan.dilation.Stretched`), and
    ``aset.window_s``, which it waits dilated (the agent checks it against its checkpoint's); the
    source writes its records in emulated time (:attr:`clock`).
    ``plugin_paths``: the ``sys.path`` entries the plan imported its policy plug-ins from
    (:attr:`testbed.core.plugins.Origin.sys_path`), which the source adds to its own before it
    resolves ``policy``; ``plugin_sha256``: per plug-in, the SHA-256 of the file the plan resolved
    (and ``run.json`` records), which the file the source resolves must have.
    ``selector_context``: what the source's selector observes (:class:`SelectorContext`).
    """

    source: str
    source_index: int
    seed: int
    policy: str
    start_ns: int
    duration_s: float = Field(gt=0)
    grace_ms: float = GRACE_MS
    report_interval_s: float = Field(gt=0)
    server_port: int
    applications: list[AppInfo]
    streams: list[StreamConfig]
    options: list[SourceOption] = Field(min_length=1)
    base_dir: str
    path_links: dict[str, list[tuple[str, str]]] = {}
    link_util_file: str | None = None
    aset: AsetSpec | None = None
    zoo_dir: str
    repo_dir: str
    records: str
    experiment: str | None = None
    ready_file: str | None = None
    go_file: str | None = None
    go_timeout_s: float = Field(300.0, gt=0)
    no_route: dict[str, list[tuple[float, float]]] = {}
    rtt_steps: dict[str, list[tuple[float, float | None]]] = {}
    time_dilation: float = Field(1.0, ge=1.0)
    plugin_paths: list[str] = []
    plugin_sha256: dict[str, str] = {}
    selector_context: SelectorContext | None = None

    @property
    def clock(self) -> EmulatedClock:
        """The run's emulated clock: ``time_dilation`` around the load's start ``start_ns``."""
        return EmulatedClock(self.time_dilation, self.start_ns)

    @classmethod
    def from_plan(cls, plan: Plan, source: str, start_ns: int, duration_s: float, run_dir: Path) -> SourceConfig | None:
        """The config of ``source`` (None when no workload entry selects it); ``duration_s`` on the
        plan's clock. For several sources, :meth:`all_from_plan` routes the network once.

        Raises:
            PlanError: a dilated experiment's plan not yet on the wall clock
                (:func:`testbed.plan.dilation.wall_clock`).
        """
        return cls.all_from_plan(plan, start_ns, duration_s, run_dir, [source]).get(source)

    @classmethod
    def all_from_plan(cls, plan: Plan, start_ns: int, duration_s: float, run_dir: Path,
                      sources: list[str] | None = None) -> dict[str, SourceConfig]:
        """Per source of ``sources`` (default: every source of the plan, in plan order) that some
        workload entry selects, its config (:meth:`from_plan`). The routes over the events' timeline
        (:meth:`Plan.no_route_spans`, :meth:`Plan.rtt_timelines`: shortest-path trees from every
        cluster at every change, about 0.1 s of CPU on 1,138 switches) are computed once for all.

        Raises:
            PlanError: a dilated experiment's plan not yet on the wall clock
                (:func:`testbed.plan.dilation.wall_clock`).
        """
        wall_clock(plan)  # an emulated plan at k != 1 is refused before anything is routed
        names = [h.name for h in plan.sources] if sources is None else list(sources)
        loaded = [n for n in names if any(n in w for w in plan.weights)]
        if not loaded:
            return {}
        spans, steps = plan.no_route_spans(), plan.rtt_timelines()
        return {n: cls._for_source(plan, n, start_ns, duration_s, run_dir, spans, steps) for n in loaded}

    @classmethod
    def _for_source(cls, plan: Plan, source: str, start_ns: int, duration_s: float, run_dir: Path,
                    spans: dict[tuple[str, str], list[tuple[float, float]]],
                    steps: dict[tuple[str, str], list[RttStep]]) -> SourceConfig:
        """The config of ``source``, which a workload entry selects, from the plan-wide ``spans``
        and ``steps`` (:meth:`all_from_plan`)."""
        clock = wall_clock(plan)
        exp = plan.experiment
        streams = [StreamConfig(index=wi, spec=w, weight=plan.weights[wi][source])
                   for wi, w in enumerate(exp.workload) if source in plan.weights[wi]]
        names = {st.spec.application for st in streams}
        apps = [AppInfo(name=a.name, family=a.family, deadline_ms=a.deadline_ms, min_accuracy=a.min_accuracy)
                for a in exp.applications if a.name in names]
        options = [SourceOption(option=o, ip=plan.host(o.cluster).ip) for o in plan.options(source)]
        path_links = {p.cluster: list(zip(p.switches, p.switches[1:], strict=False))
                      for p in plan.paths if p.source == source}
        spec_s = next(x for x in exp.sources if x.name == source)
        no_route = {c: [(a, min(b, NO_ROUTE_END_S)) for a, b in pair_spans]
                    for (s, c), pair_spans in spans.items() if s == source and pair_spans}
        rtt_steps = {c: [(a, rtt if math.isfinite(rtt) else None) for a, rtt in pair_steps]
                     for (s, c), pair_steps in steps.items() if s == source}
        policy = spec_s.policy or exp.policy
        plugins = plugin_origins([policy])
        plugin_paths = sorted({o["sys_path"] for o in plugins.values()})
        plugin_sha256 = {ref: o["sha256"] for ref, o in plugins.items()}
        return cls(source=source, source_index=[h.name for h in plan.sources].index(source), seed=exp.seed,
                   policy=policy, plugin_paths=plugin_paths, plugin_sha256=plugin_sha256, start_ns=start_ns,
                   duration_s=duration_s,
                   report_interval_s=exp.report_interval_s, server_port=exp.emulation.server_port,
                   applications=apps, streams=streams, options=options, base_dir=plan.base_dir,
                   path_links=path_links, link_util_file=str(run_dir / "link_util.json"), aset=exp.aset,
                   zoo_dir=plan.zoo_dir, repo_dir=str(REPO_ROOT),
                   records=str(run_dir / "sources" / f"{source}.records.csv"), experiment=exp.name,
                   no_route=no_route, rtt_steps=rtt_steps, grace_ms=clock.wall(GRACE_MS), time_dilation=clock.k,
                   selector_context=SelectorContext.from_plan(plan, source))


class SourceTally(_Boundary):
    """What a source says it did, written when it exits (:func:`tally_path` beside its records):
    ``created`` queries (ids ``<source>-1`` .. ``<source>-<created>``), rows it ``written`` to its
    records CSV, rows still ``unwritten`` (a full disk), and query tasks that ``failed`` (raised:
    a bug). The run's records check compares it with the rows it finds, so records lost at the
    end of a file are counted too; a source killed before it exits leaves none. ``restored``: its
    records file had been deleted during the run and the source wrote it back from its open file."""

    source: str
    created: int = Field(ge=0)
    written: int = Field(ge=0)
    unwritten: int = Field(ge=0)
    failed: int = Field(ge=0)
    restored: bool = False


def tally_path(records: str | Path) -> Path:
    """The :class:`SourceTally` file of a source's records CSV (``X.records.csv`` -> ``X.tally.json``)."""
    records = Path(records)
    return records.with_name(records.name.removesuffix(".records.csv") + ".tally.json")


# --------------------------------------------------------------------------- SDN controller

class SwitchEntry(_Boundary):
    """An OpenFlow switch: its name and DPID (> 0)."""

    name: str
    dpid: int = Field(gt=0, lt=2**64)


class LinkEntry(_Boundary):
    """An undirected switch link by DPIDs: one-way ``delay_ms`` (ms, >= 0), ``bandwidth_mbps``
    (Mbit/s, > 0). Ports are discovered by LLDP."""

    a: int
    b: int
    delay_ms: float = Field(ge=0)
    bandwidth_mbps: float = Field(gt=0)


class HostEntry(_Boundary):
    """A host at a switch port: ``port`` the switch's OpenFlow port number; the host link's delay
    (ms) and bandwidth (Mbit/s)."""

    name: str
    mac: str
    ip: str | None = None
    dpid: int
    port: int = Field(gt=0)
    delay_ms: float = Field(0.0, ge=0)
    bandwidth_mbps: float = Field(gt=0)

    @model_validator(mode="after")
    def _mac(self) -> HostEntry:
        if not MAC_RE.match(self.mac):
            raise ValueError(f"host {self.name}: bad MAC {self.mac!r} (lower-case aa:bb:cc:dd:ee:ff)")
        return self


class ControllerConfig(_Boundary):
    """The Ryu app's configuration: switches, links, hosts, and the port-stats polling period (s).

    Validation names the offending item: duplicate or unknown DPIDs, self-loops and duplicate
    links, duplicate MACs or IPs.
    """

    switches: list[SwitchEntry]
    links: list[LinkEntry]
    hosts: list[HostEntry]
    stats_interval_s: float = Field(1.0, gt=0)

    @model_validator(mode="after")
    def _consistent(self) -> ControllerConfig:
        names: dict[int, str] = {}
        for s in self.switches:
            if s.dpid in names:
                raise ValueError(f"dpid {s.dpid} is used by more than one switch")
            names[s.dpid] = s.name
        seen: set[frozenset[int]] = set()
        for lk in self.links:
            item = f"link {names.get(lk.a, lk.a)}-{names.get(lk.b, lk.b)}"
            for d in (lk.a, lk.b):
                if d not in names:
                    raise ValueError(f"{item}: dpid {d} is not a configured switch")
            if lk.a == lk.b:
                raise ValueError(f"{item}: self-loop")
            if frozenset((lk.a, lk.b)) in seen:
                raise ValueError(f"{item}: given twice (parallel links are not supported)")
            seen.add(frozenset((lk.a, lk.b)))
        macs: set[str] = set()
        ips: set[str] = set()
        for h in self.hosts:
            if h.mac in macs:
                raise ValueError(f"host {h.name}: MAC {h.mac} used twice")
            macs.add(h.mac)
            if h.ip:
                if h.ip in ips:
                    raise ValueError(f"host {h.name}: IP {h.ip} used twice")
                ips.add(h.ip)
            if h.dpid not in names:
                raise ValueError(f"host {h.name}: dpid {h.dpid} is not a configured switch")
        return self

    @classmethod
    def from_plan(cls, plan: Plan, host_ports: dict[str, int]) -> ControllerConfig:
        """The controller's view of the plan; ``host_ports``: host -> its switch's port number.

        Raises:
            PlanError: a dilated experiment's plan not yet on the wall clock.
        """
        wall_clock(plan)
        dpid = {s.name: s.dpid for s in plan.switches}
        return cls(switches=[SwitchEntry(name=s.name, dpid=s.dpid) for s in plan.switches],
                   links=[LinkEntry(a=dpid[lk.a], b=dpid[lk.b], delay_ms=lk.delay_ms,
                                    bandwidth_mbps=lk.bandwidth_mbps) for lk in plan.links],
                   hosts=[HostEntry(name=h.name, mac=h.mac, ip=h.ip, dpid=dpid[h.switch], port=host_ports[h.name],
                                    bandwidth_mbps=h.bandwidth_mbps) for h in plan.hosts],
                   stats_interval_s=plan.experiment.emulation.stats_interval_s)


# --------------------------------------------------------------------------- reading

def read_config(path: str | Path, model: type[M]) -> M:
    """Read a boundary file written with ``model_dump_json``.

    Raises:
        InputError: the file is missing or unreadable, or does not validate (the message names
            the file and each offending field).
    """
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise InputError(f"cannot read {model.__name__} file {path}: {exc.strerror}") from None
    try:
        return model.model_validate_json(text)
    except ValidationError as exc:
        raise InputError(format_validation_error(exc, str(path), model.__name__)) from None


__all__ = ["AppInfo", "ControllerConfig", "HostEntry", "LinkEntry", "ServerConfig", "SourceConfig", "SourceOption",
           "SourceTally", "StreamConfig", "SwitchEntry", "read_config", "tally_path"]
