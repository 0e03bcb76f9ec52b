"""Packet capture inside the emulated namespaces (``capture:`` key of an experiment).

One ``tcpdump`` per capture point (an interface), started in the namespace that owns the interface
(host namespaces, link-emulator namespaces, or the root namespace for switch ports) just before
the sources start, stopped (SIGINT, so the file is complete) when the load ends. Files:
``RUN_DIR/pcap/<interface>.pcap`` (nanosecond timestamps, all namespaces share one kernel clock),
``RUN_DIR/pcap/capture.json`` (the points, the bounds and tcpdump's own counters),
``RUN_DIR/logs/tcpdump-<interface>.log``.

Capture points (:func:`testbed.plan.capture_points.capture_points`, resolved and checked at plan time):

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
from dataclasses import asdict
from pathlib import Path
from typing import Any

from testbed.core.lifeline import tied_popen
from testbed.emu.mininet_network import EmulationError
from testbed.plan.capture_points import CapturePoint, capture_points
from testbed.plan.resolved import Plan
from testbed.spec.capture import CaptureSpec

PCAP_FILE_HEADER_BYTES = 24
PCAP_RECORD_HEADER_BYTES = 16


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

    ``live``: the running :class:`testbed.emu.lifecycle.Live`. Pcaps go to ``live.run_dir / "pcap"``. Waits
    until every tcpdump says it is listening (at most ``ready_timeout_s`` s each, skipped with
    ``start_delay_s``). Returns the points. Raises PlanError (unknown name) before starting anything,
    :class:`testbed.emu.mininet_network.EmulationError` when a tcpdump exits at once or does not
    start listening (its log is named); what was started is stopped by ``stack``.
    """

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
