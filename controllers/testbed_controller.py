"""Ryu application (OpenFlow 1.3) of the testbed: least-delay destination trees, proxy ARP,
port statistics per link, and a small JSON REST API.

Run it through ``testbed.controller.start_controller`` or by hand::

    TESTBED_CONTROLLER_CONFIG=controller.json \\
    .venv/bin/python -m testbed.ryu_launcher --observe-links \\
        --ofp-listen-host 127.0.0.1 --ofp-tcp-listen-port 6653 \\
        --wsapi-host 127.0.0.1 --wsapi-port 8080 controllers/testbed_controller.py

(``testbed.ryu_launcher`` is ``ryu-manager`` plus a shim for the installed eventlet.)

Behaviour
---------
* Switch ports of the configured links are found by LLDP (``ryu.topology``, ``--observe-links``).
  Once every configured switch is connected and every configured link has been seen in both
  directions, every switch gets, per known host, ``eth_dst=MAC -> output(port toward the next
  hop)`` from the least-delay tree rooted at the host's switch (:mod:`testbed.routing`); on the
  host's own switch the port is the host port. Link changes (LinkAdd/LinkDelete, switch leave)
  recompute the trees over the links that are up and only the changed flows are rewritten.
* Table-miss drops (no flooding, ever); IPv6 multicast is dropped by an explicit rule.
* ARP goes to the controller (eth_type 0x0806); requests for known IPs get a proxy reply sent out
  of the in-port. Unknown hosts are learned from ARP arriving on non-inter-switch ports.
* Every ``stats_interval_s`` an OFPPortStatsRequest goes to every switch; counter deltas give per
  link and direction: rate (Mbit/s, tx bytes of the sending port), utilization = rate / capacity,
  drops (tx_dropped + tx_errors of the sender + rx_dropped + rx_errors of the receiver).

REST (GET, JSON, 127.0.0.1): ``/testbed/status``, ``/testbed/links``,
``/testbed/path?src=MAC&dst=MAC``, ``/testbed/paths``; see the handlers for the shapes. Errors
are ``{"error": "..."}`` with status 400 (bad request), 404 (unknown host) or 503 (not ready).
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

import testbed.routing as routing

CONFIG_ENV = "TESTBED_CONTROLLER_CONFIG"
APP_KEY = "testbed_app"
COOKIE = 0x7E57BED000000001  # every flow this app installs carries it (so we only delete ours)
ALL_ONES_64 = 0xFFFFFFFFFFFFFFFF
PRIO_TABLE_MISS = 0
PRIO_DROP_NOISE = 10
PRIO_HOST = 100
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


@dataclass(frozen=True)
class LinkCfg:
    """A configured undirected switch link (``a``/``b`` in config order)."""

    a: int
    b: int
    delay_ms: float
    bandwidth_mbps: float


def _norm_mac(mac: str) -> str:
    return str(mac).strip().lower()


def load_config(path: str) -> dict:
    """Read the controller config (a :class:`testbed.boundaries.ControllerConfig`, validated there).

    Raises:
        RuntimeError: missing file or an invalid entry (the message names it).
    """
    from testbed.boundaries import ControllerConfig, read_config
    from testbed.errors import InputError

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

    def _barrier(self, dp) -> None:
        req = dp.ofproto_parser.OFPBarrierRequest(dp)
        dp.send_msg(req)
        self.pending_barriers[dp.id] = req.xid

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
        self.pending_barriers.pop(dpid, None)

    @set_ev_cls(ofp_event.EventOFPBarrierReply, MAIN_DISPATCHER)
    def _barrier_reply(self, ev) -> None:
        dpid = ev.msg.datapath.id
        if self.pending_barriers.get(dpid) == ev.msg.xid:
            del self.pending_barriers[dpid]

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
        self._recompute(f"link {s.dpid}->{d.dpid} up")

    @set_ev_cls(topo_event.EventLinkDelete)
    def _link_delete(self, ev) -> None:
        s, d = ev.link.src, ev.link.dst
        self.unexpected.discard((s.dpid, d.dpid))
        if self.dir_links.get((s.dpid, d.dpid)) == (s.port_no, d.port_no):
            del self.dir_links[(s.dpid, d.dpid)]
            self.logger.warning("link %d:%d -> %d:%d lost", s.dpid, s.port_no, d.dpid, d.port_no)
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
        for (dpid, mac), port in desired.items():
            if self.installed.get((dpid, mac)) != port:
                dp = self.datapaths[dpid]
                parser = dp.ofproto_parser
                self._flow(dp, PRIO_HOST, parser.OFPMatch(eth_dst=mac), [parser.OFPActionOutput(port)])
                self.installed[(dpid, mac)] = port
                touched.add(dpid)
        for dpid, mac in [k for k in self.installed if k not in desired]:
            del self.installed[(dpid, mac)]
            dp = self.datapaths.get(dpid)
            if dp is not None:
                self._flow(dp, PRIO_HOST, dp.ofproto_parser.OFPMatch(eth_dst=mac),
                           command=dp.ofproto.OFPFC_DELETE_STRICT)
                touched.add(dpid)
        for dpid in touched:
            self._barrier(self.datapaths[dpid])
        self.trees = trees
        if not self.initial_done:
            self.logger.info("all %d switches and %d links present: installing %d flows (%s)",
                             len(self.switch_names), len(self.link_cfg), len(desired), reason)
        elif touched:
            self.logger.info("routes recomputed (%s): %d switch(es) updated", reason, len(touched))
        self.initial_done = True

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
        """(rate Mbit/s, drops in the last interval, t) for traffic leaving tx_key into rx_key."""
        rate, drops, t = 0.0, 0, None
        dt = self.port_delta.get(tx_key) if tx_key else None
        dr = self.port_delta.get(rx_key) if rx_key else None
        if dt is not None:
            rate, drops, t = dt.tx_mbps, dt.tx_drops, dt.t
        elif dr is not None:
            rate, t = dr.rx_mbps, dr.t
        if dr is not None:
            drops += dr.rx_drops
            t = max(t or 0.0, dr.t)
        return rate, drops, t

    def _total_drops(self, *keys) -> int:
        return sum(sum(self.port_drops_total.get(k, [0, 0])) for k in keys if k is not None)

    def links(self) -> list[dict]:
        """``/testbed/links``: one row per configured switch link (a, b = DPIDs in config order,
        a_port/b_port from LLDP or None) and per host link (a = host name, a_port None, b = DPID,
        b_port = host port; ab = host -> switch). Rates in Mbit/s over the last stats interval,
        util = rate / capacity_mbps (None without capacity), drops_ab/ba = dropped + error packets
        in the last interval, drops_total since start, t = unix s of the newest sample (None
        before two samples)."""
        out = []
        for lk in self.link_cfg.values():
            ap, bp = self.dir_links.get((lk.a, lk.b), (None, None))
            if ap is None:  # only the b -> a direction seen so far
                bp, ap = self.dir_links.get((lk.b, lk.a), (None, None))
            ka = (lk.a, ap) if ap is not None else None
            kb = (lk.b, bp) if bp is not None else None
            r_ab, d_ab, t_ab = self._dir(ka, kb)
            r_ba, d_ba, t_ba = self._dir(kb, ka)
            out.append(self._link_row(lk.a, ap, lk.b, bp, "switch", lk.bandwidth_mbps, lk.delay_ms,
                                      (r_ab, d_ab, t_ab), (r_ba, d_ba, t_ba), self._total_drops(ka, kb),
                                      self.switch_names.get(lk.a), self.switch_names.get(lk.b)))
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

    @route("testbed_paths", "/testbed/paths", methods=["GET"])
    def get_paths(self, req, **_kwargs):
        if not self.app.initial_done:
            return _err(503, "no flows installed yet (switches or links missing: see /testbed/status)")
        return _json(self.app.paths())
