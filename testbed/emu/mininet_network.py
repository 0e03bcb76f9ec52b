"""Building the emulated network in Mininet from a :class:`~testbed.plan.build.Plan`, and changing its
links at run time.

* Switches: Open vSwitch, OpenFlow 1.3, ``failMode=secure`` (no forwarding until the controller
  installs flows), kernel datapath where the ``openvswitch`` module is loaded, else userspace
  (``datapath_type=netdev``).
* Switch links, ``userspace`` link emulator (kernels without netem): each link ``a - b`` becomes
  ``a-ethX <-> lK-eth0 | lK-eth1 <-> b-ethY`` (``lK`` the plan's ``emu_name``); the ``lK``
  interfaces of up to :data:`~testbed.emu.netplan.LINKS_PER_EMULATOR` links live in one namespace, node ``E<g>``
  (``node("lK")`` is that node), where one :mod:`testbed.emu.linkemu` process serves them:
  delay, loss and the bandwidth (its FIFO shaper, any rate) of each, changed at run time over its
  control socket.
* Switch links, ``netem``: a veth ``a-ethX <-> b-ethY`` with, on both ends, HTB at the bandwidth and
  netem (delay, loss, ``limit`` :data:`~testbed.emu.tc.QUEUE_PACKETS`) as its leaf; run-time changes are
  ``tc class change`` / ``tc qdisc change`` (:func:`testbed.emu.tc.tc_change_commands`).
* Host links: a veth host <-> switch, HTB at the host's bandwidth on both ends (``tc`` directly,
  so rates above Mininet's 1000 Mbit/s limit are shaped too), a pfifo of :data:`~testbed.emu.tc.QUEUE_PACKETS`.
* Neighbours: every host (plan hosts and probe hosts) holds a permanent neighbour entry for every
  other one (``ip neigh replace ... nud permanent``), so that no planned packet waits for ARP. ARP
  would go to the controller (proxy ARP), a nice-0 process that a busy machine can stall for
  seconds: a host re-resolving a peer then gets no answer within its 3 probes and fails the
  connection with ``EHOSTUNREACH`` (reproduced by stopping ryu-manager while a source connects:
  ``Connect call failed`` after 3 s). The controller still answers ARP for hosts not in the plan.
* Probe hosts ``P<i>a`` / ``P<i>b`` (unshaped) at both ends of every link that scenario events
  change: they measure each change and carry congestion traffic (:mod:`testbed.emu.dynamics`).
  Names with capitals cannot collide with a plan's names (``[a-z][a-z0-9]*``).
* **OVS shards** (userspace datapath, more than :data:`~testbed.emu.netplan.SHARD_ABOVE_SWITCHES` switches): one
  ``ovs-vswitchd`` forwards every packet of every bridge in its single main thread, and that thread
  polls every port of every bridge at each wake-up, so the cost of a hop grows with the size of the
  whole network (measured, ``benchmarks/scale_bench.py profile``: a 10-switch path costs 0.18 ms of
  RTT per switch next to 0 other bridges, 0.96 ms next to 30, 2.4 ms next to 90). The switches are
  therefore split, in breadth-first order, over shards of :data:`~testbed.emu.netplan.SWITCHES_PER_OVS`: each shard is a
  private ``ovsdb-server`` and ``ovs-vswitchd`` (children of the run, tagged) whose vswitchd runs in
  a namespace of its own (node ``O<k>``) that holds its switches' ports (two userspace datapaths
  in one namespace collide on the ``ovs-netdev`` tap); it reaches ryu-manager over a veth to the
  root namespace (:data:`~testbed.emu.netplan.CONTROLLER_IP`). Smaller networks use the system's Open vSwitch as before.
* Offloads are switched off on every veth (needed by the userspace datapath and the link emulator,
  see environment.md) and IPv6 is disabled in every namespace (no stray solicitations).

What was applied per link (shaper, rate, delay, loss) is in :attr:`Emulation.applied`, written to
``network.json`` by the bring-up; nothing is left unshaped in silence.

The names, addresses and shards come from :mod:`testbed.emu.netplan` (pure, from the plan), the
``tc`` commands from :mod:`testbed.emu.tc`. What remains here is one object, :class:`Emulation`:
its build (Mininet, shards, veths, shaping, link emulators, bridges), its run-time changes and its
teardown share the Mininet handles and the per-link state it keeps (:attr:`Emulation.applied`),
so they stay together rather than spread over modules that would hand that state around.
"""

from __future__ import annotations

import functools
import ipaddress
import json
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from testbed.core.lifeline import tied_popen
from testbed.emu import netdev
from testbed.emu.cleanup import control_dir
from testbed.emu.linkemu import LinkControl, LinkEmuError, netem_available
from testbed.emu.netplan import (
    CONTROLLER_IP,
    EmulationError,
    ProbeHost,
    check_interface_names,
    control_addresses,
    control_veth,
    emulator_groups,
    host_port_numbers,
    ovs_shards,
    probe_hosts,
    switch_port_names,
)
from testbed.emu.tc import htb_commands, netem_leaf, read_htb_rate_mbps, read_htb_rates_mbps, run_tc, tc_change_commands
from testbed.model.network import mss_of
from testbed.plan.build import Plan
from testbed.plan.dilation import rto_min_ms, wall_clock

