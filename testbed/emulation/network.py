"""Building the emulated network in Mininet from a :class:`~testbed.plan.Plan`, and changing its
links at run time.

* Switches: Open vSwitch, OpenFlow 1.3, ``failMode=secure`` (no forwarding until the controller
  installs flows), kernel datapath where the ``openvswitch`` module is loaded, else userspace
  (``datapath_type=netdev``).
* Switch links, ``userspace`` link emulator (kernels without netem): each link ``a - b`` becomes
  ``a-ethX <-> lK-eth0 | lK-eth1 <-> b-ethY``, ``lK`` a namespace of its own (the plan's
  ``emu_name``); one :mod:`testbed.emulation.linkemu` process serves up to
  :data:`LINKS_PER_EMULATOR` links (their sockets opened in each link's namespace): delay, loss
  and the bandwidth (its FIFO shaper, any rate) of each, changed at run time over its control socket.
* Switch links, ``netem``: a veth ``a-ethX <-> b-ethY`` with, on both ends, HTB at the bandwidth and
  netem (delay, loss, ``limit`` :data:`QUEUE_PACKETS`) as its leaf; run-time changes are
  ``tc class change`` / ``tc qdisc change`` (:func:`tc_change_commands`).
* Host links: a veth host <-> switch, HTB at the host's bandwidth on both ends (``tc`` directly,
  so rates above Mininet's 1000 Mbit/s limit are shaped too), a pfifo of :data:`QUEUE_PACKETS`.
* Probe hosts ``P<i>a`` / ``P<i>b`` (unshaped) at both ends of every link that scenario events
  change: they measure each change and carry congestion traffic (:mod:`testbed.emulation.dynamics`).
  Names with capitals cannot collide with a plan's names (``[a-z][a-z0-9]*``).
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
    """Emulator process name (``emu<k>``) -> the link indices it serves (userspace mode)."""
    idx = [lk.index for lk in plan.links]
    return {f"emu{k}": idx[i:i + LINKS_PER_EMULATOR] for k, i in enumerate(range(0, len(idx), LINKS_PER_EMULATOR))}


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


def planned_root_interfaces(plan: Plan, link_emulator: str) -> list[str]:
    """Names of the root-namespace interfaces the build will create (switch ports), for cleanup."""
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
    """Run ``tc`` commands in the root namespace (``node`` None) or in a Mininet node.

    Raises:
        EmulationError: a command failed (its stderr is quoted).
    """
    for cmd in cmds:
        if node is None:
            res = subprocess.run(cmd, capture_output=True, text=True)
            err = res.stderr.strip() if res.returncode else ""
        else:
            out = node.cmd(" ".join(cmd) + " 2>&1; echo rc=$?")
            err = "" if out.rstrip().endswith("rc=0") else out.strip()
        if err:
            raise EmulationError(f"'{' '.join(cmd)}' failed: {err}")


_TC_RATE = re.compile(r"class htb 5:1 .*?\brate (\d+(?:\.\d+)?)([KMGT]?)bit")
_SI = {"": 1e-6, "K": 1e-3, "M": 1.0, "G": 1e3, "T": 1e6}


def read_htb_rate_mbps(dev: str, node=None) -> float | None:
    """The rate of HTB class 5:1 on ``dev`` as the kernel reports it (``tc class show``), Mbit/s;
    None if there is none."""
    cmd = ["tc", "class", "show", "dev", dev]
    out = subprocess.run(cmd, capture_output=True, text=True).stdout if node is None else node.cmd(" ".join(cmd))
    m = _TC_RATE.search(out or "")
    return float(m.group(1)) * _SI[m.group(2)] if m else None


# --------------------------------------------------------------------------- the network

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
    _controls: dict = field(default_factory=dict)  # emulator process name -> (LinkControl, process, socket path)
    _group_of: dict[int, str] = field(default_factory=dict)

    def build(self) -> None:
        """Create namespaces, switches and links (nothing is started yet).

        Raises:
            EmulationError: Mininet failed to build, or a port name is too long.
        """
        mn_net, mn_node, mn_link = _import_mininet()
        check_interface_names(self.plan)

        class LinkEmulatorNode(mn_node.Node):
            """A namespace holding only a link's two emulator interfaces: no IP, interfaces up."""

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
        net.addController("c0", controller=Ryu, ip="127.0.0.1", port=exp.emulation.of_port)
        for s in self.plan.switches:
            net.addSwitch(s.name, cls=mn_node.OVSSwitch, dpid=f"{s.dpid:016x}", datapath=self.datapath,
                          protocols="OpenFlow13", failMode="secure")
        self._add_switch_links(net, LinkEmulatorNode)
        for h in self.plan.hosts:
            host = net.addHost(h.name, ip=f"{h.ip}/8", mac=h.mac)
            lnk = net.addLink(host, net.get(h.switch), cls=mn_link.Link)
            self.host_ports[h.name] = net.get(h.switch).ports[lnk.intf2]
            self.host_intfs[h.name] = (lnk.intf1.name, lnk.intf2.name)
        self.probes = probe_hosts(self.plan)
        for p in self.probes:
            host = net.addHost(p.name, ip=f"{p.ip}/8", mac=p.mac)
            lnk = net.addLink(host, net.get(p.switch), cls=mn_link.Link)
            self.host_ports[p.name] = net.get(p.switch).ports[lnk.intf2]
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

    def _add_switch_links(self, net, emu_cls) -> None:
        _, _, mn_link = _import_mininet()
        for group, idx in emulator_groups(self.plan).items():
            for i in idx:
                self._group_of[i] = group
        for lk in self.plan.links:
            a, b = net.get(lk.a), net.get(lk.b)
            if self.link_emulator == "netem":
                lnk = net.addLink(a, b, cls=mn_link.Link)
                self.ports[lk.index] = (lnk.intf1.name, lnk.intf2.name)
            else:
                emu = net.addHost(lk.emu_name, cls=emu_cls, ip=None)
                l1 = net.addLink(a, emu, cls=mn_link.Link)
                l2 = net.addLink(emu, b, cls=mn_link.Link)
                self.ports[lk.index] = (l1.intf1.name, l2.intf2.name)

    def _configure_interfaces(self, net) -> None:
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

    def _shape_switch_ports(self) -> None:
        """HTB on the switch end of every host link and, with netem, HTB + netem on both ends of
        every switch link; read back from the kernel. Must run after OVS added the ports: adding a
        port to a userspace-datapath bridge deletes its root qdisc (measured: HTB set before
        ``add-port`` is gone after it, one set after it survives carrier flaps)."""
        want = {sw_if: h.bandwidth_mbps for h in self.plan.hosts for sw_if in [self.host_intfs[h.name][1]]}
        for h in self.plan.hosts:
            _run_tc(htb_commands(self.host_intfs[h.name][1], h.bandwidth_mbps))
        if self.link_emulator == "netem":
            for lk in self.plan.links:
                for dev in self.ports[lk.index]:
                    _run_tc(htb_commands(dev, lk.bandwidth_mbps, netem_leaf(lk.delay_ms, lk.loss_pct)))
                    want[dev] = lk.bandwidth_mbps
        for dev, rate in want.items():
            got = read_htb_rate_mbps(dev)
            if got is None or abs(got - rate) > 0.01 * rate:
                raise EmulationError(f"port {dev}: HTB rate {got} Mbit/s after shaping, asked {rate:g}")

    def start_link_emulators(self, python: str) -> None:
        """Start one :mod:`testbed.emulation.linkemu` process per group of links (userspace mode
        only; it runs in the first link's namespace and opens the others' sockets in theirs) and
        connect to each one's control socket. Per-link stats go to ``linkemu/lK.json``.

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
            home = self.net.get(by_index[idx[0]].emu_name)
            rows = []
            for i in idx:
                lk = by_index[i]
                node = self.net.get(lk.emu_name)
                rows.append({"if_a": f"{lk.emu_name}-eth0", "if_b": f"{lk.emu_name}-eth1", "name": lk.emu_name,
                             "delay_ms": lk.delay_ms, "loss_pct": lk.loss_pct, "rate_mbps": lk.bandwidth_mbps,
                             "seed": self.plan.experiment.seed + i,
                             "netns": None if node is home else f"/proc/{node.pid}/ns/net"})
            links_file = logs / f"linkemu-{group}.links.json"
            links_file.write_text(json.dumps(rows, indent=1))
            ctl = ctl_dir / f"{group}.sock"
            cmd = [python, "-m", "testbed.emulation.linkemu", "--links", str(links_file), "--control", str(ctl),
                   "--stats-dir", str(self.run_dir / "linkemu")]
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
        """Start the switches (they connect to the controller) and tag their bridges as ours."""
        self.net.start()
        names = " ".join(f"-- set bridge {s.name} external_ids:testbed_run={run_id}" for s in self.plan.switches)
        subprocess.run(f"ovs-vsctl --timeout=10 {names}", shell=True, capture_output=True)
        self._shape_switch_ports()

    def node(self, name: str):
        """The Mininet node called ``name``."""
        return self.net.get(name)

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
                if "up" in change:
                    res = subprocess.run(["ip", "link", "set", "dev", dev, "up" if change["up"] else "down"],
                                         capture_output=True, text=True)
                    if res.returncode:
                        raise EmulationError(f"ip link set {dev}: {res.stderr.strip()}")
                _run_tc(tc_change_commands(dev, state, {k: v for k, v in change.items() if k != "up"}))
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
                  "applied_mbps_switch_to_host": read_htb_rate_mbps(self.host_intfs[h.name][1])}
                 for h in self.plan.hosts]
        return {"link_emulator": self.link_emulator, "datapath": self.datapath, "links": links, "hosts": hosts,
                "probe_hosts": [p.__dict__ for p in self.probes]}

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
        if self.net is not None:
            self.net.stop()
            self.net = None
        shutil.rmtree(control_dir(self.run_id), ignore_errors=True)

