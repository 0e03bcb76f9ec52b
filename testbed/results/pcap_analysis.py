"""Per-hop, per-query analysis of a run's pcaps (written by :mod:`testbed.emu.pcap`).

Reading: files through scapy's ``RawPcapReader`` / ``RawPcapNgReader`` (pcap and pcapng, exact
integer ns timestamps), headers through dpkt. Not scapy's own dissection: on the same 200,000
packets it took 239 us per packet against 25 us for scapy's reader + dpkt, so a 50 MiB capture
file (the default bound, about 190,000 packets) would take 45 s instead of 5 s
(``benchmarks/pcap_bench.py``, docs/reports.md). IPv4 only: TCP over IPv6 is left out and named
in ``analysis.json``'s ``errors`` (:data:`IPV6`); a file that is not Ethernet pcap/pcapng of one
interface is skipped and named there too.

Matching (all capture points share one kernel clock, so timestamps compare directly):

* **A packet across capture points**: the same transmitted TCP segment has the same
  (IP src, IP dst, ports, IP ID, TCP seq, TCP ack, flags, payload length) at every point (no NAT on
  the path; Linux gives every transmission, retransmissions included, a new IP ID). Sorting one
  packet's observations by time gives its hops; hop one-way delay = t(next point) - t(point).
* **A segment to a query**: every query is one HTTP/1.1 request (``POST ...``, carrying
  ``X-Testbed-Query-Id: <source>-<seq>`` in its first segment) and one response (``HTTP/1.x ...``);
  a connection may carry several requests one after the other (keep-alive, no pipelining),
  including requests that are not queries (``GET /v1/stats``: matched, then left out). A data
  segment belongs to the message whose first byte (TCP sequence number, relative to the flow's
  first seen one) is the largest at or below its own; the k-th response of a connection answers its
  k-th request.
* **Retransmissions**: a byte range (flow, seq, length) sent with more than one IP ID.

Files written to ``RUN_DIR/capture/`` (columns in docs/records-schema.md):
``queries.csv`` / ``.parquet`` (one row per query seen on the wire, ``pkt_*`` columns joined into
the records by :func:`testbed.results.summary.merge_records`), ``hops.csv`` (per query and direction, the
hops of the message's first segment), ``hop_delays.csv`` (per hop over every matched packet:
count, percentiles, the configured link delay when the hop is an emulated link), ``analysis.json``.
"""

from __future__ import annotations

import json
import re
import socket
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd

from testbed.core.errors import InputError

LINKTYPE_ETHERNET = 1
PCAP_EXTENSIONS = (".pcap", ".pcapng")
QUERY_ID_RE = re.compile(rb"X-Testbed-Query-Id: *([A-Za-z0-9_.-]+)")
HEAD_BYTES = 400
#: First bytes of an HTTP/1.x message: a request line (any method: the sources also poll
#: ``GET /v1/stats`` on the same connections) or a status line (RFC 9112 section 3 and 4).
HTTP_START_RE = re.compile(rb"(?:[A-Z]{3,10} /[^ ]* HTTP/1\.[01]\r\n|HTTP/1\.[01] \d{3})")
KEY = ["src", "dst", "sport", "dport", "ipid", "seq", "ack", "flags", "paylen"]
#: parse_tcp's answer for a TCP segment over IPv6: refused (IPv6 has no identification field, which
#: tells a retransmission from its original at every capture point).
IPV6 = "ipv6"


class PcapError(InputError):
    """A capture file that cannot be analysed: not pcap/pcapng, not Ethernet, or several interfaces."""


def _timestamp_ns(reader, meta) -> int:
    """Exact integer ns of a record: pcap (micro- or nanosecond magic) or pcapng (the interface's
    ``if_tsresol``, units per second; a power of 10 up to 10^9 is exact, finer ones are floored)."""
    if hasattr(meta, "tsresol"):
        return (((meta.tshigh << 32) | meta.tslow) * 1_000_000_000) // meta.tsresol
    return meta.sec * 1_000_000_000 + meta.usec * (1 if reader.nano else 1000)