OFFLOAD_OFF = "rx off tx off sg off tso off gso off gro off"
OVS_SCHEMA = Path("/usr/share/openvswitch/vswitch.ovsschema")
#: TCP settings of every emulated host's namespace. The model sends a message's frames back to back
#: at the link's rate (:mod:`testbed.model.network`, "transfer"): a warm congestion window. Linux
#: restarts the window from its initial 10 segments (RFC 6928) after an idle RTO (RFC 5681 section
#: 4.1, ``tcp_slow_start_after_idle`` = 1 by default), which would cost a request of more than 10
#: segments on a connection idle that long one more round trip that the model has not. Kept off, as
#: latency-sensitive servers commonly run (Grigorik, High Performance Browser Networking, ch. 2,
#: "Slow-Start Restart").
TCP_SYSCTLS = {"net.ipv4.tcp_slow_start_after_idle": 0}
#: Each switch's controller connection (``ovs-vsctl set controller``): out of band, reconnecting
#: within 1 s, and no inactivity probe. Open vSwitch's default probe (5 s) disconnects a switch
#: whose controller has not answered within 5 s, which a starved controller of a large network
#: does not, and each disconnection is a reroute around a switch that never failed. The
#: controller is local: its death closes the connections at once (and the run's health watch
#: reports it, ``testbed.emu.health``). Open vSwitch 3.1 opens the connection with a 5 s probe
#: all the same and applies this one only at a reconfiguration while it is up (ofproto/connmgr.c:
#: ``ofservice_create`` and ``ofconn_create`` leave the 5 s, ``ofservice_reconfigure`` sets it):
#: :meth:`Emulation.apply_controller_settings` makes that reconfiguration.
CONTROLLER_SETTINGS = ("connection_mode=out-of-band", "max_backoff=1000", "inactivity_probe=0")
#: How many shards' databases :meth:`Emulation.apply_controller_settings` writes at a time.
SETTINGS_PARALLEL = 8
#: The congestion control of every emulated host's route (``ip route ... congctl``). Back to back
#: also means an unpaced sender: CUBIC (RFC 9438; Linux's default since 2.6.19). A new namespace
#: inherits the machine's default, and a namespace other than the first may set its default only
#: to one of ``tcp_allowed_congestion_control`` (EPERM otherwise), so the route carries it. BBR,
#: which some machines set, paces each message at its bandwidth estimate (Cardwell et al., "BBR:
#: Congestion-Based Congestion Control", ACM Queue 14(5), 2016): a share of the RTT per message
#: that the model has not.
TCP_CONGESTION_CONTROL = "cubic"
#: SCHED_FIFO priority of the forwarding processes (link emulators, shards' ovs-vswitchd); 0: nice -10
#: only. netem works in softirq, ahead of every process; this is its user-space counterpart. Measured
#: on Gabriel 100 (20 shards) while other jobs kept both cores busy (load 3): RTT self-check error
#: median 6.3-11.0 ms at nice -10, 3.1-3.5 ms under SCHED_FIFO (the kernel's EEVDF scheduler does
#: not preempt a busy task for a woken nice -10 one at once). The kernel's RT throttling
#: (``sched_rt_runtime_us``, 95 %) keeps the rest of the machine alive should one spin.
#: ``$TESTBED_RT_PRIORITY`` overrides it (benchmarks).
RT_PRIORITY = int(os.environ.get("TESTBED_RT_PRIORITY", "10"))
#: Link emulators forward this much at most per link on the 2-core build machine (Mbit/s,
#: benchmarks/linkemu_bench.py: 407-670 Mbit/s of one TCP flow); above it the machine, not the
#: shaper, limits a link. Used only to say so.
EMULATOR_CEILING_MBPS = 400.0


def _import_mininet():
    try:
        import mininet.net  # noqa: F401
    except ImportError:  # Debian's python3-mininet lives outside the venv
        sys.path.append("/usr/lib/python3/dist-packages")
    from mininet import link, log, net, node

    log.setLogLevel(os.environ.get("TESTBED_MININET_LOG", "warning"))
    return net, node, link


def ovs_kernel_datapath_available() -> bool:
    """True when the ``openvswitch`` kernel module is loaded (or loadable)."""
    if Path("/sys/module/openvswitch").exists():
        return True
    return subprocess.run(["modprobe", "-q", "openvswitch"], capture_output=True).returncode == 0


def _choose(setting: str, requested: str, have: bool, native: str, fallback: str, missing: str) -> str:
    """Resolve ``emulation.<setting>``: ``auto`` is ``native`` when this machine has it (``have``), else
    ``fallback``; ``native`` asked for where it is missing is an :class:`EmulationError` saying ``missing``."""
    if requested == native and not have:
        raise EmulationError(f"emulation.{setting}={native}, but {missing}; use {setting}: {fallback} (or auto)")
    if requested == "auto":
        return native if have else fallback
    return requested


def choose_datapath(requested: str) -> str:
    """Resolve ``auto|kernel|user`` into ``kernel`` or ``user``.

    Raises:
        EmulationError: ``kernel`` requested but the module is missing.
    """
    return _choose("datapath", requested, ovs_kernel_datapath_available(), "kernel", "user",
                   "the openvswitch kernel module is not available")


def choose_link_emulator(requested: str) -> str:
    """Resolve ``auto|netem|userspace`` into ``netem`` or ``userspace``.

    Raises:
        EmulationError: ``netem`` requested but the kernel lacks the netem qdisc.
    """
    return _choose("link_emulator", requested, netem_available(), "netem", "userspace",
                   "this kernel has no netem qdisc (sch_netem)")


def _priority_prefix() -> list[str]:
    """The command prefix that runs a forwarding daemon at :data:`RT_PRIORITY` (SCHED_FIFO) or nice -10."""
    return ["chrt", "-f", str(RT_PRIORITY)] if RT_PRIORITY else ["nice", "-n", "-10"]


def _wait_for(cond, timeout_s: float, what: str, proc=None) -> None:
    """Poll ``cond`` every 20 ms until true.

    Raises:
        EmulationError: ``proc`` exited or ``timeout_s`` passed (``what`` names it).
    """
    deadline = time.monotonic() + timeout_s
    while not cond():
        if proc is not None and proc.poll() is not None:
            raise EmulationError(f"{what} exited with code {proc.returncode}")
        if time.monotonic() > deadline:
            raise EmulationError(f"{what} not ready after {timeout_s:g} s")
        time.sleep(0.02)


# --------------------------------------------------------------------------- the network

