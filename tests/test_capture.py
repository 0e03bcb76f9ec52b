"""Packet capture: capture-point resolution (plan only) and packet matching on a crafted pcap.

The pcaps here are written byte by byte (pcap + Ethernet/IPv4/TCP headers), so every timestamp,
sequence number and IP ID is known and the expected delays are exact.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pandas as pd
import pytest

from testbed.emu.pcap import packet_bound, tcpdump_command
from testbed.model.records import RECORD_FIELDS
from testbed.plan.build import PlanError, plan_experiment
from testbed.plan.capture_points import capture_points, validate_capture
from testbed.results.pcap_analysis import IPV6, PcapError, analyze_run, load_packets, parse_tcp, read_pcap
from testbed.results.summary import merge_records
from testbed.spec.capture import CaptureSpec

REPO = Path(__file__).resolve().parents[1]
MS = 1_000_000


# ---------------------------------------------------------------- crafted pcaps

def _ip(s: str) -> bytes:
    return bytes(int(x) for x in s.split("."))


def frame(src: str, dst: str, sport: int, dport: int, seq: int, ack: int, ipid: int, payload: bytes = b"",
          flags: int = 0x18) -> bytes:
    tcp = struct.pack("!HHIIBBHHH", sport, dport, seq, ack, 5 << 4, flags, 65535, 0, 0) + payload
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(tcp), ipid, 0x4000, 64, 6, 0, _ip(src), _ip(dst))
    return b"\x00" * 6 + b"\x00" * 5 + b"\x01" + b"\x08\x00" + ip + tcp


def write_pcap(path: Path, packets: list[tuple[int, bytes]], snaplen: int = 65535) -> None:
    with open(path, "wb") as f:
        f.write(struct.pack("<IHHiIII", 0xA1B23C4D, 2, 4, 0, 0, snaplen, 1))  # nanosecond pcap, Ethernet
        for ts, data in packets:
            cut = data[:snaplen]
            f.write(struct.pack("<IIII", ts // 1_000_000_000, ts % 1_000_000_000, len(cut), len(data)) + cut)


CLI, SRV, CPORT, SPORT = "10.0.0.1", "10.0.0.4", 40000, 8501
T0 = 1_800_000_000 * 1_000_000_000
# cumulative one-way delay (ns) at each point, client -> server; the reverse direction mirrors it
POINTS = {"srca-eth0": 0, "l1-eth0": 10_000, "l1-eth1": 2_010_000 + 200_000, "edgec-eth0": 2_230_000}


def _request(qid: str, body: int) -> bytes:
    head = (f"POST /v1/models/digits_small:predict HTTP/1.1\r\nHost: {SRV}:{SPORT}\r\n"
            f"Content-Type: application/json\r\nX-Testbed-Query-Id: {qid}\r\nContent-Length: {body}\r\n\r\n")
    return head.encode()


def crafted_run(tmp_path: Path) -> Path:
    """Two queries on one keep-alive connection, captured at 4 points of a 1-link path.

    srca-1: request = header segment + 1000-byte segment (sent twice: retransmitted 3 ms later),
    response = 1 segment; then a ``GET /v1/stats`` and its response (no query); then srca-2: request
    and response of one segment each.
    """
    sends: list[tuple[int, str, bytes]] = []  # (send time at its sender, direction, frame)
    r1 = _request("srca-1", 1000)
    s = 1000  # client seq
    sends.append((T0, "up", frame(CLI, SRV, CPORT, SPORT, s, 500, 7, r1)))
    sends.append((T0 + 1 * MS, "up", frame(CLI, SRV, CPORT, SPORT, s + len(r1), 500, 8, b"x" * 1000)))
    sends.append((T0 + 4 * MS, "up", frame(CLI, SRV, CPORT, SPORT, s + len(r1), 500, 9, b"x" * 1000)))
    s += len(r1) + 1000
    resp1 = b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n0123456789"
    sends.append((T0 + 10 * MS, "down", frame(SRV, CLI, SPORT, CPORT, 500, s, 70, resp1)))
    # a request that is not a query (the sources poll the servers' stats on the same connections)
    get = b"GET /v1/stats HTTP/1.1\r\nHost: x\r\n\r\n"
    sends.append((T0 + 30 * MS, "up", frame(CLI, SRV, CPORT, SPORT, s, 500 + len(resp1), 20, get)))
    s += len(get)
    resp_get = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"
    sv = 500 + len(resp1)
    sends.append((T0 + 31 * MS, "down", frame(SRV, CLI, SPORT, CPORT, sv, s, 80, resp_get)))
    sv += len(resp_get)
    r2 = _request("srca-2", 0)
    sends.append((T0 + 50 * MS, "up", frame(CLI, SRV, CPORT, SPORT, s, sv, 10, r2)))
    resp2 = b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabc"
    sends.append((T0 + 60 * MS, "down", frame(SRV, CLI, SPORT, CPORT, sv, s + len(r2), 71, resp2)))
    # a pure ACK, seen everywhere, matched as a packet but part of no message
    sends.append((T0 + 61 * MS, "up", frame(CLI, SRV, CPORT, SPORT, s + len(r2), sv + len(resp2), 11, flags=0x10)))
    pcap = tmp_path / "pcap"
    pcap.mkdir()
    last = POINTS["edgec-eth0"]
    for point, off in POINTS.items():
        pk = []
        for t, direction, f in sends:
            if direction == "up":
                pk.append((t + off, f))
            else:
                pk.append((t + last - off, f))
        write_pcap(pcap / f"{point}.pcap", sorted(pk), snaplen=256)
    meta = {"link_emulator": "userspace", "server_port": SPORT, "points": {
        "srca-eth0": {"kind": "host", "host": "srca", "link": None, "side": None},
        "l1-eth0": {"kind": "link", "link": 1, "side": "a"},
        "l1-eth1": {"kind": "link", "link": 1, "side": "b"},
        "edgec-eth0": {"kind": "host", "host": "edgec", "link": None, "side": None}}}
    (pcap / "capture.json").write_text(json.dumps(meta))
    (tmp_path / "plan.json").write_text(json.dumps({"links": [{"index": 1, "a": "s1", "b": "s2", "delay_ms": 2.0}],
                                                    "hosts": []}))
    return tmp_path


def test_read_and_parse_crafted_pcap(tmp_path):
    run = crafted_run(tmp_path)
    pk = list(read_pcap(run / "pcap" / "l1-eth1.pcap"))
    assert len(pk) == 9 and pk[0][0] == T0 + POINTS["l1-eth1"]
    f = parse_tcp(pk[0][1])
    assert f[:9] == (CLI, SRV, CPORT, SPORT, 7, 1000, 500, 0x18, len(_request("srca-1", 1000)))
    assert b"X-Testbed-Query-Id: srca-1" in f[9]  # within the 256-byte snaplen
    df = load_packets(run / "pcap")
    assert len(df) == 36 and int(df["start"].sum()) == 6 * 4


def test_analysis_of_crafted_run(tmp_path):
    run = crafted_run(tmp_path)
    res = analyze_run(run)
    assert res["queries_matched"] == 2 and res["retransmissions"] == 1
    assert res["packets_per_point"] == {p: 9 for p in sorted(POINTS)}
    q = pd.read_csv(run / "capture" / "queries.csv").set_index("query_id")
    a = q.loc["srca-1"]
    assert a["pkt_req_first_tx_ns"] == T0 and a["pkt_req_last_tx_ns"] == T0 + 1 * MS
    assert a["pkt_req_first_rx_ns"] == T0 + 2_230_000 and a["pkt_req_last_rx_ns"] == T0 + 1 * MS + 2_230_000
    assert a["pkt_req_tx_ms"] == pytest.approx(1.0) and a["pkt_req_owd_ms"] == pytest.approx(2.23)
    assert a["pkt_req_transfer_ms"] == pytest.approx(3.23)
    assert a["pkt_req_segments"] == 2 and a["pkt_req_payload_bytes"] == len(_request("srca-1", 1000)) + 1000
    assert a["pkt_req_retransmissions"] == 1 and a["pkt_resp_retransmissions"] == 0 and a["pkt_retransmissions"] == 1
    assert a["pkt_req_tx_point"] == "srca-eth0" and a["pkt_req_rx_point"] == "edgec-eth0"
    assert a["pkt_resp_tx_point"] == "edgec-eth0" and a["pkt_resp_rx_point"] == "srca-eth0"
    assert a["pkt_resp_first_tx_ns"] == T0 + 10 * MS and a["pkt_resp_owd_ms"] == pytest.approx(2.23)
    assert a["pkt_e2e_ms"] == pytest.approx(10 + 2.23)  # response last byte in - request first byte out
    assert a["pkt_req_hops"] == "srca-eth0>l1-eth0:0.010 l1-eth0>l1-eth1:2.200 l1-eth1>edgec-eth0:0.020"
    b = q.loc["srca-2"]
    assert b["pkt_req_segments"] == 1 and b["pkt_req_tx_ms"] == 0 and b["pkt_retransmissions"] == 0
    assert b["pkt_resp_payload_bytes"] == len(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabc")
    hops = pd.read_csv(run / "capture" / "hops.csv")
    assert len(hops) == 2 * 2 * 3  # 2 queries x (request, response) x 3 hops
    h = pd.read_csv(run / "capture" / "hop_delays.csv").set_index(["from", "to"])
    link = h.loc[("l1-eth0", "l1-eth1")]
    assert link["packets"] == 6 and link["median_ms"] == pytest.approx(2.2)  # 5 data sends + the ACK
    assert link["configured_ms"] == 2.0 and link["excess_median_ms"] == pytest.approx(0.2)
    back = h.loc[("l1-eth1", "l1-eth0")]
    assert back["packets"] == 3 and back["configured_ms"] == 2.0
    assert pd.isna(h.loc[("srca-eth0", "l1-eth0"), "configured_ms"])


def test_merge_records_joins_packet_columns(tmp_path):
    run = crafted_run(tmp_path)
    analyze_run(run)
    (run / "sources").mkdir()
    rows = [{"query_id": f"srca-{i}", "source": "srca", "t0_ns": T0 + i, "outcome": "success"} for i in (1, 2, 3)]
    pd.DataFrame(rows, columns=RECORD_FIELDS).to_csv(run / "sources" / "srca.records.csv", index=False)
    df = merge_records(run)
    assert list(df["query_id"]) == ["srca-1", "srca-2", "srca-3"]
    assert list(df["pkt_req_segments"].fillna(-1)) == [2, 1, -1]
    assert pd.read_parquet(run / "records.parquet")["pkt_retransmissions"].fillna(-1).tolist() == [1, 0, -1]


# ---------------------------------------------------------------- capture points (plan only)

@pytest.fixture(scope="module")
def plan():
    return plan_experiment(REPO / "experiments" / "capture.yaml")


def test_capture_points_all_and_edge(plan):
    all_pts = capture_points(plan, CaptureSpec(interfaces="all"))
    assert [p.name for p in all_pts] == ["srca-eth0", "edgec-eth0", "l1-eth0", "l1-eth1", "l2-eth0", "l2-eth1",
                                        "l3-eth0", "l3-eth1"]
    assert all_pts[2].node == "l1" and all_pts[2].side == "a" and all_pts[0].node == "srca"
    assert [p.name for p in capture_points(plan, CaptureSpec(interfaces="edge"))] == ["srca-eth0", "edgec-eth0"]
    # with netem there is no emulator namespace: a link is captured on its two switch ports
    net = capture_points(plan, CaptureSpec(interfaces=["l2"]), "netem")
    assert [(p.name, p.node, p.side) for p in net] == [("s2-eth2", None, "a"), ("s3-eth1", None, "b")]


def test_capture_points_list(plan):
    pts = capture_points(plan, CaptureSpec(interfaces=["srca", "l1", "s2", "edgec-eth0", "l1-eth0"]))
    assert [p.name for p in pts] == ["srca-eth0", "l1-eth0", "l1-eth1", "s2-eth1", "s2-eth2", "edgec-eth0"]


def test_capture_unknown_name_is_named(plan):
    with pytest.raises(PlanError, match=r"capture\.interfaces\.1: 'srcx' is not a host.*did you mean 'srca'"):
        capture_points(plan, CaptureSpec(interfaces=["srca", "srcx"]))
    bad = plan.experiment.model_copy(update={"capture": CaptureSpec(interfaces=["l9"])})
    plan2 = plan.model_copy(update={"experiment": bad})
    with pytest.raises(PlanError, match=r"capture\.interfaces\.0: 'l9'"):
        validate_capture(plan2)
    validate_capture(plan)


def test_size_bound_and_command(plan, tmp_path):
    spec = CaptureSpec(interfaces="edge", snaplen_bytes=256, max_mib=1)
    n = packet_bound(spec)
    assert n == (2**20 - 24) // (16 + 256) == 3854
    assert 24 + n * (16 + 256) <= 2**20 < 24 + (n + 1) * (16 + 256)
    pt = capture_points(plan, spec)[0]
    cmd = tcpdump_command(pt, spec, tmp_path / "x.pcap", 8501)
    assert cmd[:3] == ["tcpdump", "-i", "srca-eth0"] and cmd[cmd.index("-c") + 1] == "3854"
    assert cmd[-1] == "tcp port 8501" and "--time-stamp-precision=nano" in cmd and "--immediate-mode" in cmd
    delayed = tcpdump_command(pt, CaptureSpec(start_delay_s=1.5), tmp_path / "x.pcap", 8501)
    assert delayed[:2] == ["sh", "-c"] and "sleep 1.500" in delayed[2] and delayed[4] == "tcpdump"


# ---------------------------------------------------------------- formats: pcapng, IPv6, refusals

def write_pcapng(path: Path, packets: list[tuple[int, bytes]], snaplen: int = 65535, interfaces: int = 1,
                 linktype: int = 1) -> None:
    """pcapng (little endian): a section header, ``interfaces`` interface descriptions with
    if_tsresol = 9 (ns), then one enhanced packet block per packet on interface 0."""
    def block(btype: int, body: bytes) -> bytes:
        body += b"\x00" * (-len(body) % 4)
        n = 12 + len(body)
        return struct.pack("<II", btype, n) + body + struct.pack("<I", n)

    out = block(0x0A0D0D0A, struct.pack("<IHHq", 0x1A2B3C4D, 1, 0, -1))
    tsresol = struct.pack("<HHB3x", 9, 1, 9) + struct.pack("<HH", 0, 0)  # if_tsresol 10^-9, opt_endofopt
    for _ in range(interfaces):
        out += block(1, struct.pack("<HHI", linktype, 0, snaplen) + tsresol)
    for ts, data in packets:
        cut = data[:snaplen]
        out += block(6, struct.pack("<IIIII", 0, ts >> 32, ts & 0xFFFFFFFF, len(cut), len(data)) + cut)
    path.write_bytes(out)


def frame6(payload: bytes = b"x") -> bytes:
    tcp = struct.pack("!HHIIBBHHH", CPORT, SPORT, 1, 1, 5 << 4, 0x18, 65535, 0, 0) + payload
    ip6 = struct.pack("!IHBB16s16s", 6 << 28, len(tcp), 6, 64, b"\x20\x01" + b"\x00" * 13 + b"\x01",
                      b"\x20\x01" + b"\x00" * 13 + b"\x02")
    return b"\x00" * 11 + b"\x01" + b"\x86\xdd" + ip6 + tcp


def test_pcapng_gives_the_same_analysis(tmp_path):
    (tmp_path / "classic").mkdir()
    (tmp_path / "ng").mkdir()
    ref = crafted_run(tmp_path / "classic")
    analyze_run(ref)
    ng = crafted_run(tmp_path / "ng")
    for f in sorted((ng / "pcap").glob("*.pcap")):
        write_pcapng(f.with_suffix(".pcapng"), list(read_pcap(f)), snaplen=256)
        f.unlink()
    assert list(read_pcap(ng / "pcap" / "l1-eth1.pcapng"))[0][0] == T0 + POINTS["l1-eth1"]  # exact ns
    res = analyze_run(ng)
    assert res["queries_matched"] == 2 and res["errors"] == []
    for name in ("queries.csv", "hops.csv", "hop_delays.csv"):
        pd.testing.assert_frame_equal(pd.read_csv(ng / "capture" / name), pd.read_csv(ref / "capture" / name))


def test_refused_captures_are_named(tmp_path):
    pk = [(T0, frame(CLI, SRV, CPORT, SPORT, 1, 1, 1, b"x"))]
    write_pcapng(tmp_path / "two.pcapng", pk, interfaces=2)
    with pytest.raises(PcapError, match="pcapng file with 2 interfaces"):
        list(read_pcap(tmp_path / "two.pcapng"))
    write_pcapng(tmp_path / "raw.pcapng", pk, linktype=101)
    with pytest.raises(PcapError, match=r"link type 101, expected Ethernet \(1\)"):
        list(read_pcap(tmp_path / "raw.pcapng"))
    (tmp_path / "text.pcap").write_bytes(b"hello, this is not a capture")
    with pytest.raises(PcapError, match="not a pcap or pcapng file"):
        list(read_pcap(tmp_path / "text.pcap"))
    (tmp_path / "empty.pcap").write_bytes(b"")
    assert list(read_pcap(tmp_path / "empty.pcap")) == []


def test_ipv6_segments_are_left_out_with_a_note(tmp_path):
    d = tmp_path / "pcap"
    d.mkdir()
    v4 = frame(CLI, SRV, CPORT, SPORT, 1, 1, 1, b"x")
    write_pcap(d / "p.pcap", [(T0, v4), (T0 + 1, frame6()), (T0 + 2, frame6())])
    assert parse_tcp(frame6()) == IPV6 and parse_tcp(v4)[0] == CLI
    errors: list[str] = []
    df = load_packets(d, errors=errors)
    assert len(df) == 1 and df["ts_ns"].tolist() == [T0]
    assert len(errors) == 1 and "2 TCP segments over IPv6 left out" in errors[0]


def test_truncated_last_record_is_left_out(tmp_path):
    p = tmp_path / "cut.pcap"
    f = frame(CLI, SRV, CPORT, SPORT, 1, 1, 1, b"x" * 100)
    write_pcap(p, [(T0, f), (T0 + 1, f)])
    p.write_bytes(p.read_bytes()[:-30])  # the capture was killed mid-write
    assert [ts for ts, _ in read_pcap(p)] == [T0]