def read_pcap(path: Path) -> Iterator[tuple[int, bytes]]:
    """Yield ``(timestamp_ns, frame_bytes)`` of a pcap or pcapng capture of one Ethernet interface.

    Read through scapy's ``RawPcapReader`` (classic pcap, either byte order, micro- or nanosecond
    timestamps: https://www.tcpdump.org/manpages/pcap-savefile.5.txt), which hands pcapng files
    to ``RawPcapNgReader`` (https://www.ietf.org/archive/id/draft-ietf-opsawg-pcapng-03.html: the
    link type and timestamp resolution per interface). An empty file yields nothing; a truncated
    last record (capture killed mid-write) is left out.

    Raises:
        PcapError: not a pcap/pcapng file, a link type other than Ethernet (1), or a pcapng file
            holding more than one interface (a file is one capture point here).
    """
    from scapy.error import Scapy_Exception  # deferred: scapy is heavy to import
    from scapy.utils import RawPcapReader

    if Path(path).stat().st_size == 0:
        return
    try:
        reader = RawPcapReader(str(path))
    except Scapy_Exception as exc:
        raise PcapError(f"{path}: not a pcap or pcapng file ({exc})") from None
    ng = hasattr(reader, "interfaces")
    with reader:
        if not ng and reader.linktype & 0xFFFF != LINKTYPE_ETHERNET:
            raise PcapError(f"{path}: link type {reader.linktype}, expected Ethernet (1)")
        for data, meta in reader:
            if ng:
                if len(reader.interfaces) > 1:
                    raise PcapError(f"{path}: pcapng file with {len(reader.interfaces)} interfaces; capture one "
                                    f"interface per file (each file is one capture point)")
                if meta.linktype != LINKTYPE_ETHERNET:
                    raise PcapError(f"{path}: link type {meta.linktype}, expected Ethernet (1)")
            elif len(data) < meta.caplen:
                return  # truncated last record
            yield _timestamp_ns(reader, meta), data


def parse_tcp(frame: bytes) -> tuple | str | None:
    """Header fields of an Ethernet (802.1Q/802.1ad tags allowed) / IPv4 / TCP frame, dissected by
    dpkt; :data:`IPV6` for a TCP segment over IPv6 (refused); None for anything else.

    Returns ``(src, dst, sport, dport, ipid, seq, ack, flags, paylen, payload_head)``; ``paylen``
    is the TCP payload length from the IP total length (so correct under a short snaplen),
    ``payload_head`` the captured payload bytes (at most HEAD_BYTES). A fragment (no TCP header of
    its own) is None.
    """
    import dpkt  # deferred: only the packet analysis needs it

    try:
        ip = dpkt.ethernet.Ethernet(frame).data
    except (dpkt.NeedData, dpkt.UnpackError):
        return None
    if isinstance(ip, dpkt.ip6.IP6):
        return IPV6 if getattr(ip, "p", None) == 6 else None
    if not isinstance(ip, dpkt.ip.IP) or not isinstance(ip.data, dpkt.tcp.TCP):
        return None
    tcp = ip.data
    paylen = ip.len - ip.hl * 4 - tcp.off * 4
    head = bytes(tcp.data[:HEAD_BYTES]) if paylen > 0 else b""
    return (socket.inet_ntoa(ip.src), socket.inet_ntoa(ip.dst), tcp.sport, tcp.dport, ip.id, tcp.seq, tcp.ack,
            tcp.flags, paylen, head)


def _capture_file(pcap_dir: Path, point: str) -> Path | None:
    """``<point>.pcap``, else ``<point>.pcapng``, in ``pcap_dir`` (None: neither)."""
    for ext in PCAP_EXTENSIONS:
        if (pcap_dir / f"{point}{ext}").exists():
            return pcap_dir / f"{point}{ext}"
    return None