@functools.cache
def _bridge_class(mn_node):
    """Mininet's OVS switch as the testbed uses it: a bridge of the system's Open vSwitch that
    :meth:`Emulation.create_bridges` makes (all in one ``ovs-vsctl``), without Mininet's shell per
    switch (a ``bash`` in the root namespace, ~10-20 ms each to start here): its few commands
    (Mininet's teardown) run as plain processes."""

    class Bridge(mn_node.OVSSwitch):
        isSetup = True  # preflight checked ovs-vsctl; nothing here needs Mininet's OVS version probe

        def startShell(self, mnopts=None):  # noqa: N802 - Mininet's name
            self.pid = None

        def start(self, controllers):  # the bridge is create_bridges' (Mininet's start is not called)
            return None

        def cmd(self, *args, **_kwargs):
            res = subprocess.run(" ".join(str(a) for a in args), shell=True, capture_output=True, text=True)
            return res.stdout + res.stderr

        @classmethod
        def batchShutdown(cls, switches, run=None):  # noqa: N802 - Mininet's name
            if switches:
                subprocess.run(["ovs-vsctl", "--timeout=10", *[x for s in switches
                                                               for x in ("--", "--if-exists", "del-br", s.name)]],
                               capture_output=True)
            return switches

    return Bridge


@functools.cache
def _port_node_class(mn_node):
    """A namespace holding only ports (a link emulator's interfaces, or an OVS shard's switch
    ports): no address; :meth:`Emulation._fast_veths` sets its interfaces and loopback up."""

    class PortNode(mn_node.Node):
        def config(self, **_params):
            return {}

    return PortNode


@functools.cache
def _host_class(mn_node):
    """Mininet's host, configured by :meth:`Emulation._fast_veths` (MAC at creation, interfaces
    and loopback up, IPv6 and offloads off) and :meth:`Emulation._configure_hosts` (address, HTB)
    instead of Mininet's five ``ifconfig`` round trips per host."""

    class Host(mn_node.Host):
        def config(self, **_params):
            return {}

    return Host


@dataclass
class OvsShard:
    """A private Open vSwitch (module doc): ``ovsdb-server`` in the root namespace, ``ovs-vswitchd``
    in Mininet node ``node`` (the namespace holding ``switches``' ports), files in ``dir``,
    reaching ryu-manager over the veth ``veth`` (root side)."""

    index: int
    node: str
    switches: list[str]
    dir: Path
    veth: str
    procs: dict = field(default_factory=dict)  # "ovsdb-server" / "ovs-vswitchd" -> process

    @property
    def db(self) -> str:
        return f"unix:{self.dir}/db.sock"

    def vsctl(self, *args: str) -> list[str]:
        return ["ovs-vsctl", f"--db={self.db}", "--timeout=60", *args]


def _sh(cmd: list[str], what: str) -> str:
    """Run ``cmd`` in the root namespace; its stdout.

    Raises:
        EmulationError: it failed (``what`` and its stderr in the message).
    """
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode:
        raise EmulationError(f"{what}: '{' '.join(cmd)}' failed: {(res.stderr or res.stdout).strip()}")
    return res.stdout


