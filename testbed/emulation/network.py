"""Building the emulated network in Mininet from a :class:`~testbed.plan.Plan`, and changing its
links at run time.

* Switches: Open vSwitch, OpenFlow 1.3, ``failMode=secure`` (no forwarding until the controller
  installs flows), kernel datapath where the ``openvswitch`` module is loaded, else userspace
  (``datapath_type=netdev``).
* Switch links, ``userspace`` link emulator (kernels without netem): each link ``a - b`` becomes
  ``a-ethX <-> lK-eth0 | lK-eth1 <-> b-ethY`` (``lK`` the plan's ``emu_name``); the ``lK``
  interfaces of up to :data:`LINKS_PER_EMULATOR` links live in one namespace, node ``E<g>``
  (``node("lK")`` is that node), where one :mod:`testbed.emulation.linkemu` process serves them:
  delay, loss and the bandwidth (its FIFO shaper, any rate) of each, changed at run time over its
  control socket.
* Switch links, ``netem``: a veth ``a-ethX <-> b-ethY`` with, on both ends, HTB at the bandwidth and
  netem (delay, loss, ``limit`` :data:`QUEUE_PACKETS`) as its leaf; run-time changes are
  ``tc class change`` / ``tc qdisc change`` (:func:`tc_change_commands`).
* Host links: a veth host <-> switch, HTB at the host's bandwidth on both ends (``tc`` directly,
  so rates above Mininet's 1000 Mbit/s limit are shaped too), a pfifo of :data:`QUEUE_PACKETS`.
* Probe hosts ``P<i>a`` / ``P<i>b`` (unshaped) at both ends of every link that scenario events
  change: they measure each change and carry congestion traffic (:mod:`testbed.emulation.dynamics`).
  Names with capitals cannot collide with a plan's names (``[a-z][a-z0-9]*``).
* **OVS shards** (userspace datapath, more than :data:`SHARD_ABOVE_SWITCHES` switches): one
  ``ovs-vswitchd`` forwards every packet of every bridge in its single main thread, and that thread
  polls every port of every bridge at each wake-up, so the cost of a hop grows with the size of the
  whole network (measured, ``benchmarks/scale_bench.py profile``: a 10-switch path costs 0.18 ms of
  RTT per switch next to 0 other bridges, 0.96 ms next to 30, 2.4 ms next to 90). The switches are
  therefore split, in breadth-first order, over shards of :data:`SWITCHES_PER_OVS`: each shard is a
  private ``ovsdb-server`` and ``ovs-vswitchd`` (children of the run, tagged) whose vswitchd runs in
  a namespace of its own (node ``O<k>``) that holds its switches' ports (two userspace datapaths
  in one namespace collide on the ``ovs-netdev`` tap); it reaches ryu-manager over a veth to the
  root namespace (:data:`CONTROLLER_IP`). Smaller networks use the system's Open vSwitch as before.
* Offloads are switched off on every veth (needed by the userspace datapath and the link emulator,
  see environment.md) and IPv6 is disabled in every namespace (no stray solicitations).

What was applied per link (shaper, rate, delay, loss) is in :attr:`Emulation.applied`, written to
``network.json`` by the bring-up; nothing is left unshaped in silence.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from testbed.errors import RunFailure
from testbed.plan import Plan

OFFLOAD_OFF = "rx off tx off sg off tso off gso off gro off"
#: Links served by one link-emulator process (one epoll loop, one timer; issue 15);
#: ``$TESTBED_LINKS_PER_EMULATOR`` overrides it (benchmarks).
LINKS_PER_EMULATOR = int(os.environ.get("TESTBED_LINKS_PER_EMULATOR", "64"))
#: Frames of the FIFO behind every shaper (HTB leaf, netem limit, the emulator's shaper):
#: a veth's txqueuelen, :data:`testbed.model.network.DEFAULT_QUEUE_PACKETS`.
QUEUE_PACKETS = 1000
#: HTB's class quantum, bytes: explicit, so that no rate triggers "quantum of class is big".
HTB_QUANTUM = 60000
#: Switches per OVS shard, and the network size from which shards are used (userspace datapath).
#: Measured on Gabriel 100 under SCHED_FIFO, RTT self-check error median: 4.1 ms with 10 per shard,
#: 3.1-3.5 with 5, 3.2-3.3 with 3 (and more processes). ``$TESTBED_SWITCHES_PER_OVS`` /
#: ``$TESTBED_SHARD_ABOVE`` override them (benchmarks).
SWITCHES_PER_OVS = int(os.environ.get("TESTBED_SWITCHES_PER_OVS", "5"))
SHARD_ABOVE_SWITCHES = int(os.environ.get("TESTBED_SHARD_ABOVE", "16"))
#: ryu-manager's OpenFlow address when shards are used (a /32 in the root namespace), and the
#: /22 the shards' control veths are numbered from (root side .2k, shard side .2k+1).
CONTROLLER_IP = "169.254.255.254"
CONTROL_NET = "169.254.252.0"
OVS_SCHEMA = Path("/usr/share/openvswitch/vswitch.ovsschema")
#: SCHED_FIFO priority of the forwarding processes (link emulators, shards' ovs-vswitchd); 0: nice -10
#: only. netem works in softirq, ahead of every process; this is its user-space counterpart. Measured
#: on Gabriel 100 (20 shards) while other jobs kept both cores busy (load 3): RTT self-check error
#: median 6.3-11.0 ms at nice -10, 3.1-3.5 ms under SCHED_FIFO (the kernel's EEVDF scheduler does
#: not preempt a busy task for a woken nice -10 one at once). The kernel's RT throttling
#: (``sched_rt_runtime_us``, 95 %) keeps the rest of the machine alive should one spin.
#: ``$TESTBED_RT_PRIORITY`` overrides it (benchmarks).
RT_PRIORITY = int(os.environ.get("TESTBED_RT_PRIORITY", "10"))
#: Where control sockets live (short paths: a Unix socket path holds at most 107 bytes).
CONTROL_ROOT = Path(os.environ.get("TESTBED_STATE_DIR", "/run/aset-testbed"))
#: Link emulators forward this much at most per link on the 2-core build machine (Mbit/s,
#: benchmarks/linkemu_bench.py: 407-670 Mbit/s of one TCP flow); above it the machine, not the
#: shaper, limits a link. Only used to say so.
EMULATOR_CEILING_MBPS = 400.0


def _import_mininet():
    try:
        import mininet.net  # noqa: F401
    except ImportError:  # Debian's python3-mininet lives outside the venv
        sys.path.append("/usr/lib/python3/dist-packages")
    from mininet import link, log, net, node

    log.setLogLevel(os.environ.get("TESTBED_MININET_LOG", "warning"))
    return net, node, link


class EmulationError(RunFailure):
    """The emulated network could not be built, a change could not be applied, or a self-check failed."""


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


# --------------------------------------------------------------------------- names and addresses

def probed_links(plan: Plan) -> list[int]:
    """Indices (``Link.index``) of the links that scenario events change, sorted."""
    pairs = {frozenset(c.link) for c in plan.changes if c.link is not None}
    return sorted(lk.index for lk in plan.links if frozenset((lk.a, lk.b)) in pairs)


@dataclass(frozen=True)
class ProbeHost:
    """A probe host at one end (``side`` a or b) of link ``link`` (its ``Link.index``), attached to
    ``switch``; ``peer`` is the probe host at the other end."""

    name: str
    link: int
    side: str
    switch: str
    ip: str
    mac: str
    peer: str


def probe_hosts(plan: Plan) -> list[ProbeHost]:
    """The probe hosts of the plan (two per probed link), in build order."""
    out = []
    by_index = {lk.index: lk for lk in plan.links}
    for i in probed_links(plan):
        lk = by_index[i]
        for side, sw, other in (("a", lk.a, "b"), ("b", lk.b, "a")):
            k = 250 if side == "a" else 251
            out.append(ProbeHost(name=f"P{i}{side}", link=i, side=side, switch=sw,
                                 ip=f"10.{k}.{(i + 1) >> 8 & 255}.{(i + 1) & 255}",
                                 mac=f"02:7e:{k - 250:02x}:{(i + 1) >> 16 & 255:02x}:{(i + 1) >> 8 & 255:02x}:"
                                     f"{(i + 1) & 255:02x}", peer=f"P{i}{other}"))
    return out


def emulator_groups(plan: Plan) -> dict[str, list[int]]:
    """Emulator node (and process) name ``E<g>`` -> the link indices it serves (userspace mode)."""
    idx = [lk.index for lk in plan.links]
    return {f"E{k}": idx[i:i + LINKS_PER_EMULATOR] for k, i in enumerate(range(0, len(idx), LINKS_PER_EMULATOR))}


def ovs_shards(plan: Plan, datapath: str) -> list[list[str]]:
    """Switch names per OVS shard (module doc), breadth-first from the first switch so that
    neighbours tend to share a shard; [] when the system's Open vSwitch serves them all."""
    if datapath != "user" or len(plan.switches) <= SHARD_ABOVE_SWITCHES:
        return []
    adj: dict[str, list[str]] = {s.name: [] for s in plan.switches}
    for lk in plan.links:
        adj[lk.a].append(lk.b)
        adj[lk.b].append(lk.a)
    order: list[str] = []
    seen: set[str] = set()
    for start in adj:
        if start in seen:
            continue
        seen.add(start)
        queue = [start]
        while queue:
            u = queue.pop(0)
            order.append(u)
            for v in adj[u]:
                if v not in seen:
                    seen.add(v)
                    queue.append(v)
    k = SWITCHES_PER_OVS
    return [order[i:i + k] for i in range(0, len(order), k)]