def load_packets(pcap_dir: Path, points: list[str] | None = None, errors: list[str] | None = None) -> pd.DataFrame:
    """All IPv4 TCP packets of ``pcap_dir/<point>.pcap`` (or ``.pcapng``) as one frame (columns:
    point, ts_ns, KEY, head, start).

    ``points``: the file stems to read (default: every ``*.pcap`` and ``*.pcapng``). ``start``: the
    segment starts an HTTP message (:data:`HTTP_START_RE`); ``head``: its captured payload bytes
    (empty bytes for other segments). ``errors``: when given, a file that cannot be analysed is
    skipped and its :class:`PcapError` message appended here (else raised), and so is a note for
    each file with TCP over IPv6 (those segments are left out: see :data:`IPV6`).
    """
    rows = []
    stems = points if points is not None else sorted({p.stem for ext in PCAP_EXTENSIONS
                                                      for p in pcap_dir.glob(f"*{ext}")})
    for point in stems:
        path = _capture_file(pcap_dir, point)
        if path is None:
            continue
        try:
            frames = list(read_pcap(path))
        except PcapError as exc:
            if errors is None:
                raise
            errors.append(str(exc))
            continue
        ipv6 = 0
        for ts, frame in frames:
            r = parse_tcp(frame)
            if r is None or r == IPV6:
                ipv6 += r == IPV6
                continue
            start = bool(HTTP_START_RE.match(r[9]))
            rows.append((point, ts, *r[:9], r[9] if start else b"", start))
        if ipv6 and errors is not None:
            errors.append(f"{path}: {ipv6} TCP segments over IPv6 left out (matching a packet across capture "
                          f"points needs the IPv4 identification field; the testbed's hosts use IPv4)")
    df = pd.DataFrame(rows, columns=["point", "ts_ns", *KEY, "head", "start"])
    return df.astype({"ts_ns": "int64", "sport": "int64", "dport": "int64", "ipid": "int64", "seq": "int64",
                      "ack": "int64", "flags": "int64", "paylen": "int64"})


def number_packets(pk: pd.DataFrame) -> pd.DataFrame:
    """``pk`` with a ``pkt`` column: the packet (one transmission, ``KEY``) each observation is of.

    An observation repeated at the same point (IP ID reuse) is a new packet (occurrence index).
    """
    pk = pk.copy()
    order = pk.sort_values("ts_ns", kind="stable")
    occ = order.groupby([*KEY, "point"], sort=False).cumcount()
    pk["pkt"] = order.assign(occ=occ).groupby([*KEY, "occ"], sort=False).ngroup()
    return pk


def packet_hops(pk: pd.DataFrame) -> pd.DataFrame:
    """One row per hop of every packet: ``pkt`` (packet number), from, to, t_from_ns, owd_ns, origin
    (the packet's first capture point), hop (0-based position on its path).

    Hops join consecutive observations of one packet (see :func:`number_packets`) in time order.
    """
    if pk.empty:
        return pd.DataFrame(columns=["pkt", "from", "to", "t_from_ns", "owd_ns", "origin", "hop"])
    if "pkt" not in pk:
        pk = number_packets(pk)
    pk = pk.sort_values(["pkt", "ts_ns"], kind="stable")
    pkt, pt, ts = pk["pkt"].to_numpy(), pk["point"].to_numpy(), pk["ts_ns"].to_numpy(dtype="int64")
    m = pkt[1:] == pkt[:-1]  # integer arithmetic: ns since the epoch do not fit a float64 exactly
    first = np.r_[True, pkt[1:] != pkt[:-1]]
    start = np.maximum.accumulate(np.where(first, np.arange(len(pkt)), 0))  # row of each packet's first point
    return pd.DataFrame({"pkt": pkt[:-1][m], "from": pt[:-1][m], "to": pt[1:][m], "t_from_ns": ts[:-1][m],
                         "owd_ns": (ts[1:] - ts[:-1])[m], "origin": pt[start[:-1][m]],
                         "hop": (np.arange(len(pkt)) - start)[:-1][m]})