@dataclass
class Emulation:
    """A built (and later started) Mininet network for a plan, and its run-time link control."""

    plan: Plan
    link_emulator: str
    datapath: str
    run_dir: Path
    run_id: str = "adhoc"
    net: object = None
    host_ports: dict[str, int] = field(default_factory=dict)
    emulators: list = field(default_factory=list)
    emulator_procs: dict = field(default_factory=dict)  # link emulator node (lK) -> the process serving it
    probes: list[ProbeHost] = field(default_factory=list)
    applied: dict[int, dict] = field(default_factory=dict)  # link index -> parameters in force
    ports: dict[int, tuple[str, str]] = field(default_factory=dict)  # link index -> (a port, b port)
    host_intfs: dict[str, tuple[str, str]] = field(default_factory=dict)  # host -> (its interface, switch port)
    shards: list[OvsShard] = field(default_factory=list)
    port_home: dict[str, str] = field(default_factory=dict)  # switch port -> its shard node (sharded only)
    _controls: dict = field(default_factory=dict)  # emulator process name -> (LinkControl, process, socket path)
    _group_of: dict[int, str] = field(default_factory=dict)
    _emu_node: dict[str, str] = field(default_factory=dict)  # lK -> the node E<g> holding its interfaces
    python: str = sys.executable  # the interpreter of the link emulators
    _bridges_made: bool = False
    #: The offset (ms) for the datapath's own latency (:meth:`compensate_delays`): ``min(delay,
    #: offset)`` is taken off every link's emulated one-way delay; ``applied`` keeps the delay asked.
    delay_offset_ms: float = 0.0

    def __post_init__(self) -> None:
        self.probes = probe_hosts(self.plan)
        self.host_ports = host_port_numbers(self.plan)
        self.sharded = bool(ovs_shards(self.plan, self.datapath))

    @property
    def controller_host(self) -> str:
        """The address ryu-manager listens on for OpenFlow."""
        return CONTROLLER_IP if self.sharded else "127.0.0.1"

    def port_node(self, ifname: str) -> str | None:
        """The Mininet node whose namespace holds switch port ``ifname`` (None: the root namespace)."""
        return self.port_home.get(ifname)

    def _port_cmd(self, ifname: str):
        """The Mininet node to run a command on ``ifname`` in (None: the root namespace)."""
        home = self.port_home.get(ifname)
        return None if home is None else self.net.get(home)

    def build(self) -> None:
        """Create namespaces, switches (or OVS shard nodes) and links, with every interface up,
        its offloads and IPv6 off, and the hosts' addresses and HTB; start the link emulators
        (:meth:`start_link_emulators` waits for them). No bridge exists yet.

        Raises:
            EmulationError: Mininet failed to build, a port name is too long, or an interface
                could not be set up.
        """
        mn_net, mn_node, _ = _import_mininet()
        check_interface_names(self.plan)
        net = mn_net.Mininet(topo=None, build=False, controller=None, autoSetMacs=False,
                             autoStaticArp=False, waitConnected=False)
        self.net = net
        home = self._add_switches(net, mn_node)
        names = iter(switch_port_names(self.plan))
        pairs = self._switch_link_pairs(net, home, names)
        hosts = self._add_hosts(net, mn_node, home, names, pairs)
        self._fast_veths(pairs)
        if self.link_emulator == "userspace":
            self._launch_link_emulators()
        try:
            net.build()  # Mininet's bookkeeping only: the hosts' config is _configure_hosts'
        except Exception as exc:  # Mininet raises bare Exceptions
            raise EmulationError(f"Mininet could not build the network: {exc}") from exc
        self._configure_hosts(hosts)
        for lk in self.plan.links:
            self.applied[lk.index] = {"delay_ms": lk.delay_ms, "rate_mbps": lk.bandwidth_mbps, "loss_pct": lk.loss_pct,
                                      "up": True}
        if self.shards:
            self._control_network()

    def _add_switches(self, net, mn_node) -> dict:
        """Mininet switches (system Open vSwitch; bridges made by :meth:`create_bridges`) or one
        port node per OVS shard; switch -> the Mininet node its ports go on."""
        groups = ovs_shards(self.plan, self.datapath)
        if not groups:
            bridge = _bridge_class(mn_node)
            for s in self.plan.switches:
                net.addSwitch(s.name, cls=bridge, dpid=f"{s.dpid:016x}", datapath=self.datapath,
                              protocols="OpenFlow13", failMode="secure")
            return {s.name: net.get(s.name) for s in self.plan.switches}
        home = {}
        port_node = _port_node_class(mn_node)
        for k, members in enumerate(groups):
            node = net.addHost(f"O{k}", cls=port_node, ip=None)
            self.shards.append(OvsShard(k, node.name, members, control_dir(self.run_id) / f"ovs{k}",
                                        control_veth(self.run_id, k)))
            home.update(dict.fromkeys(members, node))
        return home

    def _switch_link_pairs(self, net, home: dict, names) -> list[tuple]:
        """The veths of every switch link (through its emulator node ``E<g>``, added here, in
        userspace mode), as :meth:`_fast_veths` pairs."""
        if self.link_emulator == "userspace":
            port_node = _port_node_class(_import_mininet()[1])
            for group, idx in emulator_groups(self.plan).items():
                net.addHost(group, cls=port_node, ip=None)
                for i in idx:
                    self._group_of[i] = group
        pairs = []
        for lk in self.plan.links:
            a, b = home[lk.a], home[lk.b]
            pa, pb = next(names), next(names)
            if self.link_emulator == "netem":
                pairs.append((a, pa, b, pb, None))
            else:
                emu = net.get(self._group_of[lk.index])
                pairs += [(a, pa, emu, f"{lk.emu_name}-eth0", None), (emu, f"{lk.emu_name}-eth1", b, pb, None)]
                self._emu_node[lk.emu_name] = emu.name
            if self.shards:
                self.port_home[pa], self.port_home[pb] = a.name, b.name
            self.ports[lk.index] = (pa, pb)
        return pairs

    def _add_hosts(self, net, mn_node, home: dict, names, pairs: list[tuple]) -> list[tuple]:
        """The plan's hosts and the probe hosts, each with its veth to its switch appended to
        ``pairs`` (the host end carrying the host's MAC); ``(node, interface, ip, rate or None)``."""
        host_cls = _host_class(mn_node)
        out = []
        every = self._every_host()
        for name, ip, mac, switch, rate in every:
            node = net.addHost(name, cls=host_cls, ip=f"{ip}/8", mac=mac)
            port = next(names)
            pairs.append((node, f"{name}-eth0", home[switch], port, mac))
            if self.shards:
                self.port_home[port] = home[switch].name
            if rate is not None:
                self.host_intfs[name] = (f"{name}-eth0", port)
            out.append((node, f"{name}-eth0", ip, rate))
        return out

    def _every_host(self) -> list[tuple]:
        """``(name, ip, mac, switch, rate or None)`` of the plan's hosts, then the probe hosts."""
        every = [(h.name, h.ip, h.mac, h.switch, h.bandwidth_mbps) for h in self.plan.hosts]
        return every + [(p.name, p.ip, p.mac, p.switch, None) for p in self.probes]

    def _neighbour_batch(self, name: str, intf: str) -> Path:
        """An ``ip -batch`` file giving host ``name`` (interface ``intf``) a permanent neighbour
        entry for every other host (module doc, "Neighbours"); in the run's ``logs/``."""
        lines = [f"neigh replace {ip} lladdr {mac} dev {intf} nud permanent"
                 for other, ip, mac, _sw, _rate in self._every_host() if other != name]
        path = self.run_dir / "logs" / f"neigh-{name}.batch"
        path.write_text("\n".join(lines) + "\n")
        return path

    def _fast_veths(self, pairs: list[tuple]) -> None:
        """Create veths ``(node_a, name_a, node_b, name_b, mac_a or None)`` with one ``ip -batch``
        (each end created in its node's namespace), register them with Mininet without its
        per-interface commands, and set every interface (and each namespace's loopback) up with
        offloads and IPv6 off in-process (:mod:`testbed.emu.netdev`), both ends at the
        topology's MTU (``topology.mtu``). Mininet's own
        ``addLink`` runs several commands per interface, and ``ethtool``/``sysctl``/``ip`` per
        interface are ~90 processes on Abilene (0.3-0.4 s here)."""
        _, _, mn_link = _import_mininet()

        class QuietIntf(mn_link.Intf):
            def config(self, **_params):
                return {}

        lines = []
        mtu = f" mtu {int(self.plan.experiment.topology.mtu)}"  # both ends: the topology's MTU
        for na, ia, nb, ib, mac in pairs:
            where_a = f" netns {na.pid}" if na.inNamespace else ""
            where_b = f" netns {nb.pid}" if nb.inNamespace else ""
            addr = f" address {mac}" if mac else ""
            lines.append(f"link add name {ia}{addr}{where_a}{mtu} type veth peer name {ib}{where_b}{mtu}")
        batch = self.run_dir / "logs" / "veths.batch"
        batch.write_text("\n".join(lines) + "\n")
        _sh(["ip", "-batch", str(batch)], "creating the veths")
        per_ns: dict[int | None, list[str]] = {}
        for na, ia, nb, ib, mac in pairs:
            for node, name, m in ((na, ia, mac), (nb, ib, None)):
                QuietIntf(name, node=node, mac=m, moveIntfFn=lambda *_a: None)
                pid = node.pid if node.inNamespace else None
                per_ns.setdefault(pid, []).append(name)
        try:
            for pid, intfs in per_ns.items():
                netdev.configure(pid, intfs, namespace_ipv6_off=pid is not None,
                                 mtu=int(self.plan.experiment.topology.mtu))
                if pid is not None:
                    netdev.configure(pid, ["lo"], offloads_off=False, ipv6_off=False)
        except netdev.NetdevError as exc:
            raise EmulationError(f"setting up the veths: {exc}") from None

    def _configure_hosts(self, hosts: list[tuple]) -> None:
        """Per host, in one shell round trip each and all hosts at once: its address, its permanent
        neighbours (:meth:`_neighbour_batch`), TCP's window kept across idle periods
        (:data:`TCP_SYSCTLS`) and, for a plan host, HTB on its own end (switch ports are shaped
        once OVS has them). Its route carries TCP's congestion control
        (:data:`TCP_CONGESTION_CONTROL`) and, under time dilation k, TCP's minimum RTO x k
        (:func:`testbed.plan.dilation.rto_min_ms`)."""
        sent = []
        clock = wall_clock(self.plan)
        for node, intf, ip, rate in hosts:
            net = ipaddress.ip_interface(f"{ip}/8").network
            rto = ["rto_min", f"{rto_min_ms(clock):g}ms"] if clock.dilated else []
            cmds = [["ip", "addr", "add", f"{ip}/8", "dev", intf],
                    ["ip", "route", "replace", str(net), "dev", intf, "proto", "kernel", "scope", "link",
                     "src", ip, *rto, "congctl", TCP_CONGESTION_CONTROL]]
            cmds.append(["ip", "-batch", str(self._neighbour_batch(node.name, intf))])
            cmds += [["sysctl", "-q", "-w", f"{key}={value}"] for key, value in TCP_SYSCTLS.items()]
            cmds += htb_commands(intf, rate) if rate is not None else []
            script = " && ".join(f"{' '.join(c)} 2>&1" for c in cmds)
            node.sendCmd(f"{script}; echo rc=$?")
            sent.append((node, script))
            i = node.intf(intf)
            i.ip, i.prefixLen = ip, 8
        for node, script in sent:
            out = node.waitOutput()
            if not out.rstrip().endswith("rc=0"):
                raise EmulationError(f"'{script}' failed in {node.name}: {out.strip()}")

    def _control_network(self) -> None:
        """A veth per shard to the root namespace; ryu-manager's address on shard 0's root side,
        reached by every shard through its own veth."""
        for sh in self.shards:
            node = self.net.get(sh.node)
            root_ip, shard_ip = control_addresses(sh.index)
            _sh(["ip", "link", "add", sh.veth, "type", "veth", "peer", "name", "ctl0", "netns", str(node.pid)],
                f"control veth of shard {sh.node}")
            _sh(["ip", "addr", "add", f"{root_ip}/31", "dev", sh.veth], "control veth address")
            if sh.index == 0:
                _sh(["ip", "addr", "add", f"{CONTROLLER_IP}/32", "dev", sh.veth], "controller address")
            _sh(["ip", "link", "set", sh.veth, "up"], "control veth up")
            out = node.cmd(f"ip addr add {shard_ip}/31 dev ctl0 && ip link set ctl0 up && ip link set lo up && "
                           f"ip route add {CONTROLLER_IP}/32 via {root_ip} && echo ok")
            if "ok" not in out:
                raise EmulationError(f"control network of shard {sh.node}: {out.strip()}")

    def _start_shards(self, run_id: str) -> None:
        """Per shard: its database, ovsdb-server, ovs-vswitchd (at nice -10, as the system's), and
        its bridges with their ports, controller and tag in one transaction.

        Raises:
            EmulationError: a daemon did not come up or ovs-vsctl failed (its log is named).
        """
        logs = self.run_dir / "logs"
        dpid = {s.name: s.dpid for s in self.plan.switches}
        ports_of: dict[str, list[str]] = {}
        for name in switch_port_names(self.plan):
            ports_of.setdefault(name.rsplit("-eth", 1)[0], []).append(name)
        of_port = self.plan.experiment.emulation.of_port
        for sh in self.shards:
            sh.dir.mkdir(parents=True, exist_ok=True)
            _sh(["ovsdb-tool", "create", str(sh.dir / "conf.db"), str(OVS_SCHEMA)], f"database of shard {sh.node}")
            sh.procs["ovsdb-server"] = tied_popen(
                subprocess.Popen, ["ovsdb-server", str(sh.dir / "conf.db"), f"--remote=punix:{sh.dir}/db.sock",
                 f"--unixctl={sh.dir}/ovsdb.ctl", f"--pidfile={sh.dir}/ovsdb.pid", "--no-chdir",
                 f"--log-file={logs}/ovsdb-{sh.node}.log", "-vconsole:off"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for sh in self.shards:
            _wait_for(lambda sh=sh: (sh.dir / "db.sock").exists(), 10, f"ovsdb-server of shard {sh.node}",
                      sh.procs["ovsdb-server"])
            _sh(sh.vsctl("--no-wait", "init"), f"database of shard {sh.node}")
            sh.procs["ovs-vswitchd"] = tied_popen(
                self.net.get(sh.node).popen,
                [*_priority_prefix(), "ovs-vswitchd", sh.db, f"--unixctl={sh.dir}/vswitchd.ctl",
                 f"--pidfile={sh.dir}/vswitchd.pid", "--no-chdir", f"--log-file={logs}/ovs-vswitchd-{sh.node}.log",
                 "-vconsole:off"], env=dict(os.environ, OVS_RUNDIR=str(sh.dir)),
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for sh in self.shards:
            args: list[str] = []
            for sw in sh.switches:
                args += ["--", "add-br", sw, "--", "set", "bridge", sw, "datapath_type=netdev", "fail_mode=secure",
                         "protocols=OpenFlow13", f"other_config:datapath-id={dpid[sw]:016x}",
                         "other_config:disable-in-band=true", f"external_ids:testbed_run={run_id}",
                         "--", "set-controller", sw, f"tcp:{CONTROLLER_IP}:{of_port}",
                         "--", "set", "controller", sw, *CONTROLLER_SETTINGS]
                for port in ports_of.get(sw, []):
                    args += ["--", "add-port", sw, port, "--", "set", "interface", port,
                             f"ofport_request={port.rsplit('-eth', 1)[1]}"]
            if sh.procs["ovs-vswitchd"].poll() is not None:
                raise EmulationError(f"ovs-vswitchd of shard {sh.node} exited; see logs/ovs-vswitchd-{sh.node}.log")
            _sh(sh.vsctl(*args), f"bridges of shard {sh.node} (see logs/ovs-vswitchd-{sh.node}.log)")

    def components(self) -> dict[str, object]:
        """The shards' daemons by name (``ovs-vswitchd-O<k>``, ``ovsdb-server-O<k>``)."""
        return {f"{name}-{sh.node}": proc for sh in self.shards for name, proc in sh.procs.items()}

    def _shape_switch_ports(self) -> None:
        """HTB on the switch end of every host link and, with netem, HTB + netem on both ends of
        every switch link; read back from the kernel. Must run after OVS added the ports: adding a
        port to a userspace-datapath bridge deletes its root qdisc (measured: HTB set before
        ``add-port`` is gone after it, one set after it survives carrier flaps)."""
        want: dict[str, float] = {}
        cmds: dict[str | None, list[list[str]]] = {}  # home node (None: root namespace) -> tc commands
        for h in self.plan.hosts:
            port = self.host_intfs[h.name][1]
            cmds.setdefault(self.port_node(port), []).extend(htb_commands(port, h.bandwidth_mbps))
            want[port] = h.bandwidth_mbps
        if self.link_emulator == "netem":
            for lk in self.plan.links:
                for dev in self.ports[lk.index]:
                    cmds.setdefault(self.port_node(dev), []).extend(
                        htb_commands(dev, lk.bandwidth_mbps, netem_leaf(lk.delay_ms, lk.loss_pct)))
                    want[dev] = lk.bandwidth_mbps
        for home, batch in cmds.items():  # one tc -batch (root) or one round trip (a node) per namespace
            run_tc(batch, None if home is None else self.net.get(home))
        by_home: dict[str | None, list[str]] = {}
        for dev in want:
            by_home.setdefault(self.port_node(dev), []).append(dev)
        for home, devs in by_home.items():
            got = read_htb_rates_mbps(devs, None if home is None else self.net.get(home))
            for dev in devs:
                if got[dev] is None or abs(got[dev] - want[dev]) > 0.01 * want[dev]:
                    raise EmulationError(f"port {dev}: HTB rate {got[dev]} Mbit/s after shaping, asked {want[dev]:g}")

    def _launch_link_emulators(self) -> None:
        """Start one :mod:`testbed.emu.linkemu` process per group of links, in the group's
        node, not waiting for them (:meth:`start_link_emulators` does): their start (a Python
        interpreter each) overlaps the rest of the build. Per-link stats go to ``linkemu/lK.json``."""
        logs = self.run_dir / "logs"
        ctl_dir = control_dir(self.run_id)
        ctl_dir.mkdir(parents=True, exist_ok=True)
        by_index = {lk.index: lk for lk in self.plan.links}
        for group, idx in emulator_groups(self.plan).items():
            home = self.net.get(group)
            rows = []
            for i in idx:
                lk = by_index[i]
                rows.append({"if_a": f"{lk.emu_name}-eth0", "if_b": f"{lk.emu_name}-eth1", "name": lk.emu_name,
                             "delay_ms": lk.delay_ms, "loss_pct": lk.loss_pct, "rate_mbps": lk.bandwidth_mbps,
                             "seed": self.plan.experiment.seed + i})
            links_file = logs / f"linkemu-{group}.links.json"
            links_file.write_text(json.dumps(rows, indent=1))
            ctl = ctl_dir / f"{group}.sock"
            cmd = [self.python, "-m", "testbed.emu.linkemu", "--links", str(links_file), "--control", str(ctl),
                   "--stats-dir", str(self.run_dir / "linkemu"), "--rt-priority", str(RT_PRIORITY)]
            log = open(logs / f"linkemu-{group}.log", "w")  # noqa: SIM115 - lives with the process
            proc = tied_popen(home.popen, cmd, stdout=log, stderr=subprocess.STDOUT)
            self.emulators.append(proc)
            for i in idx:
                self.emulator_procs[by_index[i].emu_name] = proc
            self._controls[group] = (LinkControl(ctl), proc, ctl)

    def emulator_processes(self) -> dict[str, tuple[object, list[str]]]:
        """Each link emulator process by its node name (``E<g>``): the process and the link
        emulators (``lK``) it serves, in link order (userspace mode; {} with netem)."""
        return {group: (proc, [name for name, p in self.emulator_procs.items() if p is proc])
                for group, (_client, proc, _ctl) in self._controls.items()}

    def start_link_emulators(self, python: str | None = None) -> None:
        """Wait until every link emulator (userspace mode only; started by :meth:`build`, or here
        with ``python`` when it was not) answers on its control socket (polled every 10 ms).

        Raises:
            EmulationError: an emulator exited or did not answer within 15 s (its log is quoted).
        """
        if self.link_emulator != "userspace":
            return
        if not self._controls:
            self.python = python or self.python
            self._launch_link_emulators()
        logs = self.run_dir / "logs"
        for group, (client, proc, _ctl) in self._controls.items():
            deadline = time.monotonic() + 15
            while True:
                try:
                    client.request({"op": "ping"})
                    break
                except LinkEmuError as exc:
                    if proc.poll() is not None or time.monotonic() > deadline:
                        tail = (logs / f"linkemu-{group}.log").read_text(errors="replace")[-1500:]
                        raise EmulationError(f"link emulator {group} did not come up ({exc}); its log:\n"
                                             f"{tail}") from None
                    time.sleep(0.01)

    def create_bridges(self, run_id: str) -> None:
        """Without shards: every bridge with its ports (OpenFlow numbers as planned), tagged as
        ours, without a controller yet (``fail_mode=secure``: nothing forwards), in one
        ``ovs-vsctl`` transaction that returns once ovs-vswitchd has them; then the switch end
        of every host link is shaped (:meth:`_shape_switch_ports`). It needs no controller, so
        the bring-up runs it while ryu-manager starts; :meth:`start_switches` connects them.
        Mininet's own start runs one ``ovs-vsctl`` per switch, each waiting for ovs-vswitchd.

        Raises:
            EmulationError: ovs-vsctl failed, or a host port's HTB rate did not read back.
        """
        if self.shards or self._bridges_made:
            return
        dpid = {s.name: s.dpid for s in self.plan.switches}
        ports_of: dict[str, list[str]] = {}
        for name in switch_port_names(self.plan):
            ports_of.setdefault(name.rsplit("-eth", 1)[0], []).append(name)
        args: list[str] = []
        for s in self.plan.switches:
            sw = s.name
            args += ["--", "--if-exists", "del-br", sw, "--", "add-br", sw, "--", "set", "bridge", sw,
                     f"datapath_type={'netdev' if self.datapath == 'user' else 'system'}", "fail_mode=secure",
                     "protocols=OpenFlow13", f"other_config:datapath-id={dpid[sw]:016x}",
                     "other_config:disable-in-band=true", f"other_config:dp-desc={sw}",
                     f"external_ids:testbed_run={run_id}"]
            for port in ports_of.get(sw, []):
                args += ["--", "add-port", sw, port, "--", "set", "interface", port,
                         f"ofport_request={port.rsplit('-eth', 1)[1]}"]
        _sh(["ovs-vsctl", "--timeout=60", *args], "creating the bridges")
        self._bridges_made = True
        self._shape_switch_ports()

    def start_switches(self, run_id: str) -> None:
        """Connect the switches to the controller (which must listen). With shards: each shard's
        daemons and bridges, then their host ports shaped; else the bridges of
        :meth:`create_bridges` (made now if they are not yet) get their controller, all in one
        ``ovs-vsctl``."""
        if self.shards:
            self._start_shards(run_id)
            self._shape_switch_ports()
            return
        self.create_bridges(run_id)
        of_port = self.plan.experiment.emulation.of_port
        args: list[str] = []
        for s in self.plan.switches:
            args += ["--", "set-controller", s.name, f"tcp:127.0.0.1:{of_port}",
                     "--", "set", "controller", s.name, *CONTROLLER_SETTINGS]
        _sh(["ovs-vsctl", "--timeout=30", *args], "connecting the switches to the controller")

    def apply_controller_settings(self) -> None:
        """Make every ovs-vswitchd of the run apply :data:`CONTROLLER_SETTINGS` to its open
        controller connections; call once every switch is connected. Open vSwitch applies a
        Controller row's ``inactivity_probe`` to a connection only when it reconfigures the bridge
        while the connection is up, and it reconfigures on a change to a column it watches (a
        Bridge's ``external_ids``; a Controller's are not watched). So one write per database,
        ``external_ids:testbed_connected=true`` on each of the run's bridges, which ``ovs-vsctl``
        waits for ovs-vswitchd to have applied (the shards' databases :data:`SETTINGS_PARALLEL` at a
        time). The connection object outlives reconnections, so the setting then holds for the run.

        Raises:
            EmulationError: ``ovs-vsctl`` failed or timed out (the database is named).
        """
        mark = "external_ids:testbed_connected=true"
        if self.shards:
            def one(sh) -> None:
                args = [a for sw in sh.switches for a in ("--", "set", "bridge", sw, mark)]
                _sh(sh.vsctl(*args), f"controller settings of shard {sh.node}")

            with ThreadPoolExecutor(SETTINGS_PARALLEL) as pool:
                list(pool.map(one, self.shards))  # the first failure raises here, the rest finished
            return
        args = [a for s in self.plan.switches for a in ("--", "set", "bridge", s.name, mark)]
        _sh(["ovs-vsctl", "--timeout=60", *args], "controller settings of the switches")

    def nudge_switches(self) -> None:
        """Wake every ovs-vswitchd of the run once (a cheap ``ovs-appctl version``), so that a switch
        whose controller has answered its OpenFlow HELLO completes the handshake now. While a
        connection waits for the controller's HELLO, ovs-vswitchd (3.1) does not wake up for it:
        measured with tcpdump on Abilene's bring-up, ryu's HELLO came 6 ms after the switches' and
        they read it 0.25-0.5 s later, at the main loop's next timer, in about half the runs."""
        targets = [f"{sh.dir}/vswitchd.ctl" for sh in self.shards] or ["ovs-vswitchd"]
        for t in targets:
            subprocess.run(["ovs-appctl", "--timeout=2", "-t", t, "version"], capture_output=True)

    def node(self, name: str):
        """The Mininet node called ``name``; for a link emulator name ``lK``, the node holding its
        interfaces ``lK-eth0`` / ``lK-eth1``."""
        return self.net.get(self._emu_node.get(name, name))

    # -- run-time changes --
    def set_link(self, index: int, **change) -> dict:
        """Apply ``change`` (any of ``delay_ms``, ``rate_mbps``, ``loss_pct``, ``up``) to link
        ``index`` now, in both directions.

        Returns:
            ``{"t_applied": unix s when it took effect, "params": parameters now in force}``.

        Raises:
            EmulationError: the emulator or ``tc`` refused it (nothing is half-applied on a refusal
                by the emulator; a failing ``tc`` names the command).
        """
        if self.link_emulator == "userspace":
            client = self._controls[self._group_of[index]][0]
            sent = dict(change)
            if "delay_ms" in sent:
                sent["delay_ms"] = self.emulated_delay_ms(index, sent["delay_ms"])
            try:
                reply = client.set(next(lk.emu_name for lk in self.plan.links if lk.index == index), **sent)
            except LinkEmuError as exc:
                raise EmulationError(str(exc)) from None
            t = reply["t_applied"]
        else:
            state = self.applied[index]
            for dev in self.ports[index]:
                node = self._port_cmd(dev)
                if "up" in change:
                    run_tc([["ip", "link", "set", "dev", dev, "up" if change["up"] else "down"]], node)
                run_tc(tc_change_commands(dev, state, {k: v for k, v in change.items() if k != "up"}), node)
            t = time.time()
        self.applied[index] = {**self.applied[index], **change}
        return {"t_applied": t, "params": dict(self.applied[index])}

    def emulated_delay_ms(self, index: int, delay_ms: float) -> float:
        """The one-way delay (ms) the link emulator holds link ``index``'s frames for, so that the
        link with its datapath costs ``delay_ms``: ``max(0, delay_ms - offset)``."""
        return max(0.0, float(delay_ms) - self.delay_offset_ms)

    def compensate_delays(self, offset_ms: float) -> list[int]:
        """Take ``offset_ms`` (>= 0) off every switch link's emulated one-way delay from now on
        (userspace link emulator only; :func:`testbed.emu.bringup.calibrate_datapath`), the
        delays asked for (``applied``) unchanged. Returns the indices of the links whose delay is
        below the offset (emulated at 0 ms: they keep part of the datapath's latency).

        Raises:
            EmulationError: not the userspace link emulator, a negative offset, or an emulator
                refused the change.
        """
        if self.link_emulator != "userspace":
            raise EmulationError("datapath compensation lowers the user-space link emulator's delays; "
                                 f"this network uses {self.link_emulator}")
        if not offset_ms >= 0:
            raise EmulationError(f"datapath compensation: offset {offset_ms!r} ms must be >= 0")
        self.delay_offset_ms = float(offset_ms)
        for lk in self.plan.links:
            self.set_link(lk.index, delay_ms=self.applied[lk.index]["delay_ms"])
        return [lk.index for lk in self.plan.links if self.applied[lk.index]["delay_ms"] < offset_ms]

    def emulator_stats(self) -> dict[str, dict]:
        """Link emulator name (``lK``) -> its counters now (userspace mode; empty otherwise)."""
        out: dict[str, dict] = {}
        for client, _, _ in self._controls.values():
            out.update(client.request({"op": "stats"})["stats"])
        return out

    def applied_table(self) -> dict:
        """What the network applies, per switch link and host link (``network.json``)."""
        shaper = "linkemu FIFO shaper" if self.link_emulator == "userspace" else "tc htb + netem"
        links = []
        for lk in self.plan.links:
            a = self.applied.get(lk.index, {})
            row = {"link": f"{lk.a}-{lk.b}", "index": lk.index, "delay_ms": a.get("delay_ms"),
                   "bandwidth_mbps": a.get("rate_mbps"), "loss_pct": a.get("loss_pct"), "up": a.get("up"),
                   "shaper": shaper, "ports": list(self.ports.get(lk.index, ()))}
            if self.delay_offset_ms and a.get("delay_ms") is not None:
                emulated = self.emulated_delay_ms(lk.index, a["delay_ms"])
                row["datapath_compensation_ms"] = round(a["delay_ms"] - emulated, 6)  # less when the link is shorter
                row["emulator_delay_ms"] = round(emulated, 6)
            if self.link_emulator == "userspace" and (a.get("rate_mbps") or 0) > EMULATOR_CEILING_MBPS:
                row["note"] = (f"shaped at {a['rate_mbps']:g} Mbit/s, above the ~{EMULATOR_CEILING_MBPS:g} Mbit/s one "
                               f"link emulator forwards on a 2-core machine: the machine may limit this link first")
            links.append(row)
        hosts = [{"host": h.name, "switch": h.switch, "bandwidth_mbps": h.bandwidth_mbps, "shaper": "tc htb",
                  "applied_mbps_host_to_switch": read_htb_rate_mbps(self.host_intfs[h.name][0], self.net.get(h.name)),
                  "applied_mbps_switch_to_host": read_htb_rate_mbps(self.host_intfs[h.name][1],
                                                                    self._port_cmd(self.host_intfs[h.name][1]))}
                 for h in self.plan.hosts]
        mtu = int(self.plan.experiment.topology.mtu)
        return {"link_emulator": self.link_emulator, "datapath": self.datapath,
                # topology.mtu: every veth end was created with it and read back (_fast_veths)
                "mtu_bytes": mtu, "mss_bytes": mss_of(mtu), "links": links, "hosts": hosts,
                "probe_hosts": [p.__dict__ for p in self.probes],
                "ovs": ([{"shard": sh.node, "switches": sh.switches} for sh in self.shards] if self.shards
                        else "the system's Open vSwitch")}

    def stop(self) -> None:
        """Stop link emulators and Mininet (removes bridges, namespaces and veths)."""
        for client, _, _ in self._controls.values():
            client.close()
        for p in self.emulators:
            if p.poll() is None:
                p.terminate()
        for p in self.emulators:
            try:
                p.wait(timeout=3)
            except subprocess.TimeoutExpired:
                p.kill()
        procs = [p for sh in self.shards for p in sh.procs.values()]  # they keep the shard namespaces alive
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()
        if self.net is not None:
            self.net.stop()
            self.net = None
        shutil.rmtree(control_dir(self.run_id), ignore_errors=True)