def control_veth(run_id: str, k: int) -> str:
    """Root-namespace name of shard ``k``'s control veth (unique per run, <= 15 bytes)."""
    return f"tbc{hashlib.sha1(run_id.encode()).hexdigest()[:5]}{k}"


def _port_order(plan: Plan) -> list[tuple[str, str]]:
    """(switch, what) for every switch port in the order the build creates them (Mininet numbers
    a switch's ports 1, 2, ... in that order)."""
    order = []
    for lk in plan.links:
        order += [(lk.a, f"link{lk.index}"), (lk.b, f"link{lk.index}")]
    order += [(h.switch, h.name) for h in plan.hosts]
    order += [(p.switch, p.name) for p in probe_hosts(plan)]
    return order


def switch_port_names(plan: Plan) -> list[str]:
    """Root-namespace interface names of every switch port, in build order."""
    count = {s.name: 0 for s in plan.switches}
    names = []
    for sw, _ in _port_order(plan):
        count[sw] += 1
        names.append(f"{sw}-eth{count[sw]}")
    return names


def host_port_numbers(plan: Plan) -> dict[str, int]:
    """Host (and probe host) -> its switch's OpenFlow port number (known before the build)."""
    hosts = {h.name for h in plan.hosts} | {p.name for p in probe_hosts(plan)}
    return {what: int(name.rsplit("-eth", 1)[1]) for (_, what), name in zip(_port_order(plan), switch_port_names(plan),
                                                                           strict=True) if what in hosts}


