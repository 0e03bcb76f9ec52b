"""Probe daemon: timestamped UDP probes, packet trains, background traffic and its sink.

One process of this module runs in each emulated host that measures or loads a link (a probe host
at each end of a link that has events, and, for reroutes, every source and cluster host). It is
controlled over a Unix ``SOCK_SEQPACKET`` socket (one JSON object per message, one reply each;
see :class:`ProbeClient`) and does, in one ``epoll`` loop:

* **reflect**: a UDP probe arriving on :data:`PROBE_PORT` is echoed at once with its kernel receive
  time (``SO_TIMESTAMPNS``), the echo's send time and the number of probes received so far from
  that sender. All emulated hosts share one kernel clock (``docs/system-model.md``), so the one-way delay
  of each direction is ``t_rx_remote - t_tx`` and ``t_back - t_echo``, and the loss of each
  direction follows from the counts (``a -> b``: probes sent vs. received by the reflector).
* **probe**: sends probes to its targets at ``hz`` per target (continuously, raised for a while
  around an event) and keeps every sample: ``seq, t_tx, t_rx_remote, t_echo, t_back,
  remote_count`` (ns, unix epoch; ``t_back`` 0 until the echo arrives).
* **train**: ``frames`` back-to-back datagrams; the reflector reports their arrival dispersion per
  quarter of the train, from which the rate the path delivers follows (per quarter, bits of the
  frames after its first over the time between its first and last arrival; the median quarter).
* **blast**: background traffic toward a target's :data:`BLAST_PORT`: ``udp`` datagrams of
  ``size`` bytes with Poisson (exponential) gaps at a mean rate, the model's M/D/1 assumption; or
  one ``tcp`` connection paced by the kernel at the rate (``SO_MAX_PACING_RATE``). Rate 0 stops.
* **sink**: counts what arrives on :data:`BLAST_PORT` (UDP and TCP) in buckets of
  :data:`SINK_BUCKET_NS`, by kernel receive time.

Rates are Mbit/s of Ethernet frames (UDP payload + :data:`FRAME_EXTRA_BYTES`, the unit the link
emulator's shaper and HTB count); times in ns since the Unix epoch unless named ``_s``/``_ms``.
Samples and sink buckets are also appended to ``--out PREFIX.probes.csv`` / ``PREFIX.sink.csv``.

Only the standard library is imported, so the daemon starts in ~50 ms::

    python -m testbed.emu.probe --control /run/.../P3a.sock [--out runs/.../probes/P3a]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import select
import signal
import socket
import statistics
import struct
import sys
import time
from collections import deque
from collections.abc import Iterable, Iterator
from pathlib import Path

from testbed.core.errors import RunFailure
from testbed.emu.control import ControlClient, ControlServer, recv_or_drop
from testbed.emu.linkemu import _TimerFd

PROBE_PORT = 47001
BLAST_PORT = 47002
MAGIC = b"TBPR"
K_PROBE, K_ECHO, K_TRAIN, K_TRAIN_REQ, K_TRAIN_REP, K_BLAST = 1, 2, 3, 4, 5, 6
_HDR = struct.Struct("!4sB3x")
_PROBE = struct.Struct("!4sB3xIq")  # magic, kind, seq, t_tx
_ECHO = struct.Struct("!4sB3xIqqqI")  # magic, kind, seq, t_tx, t_rx_remote, t_echo, remote_count
_TRAIN = struct.Struct("!4sB3xII")  # magic, kind, train id, index
#: magic, kind, id, frames received, then per quarter of the train: frame bytes after its first frame, ns
#: from its first to its last arrival
_TRAIN_REP = struct.Struct("!4sB3xII" + "Qq" * 4)
TRAIN_PARTS = 4
PROBE_BYTES = 64
#: UDP payload -> Ethernet frame: UDP 8 + IPv4 20 + Ethernet 14 bytes.
FRAME_EXTRA_BYTES = 42
SINK_BUCKET_NS = 10_000_000
SO_TIMESTAMPNS = 35
SO_MAX_PACING_RATE = 47
#: Samples kept per target in memory (older ones stay in the CSV only).
MAX_SAMPLES = 200_000
#: An unanswered probe older than this counts as lost in :meth:`ProbeDaemon.samples`.
LOST_AFTER_NS = 2_000_000_000
_TS = struct.Struct("@ll")


def _kernel_ts(anc: Iterable[tuple[int, int, bytes]]) -> int:
    for _level, ctype, data in anc:
        if ctype == SO_TIMESTAMPNS:
            sec, nsec = _TS.unpack_from(data)
            return sec * 1_000_000_000 + nsec
    return time.time_ns()


def _datagrams(sock: socket.socket, most: int, size: int) -> Iterator[tuple[bytes, int, tuple]]:
    """Up to ``most`` datagrams waiting on the non-blocking ``sock`` (at most ``size`` bytes each):
    (data, the kernel's receive stamp in ns, the sender's address); ends when none is left."""
    for _ in range(most):
        try:
            data, anc, _flags, addr = sock.recvmsg(size, 64)
        except BlockingIOError:
            return
        yield data, _kernel_ts(anc), addr


def _train_parts(rows: list[tuple[int, int, int]]) -> list[int]:
    """Per quarter of a train's arrivals (in index order): bytes after the quarter's first frame and
    the ns from its first to its last arrival (flat list). The rate is the median of the quarters':
    a hiccup of the machine (frames held, then delivered in a burst) spoils one quarter, not the
    estimate."""
    rows = sorted(rows)
    out: list[int] = []
    k = max(2, len(rows) // TRAIN_PARTS)
    for p in range(TRAIN_PARTS):
        part = rows[p * k:(p + 1) * k] if p < TRAIN_PARTS - 1 else rows[p * k:]
        if len(part) < 2:
            out += [0, 0]
            continue
        times = [t for _, t, _ in part]
        out += [sum(b for _, _, b in part[1:]), max(times) - min(times)]
    return out


class _Target:
    """Probing state toward one reflector."""

    def __init__(self, name: str, ip: str):
        self.name, self.addr = name, (ip, PROBE_PORT)
        self.seq = 0
        self.samples: deque[list[int]] = deque(maxlen=MAX_SAMPLES)
        self.by_seq: dict[int, list[int]] = {}


class _Blast:
    """Background traffic toward one target."""

    def __init__(self, daemon: ProbeDaemon, ip: str, proto: str, rate_mbps: float, size: int, seed: int):
        self.ip, self.proto, self.size = ip, proto, size
        self.rate_mbps = rate_mbps
        self.rng = random.Random(seed)
        self.next_ns = time.time_ns()
        self.sent_bytes = 0
        self.sock: socket.socket | None = None
        self.payload = _HDR.pack(MAGIC, K_BLAST).ljust(size, b"\0")
        if proto == "tcp":
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.setsockopt(socket.SOL_SOCKET, SO_MAX_PACING_RATE, int(rate_mbps * 1e6 / 8))
            s.settimeout(3.0)
            s.connect((ip, BLAST_PORT))
            s.setblocking(False)
            self.sock = s
            self.chunk = b"\0" * 65536
            daemon.ep.register(s.fileno(), select.EPOLLOUT)
        else:
            self.sock = daemon.udp_blast_tx

    def set_rate(self, rate_mbps: float) -> None:
        self.rate_mbps = rate_mbps
        if self.proto == "tcp" and self.sock is not None:
            self.sock.setsockopt(socket.SOL_SOCKET, SO_MAX_PACING_RATE, int(rate_mbps * 1e6 / 8))
        self.next_ns = time.time_ns()

    def gap_ns(self) -> int:
        """Exponential gap for one datagram at the mean rate (frame bits / rate)."""
        mean = (self.size + FRAME_EXTRA_BYTES) * 8 / (self.rate_mbps * 1e6) * 1e9
        return int(self.rng.expovariate(1.0) * mean)

    def close(self, daemon: ProbeDaemon) -> None:
        if self.proto == "tcp" and self.sock is not None:
            with contextlib.suppress(KeyError, ValueError, OSError):
                daemon.ep.unregister(self.sock.fileno())
            self.sock.close()
        self.sock = None


class ProbeDaemon:
    """The daemon (module docstring). :meth:`run` blocks until SIGTERM/SIGINT or :meth:`stop`.

    Args:
        control_path: the control socket's path (replaced if it exists).
        out_prefix: where to append samples (``.probes.csv``) and sink buckets (``.sink.csv``);
            None: memory only.
        seed: seed of the Poisson gaps of UDP background traffic.
    """

    def __init__(self, control_path: Path, out_prefix: Path | None = None, seed: int = 0):
        self.ep = select.epoll()
        self.udp = self._udp(PROBE_PORT)
        self.sink_udp = self._udp(BLAST_PORT)
        self.sink_tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sink_tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sink_tcp.bind(("0.0.0.0", BLAST_PORT))
        self.sink_tcp.listen(16)
        self.sink_tcp.setblocking(False)
        self.udp_blast_tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.udp_blast_tx.setblocking(False)
        self.control = ControlServer(control_path, self.ep, self.handle)
        self.tcp_conns: dict[int, socket.socket] = {}
        for s in (self.udp, self.sink_udp, self.sink_tcp):
            self.ep.register(s.fileno(), select.EPOLLIN)
        self.wake_r, self.wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self.ep.register(self.wake_r, select.EPOLLIN)
        self.timer = _TimerFd()  # epoll's timeout has only millisecond resolution
        self.ep.register(self.timer.fd, select.EPOLLIN)
        self.rx_count: dict[str, int] = {}  # sender ip -> probes received
        self.targets: dict[str, _Target] = {}
        self.hz = 0.0
        self.boost_hz, self.boost_until = 0.0, 0
        self.next_probe_ns = 0
        self.trains_rx: dict[tuple[str, int], list[tuple[int, int, int]]] = {}  # (ip, id) -> [(idx, t_rx, bytes)]
        self.trains_tx: dict[int, dict] = {}
        self.train_id = 0
        self.blasts: dict[str, _Blast] = {}
        self.seed = seed
        self.sink: deque[list[int]] = deque(maxlen=MAX_SAMPLES)  # [bucket start ns, frame bytes], in time order
        self.sink_written_ns = 0  # buckets up to here are in the CSV
        self.out_prefix = out_prefix
        self._csv = self._sink_csv = None
        if out_prefix is not None:
            out_prefix.parent.mkdir(parents=True, exist_ok=True)
            self._csv = open(f"{out_prefix}.probes.csv", "w")  # noqa: SIM115 - lives with the daemon
            self._csv.write("target,seq,t_tx_ns,t_rx_remote_ns,t_echo_ns,t_back_ns,remote_count\n")
            self._sink_csv = open(f"{out_prefix}.sink.csv", "w")  # noqa: SIM115
            self._sink_csv.write("bucket_start_ns,frame_bytes\n")
        self._flushed_at = 0
        self._stopping = False

    # -- sockets --
    @staticmethod
    def _udp(port: int) -> socket.socket:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 * 1024 * 1024)
        s.bind(("0.0.0.0", port))
        s.setblocking(False)
        return s

    def stop(self) -> None:
        self._stopping = True
        with contextlib.suppress(OSError):
            os.write(self.wake_w, b"x")

    # -- receive --
    def _on_udp(self) -> None:
        for data, t_rx, addr in _datagrams(self.udp, 256, 2048):
            if len(data) < _HDR.size or data[:4] != MAGIC:
                continue
            kind = data[4]
            if kind == K_PROBE:
                n = self.rx_count.get(addr[0], 0) + 1
                self.rx_count[addr[0]] = n
                _, _, seq, t_tx = _PROBE.unpack_from(data)
                echo = _ECHO.pack(MAGIC, K_ECHO, seq, t_tx, t_rx, time.time_ns(), n)
                with contextlib.suppress(OSError):
                    self.udp.sendto(echo.ljust(PROBE_BYTES, b"\0"), addr)
            elif kind == K_ECHO:
                _, _, seq, _t_tx, t_rx_remote, t_echo, count = _ECHO.unpack_from(data)
                tgt = next((t for t in self.targets.values() if t.addr[0] == addr[0]), None)
                row = tgt.by_seq.pop(seq, None) if tgt else None
                if row is not None:
                    row[2], row[3], row[4], row[5] = t_rx_remote, t_echo, t_rx, count
                    self._log(tgt.name, row)
            elif kind == K_TRAIN:
                _, _, tid, idx = _TRAIN.unpack_from(data)
                self.trains_rx.setdefault((addr[0], tid), []).append((idx, t_rx, len(data) + FRAME_EXTRA_BYTES))
            elif kind == K_TRAIN_REQ:
                _, _, tid, _i = _TRAIN.unpack_from(data)
                rows = self.trains_rx.get((addr[0], tid), [])
                with contextlib.suppress(OSError):
                    self.udp.sendto(_TRAIN_REP.pack(MAGIC, K_TRAIN_REP, tid, len(rows), *_train_parts(rows)), addr)
            elif kind == K_TRAIN_REP:
                vals = _TRAIN_REP.unpack_from(data)
                tid, n, parts = vals[2], vals[3], vals[4:]
                tr = self.trains_tx.get(tid)
                if tr is not None and tr.get("frames_received") is None:
                    rates = [b * 8 / dt * 1e3 for b, dt in zip(parts[::2], parts[1::2], strict=True) if dt > 0 and b]
                    tr.update(frames_received=n, part_rates_mbps=[round(r, 3) for r in rates],
                              rate_mbps=statistics.median(rates) if rates else None)

    def _on_sink_udp(self) -> None:
        for data, t_rx, _addr in _datagrams(self.sink_udp, 512, 65536):
            self._count(t_rx, len(data) + FRAME_EXTRA_BYTES)

    def _count(self, t_ns: int, nbytes: int) -> None:
        b = t_ns - t_ns % SINK_BUCKET_NS
        sink = self.sink
        if not sink or sink[-1][0] < b:
            sink.append([b, 0])
        elif sink[-1][0] > b:  # a late timestamp: count it in the bucket it belongs to, if kept
            for row in reversed(sink):
                if row[0] <= b:
                    if row[0] == b:
                        row[1] += nbytes
                    return
            return
        sink[-1][1] += nbytes

    def _on_tcp_conn(self, fd: int) -> None:
        data = recv_or_drop(self.ep, self.tcp_conns, fd, 1 << 20)
        if not data:
            return
        # TCP payload -> frame bytes: one 1448-byte segment per 1514-byte frame (MSS at MTU 1500)
        self._count(time.time_ns(), len(data) * 1514 // 1448)

    # -- send --
    def _probe_tick(self, now: int) -> None:
        hz = self.boost_hz if now < self.boost_until else self.hz
        if hz <= 0 or not self.targets or now < self.next_probe_ns:
            return
        for tgt in self.targets.values():
            tgt.seq += 1
            t_tx = time.time_ns()
            row = [tgt.seq, t_tx, 0, 0, 0, 0]
            with contextlib.suppress(OSError):
                self.udp.sendto(_PROBE.pack(MAGIC, K_PROBE, tgt.seq, t_tx).ljust(PROBE_BYTES, b"\0"), tgt.addr)
            tgt.samples.append(row)
            tgt.by_seq[tgt.seq] = row
            if len(tgt.by_seq) > 4096:  # unanswered for long: lost
                for old in sorted(tgt.by_seq)[:2048]:
                    self._log(tgt.name, tgt.by_seq.pop(old))
        step = int(1e9 / hz)
        self.next_probe_ns = max(self.next_probe_ns + step, now - step)

    def _blast_tick(self, now: int) -> None:
        for b in self.blasts.values():
            if b.proto != "udp" or b.rate_mbps <= 0:
                continue
            n = 0
            while b.next_ns <= now and n < 256:
                try:
                    self.udp_blast_tx.sendto(b.payload, (b.ip, BLAST_PORT))
                    b.sent_bytes += b.size + FRAME_EXTRA_BYTES
                except BlockingIOError:
                    break
                except OSError:
                    pass
                b.next_ns += b.gap_ns()
                n += 1
            if b.next_ns < now - 50_000_000:  # more than 50 ms behind (descheduled): do not burst it all
                b.next_ns = now

    def _on_tcp_writable(self, fd: int) -> None:
        for b in self.blasts.values():
            if b.proto == "tcp" and b.sock is not None and b.sock.fileno() == fd:
                try:
                    b.sent_bytes += b.sock.send(b.chunk)
                except BlockingIOError:
                    pass
                except OSError:
                    b.close(self)
                return

    def _next_wakeup_ns(self, now: int) -> int | None:
        cands = []
        hz = self.boost_hz if now < self.boost_until else self.hz
        if hz > 0 and self.targets:
            cands.append(self.next_probe_ns)
            if now < self.boost_until:
                cands.append(self.boost_until)
        cands += [b.next_ns for b in self.blasts.values() if b.proto == "udp" and b.rate_mbps > 0]
        cands.append(now + 500_000_000)  # CSV flush
        return min(cands) if cands else None

    # -- control --
    def handle(self, msg: dict) -> dict:
        """Answer one control message (see :class:`ProbeClient`); never raises."""
        try:
            op = msg.get("op")
            fn = getattr(self, f"op_{op}", None)
            if fn is None:
                raise ValueError(f"unknown op {op!r}")
            return {"ok": True, "t": time.time_ns(), **(fn(msg) or {})}
        except (ValueError, TypeError, KeyError, OSError) as exc:
            return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}

    def op_ping(self, msg: dict) -> dict:
        return {"targets": sorted(self.targets)}

    def op_probe(self, msg: dict) -> dict:
        """``targets: {name: ip}`` (replaces the set; omit to keep it), ``hz`` per target."""
        if "targets" in msg:
            new = {n: _Target(n, ip) for n, ip in dict(msg["targets"]).items()}
            for n, t in self.targets.items():
                if n in new and new[n].addr == t.addr:
                    new[n] = t
            self.targets = new
        self.hz = float(msg.get("hz", self.hz))
        if self.hz < 0:
            raise ValueError("hz must be >= 0")
        self.next_probe_ns = time.time_ns()
        return {}

    def op_boost(self, msg: dict) -> dict:
        """``hz`` per target for ``for_s`` seconds, then back to the base rate."""
        self.boost_hz = float(msg["hz"])
        self.boost_until = time.time_ns() + int(float(msg["for_s"]) * 1e9)
        self.next_probe_ns = time.time_ns()
        return {"until_ns": self.boost_until}

    def op_samples(self, msg: dict) -> dict:
        """Samples of ``target`` sent at or after ``since_ns`` (and before ``until_ns``):
        ``[seq, t_tx, t_rx_remote, t_echo, t_back, remote_count]`` (0: no echo yet)."""
        tgt = self.targets[msg["target"]]
        since, until = int(msg.get("since_ns", 0)), int(msg.get("until_ns", 2**63 - 1))
        rows = [r for r in tgt.samples if since <= r[1] < until]
        return {"samples": rows}

    def op_train(self, msg: dict) -> dict:
        """Send ``frames`` datagrams of ``size`` bytes back to back to ``ip``; returns ``id``."""
        ip, frames, size = msg["ip"], int(msg["frames"]), int(msg.get("size", 1458))
        if not 2 <= frames <= 10000 or not 64 <= size <= 1472:
            raise ValueError("frames in [2, 10000], size in [64, 1472] bytes")
        self.train_id += 1
        tid = self.train_id
        t0 = time.time_ns()
        sent = 0
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 8 * 1024 * 1024)
        try:
            for i in range(frames):
                with contextlib.suppress(OSError):
                    s.sendto(_TRAIN.pack(MAGIC, K_TRAIN, tid, i).ljust(size, b"\0"), (ip, PROBE_PORT))
                    sent += 1
        finally:
            s.close()
        t1 = time.time_ns()
        self.trains_tx[tid] = {"id": tid, "ip": ip, "frames_sent": sent, "size": size,
                               "send_rate_mbps": sent * (size + FRAME_EXTRA_BYTES) * 8 / max(1, t1 - t0) * 1e3,
                               "t_start_ns": t0}
        return {"id": tid, "t_start_ns": t0, "t_end_ns": t1}

    def op_train_result(self, msg: dict) -> dict:
        """Ask the reflector for train ``id``'s report (again); the result so far."""
        tr = self.trains_tx[int(msg["id"])]
        with contextlib.suppress(OSError):
            self.udp.sendto(_TRAIN.pack(MAGIC, K_TRAIN_REQ, tr["id"], 0), (tr["ip"], PROBE_PORT))
        return {"train": tr}

    def op_blast(self, msg: dict) -> dict:
        """Background traffic to ``ip`` at ``rate_mbps`` (0 stops), ``proto`` udp|tcp, ``size``."""
        ip, rate = msg["ip"], float(msg["rate_mbps"])
        proto, size = msg.get("proto", "udp"), int(msg.get("size", 1458))
        if proto not in ("udp", "tcp") or rate < 0 or not 64 <= size <= 1472:
            raise ValueError("proto udp|tcp, rate_mbps >= 0, size in [64, 1472]")
        old = self.blasts.get(ip)
        if old is not None and (rate == 0 or old.proto != proto):
            old.close(self)
            del self.blasts[ip]
            old = None
        if rate > 0:
            if old is None:
                self.seed += 1
                self.blasts[ip] = _Blast(self, ip, proto, rate, size, self.seed)
            else:
                old.set_rate(rate)
        return {"t_applied_ns": time.time_ns()}

    def op_sink(self, msg: dict) -> dict:
        """Sink buckets ``[start_ns, frame_bytes]`` from ``since_ns`` on (bucket SINK_BUCKET_NS)."""
        since = int(msg.get("since_ns", 0))
        return {"bucket_ns": SINK_BUCKET_NS, "buckets": [row for row in self.sink if row[0] >= since]}

    def op_stats(self, msg: dict) -> dict:
        return {"rx_count": self.rx_count, "blasts": {ip: {"proto": b.proto, "rate_mbps": b.rate_mbps,
                                                            "sent_bytes": b.sent_bytes}
                                                       for ip, b in self.blasts.items()}}

    # -- output --
    def _log(self, name: str, row: list[int]) -> None:
        if self._csv is not None:
            self._csv.write(f"{name},{','.join(map(str, row))}\n")

    def _flush(self, now: int, final: bool = False) -> None:
        if self._csv is None or (not final and now - self._flushed_at < 1_000_000_000):
            return
        self._flushed_at = now
        cut = now - LOST_AFTER_NS
        for tgt in self.targets.values():
            for seq in [s for s, r in tgt.by_seq.items() if r[1] < cut or final]:
                self._log(tgt.name, tgt.by_seq.pop(seq))
        self._csv.flush()
        for b, nbytes in self.sink:
            if b > self.sink_written_ns and (b < now - SINK_BUCKET_NS or final):
                self._sink_csv.write(f"{b},{nbytes}\n")
                self.sink_written_ns = b
        self._sink_csv.flush()

    def run(self) -> None:
        """The loop (module docstring)."""
        poll = self.ep.poll
        while not self._stopping:
            now = time.time_ns()
            self._probe_tick(now)
            self._blast_tick(now)
            self._flush(now)
            nxt = self._next_wakeup_ns(time.time_ns())
            if nxt is not None:
                self.timer.arm(time.monotonic() + (nxt - time.time_ns()) / 1e9)
            for fd, ev in poll():
                if fd == self.timer.fd:
                    self.timer.clear()
                elif fd == self.udp.fileno():
                    self._on_udp()
                elif fd == self.sink_udp.fileno():
                    self._on_sink_udp()
                elif fd == self.sink_tcp.fileno():
                    with contextlib.suppress(BlockingIOError):
                        conn, _ = self.sink_tcp.accept()
                        conn.setblocking(False)
                        self.tcp_conns[conn.fileno()] = conn
                        self.ep.register(conn.fileno(), select.EPOLLIN)
                elif fd in self.tcp_conns:
                    self._on_tcp_conn(fd)
                elif fd == self.wake_r:
                    with contextlib.suppress(BlockingIOError):
                        os.read(self.wake_r, 64)
                elif self.control.owns(fd):
                    self.control.serve(fd)
                elif ev & select.EPOLLOUT:
                    self._on_tcp_writable(fd)
        self._flush(time.time_ns(), final=True)
        self.control.close()


