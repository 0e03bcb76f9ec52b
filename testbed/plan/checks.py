"""The plan's checks that span its parts: names and interface names, one request's transfer time
against its application's deadline, the run directory's paths, and the notes on CPU and
deadlines (the rows ``names``, ``bandwidth`` and ``run directory paths`` of
:mod:`testbed.plan.build`'s table)."""

from __future__ import annotations

import math
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from testbed.model import policies as pol
from testbed.model.network import message_ms, mss_of, transfer_ms
from testbed.plan.catalog import ModelInfo
from testbed.plan.network_layout import Network
from testbed.plan.resolved import Host, Link, PathInfo, Plan, PlanError, Switch
from testbed.plan.traces import application_rates
from testbed.spec.experiment import ApplicationSpec, Experiment

IFNAMSIZ = 16  # Linux include/uapi/linux/if.h; names hold at most IFNAMSIZ-1 = 15 bytes
PATH_MAX = 4096  # Linux include/uapi/linux/limits.h, terminating NUL included


def _check_ifname(node: str, ports: int, what: str) -> None:
    longest = f"{node}-eth{max(ports, 0)}"
    if len(longest.encode()) > IFNAMSIZ - 1:
        raise PlanError(
            f"{what} {node!r}: interface name {longest!r} is {len(longest.encode())} bytes, "
            f"over the Linux limit of {IFNAMSIZ - 1}; use a shorter name"
        )


def check_names(switches: list[Switch], links: list[Link], hosts: list[Host]) -> None:
    """Node names unique across switches, link emulators and hosts; interface names fit IFNAMSIZ.

    Raises:
        PlanError: naming the clashing or too long name.
    """
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