def planned_root_interfaces(plan: Plan, link_emulator: str, datapath: str = "kernel", run_id: str = "") -> list[str]:
    """Names of the root-namespace interfaces the build will create, for cleanup: the switch ports,
    or, with OVS shards (whose namespaces hold the ports), the shards' control veths."""
    shards = ovs_shards(plan, datapath)
    if shards:
        return [control_veth(run_id, k) for k in range(len(shards))]
    return switch_port_names(plan)


def check_interface_names(plan: Plan) -> None:
    """Every switch port name fits Linux's 15 bytes once probe hosts are added.

    Raises:
        EmulationError: naming the switch and the name.
    """
    for name in switch_port_names(plan):
        if len(name.encode()) > 15:
            raise EmulationError(f"switch port {name!r} is {len(name.encode())} bytes, over Linux's 15 (the "
                                 f"probe hosts of the scenario's link events add ports): use a shorter switch name")


def control_dir(run_id: str) -> Path:
    """The run's folder of control sockets (short, under the state folder)."""
    return CONTROL_ROOT / f"ctl-{hashlib.sha1(run_id.encode()).hexdigest()[:10]}"


def remove_control_dirs() -> int:
    """Remove every control-socket folder of earlier runs (call with the run lock held: the one run
    that may exist is ours). Returns how many were removed."""
    n = 0
    for d in CONTROL_ROOT.glob("ctl-*"):
        shutil.rmtree(d, ignore_errors=True)
        n += 1
    return n


# --------------------------------------------------------------------------- tc commands

def _htb_class(rate_mbps: float) -> list[str]:
    """HTB class parameters: the rate, an explicit quantum, and a burst of at least 15 kB (Mininet's)
    or 1 ms at the rate, so that high rates are reachable between two qdisc wake-ups."""
    burst = max(15000, int(rate_mbps * 1e6 / 8 * 0.001))
    return ["rate", f"{rate_mbps:.6f}mbit", "burst", str(burst), "cburst", str(burst), "quantum", str(HTB_QUANTUM)]