class ProbeError(RunFailure):
    """The probe daemon cannot be reached or refused a request."""


class ProbeClient(ControlClient):
    """Client of a probe daemon's control socket (:mod:`testbed.emu.control`).

    Messages (``op`` and its fields; every reply has ``ok`` and ``t`` (ns)):
    ``probe {targets: {name: ip}, hz}``, ``boost {hz, for_s}``, ``samples {target, since_ns,
    until_ns} -> samples``, ``train {ip, frames, size} -> id``, ``train_result {id} -> train``,
    ``blast {ip, rate_mbps, proto, size}``, ``sink {since_ns} -> buckets``, ``stats``, ``ping``.

    Raises:
        ProbeError: (from :meth:`request`) unreachable, timed out, or ``ok: false``.
    """

    def __init__(self, path: str | Path, timeout_s: float = 5.0):
        super().__init__(path, timeout_s, ProbeError)

    def request(self, op: str, **fields) -> dict:
        return self.call({"op": op, **fields})


def wait_ready(path: str | Path, timeout_s: float = 10.0, proc=None) -> ProbeClient:
    """A client once the daemon at ``path`` answers ``ping``.

    Raises:
        ProbeError: it did not answer within ``timeout_s`` or its process exited.
    """
    deadline = time.monotonic() + timeout_s
    client = ProbeClient(path)
    while True:
        try:
            client.request("ping")
            return client
        except ProbeError as exc:
            if proc is not None and proc.poll() is not None:
                raise ProbeError(f"probe daemon for {path} exited with code {proc.returncode}") from None
            if time.monotonic() > deadline:
                raise ProbeError(f"probe daemon did not answer within {timeout_s:g} s: {exc}") from None
            time.sleep(0.05)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m testbed.emu.probe", description=__doc__.split("\n")[0])
    p.add_argument("--control", type=Path, required=True, help="Unix control socket path")
    p.add_argument("--out", type=Path, default=None, help="CSV prefix for samples and sink buckets")
    p.add_argument("--seed", type=int, default=0, help="seed of the UDP background's Poisson gaps")
    args = p.parse_args(argv)
    d = ProbeDaemon(args.control, args.out, args.seed)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda _s, _f: d.stop())
    print(f"probe ready: {args.control}", flush=True)
    d.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
