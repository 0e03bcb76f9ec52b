"""Planned traffic does not depend on the controller's ARP, and a connection that fails says why.

The unit tests build the neighbour file from a plan, name connection errors by errno, read the
sources' "cannot reach" lines, and scale the sources' ready timeout by k. The emulation test stops
ryu-manager (as a busy machine stalls it) while every source's neighbour cache is flushed, and
requires every source to open a TCP connection to every cluster anyway.
"""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest

from testbed.core.errors import connect_error
from testbed.emu.autodilate import unreached_clusters
from testbed.emu.load import SOURCES_READY_TIMEOUT_S, sources_ready_timeout_s
from testbed.emu.mininet_network import Emulation
from testbed.emu.source import CANNOT_REACH, OPEN_TIMEOUT_S
from testbed.plan.build import plan_experiment
from testbed.plan.dilation import dilate, with_time_dilation

REPO = Path(__file__).resolve().parent.parent
TRIANGLE = REPO / "experiments" / "triangle.yaml"


def test_every_host_gets_a_permanent_entry_for_every_other(tmp_path):
    plan = plan_experiment(TRIANGLE)
    (tmp_path / "logs").mkdir()
    emu = Emulation(plan, "userspace", "user", tmp_path, "r1")
    hosts = {h.name: h for h in plan.hosts}
    name = plan.sources[0].name
    lines = emu._neighbour_batch(name, f"{name}-eth0").read_text().splitlines()
    assert len(lines) == len(hosts) - 1 + len(emu.probes)
    assert len(emu._every_host()) == len(hosts) + len(emu.probes)  # each host once
    for other in hosts.values():
        line = f"neigh replace {other.ip} lladdr {other.mac} dev {name}-eth0 nud permanent"
        assert (line in lines) == (other.name != name)


def test_probe_hosts_are_neighbours_too(tmp_path):
    plan = plan_experiment(REPO / "experiments" / "isp-att.yaml")
    (tmp_path / "logs").mkdir()
    emu = Emulation(plan, "userspace", "user", tmp_path, "r1")
    assert emu.probes, "the scenario's link events give probe hosts"
    names = [h[0] for h in emu._every_host()]
    assert len(names) == len(set(names)) == len(plan.hosts) + len(emu.probes)
    probe = emu.probes[0]
    lines = emu._neighbour_batch(plan.sources[0].name, "x-eth0").read_text().splitlines()
    assert f"neigh replace {probe.ip} lladdr {probe.mac} dev x-eth0 nud permanent" in lines


def test_connect_error_names_the_errno():
    unreach = aiohttp.ClientConnectorError(
        aiohttp.client_reqrep.ConnectionKey("10.0.0.5", 8501, False, True, None, None, None),
        OSError(errno.EHOSTUNREACH, "Connect call failed ('10.0.0.5', 8501)"))
    text = connect_error(unreach)
    assert text.startswith("ClientConnectorError: EHOSTUNREACH (the source's neighbour entry")
    assert "10.0.0.5" in text
    assert connect_error(ConnectionRefusedError(errno.ECONNREFUSED, "refused")).startswith(
        "ConnectionRefusedError: ECONNREFUSED (nothing listens")
    assert connect_error(TimeoutError()) == "TimeoutError: "


def test_unreached_clusters_reads_the_sources_logs(tmp_path):
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "source-syracuse.log").write_text(
        f"noise\n{CANNOT_REACH} ne2244 before the load: ClientConnectorError: EHOSTUNREACH (...): x\n")
    (tmp_path / "logs" / "source-roanoke.log").write_text("all fine\n")
    got = unreached_clusters(tmp_path)
    assert got == ["syracuse: cannot reach cluster ne2244 before the load: ClientConnectorError: EHOSTUNREACH (...): x"]
    assert unreached_clusters(tmp_path / "nothing") == []


def test_sources_ready_timeout_grows_with_k():
    plan = plan_experiment(TRIANGLE)
    assert sources_ready_timeout_s(dilate(plan)) == SOURCES_READY_TIMEOUT_S + OPEN_TIMEOUT_S
    at_50 = dilate(with_time_dilation(plan, 50))
    assert sources_ready_timeout_s(at_50) == SOURCES_READY_TIMEOUT_S + 50 * OPEN_TIMEOUT_S


_CONNECT = r'''
import errno, socket, sys
for ip in sys.argv[1:]:
    s = socket.socket(); s.settimeout(10)
    try:
        s.connect((ip, 8501)); print(ip, "ok")
    except OSError as e:
        print(ip, errno.errorcode.get(e.errno, str(e)))
    s.close()
'''
_LISTEN = ("import socket\ns=socket.socket();s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\n"
           "s.bind(('0.0.0.0',8501));s.listen(16);print('listening',flush=True)\n"
           "while True:\n c,_=s.accept();c.close()")


@pytest.mark.emulation
@pytest.mark.skipif(os.geteuid() != 0, reason="emulation needs root")
def test_sources_connect_while_the_controller_is_stalled(tmp_path):
    from testbed.emu.lifecycle import emulated_network, new_run_dir

    plan = plan_experiment(TRIANGLE)
    run_id, run_dir = new_run_dir(plan, tmp_path)
    with emulated_network(plan, run_id, run_dir) as live:
        listeners = [live.emu.node(c.name).popen([sys.executable, "-c", _LISTEN], stdout=subprocess.PIPE, text=True)
                     for c in plan.clusters]
        try:
            for p in listeners:
                assert p.stdout.readline().strip() == "listening"
            for h in plan.hosts:  # what an entry left to expire would need: resolving again
                live.emu.node(h.name).cmd("ip neigh flush all")
            os.kill(live.controller.pid, signal.SIGSTOP)
            try:
                got = {s.name: live.emu.node(s.name).popen(
                    [sys.executable, "-c", _CONNECT, *[c.ip for c in plan.clusters]], stdout=subprocess.PIPE,
                    text=True).communicate(timeout=60)[0].split() for s in plan.sources}
            finally:
                os.kill(live.controller.pid, signal.SIGCONT)
        finally:
            for p in listeners:
                p.kill()
                p.wait()
    for source, words in got.items():
        assert words == [w for c in plan.clusters for w in (c.ip, "ok")], f"{source}: {words}"