def htb_commands(dev: str, rate_mbps: float, leaf: list[str] | None = None) -> list[list[str]]:
    """``tc`` argv lists that shape ``dev``'s egress at ``rate_mbps`` (HTB, one class), with ``leaf``
    (default ``pfifo limit QUEUE_PACKETS``) as the class's qdisc, on a device without a root qdisc
    of its own (a new veth)."""
    leaf = leaf or ["pfifo", "limit", str(QUEUE_PACKETS)]
    return [["tc", "qdisc", "add", "dev", dev, "root", "handle", "5:", "htb", "default", "1"],
            ["tc", "class", "add", "dev", dev, "parent", "5:", "classid", "5:1", "htb", *_htb_class(rate_mbps)],
            ["tc", "qdisc", "add", "dev", dev, "parent", "5:1", "handle", "10:", *leaf]]


def netem_leaf(delay_ms: float, loss_pct: float) -> list[str]:
    """netem's arguments for a one-way delay (ms) and loss (%)."""
    return ["netem", "delay", f"{delay_ms:.6f}ms", "loss", f"{loss_pct:.6f}%", "limit", str(QUEUE_PACKETS)]


def tc_change_commands(dev: str, state: dict, change: dict) -> list[list[str]]:
    """``tc`` argv lists applying ``change`` (any of ``rate_mbps``, ``delay_ms``, ``loss_pct``) to a
    netem-mode port whose current parameters are ``state`` (same keys)."""
    new = {**state, **change}
    cmds = []
    if "rate_mbps" in change:
        cmds.append(["tc", "class", "change", "dev", dev, "parent", "5:", "classid", "5:1", "htb",
                     *_htb_class(new["rate_mbps"])])
    if "delay_ms" in change or "loss_pct" in change:
        cmds.append(["tc", "qdisc", "change", "dev", dev, "parent", "5:1", "handle", "10:",
                     *netem_leaf(new["delay_ms"], new["loss_pct"])])
    return cmds


def _run_tc(cmds: list[list[str]], node=None) -> None:
    """Run ``tc`` (or ``ip``) commands, in order, in the root namespace (``node`` None) or in a
    Mininet node (one shell round trip for all of them).

    Raises:
        EmulationError: a command failed (the first failing one and its stderr are quoted).
    """
    if not cmds:
        return
    if node is None:
        for cmd in cmds:
            res = subprocess.run(cmd, capture_output=True, text=True)
            if res.returncode:
                raise EmulationError(f"'{' '.join(cmd)}' failed: {res.stderr.strip()}")
        return
    script = " && ".join(f"{' '.join(cmd)} 2>&1" for cmd in cmds)
    out = node.cmd(f"{script}; echo rc=$?")
    if not out.rstrip().endswith("rc=0"):
        raise EmulationError(f"'{script}' failed in {node.name}: {out.strip()}")


_TC_RATE = re.compile(r"class htb 5:1 .*?\brate (\d+(?:\.\d+)?)([KMGT]?)bit")
_SI = {"": 1e-6, "K": 1e-3, "M": 1.0, "G": 1e3, "T": 1e6}


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


def read_htb_rate_mbps(dev: str, node=None) -> float | None:
    """The rate of HTB class 5:1 on ``dev`` as the kernel reports it (``tc class show``), Mbit/s;
    None if there is none."""
    cmd = ["tc", "class", "show", "dev", dev]
    out = subprocess.run(cmd, capture_output=True, text=True).stdout if node is None else node.cmd(" ".join(cmd))
    m = _TC_RATE.search(out or "")
    return float(m.group(1)) * _SI[m.group(2)] if m else None


# --------------------------------------------------------------------------- the network

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


