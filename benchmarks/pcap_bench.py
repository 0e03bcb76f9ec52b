"""Reading a capture: scapy's full dissection vs dpkt vs what testbed/results/pcap_analysis.py does.

Run: ``nice -n 19 .venv/bin/python benchmarks/pcap_bench.py [--packets 200000] [--baseline-rev 7e10f15]``

Writes a nanosecond pcap of ``--packets`` Ethernet/IPv4/TCP frames (snaplen 256 as the capture
default; two thirds carry a 210-byte HTTP request head, one third are pure ACKs), then times
turning it into the analysis' tuples (addresses, ports, IP ID, seq, ack, flags, payload length,
payload head) per packet:

* ``scapy dissect``: scapy ``RawPcapReader`` + ``Ether(frame)`` and its IP/TCP layers;
* ``dpkt``: ``dpkt.pcap.UniversalReader`` + ``dpkt.ethernet.Ethernet`` (timestamps are floats
  there: 1.8e9 s since the epoch in a float64 keep about 0.24 us, not the ns the capture has);
* ``analysis.py``: :func:`testbed.results.pcap_analysis.read_pcap` (scapy ``RawPcapReader``, exact
  integer ns) + :func:`~testbed.results.pcap_analysis.parse_tcp` (dpkt);
* ``scapy read only``: scapy ``RawPcapReader`` without dissection (the reading cost alone);
* with ``--baseline-rev``: the hand-written reader and parser of that revision (``git show``).

Wall-clock times on a shared machine (say what ran beside it).
"""

from __future__ import annotations

import argparse
import socket
import struct
import subprocess
import tempfile
import time
import types
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
T0 = 1_800_000_000 * 1_000_000_000


def _frame(i: int, payload: bytes) -> bytes:
    tcp = struct.pack("!HHIIBBHHH", 40000 + i % 50, 8501, i * 300, 7, 5 << 4, 0x18, 65535, 0, 0) + payload
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(tcp), i % 65536, 0x4000, 64, 6, 0,
                     bytes([10, 0, 0, 1]), bytes([10, 0, 0, 4]))
    return b"\x00" * 11 + b"\x01" + b"\x08\x00" + ip + tcp


def write_capture(path: Path, n: int, snaplen: int = 256) -> Path:
    """A nanosecond pcap (little endian, Ethernet) of ``n`` frames, 1 us apart."""
    body = b"POST /v1/models/x:predict HTTP/1.1\r\nX-Testbed-Query-Id: a-1\r\n" + b"x" * 150
    with open(path, "wb") as f:
        f.write(struct.pack("<IHHiIII", 0xA1B23C4D, 2, 4, 0, 0, snaplen, 1))
        for i in range(n):
            data = _frame(i, body if i % 3 else b"")
            cut = data[:snaplen]
            ts = T0 + i * 1000
            f.write(struct.pack("<IIII", ts // 10**9, ts % 10**9, len(cut), len(data)) + cut)
    return path


def scapy_dissect(path: Path) -> int:
    from scapy.layers.inet import IP, TCP
    from scapy.layers.l2 import Ether
    from scapy.utils import RawPcapReader

    n = 0
    for data, _meta in RawPcapReader(str(path)):
        e = Ether(data)
        ip, tcp = e.getlayer(IP), e.getlayer(TCP)
        if ip is not None and tcp is not None:
            _ = (ip.src, ip.dst, tcp.sport, tcp.dport, ip.id, tcp.seq, tcp.ack, int(tcp.flags),
                 ip.len - ip.ihl * 4 - tcp.dataofs * 4, bytes(tcp.payload)[:400])
            n += 1
    return n


def dpkt_only(path: Path) -> int:
    import dpkt

    n = 0
    with open(path, "rb") as f:
        for _ts, buf in dpkt.pcap.UniversalReader(f):
            ip = dpkt.ethernet.Ethernet(buf).data
            if isinstance(ip, dpkt.ip.IP) and isinstance(ip.data, dpkt.tcp.TCP):
                tcp = ip.data
                _ = (socket.inet_ntoa(ip.src), socket.inet_ntoa(ip.dst), tcp.sport, tcp.dport, ip.id, tcp.seq,
                     tcp.ack, tcp.flags, ip.len - ip.hl * 4 - tcp.off * 4, bytes(tcp.data[:400]))
                n += 1
    return n


def analysis(path: Path, mod=None) -> int:
    if mod is None:
        from testbed.results import pcap_analysis as mod
    return sum(1 for _ts, f in mod.read_pcap(path) if isinstance(mod.parse_tcp(f), tuple))


def scapy_read_only(path: Path) -> int:
    from scapy.utils import RawPcapReader

    return sum(1 for _ in RawPcapReader(str(path)))


def baseline_module(rev: str) -> types.ModuleType:
    """testbed/results/pcap_analysis.py of revision ``rev``, as a module."""
    src = subprocess.run(["git", "-C", str(REPO), "show", f"{rev}:testbed/results/pcap_analysis.py"], check=True,
                         capture_output=True, text=True).stdout
    mod = types.ModuleType(f"analysis_{rev}")
    exec(compile(src, f"{rev}:testbed/results/pcap_analysis.py", "exec"), mod.__dict__)  # noqa: S102 - our own history
    return mod


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--packets", type=int, default=200_000)
    ap.add_argument("--baseline-rev", default=None, help="also time the parser of this git revision (e.g. 7e10f15)")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = write_capture(Path(tmp) / "bench.pcap", a.packets)
        print(f"{a.packets} packets, {path.stat().st_size / 2**20:.1f} MiB")
        runs = [("scapy dissect", scapy_dissect), ("dpkt", dpkt_only), ("analysis.py (scapy read + dpkt)", analysis),
                ("scapy read only", scapy_read_only)]
        if a.baseline_rev:
            old = baseline_module(a.baseline_rev)
            runs.append((f"hand-written ({a.baseline_rev})", lambda p: analysis(p, old)))
        for name, fn in runs:
            t = time.perf_counter()
            n = fn(path)
            wall = time.perf_counter() - t
            print(f"{name:34s} {n:8d} packets {wall:7.2f} s  {wall / a.packets * 1e6:7.2f} us/packet  "
                  f"{a.packets / wall:10,.0f} packets/s")


if __name__ == "__main__":
    main()
