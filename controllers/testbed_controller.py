"""Ryu application (OpenFlow 1.3) of the testbed: least-delay destination trees, proxy ARP,
port statistics per link, and a small JSON REST API.

Run it through ``testbed.sdn.client.start_controller`` or by hand::

    TESTBED_CONTROLLER_CONFIG=controller.json \\
    .venv/bin/python -m testbed.sdn.launcher --observe-links \\
        --ofp-listen-host 127.0.0.1 --ofp-tcp-listen-port 6653 \\
        --wsapi-host 127.0.0.1 --wsapi-port 8080 controllers/testbed_controller.py

(``testbed.sdn.launcher`` is ``ryu-manager`` plus a shim for the installed eventlet.)

Behaviour
---------
* Switch ports of the configured links are found by LLDP (``ryu.topology``, ``--observe-links``).
  Once every configured switch is connected and every configured link has been seen in both
  directions, every switch gets, per known host, ``eth_dst=MAC -> output(port toward the next
  hop)`` from the least-delay tree rooted at the host's switch (:mod:`testbed.model.routing`); on the
  host's own switch the port is the host port. Link changes (LinkAdd/LinkDelete, switch leave)
  recompute the trees over the links that are up and only the changed flows are rewritten.
* Table-miss drops (no flooding, ever); IPv6 multicast is dropped by an explicit rule.
* ARP goes to the controller (eth_type 0x0806); requests for known IPs get a proxy reply sent out
  of the in-port. Unknown hosts are learned from ARP arriving on non-inter-switch ports.
* Every ``stats_interval_s`` an OFPPortStatsRequest goes to every switch; counter deltas give per
  link and direction: rate (Mbit/s, tx bytes of the sending port), utilization = rate / capacity,
  drops (tx_dropped + tx_errors of the sender + rx_dropped + rx_errors of the receiver).
* **Failures.** A port that loses carrier (a link set down) arrives as OpenFlow port status;
  ``ryu.topology`` turns it into LinkDelete, and the trees are recomputed over the links left up.
  Unanswered LLDP alone deletes no link (``LINK_LLDP_DROP``).
  LLDP finds the link again when the port comes back (LinkAdd), and the trees are recomputed.
* **Delay changes.** The run tells the controller a link's new delay (and bandwidth, for the
  utilization it reports) with ``POST /testbed/link``, at the moment it changes the link; the
  trees are recomputed by the new delays. (The controller does not measure delays itself.)
* **Pinned probe paths.** Probe hosts at both ends of a link (``$TESTBED_CONTROLLER_PINS``: a JSON
  list of ``{"a_mac", "b_mac", "a": dpid, "b": dpid}``) get ``eth_src, eth_dst`` flows that send
  their traffic over exactly that link, whatever the trees say, so that probes and background
  traffic cross the link that a scenario event changes.
* Every port status, link add/delete, parameter change and reroute is kept in an event log
  (``/testbed/events``); a reroute's ``done`` time is when every switch it changed acknowledged
  its flows (OpenFlow barrier).

REST (JSON, 127.0.0.1): GET ``/testbed/status``, ``/testbed/links``,
``/testbed/path?src=MAC&dst=MAC``, ``/testbed/paths``, ``/testbed/events?since=N``; POST
``/testbed/link``; see the handlers for the shapes. Errors are ``{"error": "..."}`` with status
400 (bad request), 404 (unknown host or link) or 503 (not ready).
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from dataclasses import dataclass

from ryu.app.wsgi import ControllerBase, Response, WSGIApplication, route
from ryu.base import app_manager
from ryu.controller import ofp_event
from ryu.controller.handler import CONFIG_DISPATCHER, DEAD_DISPATCHER, MAIN_DISPATCHER, set_ev_cls
from ryu.lib import hub
from ryu.lib.packet import arp, ether_types, ethernet, packet
from ryu.ofproto import ofproto_v1_3
from ryu.topology import event as topo_event
from ryu.topology.switches import Switches

import testbed.model.routing as routing

#: LLDP pacing of ``ryu.topology``: Ryu sleeps ``LLDP_SEND_GUARD`` (50 ms) after each periodic LLDP
#: frame, so at 186 links (372 ports) one round takes 18.6 s, and a link whose first LLDP was
#: lost (its far switch not connected yet) waits that long to be discovered. 1 ms makes a round
#: 0.4 s. Once every link is known the period becomes :data:`LLDP_PERIOD_RUNNING_S`: failures
#: arrive as port status, a repaired port is probed at once (``ryu.topology`` moves it to the
#: front), so frequent LLDP only loads the switches and the links.
Switches.LLDP_SEND_GUARD = 0.001
#: ``ryu.topology`` also deletes a link whose LLDP went unanswered more than ``LINK_LLDP_DROP`` (5)
#: times. The testbed fails a link only by taking its carrier down, which arrives as port status
#: (deleted at once, above); LLDP unanswered is a starved controller or switch (a large network
#: on a small machine), not a failure. Off.
Switches.LINK_LLDP_DROP = 2**62
LLDP_PERIOD_RUNNING_S = float(os.environ.get("TESTBED_LLDP_PERIOD_S", "10"))
#: Once every link is known, at most this many periodic LLDP frames per second (the period grows
#: with the ports: 2,948 on backbone/americas would be 295 frames/s at 10 s, each a packet-out and a
#: packet-in through this one thread beside 1,138 switches' port statistics). Our choice.
LLDP_MAX_PER_S = 30.0


def lldp_period_s(links: int) -> float:
    """The running LLDP period per port (s) for ``links`` configured links (two ports each):
    :data:`LLDP_PERIOD_RUNNING_S`, or longer so that at most :data:`LLDP_MAX_PER_S` frames go out per second."""
    return max(LLDP_PERIOD_RUNNING_S, 2 * links / LLDP_MAX_PER_S)


#: After a port comes back up its LLDP probe is sent again at these times (s after its port
#: status) until its link is rediscovered: ``ryu.topology`` probes a repaired port once, at once,
#: and that frame can be lost while the link is still coming up (its emulator, or the far port,
#: not passing frames yet); the next probe would wait the running period (:func:`lldp_period_s`), beyond the
#: run's grace for a planned link_up (``testbed.emu.health.LINK_UP_GRACE_S``). Our choice.
REPROBE_AFTER_UP_S = (0.2, 0.5, 1.0, 2.0, 4.0)

CONFIG_ENV = "TESTBED_CONTROLLER_CONFIG"
PINS_ENV = "TESTBED_CONTROLLER_PINS"
APP_KEY = "testbed_app"
COOKIE = 0x7E57BED000000001  # every flow this app installs carries it (so we only delete ours)
ALL_ONES_64 = 0xFFFFFFFFFFFFFFFF
PRIO_TABLE_MISS = 0
PRIO_DROP_NOISE = 10
PRIO_HOST = 100
PRIO_PIN = 200
#: Events kept in the log (oldest dropped first).
MAX_EVENTS = 100_000
PRIO_ARP = 300
MAC_RE = re.compile(r"^[0-9a-f]{2}(:[0-9a-f]{2}){5}$")
DURATION_UNKNOWN = 0xFFFFFFFF


@dataclass
class Host:
    """A host attached to a switch port (configured, or learned from ARP)."""

    name: str
    mac: str
    ip: str | None
    dpid: int
    port: int
    delay_ms: float = 0.0
    bandwidth_mbps: float | None = None
    learned: bool = False


@dataclass
class LinkCfg:
    """A configured undirected switch link (``a``/``b`` in config order); delay and bandwidth may
    change at run time (``POST /testbed/link``)."""

    a: int
    b: int
    delay_ms: float
    bandwidth_mbps: float


def load_pins(path: str | None) -> list[dict]:
    """Pinned probe pairs from ``path`` (``$TESTBED_CONTROLLER_PINS``), [] when unset.

    Raises:
        RuntimeError: unreadable file or an entry without ``a_mac``, ``b_mac``, ``a``, ``b``.
    """
    if not path:
        return []
    try:
        pins = json.loads(open(path).read())
        return [{"a_mac": _norm_mac(p["a_mac"]), "b_mac": _norm_mac(p["b_mac"]), "a": int(p["a"]), "b": int(p["b"])}
                for p in pins]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise RuntimeError(f"bad pins file {path}: {exc}") from exc


def _norm_mac(mac: str) -> str:
    return str(mac).strip().lower()


def load_config(path: str) -> dict:
    """Read the controller config (a :class:`testbed.plan.boundaries.ControllerConfig`, validated there).

    Raises:
        RuntimeError: missing file or an invalid entry (the message names it).
    """
    from testbed.core.errors import InputError
    from testbed.plan.boundaries import ControllerConfig, read_config

    try:
        cfg = read_config(path, ControllerConfig)
    except InputError as exc:
        raise RuntimeError(str(exc)) from exc
    switches = {s.dpid: s.name for s in cfg.switches}
    links = {frozenset((lk.a, lk.b)): LinkCfg(lk.a, lk.b, lk.delay_ms, lk.bandwidth_mbps) for lk in cfg.links}
    hosts = {h.mac: Host(h.name, h.mac, h.ip, h.dpid, h.port, h.delay_ms, h.bandwidth_mbps) for h in cfg.hosts}
    return {"switches": switches, "links": links, "hosts": hosts, "stats_interval_s": cfg.stats_interval_s}


class TestbedController(app_manager.RyuApp):
    """Least-delay forwarding, proxy ARP, port statistics and the REST API (see module doc)."""

    OFP_VERSIONS = [ofproto_v1_3.OFP_VERSION]
    _CONTEXTS = {"wsgi": WSGIApplication}

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        path = os.environ.get(CONFIG_ENV)
        if not path:
            raise RuntimeError(f"set {CONFIG_ENV} to the controller JSON config path")
        cfg = load_config(path)
        self.switch_names: dict[int, str] = cfg["switches"]
        self.link_cfg: dict[frozenset, LinkCfg] = cfg["links"]
        self.hosts: dict[str, Host] = cfg["hosts"]
        self.ip_to_mac: dict[str, str] = {h.ip: m for m, h in self.hosts.items() if h.ip}
        self.stats_interval_s = max(0.1, cfg["stats_interval_s"])
        self.datapaths: dict[int, object] = {}
        self.dir_links: dict[tuple[int, int], tuple[int, int]] = {}  # (src, dst) dpid -> (src_port, dst_port)
        self.unexpected: set[tuple[int, int]] = set()
        self.installed: dict[tuple[int, str], int] = {}  # (dpid, mac) -> out port
        self.trees: dict[str, dict[int, int]] = {}  # host mac -> {dpid: next hop dpid}
        self.graph = routing.build_graph([])
        self.initial_done = False
        self.pending_barriers: dict[int, int] = {}  # dpid -> xid
        self.port_last: dict[tuple[int, int], routing.PortSample] = {}
        self.port_delta: dict[tuple[int, int], routing.PortDelta] = {}
        self.port_drops_total: dict[tuple[int, int], list[int]] = {}  # -> [tx, rx] accumulated
        self.arp_unanswered = 0
        self._warned: set = set()
        self.pins = load_pins(os.environ.get(PINS_ENV))
        self.pins_installed: dict[tuple[int, str, str], int] = {}  # (dpid, src, dst) -> out port
        self.event_log: list[dict] = []
        self.event_seq = 0
        self.reroutes: dict[int, dict] = {}  # reroute id -> its event (until done)
        self.barrier_reroute: dict[tuple[int, int], int] = {}  # (dpid, xid) -> reroute id
        kwargs["wsgi"].register(TestbedRest, {APP_KEY: self})
        # eventlet's per-request access log goes through ryu.lib.hub at INFO: one line per poll.
        logging.getLogger("ryu.lib.hub").setLevel(logging.WARNING)
        self.threads.append(hub.spawn(self._stats_loop))
        self.logger.info("testbed controller: %d switches, %d links, %d hosts from %s",
                         len(self.switch_names), len(self.link_cfg), len(self.hosts), path)

    # ------------------------------------------------------------------ OpenFlow plumbing

    def _flow(self, dp, priority: int, match, actions=None, command=None) -> None:
        ofp, parser = dp.ofproto, dp.ofproto_parser
        inst = [parser.OFPInstructionActions(ofp.OFPIT_APPLY_ACTIONS, actions)] if actions else []
        dp.send_msg(parser.OFPFlowMod(datapath=dp, cookie=COOKIE, priority=priority, match=match,
                                      instructions=inst, command=ofp.OFPFC_ADD if command is None else command,
                                      out_port=ofp.OFPP_ANY, out_group=ofp.OFPG_ANY))

    def _barrier(self, dp, reroute: int | None = None) -> None:
        req = dp.ofproto_parser.OFPBarrierRequest(dp)
        dp.send_msg(req)
        self.pending_barriers[dp.id] = req.xid
        if reroute is not None:
            self.barrier_reroute[(dp.id, req.xid)] = reroute
            self.reroutes[reroute]["waiting"] += 1

    def _event(self, kind: str, **fields) -> dict:
        """Append to the event log (``/testbed/events``); ``t`` unix s."""
        self.event_seq += 1
        ev = {"seq": self.event_seq, "t": time.time(), "kind": kind, **fields}
        self.event_log.append(ev)
        if len(self.event_log) > MAX_EVENTS:
            del self.event_log[: len(self.event_log) - MAX_EVENTS]
        return ev

    @set_ev_cls(ofp_event.EventOFPSwitchFeatures, CONFIG_DISPATCHER)
    def _switch_features(self, ev) -> None:
        dp = ev.msg.datapath
        ofp, parser = dp.ofproto, dp.ofproto_parser
        # Remove whatever an earlier run of this app left (only our cookie: LLDP flows stay).
        dp.send_msg(parser.OFPFlowMod(datapath=dp, cookie=COOKIE, cookie_mask=ALL_ONES_64,
                                      table_id=ofp.OFPTT_ALL, command=ofp.OFPFC_DELETE,
                                      out_port=ofp.OFPP_ANY, out_group=ofp.OFPG_ANY, match=parser.OFPMatch()))
        self._flow(dp, PRIO_TABLE_MISS, parser.OFPMatch())  # no instructions: drop
        self._flow(dp, PRIO_DROP_NOISE, parser.OFPMatch(eth_dst=("33:33:00:00:00:00", "ff:ff:00:00:00:00")))
        self._flow(dp, PRIO_ARP, parser.OFPMatch(eth_type=ether_types.ETH_TYPE_ARP),
                   [parser.OFPActionOutput(ofp.OFPP_CONTROLLER, ofp.OFPCML_NO_BUFFER)])
        if dp.id not in self.switch_names:
            self.logger.warning("switch with dpid %s connected but is not in the config; ignoring it", dp.id)

    @set_ev_cls(ofp_event.EventOFPStateChange, [MAIN_DISPATCHER, DEAD_DISPATCHER])
    def _state_change(self, ev) -> None:
        dp = ev.datapath
        if dp.id is None or dp.id not in self.switch_names:
            return
        if ev.state == MAIN_DISPATCHER:
            self.datapaths[dp.id] = dp
            self._forget_switch_flows(dp.id)  # its flow table was just cleared
            self.logger.info("switch %s (dpid %d) connected", self.switch_names[dp.id], dp.id)
            self._recompute(f"switch {dp.id} connected")
        elif self.datapaths.get(dp.id) is dp:
            del self.datapaths[dp.id]
            self._forget_switch_flows(dp.id)
            self.logger.warning("switch %s (dpid %d) disconnected", self.switch_names[dp.id], dp.id)
            self._recompute(f"switch {dp.id} left")

    def _forget_switch_flows(self, dpid: int) -> None:
        for key in [k for k in self.installed if k[0] == dpid]:
            del self.installed[key]
        for key in [k for k in self.pins_installed if k[0] == dpid]:
            del self.pins_installed[key]
        self.pending_barriers.pop(dpid, None)

    @set_ev_cls(ofp_event.EventOFPBarrierReply, MAIN_DISPATCHER)
    def _barrier_reply(self, ev) -> None:
        dpid = ev.msg.datapath.id
        if self.pending_barriers.get(dpid) == ev.msg.xid:
            del self.pending_barriers[dpid]
        rid = self.barrier_reroute.pop((dpid, ev.msg.xid), None)
        if rid is not None and rid in self.reroutes:
            r = self.reroutes[rid]
            r["waiting"] -= 1
            if r["waiting"] <= 0:
                del self.reroutes[rid]
                r["done_t"] = time.time()
                r["install_ms"] = round((r["done_t"] - r["t"]) * 1e3, 3)
                self._event("reroute_done", reroute=rid, reason=r["reason"], install_ms=r["install_ms"])

    @set_ev_cls(ofp_event.EventOFPPortStatus, MAIN_DISPATCHER)
    def _port_status(self, ev) -> None:
        msg = ev.msg
        dp, desc = msg.datapath, msg.desc
        ofp = dp.ofproto
        reason = {ofp.OFPPR_ADD: "add", ofp.OFPPR_DELETE: "delete", ofp.OFPPR_MODIFY: "modify"}.get(msg.reason, "?")
        down = bool(desc.state & ofp.OFPPS_LINK_DOWN or desc.config & ofp.OFPPC_PORT_DOWN)
        self._event("port_status", dpid=dp.id, switch=self.switch_names.get(dp.id), port=desc.port_no,
                    name=desc.name.decode(errors="replace") if isinstance(desc.name, bytes) else str(desc.name),
                    reason=reason, link_down=down)
        self.logger.info("port status: %s port %d %s%s", self.switch_names.get(dp.id, dp.id), desc.port_no, reason,
                         " (link down)" if down else "")
        if msg.reason == ofp.OFPPR_MODIFY and not down and self.initial_done:
            hub.spawn(self._reprobe, dp.id, desc.port_no)

    def _reprobe(self, dpid: int, port_no: int) -> None:
        """Probe a port that came back up with LLDP at :data:`REPROBE_AFTER_UP_S` until a link from
        it is known again (``ryu.topology``'s own pacing: the port moved to the front of its LLDP
        queue)."""
        switches = app_manager.lookup_service_brick("switches")
        if switches is None:
            return
        waited = 0.0
        for at in REPROBE_AFTER_UP_S:
            hub.sleep(at - waited)
            waited = at
            if any(src == dpid and ports[0] == port_no for (src, _), ports in self.dir_links.items()):
                return
            port = switches._get_port(dpid, port_no)
            if port is None:
                return
            switches.ports.move_front(port)
            switches.lldp_event.set()

    @set_ev_cls(ofp_event.EventOFPErrorMsg, [CONFIG_DISPATCHER, MAIN_DISPATCHER])
    def _error(self, ev) -> None:
        msg = ev.msg
        self.logger.error("OpenFlow error from dpid %s: type=0x%x code=0x%x", msg.datapath.id, msg.type, msg.code)

    # ------------------------------------------------------------------ topology

    @set_ev_cls(topo_event.EventLinkAdd)
    def _link_add(self, ev) -> None:
        s, d = ev.link.src, ev.link.dst
        key = frozenset((s.dpid, d.dpid))
        if key not in self.link_cfg:
            if (s.dpid, d.dpid) not in self.unexpected:
                self.unexpected.add((s.dpid, d.dpid))
                self.logger.warning("LLDP found link %d:%d -> %d:%d, which is not in the config; not used",
                                    s.dpid, s.port_no, d.dpid, d.port_no)
            return
        new = (s.port_no, d.port_no)
        if self.dir_links.get((s.dpid, d.dpid)) == new:
            return
        self.dir_links[(s.dpid, d.dpid)] = new
        self.logger.info("link %d:%d -> %d:%d discovered", s.dpid, s.port_no, d.dpid, d.port_no)
        if self.initial_done:
            self._event("link_add", src=s.dpid, src_port=s.port_no, dst=d.dpid, dst_port=d.port_no)
        self._recompute(f"link {s.dpid}->{d.dpid} up")

    @set_ev_cls(topo_event.EventLinkDelete)
    def _link_delete(self, ev) -> None:
        s, d = ev.link.src, ev.link.dst
        self.unexpected.discard((s.dpid, d.dpid))
        if self.dir_links.get((s.dpid, d.dpid)) == (s.port_no, d.port_no):
            del self.dir_links[(s.dpid, d.dpid)]
            self.logger.warning("link %d:%d -> %d:%d lost", s.dpid, s.port_no, d.dpid, d.port_no)
            self._event("link_delete", src=s.dpid, src_port=s.port_no, dst=d.dpid, dst_port=d.port_no)
            self._recompute(f"link {s.dpid}->{d.dpid} down")

    def _link_up(self, lk: LinkCfg) -> bool:
        return (lk.a, lk.b) in self.dir_links and (lk.b, lk.a) in self.dir_links

    def missing_switches(self) -> list[int]:
        """Configured DPIDs that are not connected, sorted."""
        return sorted(d for d in self.switch_names if d not in self.datapaths)

    def missing_links(self) -> list[list[int]]:
        """Configured links ``[a, b]`` (config order) not yet seen by LLDP in both directions."""
        return [[lk.a, lk.b] for lk in self.link_cfg.values() if not self._link_up(lk)]

    def _recompute(self, reason: str) -> None:
        """Recompute every destination tree and push the flow differences (first time: only
        once the whole configured topology is there)."""
        if not self.initial_done and (self.missing_switches() or self.missing_links()):
            return
        up = [lk for lk in self.link_cfg.values()
              if self._link_up(lk) and lk.a in self.datapaths and lk.b in self.datapaths]
        self.graph = routing.build_graph([(lk.a, lk.b, lk.delay_ms) for lk in up], nodes=self.datapaths)
        roots = routing.all_trees(self.graph, sorted({h.dpid for h in self.hosts.values()}))
        desired: dict[tuple[int, str], int] = {}
        trees: dict[str, dict[int, int]] = {}
        for mac, h in self.hosts.items():
            if h.dpid not in self.datapaths:
                continue
            tree = roots[h.dpid]
            trees[mac] = tree
            desired[(h.dpid, mac)] = h.port
            for u, nh in tree.items():
                desired[(u, mac)] = self.dir_links[(u, nh)][0]
        touched: set[int] = set()
        changed = 0
        for (dpid, mac), port in desired.items():
            if self.installed.get((dpid, mac)) != port:
                changed += 1
                dp = self.datapaths[dpid]
                parser = dp.ofproto_parser
                self._flow(dp, PRIO_HOST, parser.OFPMatch(eth_dst=mac), [parser.OFPActionOutput(port)])
                self.installed[(dpid, mac)] = port
                touched.add(dpid)
        for dpid, mac in [k for k in self.installed if k not in desired]:
            changed += 1
            del self.installed[(dpid, mac)]
            dp = self.datapaths.get(dpid)
            if dp is not None:
                self._flow(dp, PRIO_HOST, dp.ofproto_parser.OFPMatch(eth_dst=mac),
                           command=dp.ofproto.OFPFC_DELETE_STRICT)
                touched.add(dpid)
        touched |= self._install_pins()
        rid = None
        if self.initial_done and touched:
            ev = self._event("reroute", reason=reason, switches=sorted(touched), flows=changed)
            rid = ev["seq"]
            self.reroutes[rid] = {"t": ev["t"], "reason": reason, "waiting": 0}
        for dpid in touched:
            self._barrier(self.datapaths[dpid], rid)
        self.trees = trees
        if not self.initial_done:
            self.logger.info("all %d switches and %d links present: installing %d flows (%s)",
                             len(self.switch_names), len(self.link_cfg), len(desired), reason)
            Switches.LLDP_SEND_PERIOD_PER_PORT = lldp_period_s(len(self.link_cfg))
        elif touched:
            self.logger.info("routes recomputed (%s): %d switch(es), %d flow(s) updated", reason, len(touched),
                             changed)
        self.initial_done = True

    def _install_pins(self) -> set[int]:
        """(Re)install the pinned probe flows whose out port is known and changed; the DPIDs touched."""
        touched = set()
        for p in self.pins:
            ends = ((p["a"], p["b"], p["a_mac"], p["b_mac"]), (p["b"], p["a"], p["b_mac"], p["a_mac"]))
            for sw, other, src, dst in ends:
                ports = self.dir_links.get((sw, other))
                dp = self.datapaths.get(sw)
                if ports is None or dp is None or self.pins_installed.get((sw, src, dst)) == ports[0]:
                    continue
                parser = dp.ofproto_parser
                self._flow(dp, PRIO_PIN, parser.OFPMatch(eth_src=src, eth_dst=dst), [parser.OFPActionOutput(ports[0])])
                self.pins_installed[(sw, src, dst)] = ports[0]
                touched.add(sw)
        return touched

    def set_link(self, a: int, b: int, delay_ms: float | None = None, bandwidth_mbps: float | None = None) -> dict:
        """Change a configured link's delay (routing) and/or bandwidth (utilization), recompute.

        Raises:
            KeyError: no such configured link. ValueError: a negative delay or non-positive bandwidth.
        """
        lk = self.link_cfg.get(frozenset((a, b)))
        if lk is None:
            raise KeyError(f"no configured link between dpid {a} and dpid {b}")
        if delay_ms is not None and not 0 <= float(delay_ms) < float("inf"):
            raise ValueError(f"delay_ms must be >= 0, got {delay_ms!r}")
        if bandwidth_mbps is not None and not 0 < float(bandwidth_mbps) < float("inf"):
            raise ValueError(f"bandwidth_mbps must be > 0, got {bandwidth_mbps!r}")
        before = (lk.delay_ms, lk.bandwidth_mbps)
        if delay_ms is not None:
            lk.delay_ms = float(delay_ms)
        if bandwidth_mbps is not None:
            lk.bandwidth_mbps = float(bandwidth_mbps)
        ev = self._event("link_change", a=a, b=b, delay_ms=lk.delay_ms, bandwidth_mbps=lk.bandwidth_mbps,
                         before={"delay_ms": before[0], "bandwidth_mbps": before[1]})
        n0 = self.event_seq
        if delay_ms is not None and delay_ms != before[0]:
            self._recompute(f"link {a}-{b} delay {before[0]:g} -> {lk.delay_ms:g} ms")
        reroute = next((e for e in self.event_log[-3:] if e["kind"] == "reroute" and e["seq"] > n0), None)
        return {"t": ev["t"], "reroute": reroute}

    # ------------------------------------------------------------------ ARP

    @set_ev_cls(ofp_event.EventOFPPacketIn, MAIN_DISPATCHER)
    def _packet_in(self, ev) -> None:
        msg = ev.msg
        dp = msg.datapath
        try:
            pkt = packet.Packet(msg.data)
        except Exception:  # noqa: BLE001 - malformed frame: ignore
            return
        eth = pkt.get_protocol(ethernet.ethernet)
        if eth is None or eth.ethertype != ether_types.ETH_TYPE_ARP:
            return  # LLDP (handled by ryu.topology) or noise: quietly ignored
        a = pkt.get_protocol(arp.arp)
        if a is None:
            return
        in_port = msg.match["in_port"]
        self._learn(dp.id, in_port, _norm_mac(a.src_mac), a.src_ip)
        if a.opcode == arp.ARP_REQUEST:
            mac = self.ip_to_mac.get(a.dst_ip)
            if mac is None or mac == _norm_mac(a.src_mac):
                self.arp_unanswered += 1
                return
            self._send_arp_reply(dp, in_port, req=a, target_mac=mac)
        elif a.opcode == arp.ARP_REPLY:
            h = self.hosts.get(_norm_mac(eth.dst))
            target = self.datapaths.get(h.dpid) if h else None
            if target is not None:
                self._packet_out(target, h.port, msg.data)

    def _send_arp_reply(self, dp, port: int, req, target_mac: str) -> None:
        p = packet.Packet()
        p.add_protocol(ethernet.ethernet(ethertype=ether_types.ETH_TYPE_ARP, dst=req.src_mac, src=target_mac))
        p.add_protocol(arp.arp(opcode=arp.ARP_REPLY, src_mac=target_mac, src_ip=req.dst_ip,
                               dst_mac=req.src_mac, dst_ip=req.src_ip))
        p.serialize()
        self._packet_out(dp, port, p.data)

    @staticmethod
    def _packet_out(dp, port: int, data: bytes) -> None:
        ofp, parser = dp.ofproto, dp.ofproto_parser
        dp.send_msg(parser.OFPPacketOut(datapath=dp, buffer_id=ofp.OFP_NO_BUFFER, in_port=ofp.OFPP_CONTROLLER,
                                        actions=[parser.OFPActionOutput(port)], data=data))

    def _inter_switch_port(self, dpid: int, port: int) -> bool:
        return any((s == dpid and ps == port) or (d == dpid and pd == port)
                   for (s, d), (ps, pd) in self.dir_links.items())

    def _learn(self, dpid: int, port: int, mac: str, ip: str) -> None:
        h = self.hosts.get(mac)
        if h is not None:
            if (h.dpid, h.port) != (dpid, port) and not h.learned and ("moved", mac) not in self._warned:
                self._warned.add(("moved", mac))
                self.logger.warning("host %s (%s) configured at dpid %d port %d sent ARP from dpid %d port %d",
                                    h.name, mac, h.dpid, h.port, dpid, port)
            return
        if (not self.initial_done or dpid not in self.switch_names or self._inter_switch_port(dpid, port)
                or not MAC_RE.match(mac) or int(mac[:2], 16) & 1 or ip in (None, "0.0.0.0")):
            return
        if ip in self.ip_to_mac:
            if ("ip", mac) not in self._warned:
                self._warned.add(("ip", mac))
                self.logger.warning("%s claims IP %s of host %s; not learned", mac, ip,
                                    self.hosts[self.ip_to_mac[ip]].name)
            return
        self.hosts[mac] = Host(f"learned-{mac}", mac, ip, dpid, port, learned=True)
        self.ip_to_mac[ip] = mac
        self.logger.info("learned host %s (%s) at dpid %d port %d", mac, ip, dpid, port)
        self._recompute(f"host {mac} learned")

    # ------------------------------------------------------------------ port statistics

    def _stats_loop(self) -> None:
        while True:
            for dp in list(self.datapaths.values()):
                try:
                    dp.send_msg(dp.ofproto_parser.OFPPortStatsRequest(dp, 0, dp.ofproto.OFPP_ANY))
                except Exception as exc:  # noqa: BLE001 - a switch going away mid-loop
                    self.logger.debug("port stats request to %s failed: %s", dp.id, exc)
            hub.sleep(self.stats_interval_s)

    @set_ev_cls(ofp_event.EventOFPPortStatsReply, MAIN_DISPATCHER)
    def _port_stats(self, ev) -> None:
        dpid = ev.msg.datapath.id
        now = time.time()
        for st in ev.msg.body:
            if st.port_no > dp_max_port(ev.msg.datapath):
                continue  # LOCAL and other reserved ports
            dur = None if st.duration_sec == DURATION_UNKNOWN else st.duration_sec + st.duration_nsec / 1e9
            cur = routing.PortSample(now, dur, st.tx_bytes, st.rx_bytes, st.tx_dropped, st.rx_dropped,
                                     st.tx_errors, st.rx_errors)
            key = (dpid, st.port_no)
            prev = self.port_last.get(key)
            self.port_last[key] = cur
            if prev is None:
                continue
            d = routing.port_delta(prev, cur)
            self.port_delta[key] = d
            tot = self.port_drops_total.setdefault(key, [0, 0])
            tot[0] += d.tx_drops
            tot[1] += d.rx_drops

    # ------------------------------------------------------------------ REST views

    def status(self) -> dict:
        """``/testbed/status``: ready (all switches, all links both ways, flows acknowledged by a
        barrier on every switch), expected/connected/missing switches and links, flows_installed,
        plus ``switch_names`` ({"dpid": name}) and ``unexpected_links`` (LLDP links not configured)."""
        ms, ml = self.missing_switches(), self.missing_links()
        flows = self.initial_done and not self.pending_barriers
        return {"ready": not ms and not ml and flows,
                "switches_expected": len(self.switch_names),
                "switches_connected": sorted(d for d in self.datapaths if d in self.switch_names),
                "missing_switches": ms,
                "links_expected": len(self.link_cfg),
                "links_discovered": len(self.link_cfg) - len(ml),
                "missing_links": ml,
                "flows_installed": flows,
                "switch_names": {str(d): n for d, n in sorted(self.switch_names.items())},
                "unexpected_links": sorted([a, b] for a, b in self.unexpected)}

    def _dir(self, tx_key, rx_key):
        """(rate Mbit/s, drops in the last interval, t) for traffic leaving tx_key into rx_key. The
        rate is what the link carried: the bytes received at rx_key's port, after the link's shaper
        and emulator; the bytes tx_key's port sent into the link (the offered load, before the
        shaper: above the capacity when the link is overloaded) only while rx_key's port is not
        known yet."""
        return routing.carried(self.port_delta.get(tx_key) if tx_key else None,
                               self.port_delta.get(rx_key) if rx_key else None)

    def _total_drops(self, *keys) -> int:
        return sum(sum(self.port_drops_total.get(k, [0, 0])) for k in keys if k is not None)

    def links(self) -> list[dict]:
        """``/testbed/links``: one row per configured switch link (a, b = DPIDs in config order,
        a_port/b_port from LLDP or None) and per host link (a = host name, a_port None, b = DPID,
        b_port = host port; ab = host -> switch). Rates in Mbit/s over the last stats interval, what
        each link carried (received at its far end, after its shaper: ``_dir``), util = rate /
        capacity_mbps (None without capacity), drops_ab/ba = dropped + error packets in the last
        interval, drops_total since start, t = unix s of the newest sample (None before two samples)."""
        out = []
        for lk in self.link_cfg.values():
            ap, bp = self.dir_links.get((lk.a, lk.b), (None, None))
            if ap is None:  # only the b -> a direction seen so far
                bp, ap = self.dir_links.get((lk.b, lk.a), (None, None))
            ka = (lk.a, ap) if ap is not None else None
            kb = (lk.b, bp) if bp is not None else None
            r_ab, d_ab, t_ab = self._dir(ka, kb)
            r_ba, d_ba, t_ba = self._dir(kb, ka)
            row = self._link_row(lk.a, ap, lk.b, bp, "switch", lk.bandwidth_mbps, lk.delay_ms,
                                 (r_ab, d_ab, t_ab), (r_ba, d_ba, t_ba), self._total_drops(ka, kb),
                                 self.switch_names.get(lk.a), self.switch_names.get(lk.b))
            row["up"] = self._link_up(lk)
            out.append(row)
        for h in self.hosts.values():
            k = (h.dpid, h.port)
            d = self.port_delta.get(k)
            ab = (d.rx_mbps, d.rx_drops, d.t) if d else (0.0, 0, None)  # host -> switch
            ba = (d.tx_mbps, d.tx_drops, d.t) if d else (0.0, 0, None)  # switch -> host
            out.append(self._link_row(h.name, None, h.dpid, h.port, "host", h.bandwidth_mbps, h.delay_ms,
                                      ab, ba, self._total_drops(k), h.name, self.switch_names.get(h.dpid)))
        return out

    @staticmethod
    def _link_row(a, a_port, b, b_port, kind, cap, delay, ab, ba, total, a_name, b_name) -> dict:
        ts = [t for t in (ab[2], ba[2]) if t is not None]
        return {"a": a, "a_port": a_port, "b": b, "b_port": b_port, "kind": kind, "capacity_mbps": cap,
                "delay_ms": delay, "t": max(ts) if ts else None,
                "rate_mbps_ab": ab[0], "rate_mbps_ba": ba[0],
                "util_ab": routing.utilization(ab[0], cap), "util_ba": routing.utilization(ba[0], cap),
                "drops_ab": ab[1], "drops_ba": ba[1], "drops_total": total, "a_name": a_name, "b_name": b_name}

    def path(self, src_mac: str, dst_mac: str) -> dict:
        """``/testbed/path``: ``{"src", "dst", "dpids", "delay_ms"}`` along the installed tree toward
        ``dst``; delay_ms = one-way sum of link delays including both host links (ms).

        Raises:
            KeyError: unknown MAC. routing.NoRouteError: no route now. LookupError: flows not installed yet.
        """
        src, dst = self.hosts.get(src_mac), self.hosts.get(dst_mac)
        for mac, h in ((src_mac, src), (dst_mac, dst)):
            if h is None:
                raise KeyError(f"unknown host MAC {mac}")
        if not self.initial_done:
            raise LookupError("no flows installed yet (switches or links missing: see /testbed/status)")
        tree = self.trees.get(dst_mac)
        if tree is None:
            raise routing.NoRouteError(f"no route to {dst.name} ({dst_mac}): its switch {dst.dpid} is not connected")
        try:
            dpids = routing.tree_path(tree, src.dpid, dst.dpid)
        except routing.NoRouteError as exc:
            raise routing.NoRouteError(f"no route from {src.name} ({src_mac}) to {dst.name} ({dst_mac}): "
                                       f"{exc}") from exc
        delay = src.delay_ms + routing.path_delay_ms(self.graph, dpids) + dst.delay_ms
        return {"src": src_mac, "dst": dst_mac, "dpids": dpids, "delay_ms": round(delay, 9)}

    def paths(self) -> list[dict]:
        """``/testbed/paths``: :meth:`path` for every ordered pair of distinct hosts with a route."""
        out = []
        for s in self.hosts:
            for d in self.hosts:
                if s != d:
                    try:
                        out.append(self.path(s, d))
                    except routing.NoRouteError:
                        continue
        return out


def dp_max_port(dp) -> int:
    """Highest physical port number of this OpenFlow version (0xffffff00 in OF1.3)."""
    return dp.ofproto.OFPP_MAX


def _json(obj, status: int = 200) -> Response:
    return Response(status=status, content_type="application/json", body=json.dumps(obj).encode())


def _err(status: int, message: str) -> Response:
    return _json({"error": message}, status)


class TestbedRest(ControllerBase):
    """``/testbed/*`` JSON endpoints (GET only)."""

    def __init__(self, req, link, data, **config):
        super().__init__(req, link, data, **config)
        self.app: TestbedController = data[APP_KEY]

    @route("testbed_status", "/testbed/status", methods=["GET"])
    def get_status(self, req, **_kwargs):
        return _json(self.app.status())

    @route("testbed_links", "/testbed/links", methods=["GET"])
    def get_links(self, req, **_kwargs):
        return _json(self.app.links())

    @route("testbed_path", "/testbed/path", methods=["GET"])
    def get_path(self, req, **_kwargs):
        macs = {}
        for arg in ("src", "dst"):
            v = req.GET.get(arg)
            if not v:
                return _err(400, f"missing query parameter '{arg}' (a host MAC, e.g. 00:00:00:00:00:01)")
            v = _norm_mac(v)
            if not MAC_RE.match(v):
                return _err(400, f"query parameter '{arg}' is not a MAC address: {req.GET.get(arg)!r}")
            macs[arg] = v
        if macs["src"] == macs["dst"]:
            return _err(400, f"src and dst are the same host {macs['src']}")
        try:
            return _json(self.app.path(macs["src"], macs["dst"]))
        except KeyError as exc:
            return _err(404, exc.args[0])
        except routing.NoRouteError as exc:
            return _err(404, str(exc))
        except LookupError as exc:
            return _err(503, str(exc))

    @route("testbed_events", "/testbed/events", methods=["GET"])
    def get_events(self, req, **_kwargs):
        """Events with ``seq`` > ``since`` (default 0): ``seq``, ``t`` (unix s), ``kind``
        (port_status, link_add, link_delete, link_change, reroute, reroute_done) and its fields."""
        try:
            since = int(req.GET.get("since", 0))
        except ValueError:
            return _err(400, "'since' must be an integer")
        return _json([e for e in self.app.event_log if e["seq"] > since])

    @route("testbed_link", "/testbed/link", methods=["POST"])
    def post_link(self, req, **_kwargs):
        """Body ``{"a": dpid, "b": dpid, "delay_ms"?: ms, "bandwidth_mbps"?: Mbit/s}`` ->
        ``{"t": unix s, "reroute": the reroute event or null}``."""
        try:
            body = json.loads(req.body or b"{}")
            a, b = int(body["a"]), int(body["b"])
        except (ValueError, TypeError, KeyError) as exc:
            return _err(400, f"body must be JSON with integer 'a' and 'b' (DPIDs): {exc}")
        try:
            return _json(self.app.set_link(a, b, body.get("delay_ms"), body.get("bandwidth_mbps")))
        except KeyError as exc:
            return _err(404, exc.args[0])
        except (ValueError, TypeError) as exc:
            return _err(400, str(exc))

    @route("testbed_paths", "/testbed/paths", methods=["GET"])
    def get_paths(self, req, **_kwargs):
        if not self.app.initial_done:
            return _err(503, "no flows installed yet (switches or links missing: see /testbed/status)")
        return _json(self.app.paths())