def expected_hop_delays(plan: dict, meta: dict) -> dict[tuple[str, str], float]:
    """Configured one-way delay (ms) of hops that are one emulated link, both directions.

    Link points: ``lK-eth0`` <-> ``lK-eth1`` (user-space emulator) or the two switch ports of the link
    (netem), as recorded in ``capture.json``.
    """
    delay = {lk["index"]: float(lk["delay_ms"]) for lk in plan.get("links", [])}
    sides: dict[int, dict[str, str]] = {}
    for name, p in meta.get("points", {}).items():
        if p.get("link") is not None and p.get("side") and p.get("kind") in ("link", "switch"):
            if p["kind"] == "link" or meta.get("link_emulator") != "userspace":
                sides.setdefault(p["link"], {})[p["side"]] = name
    out = {}
    for k, s in sides.items():
        if "a" in s and "b" in s and k in delay:
            out[(s["a"], s["b"])] = out[(s["b"], s["a"])] = delay[k]
    return out


def _compensation_ms(run_dir: Path, meta: dict) -> float:
    """The one-way delay (ms) the run took off every emulated link for the datapath's own latency
    (``datapath_calibration.json``; 0 without one, or when the hops are not the emulator's)."""
    try:
        cal = json.loads((Path(run_dir) / "datapath_calibration.json").read_text())
    except (OSError, ValueError):
        return 0.0
    if meta.get("link_emulator") != "userspace":
        return 0.0
    offset = cal.get("link_offset_one_way_ms") if isinstance(cal, dict) else None
    return float(offset) if isinstance(offset, int | float) and offset >= 0 else 0.0


def _message_table(pk: pd.DataFrame, server_port: int) -> pd.DataFrame:
    """Data segments with their message: columns of pk + conn, direction, rel_seq, msg (index in conn)."""
    d = pk[pk["paylen"] > 0].copy()
    if d.empty:
        return d.assign(conn="", direction="", rel_seq=0, msg=-1)
    to_server = d["dport"] == server_port
    d["direction"] = np.where(to_server, "request", "response")
    cli_ip = np.where(to_server, d["src"], d["dst"])
    cli_port = np.where(to_server, d["sport"], d["dport"])
    srv_ip = np.where(to_server, d["dst"], d["src"])
    d["conn"] = [f"{a}:{b}>{c}" for a, b, c in zip(cli_ip, cli_port, srv_ip, strict=True)]
    base = pk.sort_values("ts_ns").groupby(["src", "sport", "dst", "dport"])["seq"].first()
    b = base.reindex(pd.MultiIndex.from_frame(d[["src", "sport", "dst", "dport"]])).to_numpy()
    d["rel_seq"] = (d["seq"].to_numpy() - b) % 2**32
    starts = (d[d["start"]].groupby(["conn", "direction"])["rel_seq"]
              .apply(lambda s: np.unique(s.to_numpy())))
    msg = np.full(len(d), -1)
    for (conn, direction), idx in d.groupby(["conn", "direction"]).indices.items():
        st = starts.get((conn, direction))
        if st is not None:
            msg[idx] = np.searchsorted(st, d["rel_seq"].to_numpy()[idx], side="right") - 1
    d["msg"] = msg
    return d[d["msg"] >= 0]


