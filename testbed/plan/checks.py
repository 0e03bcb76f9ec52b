"""The plan's checks that span its parts: names and interface names, one request's transfer time
against its application's deadline, the run directory's paths, and the notes on CPU and
deadlines (the rows ``names``, ``bandwidth`` and ``run directory paths`` of
:mod:`testbed.plan.build`'s table)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from testbed.model.network import mss_of, transfer_ms
from testbed.plan.catalog import ModelInfo
from testbed.plan.resolved import Host, Link, PathInfo, Plan, PlanError, Switch
from testbed.plan.topology import Network
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

def cpu_note(exp: Experiment) -> str | None:
    """A note when the clusters' CPU shares leave less than :data:`CPU_HEADROOM_CORES` of this
    machine's cores to the rest of an emulation, or None."""
    cores, cpus = sum(c.cpu_cores for c in exp.clusters), os.cpu_count() or 1
    if cores <= cpus - CPU_HEADROOM_CORES:
        return None
    return (f"the clusters' CPU shares add up to {cores:g} cores on a machine with {cpus}: an emulation "
            f"needs about {CPU_HEADROOM_CORES:g} core for the sources, the network and the controller, "
            f"or the servers do not get their shares (the summary's service check says so)")


def senders_and_servers(exp: Experiment, models: dict[str, ModelInfo],
                        app: ApplicationSpec) -> tuple[list[str], list[str]]:
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


__all__ = ["CPU_HEADROOM_CORES", "IFNAMSIZ", "PATH_MAX", "check_names", "check_transfers", "cpu_note",
           "deadlines_below_rtt", "run_dir_limit_problem", "runs_dir_problem", "senders_and_servers"]
