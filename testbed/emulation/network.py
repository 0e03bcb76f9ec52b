"""Building the emulated network in Mininet from a :class:`~testbed.plan.Plan`.

* Switches: Open vSwitch, OpenFlow 1.3, ``failMode=secure`` (no forwarding until the controller
  installs flows), kernel datapath where the ``openvswitch`` module is loaded, else userspace
  (``datapath_type=netdev``).
* Link delay: ``netem`` through Mininet's TCLink where the kernel has it; otherwise each switch
  link ``a - b`` becomes ``a-ethX <-> lK-eth0 | lK-eth1 <-> b-ethY`` where ``lK`` is a namespace
  running :mod:`testbed.emulation.linkemu` (frames forwarded after the one-way delay).
* Bandwidth: HTB (Mininet TCIntf ``bw``) on the switch ports, Mbit/s.
* Offloads are switched off on every veth (needed by the userspace datapath and the link emulator,
  see environment.md) and IPv6 is disabled in every namespace (no stray solicitations).
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from testbed.errors import RunFailure
from testbed.plan import Plan

OFFLOAD_OFF = "rx off tx off sg off tso off gso off gro off"


def _import_mininet():
    try:
        import mininet.net  # noqa: F401
    except ImportError:  # Debian's python3-mininet lives outside the venv
        sys.path.append("/usr/lib/python3/dist-packages")
    from mininet import link, log, net, node

    log.setLogLevel(os.environ.get("TESTBED_MININET_LOG", "warning"))
    return net, node, link


class EmulationError(RunFailure):
    """The emulated network could not be built or failed a self-check."""


def ovs_kernel_datapath_available() -> bool:
    """True when the ``openvswitch`` kernel module is loaded (or loadable)."""
    if Path("/sys/module/openvswitch").exists():
        return True
    return subprocess.run(["modprobe", "-q", "openvswitch"], capture_output=True).returncode == 0


def choose_datapath(requested: str) -> str:
    """Resolve ``auto|kernel|user`` into ``kernel`` or ``user``.

    Raises:
        EmulationError: ``kernel`` requested but the module is missing.
    """
    have = ovs_kernel_datapath_available()
    if requested == "kernel" and not have:
        raise EmulationError("emulation.datapath=kernel, but the openvswitch kernel module is not available; "
                             "use datapath: user (or auto)")
    if requested == "auto":
        return "kernel" if have else "user"
    return requested


def choose_link_emulator(requested: str) -> str:
    """Resolve ``auto|netem|userspace`` into ``netem`` or ``userspace``.

    Raises:
        EmulationError: ``netem`` requested but the kernel lacks the netem qdisc.
    """
    from testbed.emulation.linkemu import netem_available

    have = netem_available()
    if requested == "netem" and not have:
        raise EmulationError("emulation.link_emulator=netem, but this kernel has no netem qdisc "
                             "(sch_netem); use link_emulator: userspace (or auto)")
    if requested == "auto":
        return "netem" if have else "userspace"
    return requested


def planned_root_interfaces(plan: Plan, link_emulator: str) -> list[str]:
    """Names of the root-namespace interfaces the build will create (switch ports), for cleanup."""
    names = []
    count = {s.name: 0 for s in plan.switches}
    order = [(lk.a, lk.b) for lk in plan.links] + [(h.switch, None) for h in plan.hosts]
    for a, b in order:
        for sw in (a, b):
            if sw is not None:
                count[sw] += 1
                names.append(f"{sw}-eth{count[sw]}")
    return names


@dataclass
class Emulation:
    """A built (and later started) Mininet network for a plan."""

    plan: Plan
    link_emulator: str
    datapath: str
    run_dir: Path
    net: object = None
    host_ports: dict[str, int] = field(default_factory=dict)
    emulators: list = field(default_factory=list)
    emulator_procs: dict = field(default_factory=dict)  # link emulator node -> its process

    def build(self) -> None:
        """Create namespaces, switches and links (nothing is started yet).

        Raises:
            EmulationError: Mininet failed to build.
        """
        mn_net, mn_node, mn_link = _import_mininet()

        class LinkEmulatorNode(mn_node.Node):
            """A namespace holding only a user-space link emulator: no IP, interfaces up."""

            def config(self, **params):
                params.pop("ip", None)
                params.pop("mac", None)
                r = super().config(**params)
                for intf in self.intfList():
                    self.cmd(f"ip link set {intf} up")
                return r

        class ShapedIntf(mn_link.TCIntf):
            """TCIntf without HTB's "quantum of class is big" warning: with one class per
            interface the quantum (rate / r2q) only sets the DRR granularity, not the rate."""

            def tc(self, cmd, tc="tc"):
                out = super().tc(cmd, tc)
                return "\n".join(ln for ln in out.splitlines() if "is big. Consider r2q" not in ln)

        def shaped_link(a, b, params1, params2):
            return net.addLink(a, b, cls=mn_link.Link, intf=ShapedIntf, params1=params1, params2=params2)

        exp = self.plan.experiment
        net = mn_net.Mininet(topo=None, build=False, controller=None, autoSetMacs=False,
                             autoStaticArp=False, waitConnected=False)
        self.net = net
        class Ryu(mn_node.RemoteController):
            """ryu-manager, started by testbed.run; Mininet's probe at construction time would
            only warn that it is not listening yet."""

            def checkListening(self):
                return None

        net.addController("c0", controller=Ryu, ip="127.0.0.1", port=exp.emulation.of_port)
        for s in self.plan.switches:
            net.addSwitch(s.name, cls=mn_node.OVSSwitch, dpid=f"{s.dpid:016x}", datapath=self.datapath,
                          protocols="OpenFlow13", failMode="secure")
        for lk in self.plan.links:
            a, b = net.get(lk.a), net.get(lk.b)
            shaped = {"bw": lk.bandwidth_mbps}
            if self.link_emulator == "netem":
                params = dict(shaped, delay=f"{lk.delay_ms:.3f}ms")
                if lk.loss_pct:
                    params["loss"] = lk.loss_pct
                shaped_link(a, b, params, dict(params))
            else:
                emu = net.addHost(lk.emu_name, cls=LinkEmulatorNode, ip=None)
                shaped_link(a, emu, dict(shaped), {})
                shaped_link(emu, b, {}, dict(shaped))
        for h in self.plan.hosts:
            host = net.addHost(h.name, ip=f"{h.ip}/8", mac=h.mac)
            bw = min(h.bandwidth_mbps, 1000.0)  # Mininet's HTB accepts at most 1000 Mbit/s
            lnk = shaped_link(host, net.get(h.switch), {"bw": bw}, {"bw": bw})
            self.host_ports[h.name] = net.get(h.switch).ports[lnk.intf2]
        try:
            net.build()
        except Exception as exc:  # Mininet raises bare Exceptions
            raise EmulationError(f"Mininet could not build the network: {exc}") from exc
        for node in net.hosts:
            node.cmd("sysctl -qw net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1")
            for intf in node.intfNames():
                if intf != "lo":
                    node.cmd(f"ethtool -K {intf} {OFFLOAD_OFF}")
        for sw in net.switches:
            for intf in sw.intfNames():
                if intf != "lo":
                    subprocess.run(f"ethtool -K {intf} {OFFLOAD_OFF}; "
                                   f"sysctl -qw net.ipv6.conf.{intf}.disable_ipv6=1",
                                   shell=True, capture_output=True)

    def start_link_emulators(self, python: str) -> None:
        """Start one :mod:`testbed.emulation.linkemu` process per link (userspace mode only)."""
        if self.link_emulator != "userspace":
            return
        logs = self.run_dir / "logs"
        for lk in self.plan.links:
            node = self.net.get(lk.emu_name)
            cmd = [python, "-m", "testbed.emulation.linkemu", "--if-a", f"{lk.emu_name}-eth0",
                   "--if-b", f"{lk.emu_name}-eth1", "--delay-ms", f"{lk.delay_ms:.6f}",
                   "--loss-pct", f"{lk.loss_pct:g}", "--seed", str(self.plan.experiment.seed + lk.index),
                   "--stats-file", str(self.run_dir / "linkemu" / f"{lk.emu_name}.json")]
            log = open(logs / f"linkemu-{lk.emu_name}.log", "w")  # noqa: SIM115 - lives with the process
            proc = node.popen(cmd, stdout=log, stderr=subprocess.STDOUT)
            self.emulators.append(proc)
            self.emulator_procs[lk.emu_name] = proc

    def start_switches(self, run_id: str) -> None:
        """Start the switches (they connect to the controller) and tag their bridges as ours."""
        self.net.start()
        names = " ".join(f"-- set bridge {s.name} external_ids:testbed_run={run_id}" for s in self.plan.switches)
        subprocess.run(f"ovs-vsctl --timeout=10 {names}", shell=True, capture_output=True)

    def node(self, name: str):
        """The Mininet node called ``name``."""
        return self.net.get(name)

    def stop(self) -> None:
        """Stop link emulators and Mininet (removes bridges, namespaces and veths)."""
        for p in self.emulators:
            if p.poll() is None:
                p.terminate()
        for p in self.emulators:
            try:
                p.wait(timeout=3)
            except subprocess.TimeoutExpired:
                p.kill()
        if self.net is not None:
            self.net.stop()
            self.net = None