def analyze_packets(pk: pd.DataFrame, server_port: int,
                    hops: pd.DataFrame | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per-query packet measures and per-query hop lists from a packet table (see :func:`load_packets`).

    Returns ``(queries, query_hops)``. ``queries``: one row per request seen whose first segment
    carries a query id; columns ``query_id`` and the ``pkt_*`` columns of docs/records-schema.md
    (times in ns since the epoch, durations in ms, sizes in bytes). ``query_hops``: query_id,
    direction, hop (0-based), from, to, owd_ms of the first segment of the request/response.
    ``pk`` must carry ``pkt`` (:func:`number_packets`) when ``hops`` is given.
    """
    cols = ["query_id"]
    if pk.empty:
        return pd.DataFrame(columns=cols), pd.DataFrame(columns=["query_id", "direction", "hop", "from", "to",
                                                                  "owd_ms"])
    pk = pk.reset_index(drop=True)
    if "pkt" not in pk:
        pk = number_packets(pk)
    if hops is None:
        hops = packet_hops(pk)
    d = _message_table(pk, server_port)
    # query id of each request: from the message's first segment (any point that kept the header)
    firsts = d[d["start"]]
    ids = {}
    for (conn, direction, msg), g in firsts.groupby(["conn", "direction", "msg"]):
        if direction == "request":
            for h in g["head"]:
                m = QUERY_ID_RE.search(h)
                if m:
                    ids[(conn, msg)] = m.group(1).decode()
                    break
    hop_by_pkt = {k: g for k, g in hops.groupby("pkt")} if not hops.empty else {}
    rows, hop_rows = {}, []
    for (conn, direction, msg), g in d.groupby(["conn", "direction", "msg"]):
        qid = ids.get((conn, msg))
        if qid is None:
            continue
        p = "req" if direction == "request" else "resp"
        r = rows.setdefault(qid, {"query_id": qid})
        first_seen = g.groupby("point")["ts_ns"].min().sort_values()
        tx_pt, rx_pt = first_seen.index[0], first_seen.index[-1]
        seg_first = g.groupby(["point", "rel_seq", "paylen"])["ts_ns"].min()
        tx, rx = seg_first.loc[tx_pt], seg_first.loc[rx_pt]
        r[f"pkt_{p}_first_tx_ns"], r[f"pkt_{p}_last_tx_ns"] = int(tx.min()), int(tx.max())
        r[f"pkt_{p}_first_rx_ns"], r[f"pkt_{p}_last_rx_ns"] = int(rx.min()), int(rx.max())
        r[f"pkt_{p}_tx_ms"] = round((tx.max() - tx.min()) / 1e6, 4)
        r[f"pkt_{p}_owd_ms"] = round((rx.min() - tx.min()) / 1e6, 4)
        r[f"pkt_{p}_transfer_ms"] = round((rx.max() - tx.min()) / 1e6, 4)
        segs = g.drop_duplicates(["rel_seq", "paylen"])
        r[f"pkt_{p}_segments"] = int(len(segs))
        r[f"pkt_{p}_payload_bytes"] = int(segs["paylen"].sum())
        sends = g.groupby(["rel_seq", "paylen"])["ipid"].nunique()
        r[f"pkt_{p}_retransmissions"] = int((sends - 1).sum())
        r[f"pkt_{p}_points"] = int(len(first_seen))
        r[f"pkt_{p}_tx_point"], r[f"pkt_{p}_rx_point"] = tx_pt, rx_pt
        first_pkt = g.loc[g["rel_seq"] == g["rel_seq"].min()].sort_values("ts_ns")["pkt"].iloc[0]
        hp = hop_by_pkt.get(first_pkt)
        if hp is not None:
            parts = []
            for i, h in enumerate(hp.itertuples(index=False)):
                hop_rows.append((qid, direction, i, h[1], h[2], round(h[4] / 1e6, 4)))
                parts.append(f"{h[1]}>{h[2]}:{h[4] / 1e6:.3f}")
            r[f"pkt_{p}_hops"] = " ".join(parts)
    q = pd.DataFrame(list(rows.values()))
    for c in [c for c in q.columns if c.endswith("_ns")]:  # nullable ints: ns do not fit a float64
        q[c] = pd.array([r.get(c) for r in rows.values()], dtype="Int64")
    if not q.empty:
        for c in ("req", "resp"):
            if f"pkt_{c}_retransmissions" not in q:
                q[f"pkt_{c}_retransmissions"] = pd.NA
        q["pkt_retransmissions"] = q[["pkt_req_retransmissions", "pkt_resp_retransmissions"]].sum(axis=1,
                                                                                               min_count=1)
        if "pkt_resp_first_rx_ns" in q and "pkt_req_first_tx_ns" in q:
            q["pkt_e2e_ms"] = ((q["pkt_resp_last_rx_ns"] - q["pkt_req_first_tx_ns"]) / 1e6).round(4)
    hop_df = pd.DataFrame(hop_rows, columns=["query_id", "direction", "hop", "from", "to", "owd_ms"])
    return q, hop_df


def hop_delay_table(hops: pd.DataFrame, expected: dict[tuple[str, str], float],
                    compensation_ms: float = 0.0) -> pd.DataFrame:
    """Per hop (from, to) over every matched packet: packets, min/p5/median/mean/p95/max one-way delay
    (ms), the configured link delay (ms, emulated links only), the delay the link element itself
    holds frames for (``emulated_ms``: configured minus the datapath compensation of the run,
    ``compensation_ms``, floored at 0; see :func:`testbed.emu.bringup.calibrate_datapath`:
    the switches' hops carry the rest) and median minus emulated.

    ``hops``: :func:`packet_hops`. Rows in path order (grouped by where the packets entered).
    """
    cols = ["from", "to", "packets", "min_ms", "p5_ms", "median_ms", "mean_ms", "p95_ms", "max_ms",
            "configured_ms", "emulated_ms", "excess_median_ms"]
    if hops.empty:
        return pd.DataFrame(columns=cols)
    g = hops.assign(ms=hops["owd_ns"] / 1e6).groupby(["from", "to"])["ms"]
    t = pd.DataFrame({"packets": g.size(), "min_ms": g.min(), "p5_ms": g.quantile(0.05),
                      "median_ms": g.median(), "mean_ms": g.mean(), "p95_ms": g.quantile(0.95),
                      "max_ms": g.max()}).reset_index()
    t["configured_ms"] = [expected.get((a, b)) for a, b in zip(t["from"], t["to"], strict=True)]
    t["configured_ms"] = t["configured_ms"].astype("float64")
    t["emulated_ms"] = (t["configured_ms"] - float(compensation_ms)).clip(lower=0.0)
    t["excess_median_ms"] = t["median_ms"] - t["emulated_ms"]
    # path order: by the most common origin of the hop's packets, then the hop's position
    gk = hops.groupby(["from", "to"])
    order = pd.DataFrame({"origin": gk["origin"].agg(lambda o: o.mode().iloc[0]), "pos": gk["hop"].median()})
    t = t.join(order, on=["from", "to"]).sort_values(["origin", "pos", "from", "to"])
    return t[cols].round(4).reset_index(drop=True)


def analyze_run(run_dir: Path) -> dict:
    """Analyse ``run_dir/pcap`` and write ``run_dir/capture/`` (see the module docstring).

    Needs ``pcap/capture.json`` (written by the capture) and ``plan.json`` (for link delays; optional).
    Returns the content of ``analysis.json``: packets per point, queries matched, request starts
    seen, retransmissions, the hop table as records, ``errors`` (unreadable pcap files, skipped).
    """
    run_dir = Path(run_dir)
    pcap_dir = run_dir / "pcap"
    meta_path = pcap_dir / "capture.json"
    meta = json.loads(meta_path.read_text()) if meta_path.exists() else {"points": {}}
    plan_path = run_dir / "plan.json"
    plan = json.loads(plan_path.read_text()) if plan_path.exists() else {}
    port = int(meta.get("server_port") or plan.get("experiment", {}).get("emulation", {}).get("server_port", 8501))
    errors: list[str] = []
    pk = number_packets(load_packets(pcap_dir, list(meta["points"]) or None, errors))
    hops = packet_hops(pk)
    q, qh = analyze_packets(pk, port, hops)
    out = run_dir / "capture"
    out.mkdir(exist_ok=True)
    q.to_csv(out / "queries.csv", index=False)
    if not q.empty:
        q.to_parquet(out / "queries.parquet", index=False)
    qh.to_csv(out / "hops.csv", index=False)
    table = hop_delay_table(hops, expected_hop_delays(plan, meta), _compensation_ms(run_dir, meta))
    table.to_csv(out / "hop_delays.csv", index=False)
    req = pk[pk["start"] & (pk["dport"] == port)] if not pk.empty else pk
    requests = int(len(req.drop_duplicates(["src", "sport", "seq"])))
    result = {
        "packets_per_point": {} if pk.empty else {k: int(v) for k, v in
                                                  pk["point"].value_counts().sort_index().items()},
        "queries_matched": int(len(q)),
        "request_segments_with_header": requests,
        "retransmissions": 0 if q.empty else int(q["pkt_retransmissions"].fillna(0).sum()),
        "hop_delays": json.loads(table.to_json(orient="records")),
        "errors": errors,
    }
    (out / "analysis.json").write_text(json.dumps(result, indent=1))
    return result