def check_transfers(net: Network, paths: list[PathInfo], models: dict[str, ModelInfo],
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
    exp = net.exp
    mss = mss_of(exp.topology.mtu)
    by_pair = {frozenset((lk.a, lk.b)): lk for lk in net.links}
    labels = {s.name: s.label for s in net.switches}
    for a in exp.applications:
        sources, clusters = (set(x) for x in senders_and_servers(exp, models, a))
        crossed: dict[str, float] = {}  # item -> capacity (Mbit/s)
        for h in net.hosts:
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
            return f"{runs_dir} is not writable: creating a file in it failed ({exc.strerror or exc})"
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

def cpu_note(exp: Experiment) -> str | None:
    """A note when the clusters' CPU shares leave less than :data:`CPU_HEADROOM_CORES` of this
    machine's cores to the rest of an emulation, or None."""
    cores, cpus = sum(c.cpu_cores for c in exp.clusters), os.cpu_count() or 1
    if cores <= cpus - CPU_HEADROOM_CORES:
        return None
    return (f"the clusters' CPU shares add up to {cores:g} cores on a machine with {cpus}: an emulation "
            f"needs about {CPU_HEADROOM_CORES:g} core for the sources, the network and the controller, "
            f"or the servers do not get their shares (the summary's service check says so)")


def overload_note(plan: Plan) -> str | None:
    """A note when the plan offers more work than all its clusters' cores together can do at the
    profile's speed, counting each application's queries at its cheapest (cluster, model) that
    meets its accuracy floor (unthrottled mean call + request handling, CPU ms; a lower bound of
    the work: a valid scenario of overload then is one on purpose); None otherwise.

    Raises:
        testbed.model.arrivals.ArrivalError: a workload entry's process cannot be built (the plan
            has checked it).
    """
    rates = application_rates(plan.experiment.workload, plan.weights, Path(plan.base_dir))
    demand = 0.0
    for app in plan.experiment.applications:
        good = [plan.services[c][m] for c, m in plan.served_by(app)]
        if good and rates.get(app.name):
            demand += rates[app.name] * min(f.wall_mean_ms + f.handling_ms for f in good)
    cores = sum(c.cpu_cores for c in plan.experiment.clusters)
    if demand / 1e3 <= cores:
        return None
    return (f"the load offers at least {demand / 1e3:.2f} cores of work (each application's queries at its "
            f"cheapest model that meets its accuracy, model call and request handling at the profile's speed) "
            f"to clusters of {cores:g} cores in all: their queues will grow and most queries miss their "
            f"deadlines (an overload on purpose is a valid scenario)")


def senders_and_servers(exp: Experiment, models: dict[str, ModelInfo],
                        app: ApplicationSpec) -> tuple[list[str], list[str]]:
    """(the sources a workload entry makes send application ``app``, the clusters that serve a
    model of its family), each sorted by name."""
    senders = sorted({s.name for w in exp.workload if w.application == app.name for s in exp.sources
                      if w.sources == "all" or s.name in w.sources})
    servers = sorted(c.name for c in exp.clusters if any(models[m].family == app.family for m in c.models))
    return senders, servers


@dataclass(frozen=True)
class ZeroLoadPair:
    """One (source, cluster, model) of an application at zero load (ms): ``rtt_ms`` the plan's RTT
    of the path, ``network_ms`` the request's and the answer's one-way times along it
    (:func:`testbed.model.network.message_ms`: the RTT plus the messages' transfer on every link,
    host links included), ``service_ms`` the model's expected time at the cluster's share
    (:attr:`testbed.model.service.ServiceFigures.expected_ms`, the dispatcher's t_m)."""

    source: str
    cluster: str
    model: str
    rtt_ms: float
    network_ms: float
    service_ms: float

    @property
    def e2e_ms(self) -> float:
        """The query's end-to-end time at zero load (ms): network + service."""
        return self.network_ms + self.service_ms

    def parts(self) -> str:
        """``src -> cluster with model, E ms (RTT r + transfers t + service s ms)``."""
        return (f"{self.source} -> {self.cluster} with {self.model}, {self.e2e_ms:.1f} ms (RTT {self.rtt_ms:.1f} + "
                f"transfers {self.network_ms - self.rtt_ms:.1f} + service {self.service_ms:.1f} ms)")


@dataclass(frozen=True)
class AppFeasibility:
    """Whether an application's queries can meet its deadline at zero load. ``fastest``: per source
    that sends it, its fastest (cluster, model) among those meeting the accuracy floor (absent: no
    such model is served). ``feasible``: the pairs that meet the deadline (the model's feasibility
    rule, :func:`testbed.model.policies.feasible`, with the zero-load network time as the RTT)."""

    application: str
    deadline_ms: float
    fastest: dict[str, ZeroLoadPair]
    feasible: list[ZeroLoadPair]

    @property
    def ok(self) -> bool:
        """At least one (source, cluster, model) meets the deadline at zero load."""
        return bool(self.feasible)

    @property
    def late_sources(self) -> list[str]:
        """Sources that send the application and have no pair within its deadline at zero load."""
        return sorted(s for s, p in self.fastest.items() if p.e2e_ms > self.deadline_ms)

    def nearest_deadline_ms(self, every_source: bool = False) -> float | None:
        """The shortest whole-ms deadline that one pair (``every_source``: every sending source's
        fastest pair) meets at zero load; None when no model meets the accuracy floor."""
        if not self.fastest:
            return None
        times = [p.e2e_ms for p in self.fastest.values()]
        return float(math.ceil((max(times) if every_source else min(times)) - 1e-9))


def zero_load_feasibility(plan: Plan) -> list[AppFeasibility]:
    """Per application that some source sends and some cluster serves: its (source, cluster,
    model) pairs at zero load (:class:`ZeroLoadPair`) from the plan's own figures: the planned
    paths and the links as planned (no events), the request bytes of the application and the
    answer bytes (``simulation.response_bytes``), and the models' ``expected_ms`` at each cluster.
    A pair is feasible when its accuracy meets ``min_accuracy`` and network + service <= deadline
    (the dispatcher's rule, RTT + t_m <= D, with the messages' transfer times added: without them
    a continental path of 70 hops at 100 Mbit/s passes that rule and every query still misses)."""
    plan = plan.emulated
    exp = plan.experiment
    net = plan.network_state()
    host = {h.name: h for h in plan.hosts}
    resp = exp.simulation.response_bytes
    out = []
    for a in exp.applications:
        senders, servers = senders_and_servers(exp, plan.models, a)
        if not senders or not servers:
            continue
        req = plan.request_bytes[a.name]
        fastest: dict[str, ZeroLoadPair] = {}
        feasible: list[ZeroLoadPair] = []
        for p in plan.paths:
            if p.source not in senders or p.cluster not in servers:
                continue
            hs, hc = host[p.source].bandwidth_mbps, host[p.cluster].bandwidth_mbps
            network = message_ms(net, p.switches, req, (hs, hc)) + message_ms(net, p.switches[::-1], resp, (hc, hs))
            figs = plan.services[p.cluster]
            options = [pol.Option(p.cluster, m, network, f.expected_ms, plan.models[m].accuracy)
                       for m, f in figs.items() if plan.models[m].family == a.family]
            accurate = [o for o in options if o.accuracy >= a.min_accuracy]
            for o in pol.feasible(options, a.deadline_ms, a.min_accuracy):
                feasible.append(ZeroLoadPair(p.source, p.cluster, o.model, p.rtt_ms, network, o.service_ms))
            if accurate:
                best = min(accurate, key=lambda o: (o.service_ms, o.model))
                pair = ZeroLoadPair(p.source, p.cluster, best.model, p.rtt_ms, network, best.service_ms)
                if p.source not in fastest or pair.e2e_ms < fastest[p.source].e2e_ms:
                    fastest[p.source] = pair
        out.append(AppFeasibility(a.name, a.deadline_ms, fastest, feasible))
    return out


#: The prefix of the warning :func:`feasibility_warnings` gives for an application no query of
#: which can meet its deadline.
INFEASIBLE_WARNING = "WARNING: no query of application"


def feasibility_warnings(plan: Plan, verdicts: list[AppFeasibility] | None = None) -> list[str]:
    """The plan's lines on :func:`zero_load_feasibility`: a WARNING per application with no pair
    within its deadline at zero load (naming the fastest pair, its parts, and the nearest deadline
    that would work), and a note per application some of whose sources have none (a valid scenario,
    e.g. a test of deadline misses: ``testbed plan``, ``run`` and ``simulate`` say so and go on)."""
    out = []
    for f in verdicts if verdicts is not None else zero_load_feasibility(plan):
        if not f.fastest:
            continue  # no model meets the accuracy floor: the plan refuses that before (check_served)
        if not f.ok:
            best = min(f.fastest.values(), key=lambda p: p.e2e_ms)
            out.append(f"{INFEASIBLE_WARNING} {f.application!r} can meet its deadline of {f.deadline_ms:g} ms, even "
                       f"at zero load: no (source, cluster, model) answers within it; the fastest is {best.parts()}. "
                       f"The nearest deadline that would work: {f.nearest_deadline_ms():g} ms "
                       f"({f.nearest_deadline_ms(every_source=True):g} ms for every source); or place clusters "
                       f"nearer the sources (testbed new-experiment does)")
        elif f.late_sources:
            late = f.late_sources
            worst = max((f.fastest[s] for s in late), key=lambda p: p.e2e_ms)
            out.append(f"application {f.application!r}: {len(late)} of {len(f.fastest)} sources that send it have no "
                       f"(cluster, model) within its deadline of {f.deadline_ms:g} ms at zero load "
                       f"({', '.join(late[:8])}{' ...' if len(late) > 8 else ''}; the slowest: {worst.parts()}): "
                       f"their queries will miss it; a deadline of {f.nearest_deadline_ms(every_source=True):g} ms "
                       f"would serve every source")
    return out


__all__ = ["CPU_HEADROOM_CORES", "IFNAMSIZ", "INFEASIBLE_WARNING", "PATH_MAX", "AppFeasibility", "ZeroLoadPair",
           "check_names", "check_transfers", "cpu_note", "feasibility_warnings", "overload_note",
           "run_dir_limit_problem", "runs_dir_problem", "senders_and_servers", "zero_load_feasibility"]
