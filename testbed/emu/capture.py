"""Packet capture inside the emulated namespaces (``capture:`` key of an experiment).

One ``tcpdump`` per capture point (an interface), started in the namespace that owns the interface
(host namespaces, link-emulator namespaces, or the root namespace for switch ports) just before
the sources start, stopped (SIGINT, so the file is complete) when the load ends. Files:
``RUN_DIR/pcap/<interface>.pcap`` (nanosecond timestamps, all namespaces share one kernel clock),
``RUN_DIR/pcap/capture.json`` (the points, the bounds and tcpdump's own counters),
``RUN_DIR/logs/tcpdump-<interface>.log``.

Capture points (see :func:`capture_points`):

* a host ``h``: its interface ``h-eth0`` in the host's namespace;
* a link ``lK`` (``K`` = link index, as in ``testbed plan``): with the user-space link emulator,
  ``lK-eth0`` (side ``a``) and ``lK-eth1`` (side ``b``) in the emulator's namespace, so the hop
  ``lK-eth0 > lK-eth1`` is exactly the emulated link; with netem, the two switch ports of the link;
* a switch ``sN``: every port ``sN-ethP`` (root namespace);
* an interface name (``srca-eth0``, ``l2-eth1``, ``s1-eth3``): that interface.

Size bound: ``tcpdump -s SNAPLEN -c N`` with N = floor((max_mib x 2^20 - 24) / (16 + SNAPLEN)),
so a pcap file can never exceed ``max_mib`` MiB (pcap: 24-byte file header + 16 bytes per record,
https://www.tcpdump.org/manpages/pcap-savefile.5.txt); capture on that interface stops when the
count is reached. Only the query traffic is captured (BPF ``tcp port <server_port>``).
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from testbed.core.lifeline import tied_popen
from testbed.plan.build import Plan, PlanError
from testbed.spec.capture import CaptureSpec

PCAP_FILE_HEADER_BYTES = 24
PCAP_RECORD_HEADER_BYTES = 16
_IFNAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,14}$")


@dataclass(frozen=True)
class CapturePoint:
    """One interface we capture on.

    ``name``: the interface name (also the pcap file stem); ``node``: the Mininet node whose
    namespace holds it (None = root namespace); ``kind``: ``host``, ``link`` or ``switch``;
    ``host``: the host name (kind host); ``link``: the link index and ``side`` (``a``/``b``, the end
    of the link the interface faces) for link points and switch ports on switch links.
    """

    name: str
    node: str | None
    kind: str
    host: str | None = None
    link: int | None = None
    side: str | None = None
    switch: str | None = None


def _switch_ports(plan: Plan) -> list[CapturePoint]:
    """Every switch port in the order Mininet creates them (links first, then hosts)."""
    count = {s.name: 0 for s in plan.switches}
    out = []
    for lk in plan.links:
        for sw, side in ((lk.a, "a"), (lk.b, "b")):
            count[sw] += 1
            out.append(CapturePoint(f"{sw}-eth{count[sw]}", None, "switch", link=lk.index, side=side, switch=sw))
    for h in plan.hosts:
        count[h.switch] += 1
        out.append(CapturePoint(f"{h.switch}-eth{count[h.switch]}", None, "switch", host=h.name, switch=h.switch))
    return out


def _link_points(plan: Plan, link_emulator: str) -> dict[str, list[CapturePoint]]:
    """Link emulator name -> its two capture points (a side first)."""
    ports = _switch_ports(plan)
    out = {}
    for lk in plan.links:
        if link_emulator == "userspace":
            out[lk.emu_name] = [CapturePoint(f"{lk.emu_name}-eth0", lk.emu_name, "link", link=lk.index, side="a"),
                                CapturePoint(f"{lk.emu_name}-eth1", lk.emu_name, "link", link=lk.index, side="b")]
        else:
            out[lk.emu_name] = [p for p in ports if p.link == lk.index]
    return out


def capture_points(plan: Plan, spec: CaptureSpec, link_emulator: str = "userspace") -> list[CapturePoint]:
    """Resolve ``spec.interfaces`` against the plan into capture points (no duplicates, plan order).

    ``link_emulator``: ``userspace`` or ``netem`` (decides where a link is captured, see the module
    docstring). Raises :class:`testbed.plan.build.PlanError` naming the first unknown item
    (``capture.interfaces.2: 'x' is not a host, switch, link (lK) or interface of the plan``).
    """
    hosts = {h.name: CapturePoint(f"{h.name}-eth0", h.name, "host", host=h.name) for h in plan.hosts}
    links = _link_points(plan, link_emulator)
    ports = _switch_ports(plan)
    if spec.interfaces == "edge":
        return list(hosts.values())
    if spec.interfaces == "all":
        return list(hosts.values()) + [p for lk in plan.links for p in links[lk.emu_name]]
    by_if: dict[str, CapturePoint] = {p.name: p for p in ports}
    if link_emulator == "userspace":
        by_if.update({p.name: p for pts in links.values() for p in pts})
    else:  # lK-eth0/1 do not exist with netem: they stand for the link's switch ports
        by_if.update({f"{k}-eth{i}": p for k, pts in links.items() for i, p in enumerate(pts)})
    by_if.update({p.name: p for p in hosts.values()})
    out: dict[str, CapturePoint] = {}
    for i, item in enumerate(spec.interfaces):
        if item in hosts:
            found = [hosts[item]]
        elif item in links:
            found = links[item]
        elif any(s.name == item for s in plan.switches):
            found = [p for p in ports if p.switch == item]
        elif item in by_if:
            found = [by_if[item]]
        else:
            import difflib

            close = difflib.get_close_matches(item, list(hosts) + list(links) + list(by_if), n=3, cutoff=0.5)
            hint = f"; did you mean {', '.join(map(repr, close))}?" if close else ""
            raise PlanError(f"capture.interfaces.{i}: {item!r} is not a host, switch, link emulator (lK) or "
                            f"interface of the plan{hint} (see `testbed plan`)")
        for p in found:
            out.setdefault(p.name, p)
    if not out:
        raise PlanError("capture.interfaces: the list is empty; use edge, all or name interfaces")
    return list(out.values())


def validate_capture(plan: Plan) -> None:
    """Check the experiment's ``capture:`` names against the plan (no-op without ``capture:``).

    Raises :class:`testbed.plan.build.PlanError` naming the offending item; builds nothing.
    """
    spec = plan.experiment.capture
    if spec is not None:
        for p in capture_points(plan, spec, "userspace"):
            if not _IFNAME_RE.match(p.name):
                raise PlanError(f"capture: interface name {p.name!r} is not a valid Linux interface name")


def packet_bound(spec: CaptureSpec) -> int:
    """Packets per capture file so that the file stays within ``spec.max_mib`` MiB (see module doc)."""
    n = int((spec.max_mib * 2**20 - PCAP_FILE_HEADER_BYTES) // (PCAP_RECORD_HEADER_BYTES + spec.snaplen_bytes))
    return max(n, 1)


def tcpdump_command(point: CapturePoint, spec: CaptureSpec, pcap: Path, server_port: int) -> list[str]:
    """The tcpdump argv for one point.

    ``--immediate-mode`` (no TPACKET_V3 block timeout: packets still in the ring when tcpdump is
    stopped would be lost, seen as "received by filter" > "captured") and ``-U`` (each packet
    written to the file at once): the capture is complete up to the stop.
    """
    cmd = ["tcpdump", "-i", point.name, "-nn", "-U", "--immediate-mode", "-Z", "root", "-s", str(spec.snaplen_bytes),
           "-c", str(packet_bound(spec)), "--time-stamp-precision=nano", "-w", str(pcap),
           f"tcp port {int(server_port)}"]
    if spec.start_delay_s > 0:
        cmd = ["sh", "-c", f"sleep {float(spec.start_delay_s):.3f}; exec \"$@\"", "tcpdump-delayed", *cmd]
    return cmd


_STATS_RE = re.compile(r"(\d+) packets? (captured|received by filter|dropped by kernel)")


def _stop(procs: dict[str, subprocess.Popen], logs: dict[str, Path], meta: dict, meta_path: Path) -> None:
    for p in procs.values():
        if p.poll() is None:
            p.send_signal(signal.SIGINT)
    deadline = time.monotonic() + 5
    for p in procs.values():
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=3)
    for name, log in logs.items():
        text = log.read_text(errors="replace") if log.exists() else ""
        counts = {kind.replace(" ", "_"): int(n) for n, kind in _STATS_RE.findall(text)}
        pcap = meta_path.parent / f"{name}.pcap"
        meta["points"][name].update(counts, bytes=pcap.stat().st_size if pcap.exists() else 0,
                                    bound_reached=counts.get("captured", 0) >= meta["packet_bound"])
    meta_path.write_text(json.dumps(meta, indent=1))


def start_capture(live: Any, spec: CaptureSpec, stack: ExitStack, ready_timeout_s: float = 5.0) -> list[CapturePoint]:
    """Start one tcpdump per capture point; register their stop on ``stack``.

    ``live``: the running :class:`testbed.emu.run.Live`. Pcaps go to ``live.run_dir / "pcap"``. Waits
    until every tcpdump says it is listening (at most ``ready_timeout_s`` s each, skipped with
    ``start_delay_s``). Returns the points. Raises PlanError (unknown name) before starting anything,
    :class:`testbed.emu.network.EmulationError` when a tcpdump exits at once or does not
    start listening (its log is named); what was started is stopped by ``stack``.
    """
    from testbed.emu.network import EmulationError

    plan: Plan = live.plan
    mode = getattr(live.emu, "link_emulator", "userspace")
    points = capture_points(plan, spec, mode)
    pcap_dir = Path(live.run_dir) / "pcap"
    log_dir = Path(live.run_dir) / "logs"
    pcap_dir.mkdir(parents=True, exist_ok=True)
    log_dir.mkdir(parents=True, exist_ok=True)
    port = plan.experiment.emulation.server_port
    meta = {"link_emulator": mode, "server_port": port, "snaplen_bytes": spec.snaplen_bytes,
            "max_mib": spec.max_mib, "packet_bound": packet_bound(spec), "start_delay_s": spec.start_delay_s,
            "points": {p.name: asdict(p) for p in points}}
    procs: dict[str, subprocess.Popen] = {}
    logs: dict[str, Path] = {}
    stack.callback(_stop, procs, logs, meta, pcap_dir / "capture.json")
    for p in points:
        cmd = tcpdump_command(p, spec, pcap_dir / f"{p.name}.pcap", port)
        logs[p.name] = log_dir / f"tcpdump-{p.name}.log"
        with open(logs[p.name], "w") as log:
            if p.node is None:
                procs[p.name] = tied_popen(subprocess.Popen, cmd, stdout=log, stderr=subprocess.STDOUT)
            else:
                procs[p.name] = tied_popen(live.emu.node(p.node).popen, cmd, stdout=log, stderr=subprocess.STDOUT)
    if spec.start_delay_s > 0:
        return points
    deadline = time.monotonic() + ready_timeout_s
    for name, proc in procs.items():
        while "listening on" not in logs[name].read_text(errors="replace"):
            if proc.poll() is not None:
                raise EmulationError(f"tcpdump on {name} exited with {proc.returncode}; see {logs[name]}")
            if time.monotonic() > deadline:
                raise EmulationError(f"tcpdump on {name} did not start within {ready_timeout_s:g} s; see {logs[name]}")
            time.sleep(0.05)
    return points