def _control_addresses(k: int) -> tuple[str, str]:
    """(root side, shard side) addresses of shard ``k``'s control veth, a /31 each."""
    import ipaddress

    base = int(ipaddress.ip_address(CONTROL_NET)) + 2 * k
    return str(ipaddress.ip_address(base)), str(ipaddress.ip_address(base + 1))


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
    _configured: set[str] = field(default_factory=set)  # interfaces already up with offloads off

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
        """Create namespaces, switches (or OVS shard nodes) and links (nothing is started yet).

        Raises:
            EmulationError: Mininet failed to build, or a port name is too long.
        """
        mn_net, mn_node, mn_link = _import_mininet()
        check_interface_names(self.plan)

        class PortNode(mn_node.Node):
            """A namespace holding only ports (a link's emulator interfaces, or an OVS shard's
            switch ports): no IP, interfaces up."""

            def config(self, **params):
                params.pop("ip", None)
                params.pop("mac", None)
                r = super().config(**params)
                for intf in self.intfList():
                    self.cmd(f"ip link set {intf} up")
                return r

        class Ryu(mn_node.RemoteController):
            """ryu-manager, started by the bring-up; Mininet's probe at construction time would
            only warn that it is not listening yet."""

            def checkListening(self):
                return None

        exp = self.plan.experiment
        net = mn_net.Mininet(topo=None, build=False, controller=None, autoSetMacs=False,
                             autoStaticArp=False, waitConnected=False)
        self.net = net
        home = self._add_switches(net, mn_node, PortNode, Ryu, exp.emulation.of_port)
        names = iter(switch_port_names(self.plan))

        def link(a, b, a_port: bool, b_port: bool = False) -> list[str]:
            """A veth (Mininet's) between ``a`` and ``b``; its switch end(s) get their planned port names."""
            kw, out = {}, []
            for is_port, key, node in ((a_port, "intfName1", a), (b_port, "intfName2", b)):
                if is_port:
                    kw[key] = port = next(names)
                    out.append(port)
                    if self.shards:
                        self.port_home[port] = node.name
            net.addLink(a, b, cls=mn_link.Link, **kw)
            return out

        self._add_switch_links(net, PortNode, home, names)
        for h in self.plan.hosts:
            host = net.addHost(h.name, ip=f"{h.ip}/8", mac=h.mac)
            (port,) = link(host, home[h.switch], False, True)
            self.host_intfs[h.name] = (f"{h.name}-eth0", port)
        for p in self.probes:
            host = net.addHost(p.name, ip=f"{p.ip}/8", mac=p.mac)
            link(host, home[p.switch], False, True)
        try:
            net.build()
        except Exception as exc:  # Mininet raises bare Exceptions
            raise EmulationError(f"Mininet could not build the network: {exc}") from exc
        self._configure_interfaces(net)
        for h in self.plan.hosts:  # the host's own end; switch ports are shaped once OVS has them
            _run_tc(htb_commands(self.host_intfs[h.name][0], h.bandwidth_mbps), self.net.get(h.name))
        for lk in self.plan.links:
            self.applied[lk.index] = {"delay_ms": lk.delay_ms, "rate_mbps": lk.bandwidth_mbps, "loss_pct": lk.loss_pct,
                                      "up": True}
        if self.shards:
            self._control_network()

    def _add_switches(self, net, mn_node, port_node_cls, ryu_cls, of_port: int) -> dict:
        """Mininet switches (system Open vSwitch) or one port node per OVS shard; switch -> the
        Mininet node its ports go on."""
        groups = ovs_shards(self.plan, self.datapath)
        if not groups:
            net.addController("c0", controller=ryu_cls, ip="127.0.0.1", port=of_port)
            for s in self.plan.switches:
                net.addSwitch(s.name, cls=mn_node.OVSSwitch, dpid=f"{s.dpid:016x}", datapath=self.datapath,
                              protocols="OpenFlow13", failMode="secure")
            return {s.name: net.get(s.name) for s in self.plan.switches}
        home = {}
        for k, members in enumerate(groups):
            node = net.addHost(f"O{k}", cls=port_node_cls, ip=None)
            self.shards.append(OvsShard(k, node.name, members, control_dir(self.run_id) / f"ovs{k}",
                                        control_veth(self.run_id, k)))
            home.update(dict.fromkeys(members, node))
        return home

    def _add_switch_links(self, net, emu_cls, home: dict, names) -> None:
        """Every switch link's veth(s), created in one batch (:meth:`_fast_veths`)."""
        if self.link_emulator == "userspace":
            for group, idx in emulator_groups(self.plan).items():
                net.addHost(group, cls=emu_cls, ip=None)
                for i in idx:
                    self._group_of[i] = group
        pairs = []
        for lk in self.plan.links:
            a, b = home[lk.a], home[lk.b]
            pa, pb = next(names), next(names)
            if self.link_emulator == "netem":
                pairs.append((a, pa, b, pb))
            else:
                emu = net.get(self._group_of[lk.index])
                pairs += [(a, pa, emu, f"{lk.emu_name}-eth0"), (emu, f"{lk.emu_name}-eth1", b, pb)]
                self._emu_node[lk.emu_name] = emu.name
            if self.shards:
                self.port_home[pa], self.port_home[pb] = a.name, b.name
            self.ports[lk.index] = (pa, pb)
        self._fast_veths(pairs)

    def _fast_veths(self, pairs: list[tuple]) -> None:
        """Create veths ``(node_a, name_a, node_b, name_b)`` with one ``ip -batch`` (each end
        created in its node's namespace), register them with Mininet without its per-interface
        commands, and bring them up with offloads off in one shell per node. Mininet's own
        ``addLink`` runs several commands per interface (0.48 s for Abilene's 32 veths here)."""
        _, _, mn_link = _import_mininet()

        class QuietIntf(mn_link.Intf):
            def config(self, **_params):
                return {}

        lines = []
        for na, ia, nb, ib in pairs:
            where_a = f" netns {na.pid}" if na.inNamespace else ""
            where_b = f" netns {nb.pid}" if nb.inNamespace else ""
            lines.append(f"link add name {ia}{where_a} type veth peer name {ib}{where_b}")
        batch = self.run_dir / "logs" / "veths.batch"
        batch.write_text("\n".join(lines) + "\n")
        _sh(["ip", "-batch", str(batch)], "creating the switch links' veths")
        per_node: dict[object, list[str]] = {}
        for na, ia, nb, ib in pairs:
            for node, name in ((na, ia), (nb, ib)):
                QuietIntf(name, node=node, moveIntfFn=lambda *_a: None)
                per_node.setdefault(node, []).append(name)
                self._configured.add(name)
        root: list[str] = []
        for node, intfs in per_node.items():
            if node.inNamespace:  # ethtool calls in parallel: each is a few ms of syscalls
                node.cmd("; ".join(f"ip link set {i} up" for i in intfs) + "; "
                         + " ".join(f"ethtool -K {i} {OFFLOAD_OFF} &" for i in intfs) + " wait")
            else:
                root += intfs
        if root:  # root-namespace switch ports: one shell for all
            subprocess.run("; ".join(f"ip link set {i} up; sysctl -qw net.ipv6.conf.{i}.disable_ipv6=1" for i in root)
                           + "; " + " ".join(f"ethtool -K {i} {OFFLOAD_OFF} &" for i in root) + " wait",
                           shell=True, capture_output=True)

    def _configure_interfaces(self, net) -> None:
        """IPv6 off in every namespace, offloads off on every interface not done by :meth:`_fast_veths`."""
        for node in net.hosts:
            intfs = [i for i in node.intfNames() if i != "lo" and i not in self._configured]
            node.cmd("sysctl -qw net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1; "
                     + "; ".join(f"ethtool -K {i} {OFFLOAD_OFF}" for i in intfs))
        ports = [i for sw in net.switches for i in sw.intfNames() if i != "lo" and i not in self._configured]
        if ports:  # one shell for all root-namespace switch ports
            subprocess.run("; ".join(f"ethtool -K {i} {OFFLOAD_OFF}; sysctl -qw net.ipv6.conf.{i}.disable_ipv6=1"
                                     for i in ports), shell=True, capture_output=True)

    def _control_network(self) -> None:
        """A veth per shard to the root namespace; ryu-manager's address on shard 0's root side,
        reached by every shard through its own veth."""
        for sh in self.shards:
            node = self.net.get(sh.node)
            root_ip, shard_ip = _control_addresses(sh.index)
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
            sh.procs["ovsdb-server"] = subprocess.Popen(
                ["ovsdb-server", str(sh.dir / "conf.db"), f"--remote=punix:{sh.dir}/db.sock",
                 f"--unixctl={sh.dir}/ovsdb.ctl", f"--pidfile={sh.dir}/ovsdb.pid", "--no-chdir",
                 f"--log-file={logs}/ovsdb-{sh.node}.log", "-vconsole:off"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for sh in self.shards:
            _wait_for(lambda sh=sh: (sh.dir / "db.sock").exists(), 10, f"ovsdb-server of shard {sh.node}",
                      sh.procs["ovsdb-server"])
            _sh(sh.vsctl("--no-wait", "init"), f"database of shard {sh.node}")
            sh.procs["ovs-vswitchd"] = self.net.get(sh.node).popen(
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
                         "--", "set", "controller", sw, "connection_mode=out-of-band", "max_backoff=1000"]
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
        want = {}
        for h in self.plan.hosts:
            port = self.host_intfs[h.name][1]
            _run_tc(htb_commands(port, h.bandwidth_mbps), self._port_cmd(port))
            want[port] = h.bandwidth_mbps
        if self.link_emulator == "netem":
            for lk in self.plan.links:
                for dev in self.ports[lk.index]:
                    _run_tc(htb_commands(dev, lk.bandwidth_mbps, netem_leaf(lk.delay_ms, lk.loss_pct)),
                            self._port_cmd(dev))
                    want[dev] = lk.bandwidth_mbps
        for dev, rate in want.items():
            got = read_htb_rate_mbps(dev, self._port_cmd(dev))
            if got is None or abs(got - rate) > 0.01 * rate:
                raise EmulationError(f"port {dev}: HTB rate {got} Mbit/s after shaping, asked {rate:g}")

    def start_link_emulators(self, python: str) -> None:
        """Start one :mod:`testbed.emulation.linkemu` process per group of links, in the group's
        node (userspace mode only), and connect to each one's control socket. Per-link stats go to
        ``linkemu/lK.json``.

        Raises:
            EmulationError: an emulator did not come up (its log is quoted).
        """
        if self.link_emulator != "userspace":
            return
        from testbed.emulation.linkemu import LinkControl, LinkEmuError

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
            cmd = [python, "-m", "testbed.emulation.linkemu", "--links", str(links_file), "--control", str(ctl),
                   "--stats-dir", str(self.run_dir / "linkemu"), "--rt-priority", str(RT_PRIORITY)]
            log = open(logs / f"linkemu-{group}.log", "w")  # noqa: SIM115 - lives with the process
            proc = home.popen(cmd, stdout=log, stderr=subprocess.STDOUT)
            self.emulators.append(proc)
            for i in idx:
                self.emulator_procs[by_index[i].emu_name] = proc
            self._controls[group] = (LinkControl(ctl), proc, ctl)
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
                    time.sleep(0.05)

    def start_switches(self, run_id: str) -> None:
        """Start the switches (they connect to the controller), tagged as ours, and shape their
        host ports. With shards: each shard's daemons and bridges; else Mininet's switches."""
        self.net.start()
        if self.shards:
            self._start_shards(run_id)
        else:
            names = " ".join(f"-- set bridge {s.name} external_ids:testbed_run={run_id}" for s in self.plan.switches)
            subprocess.run(f"ovs-vsctl --timeout=10 {names}", shell=True, capture_output=True)
        self._shape_switch_ports()

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
            from testbed.emulation.linkemu import LinkEmuError

            client = self._controls[self._group_of[index]][0]
            try:
                reply = client.set(next(lk.emu_name for lk in self.plan.links if lk.index == index), **change)
            except LinkEmuError as exc:
                raise EmulationError(str(exc)) from None
            t = reply["t_applied"]
        else:
            state = self.applied[index]
            for dev in self.ports[index]:
                node = self._port_cmd(dev)
                if "up" in change:
                    _run_tc([["ip", "link", "set", "dev", dev, "up" if change["up"] else "down"]], node)
                _run_tc(tc_change_commands(dev, state, {k: v for k, v in change.items() if k != "up"}), node)
            t = time.time()
        self.applied[index] = {**self.applied[index], **change}
        return {"t_applied": t, "params": dict(self.applied[index])}

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
            if self.link_emulator == "userspace" and (a.get("rate_mbps") or 0) > EMULATOR_CEILING_MBPS:
                row["note"] = (f"shaped at {a['rate_mbps']:g} Mbit/s, above the ~{EMULATOR_CEILING_MBPS:g} Mbit/s one "
                               f"link emulator forwards on a 2-core machine: the machine may limit this link first")
            links.append(row)
        hosts = [{"host": h.name, "switch": h.switch, "bandwidth_mbps": h.bandwidth_mbps, "shaper": "tc htb",
                  "applied_mbps_host_to_switch": read_htb_rate_mbps(self.host_intfs[h.name][0], self.net.get(h.name)),
                  "applied_mbps_switch_to_host": read_htb_rate_mbps(self.host_intfs[h.name][1],
                                                                    self._port_cmd(self.host_intfs[h.name][1]))}
                 for h in self.plan.hosts]
        return {"link_emulator": self.link_emulator, "datapath": self.datapath, "links": links, "hosts": hosts,
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

