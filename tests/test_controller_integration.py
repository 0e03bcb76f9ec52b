"""The real Ryu controller against a real Mininet triangle (userspace Open vSwitch).

rc1 -(2 ms)- rc2 -(3 ms)- rc3, plus a slow direct rc1 -(10 ms)- rc3 edge, one host per switch
(rch1..rch3). The configured delays only steer routing here (no delay is emulated), so the
controller must send rch1 -> rch3 over rc2. Root only; marked ``emulation``. Everything created
(bridges rc1..rc3, hosts rch1..rch3, the ryu-manager process) is removed even on failure.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time

import pytest

from testbed.sdn import client as ctl

pytestmark = [
    pytest.mark.emulation,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root (Mininet, Open vSwitch)"),
    pytest.mark.skipif(shutil.which("ovs-vsctl") is None or shutil.which("mnexec") is None,
                       reason="needs Open vSwitch and Mininet"),
]

DELAYS = {(1, 2): 2.0, (2, 3): 3.0, (1, 3): 10.0}  # ms; rc1 -> rc3 direct is the slow edge
LINK_MBPS = 100.0
OFFLOADS_OFF = "tx off rx off sg off tso off gso off gro off"


def _mac(i: int) -> str:
    return f"00:00:00:00:00:{i:02x}"


def _import_mininet():
    try:
        import mininet.net  # noqa: F401
    except ImportError:
        sys.path.append("/usr/lib/python3/dist-packages")
    from mininet import log, net, node

    log.setLogLevel("warning")
    return net, node


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def triangle(tmp_path_factory):
    """A started triangle with a ready controller: yields (net, rest_url, host_by_index)."""
    mn_net, mn_node = _import_mininet()
    tmp = tmp_path_factory.mktemp("rc_ctl")
    of_port, rest_port = _free_port(), _free_port()
    while rest_port == of_port:
        rest_port = _free_port()
    net = proc = None
    try:
        net = mn_net.Mininet(topo=None, build=False, controller=None, autoSetMacs=False, autoStaticArp=False,
                             waitConnected=False)
        net.addController("rcc0", controller=mn_node.RemoteController, ip="127.0.0.1", port=of_port)
        sw = {i: net.addSwitch(f"rc{i}", cls=mn_node.OVSSwitch, dpid=f"{i:016x}", datapath="user",
                               protocols="OpenFlow13", failMode="secure") for i in (1, 2, 3)}
        for a, b in DELAYS:
            net.addLink(sw[a], sw[b])
        hosts, host_cfg = {}, []
        for i in (1, 2, 3):
            h = net.addHost(f"rch{i}", ip=f"10.0.0.{i}/24", mac=_mac(i))
            link = net.addLink(h, sw[i])
            hosts[i] = h
            host_cfg.append({"name": h.name, "mac": _mac(i), "ip": f"10.0.0.{i}", "dpid": i,
                             "port": sw[i].ports[link.intf2], "delay_ms": 0.0, "bandwidth_mbps": 1000.0})
        net.build()
        for h in hosts.values():
            h.cmd("sysctl -qw net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1")
            h.cmd(f"ethtool -K {h.defaultIntf()} {OFFLOADS_OFF}")
        for s in sw.values():
            for intf in s.intfNames():
                if intf != "lo":
                    os.system(f"ethtool -K {intf} {OFFLOADS_OFF} >/dev/null 2>&1; "
                              f"sysctl -qw net.ipv6.conf.{intf}.disable_ipv6=1 >/dev/null 2>&1")
        cfg = ctl.write_config(
            tmp / "controller.json",
            switches=[{"name": f"rc{i}", "dpid": i} for i in (1, 2, 3)],
            links=[{"a": a, "b": b, "delay_ms": d, "bandwidth_mbps": LINK_MBPS} for (a, b), d in DELAYS.items()],
            hosts=host_cfg,
            stats_interval_s=0.5,
        )
        proc = ctl.start_controller(cfg, of_port, rest_port, tmp / "controller.log")
        net.start()
        rest_url = f"http://127.0.0.1:{rest_port}"
        ctl.wait_ready(rest_url, timeout_s=30)
        yield net, rest_url, hosts
    finally:
        if net is not None:
            net.stop()
        if proc is not None:
            ctl.stop_controller(proc)


def test_all_hosts_ping_each_other(triangle):
    net, _, hosts = triangle
    loss = net.ping(hosts=list(hosts.values()), timeout="2")
    assert loss == 0.0


def test_status_reports_every_link(triangle):
    _, rest_url, _ = triangle
    st = ctl.get_status(rest_url)
    assert st["ready"] is True and st["flows_installed"] is True
    assert st["links_discovered"] == st["links_expected"] == 3
    assert st["switches_connected"] == [1, 2, 3] and st["missing_switches"] == [] and st["missing_links"] == []


def test_path_takes_the_two_hop_least_delay_route(triangle):
    _, rest_url, _ = triangle
    p = ctl.get_path(rest_url, _mac(1), _mac(3))
    assert p == {"src": _mac(1), "dst": _mac(3), "dpids": [1, 2, 3], "delay_ms": pytest.approx(5.0)}
    assert ctl.get_path(rest_url, _mac(3), _mac(1))["dpids"] == [3, 2, 1]
    assert ctl.get_path(rest_url, _mac(1), _mac(2))["dpids"] == [1, 2]
    paths = ctl.get_paths(rest_url)
    assert len(paths) == 6 and all(q["dpids"][0] != q["dpids"][-1] for q in paths)
    with pytest.raises(ctl.ControllerError, match="00:00:00:00:00:99"):
        ctl.get_path(rest_url, _mac(1), "00:00:00:00:00:99")
    with pytest.raises(ctl.ControllerError, match="HTTP 400"):
        ctl.get_path(rest_url, "not-a-mac", _mac(1))


def test_links_show_rate_on_the_used_path(triangle):
    _, rest_url, hosts = triangle
    # ~2 Mbit/s of ICMP from rch1 to rch3 for 4 s: it must show up on rc1->rc2, not on rc1->rc3.
    pinger = hosts[1].popen(["ping", "-q", "-c", "800", "-i", "0.005", "-s", "1200", "10.0.0.3"])
    try:
        best = None
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            time.sleep(0.5)
            links = {(r["a"], r["b"]): r for r in ctl.get_links(rest_url)}
            r12, r13 = links[(1, 2)], links[(1, 3)]
            if r12["rate_mbps_ab"] > 0.5:
                best = (r12, r13, links)
                break
        assert best is not None, f"no traffic seen on rc1->rc2: {links}"
        r12, r13, links = best
        assert r12["kind"] == "switch" and r12["capacity_mbps"] == LINK_MBPS and r12["delay_ms"] == 2.0
        assert isinstance(r12["a_port"], int) and isinstance(r12["b_port"], int) and r12["t"] > 0
        assert r12["util_ab"] == pytest.approx(r12["rate_mbps_ab"] / LINK_MBPS)
        assert r12["rate_mbps_ba"] > 0.5  # echo replies come back rc2 -> rc1
        assert r13["rate_mbps_ab"] < 0.1 and r13["rate_mbps_ba"] < 0.1  # the slow edge stays idle
        host1 = links[("rch1", 1)]
        assert host1["kind"] == "host" and host1["rate_mbps_ab"] > 0.5 and host1["capacity_mbps"] == 1000.0
        assert all(r["drops_total"] >= 0 for r in links.values())
    finally:
        pinger.terminate()
        pinger.wait(timeout=5)


def test_wait_ready_names_a_switch_that_never_connects(tmp_path):
    cfg = ctl.write_config(tmp_path / "c.json", switches=[{"name": "rcx9", "dpid": 9}], links=[],
                           hosts=[], stats_interval_s=1.0)
    of_port, rest_port = _free_port(), _free_port()
    proc = ctl.start_controller(cfg, of_port, rest_port, tmp_path / "c.log")
    try:
        if os.geteuid() == 0:  # root starts it at the system ovs-vswitchd's priority
            assert os.getpriority(os.PRIO_PROCESS, proc.pid) == ctl.CONTROLLER_NICE == -10
        with pytest.raises(ctl.ControllerNotReady, match=r"switch rcx9 \(dpid 9\) never connected"):
            ctl.wait_ready(f"http://127.0.0.1:{rest_port}", timeout_s=4)
    finally:
        ctl.stop_controller(proc)
    assert proc.poll() is not None


def _wait_path(rest_url: str, src: str, dst: str, want: list[int], timeout_s: float) -> dict:
    """The path once it is ``want`` and every switch acknowledged its flows (a barrier): the REST
    path changes when the flows are sent, before Open vSwitch has applied them."""
    deadline = time.monotonic() + timeout_s
    while True:
        p = ctl.get_path(rest_url, src, dst)
        if (p["dpids"] == want and ctl.get_status(rest_url)["flows_installed"]) or time.monotonic() > deadline:
            return p
        time.sleep(0.2)


def test_link_failure_reroutes_and_recovers(triangle):
    net, rest_url, _ = triangle
    net.configLinkStatus("rc1", "rc2", "down")
    try:
        p = _wait_path(rest_url, _mac(1), _mac(3), [1, 3], 15)
        assert p["dpids"] == [1, 3] and p["delay_ms"] == pytest.approx(10.0)
        st = ctl.get_status(rest_url)
        assert st["ready"] is False and st["missing_links"] == [[1, 2]]
        assert ctl.get_path(rest_url, _mac(1), _mac(2))["dpids"] == [1, 3, 2]
        assert net.ping(hosts=[net.get("rch1"), net.get("rch2")], timeout="2") == 0.0
    finally:
        net.configLinkStatus("rc1", "rc2", "up")
    p = _wait_path(rest_url, _mac(1), _mac(3), [1, 2, 3], 15)
    assert p["dpids"] == [1, 2, 3]
    ctl.wait_ready(rest_url, timeout_s=15)


LLDP_FLOW = "priority=65535,dl_type=0x88cc,dl_dst=01:80:c2:00:00:0e"


def _ofctl(*args: str) -> None:
    out = subprocess.run(["ovs-ofctl", "-O", "OpenFlow13", *args], capture_output=True, text=True, timeout=10)
    assert out.returncode == 0, out.stderr


def test_a_link_whose_first_lldp_is_lost_on_coming_up_is_rediscovered_at_once(triangle):
    """A port that comes back up is probed again until its link is known (the controller's
    REPROBE_AFTER_UP_S): with both ends' LLDP flow removed for the first 0.3 s after the link comes
    up (ryu.topology's flow to the controller; without it the table-miss drops the frame, and no
    port status is sent), ryu's one probe at port-up is lost, and its next periodic one would come
    10 s later (LLDP_PERIOD_RUNNING_S); the link is back well before."""
    net, rest_url, _ = triangle
    net.configLinkStatus("rc1", "rc2", "down")
    try:
        _wait_path(rest_url, _mac(1), _mac(3), [1, 3], 15)
        for sw in ("rc1", "rc2"):
            _ofctl("del-flows", sw, "dl_type=0x88cc")
        net.configLinkStatus("rc1", "rc2", "up")
        t_up = time.monotonic()
        time.sleep(0.3)
    finally:
        for sw in ("rc1", "rc2"):
            _ofctl("add-flow", sw, f"{LLDP_FLOW},actions=CONTROLLER:65535")
        net.configLinkStatus("rc1", "rc2", "up")
    p = _wait_path(rest_url, _mac(1), _mac(3), [1, 2, 3], 15)
    back_s = time.monotonic() - t_up
    assert p["dpids"] == [1, 2, 3] and back_s < 8.0, f"rediscovered {back_s:.1f} s after the link came up"
    ctl.wait_ready(rest_url, timeout_s=15)


def test_controller_process_imports_numpy_only_at_first_use():
    """ryu-manager's process (testbed.sdn.launcher) loads the controller app and its config
    validation without running numpy, networkx, dnspython or setuptools (the bring-up waits for
    its start), and numpy still works when touched."""
    import subprocess

    code = ("import sys; import testbed.sdn.launcher as l; l._lazy_imports(); l._patch_eventlet(); "
            "import ryu.app.wsgi, ryu.topology.switches, ryu.controller.ofp_handler; "
            "sys.path.insert(0, 'controllers'); import testbed_controller, testbed.plan.boundaries; "
            "print(sorted(m for m in ('numpy._core', 'networkx', 'dns', 'setuptools', 'pkg_resources') "
            "if m in sys.modules)); import testbed.model.dispatch as d; print(int(d.np.arange(4).sum()))")
    env = dict(os.environ, **ctl.FAST_START_ENV)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         cwd=str(ctl.REPO_ROOT), check=True).stdout.split()
    assert out == ["[]", "6"]


def test_the_running_lldp_period_grows_with_the_ports():
    """10 s on a small network; on 1,474 links (2,948 ports) long enough for 30 frames/s at most."""
    import subprocess

    code = ("import sys; import testbed.sdn.launcher as l; l._lazy_imports(); l._patch_eventlet(); "
            "sys.path.insert(0, 'controllers'); import testbed_controller as t; "
            "print(t.lldp_period_s(15), round(t.lldp_period_s(1474), 2))")
    env = dict(os.environ, **ctl.FAST_START_ENV)
    env.pop("TESTBED_LLDP_PERIOD_S", None)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         cwd=str(ctl.REPO_ROOT), check=True).stdout.split()
    assert out == ["10.0", "98.27"]
