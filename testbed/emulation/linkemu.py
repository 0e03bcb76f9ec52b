"""User-space link emulator: forwards Ethernet frames between two interfaces after a delay.

Used where the kernel has no ``netem`` qdisc (see ``environment.md``: the build/CI machines). A
delayed link ``s1 <-> s2`` is built as ``s1-ethX <-> lN-eth0 | lN-eth1 <-> s2-ethY``, and one
process of this module runs in the namespace of ``lN``, forwarding *every* frame (LLDP, ARP, IP,
VLAN-tagged or not) unchanged from one interface to the other after the link's one-way delay,
in both directions. Bandwidth is not shaped here (HTB on the switch ports does that)::

    python -m testbed.emulation.linkemu --if-a lN-eth0 --if-b lN-eth1 --delay-ms 10 \\
        [--jitter-ms 1] [--loss-pct 0.5] [--seed 7] [--stats-file run/linkemu/lN.json]

Units: delays in milliseconds (``*_ms``), loss in percent, socket buffers in bytes, lateness in
microseconds (``*_us``).

Design (and where each choice comes from):

* Two ``AF_PACKET``/``SOCK_RAW`` sockets bound with ``ETH_P_ALL`` to the two interfaces
  (packet(7)), promiscuous membership so that real NICs hand over frames for any MAC.
* Frames this process sent itself come back to a packet socket as ``PACKET_OUTGOING``; they are
  suppressed in the kernel with ``PACKET_IGNORE_OUTGOING`` (Linux >= 4.20) and, in any case,
  skipped by the ``pkttype`` field of the address ``recvmsg`` returns.
* The kernel moves 802.1Q tags out of the frame (``skb_vlan_untag``) before packet sockets see
  it; the tag comes back through ``PACKET_AUXDATA`` and is re-inserted, as libpcap does.
* Each frame's delay counts from the kernel's receive timestamp (``SO_TIMESTAMPNS``, converted
  from CLOCK_REALTIME to CLOCK_MONOTONIC), so the time a frame waits in the socket buffer while
  the emulator is busy is part of its delay rather than added to it. If a timestamp is missing
  or implausible the time of reading is used instead.
* One single-threaded ``epoll`` loop; one FIFO (``deque``) per direction. With a constant delay
  the due times are monotonic; with jitter a frame is never sent before its predecessor in the
  same direction (``due = max(due, previous due)``), so frames are **never reordered** (unlike
  netem with jitter). Sockets are drained in batches of :data:`RX_BATCH` frames.
* Sleeping until the next due frame uses a ``timerfd`` (nanosecond ``hrtimer``, no timer slack)
  in the epoll set, because ``epoll_wait``'s timeout has only millisecond resolution. At idle the
  process blocks in ``epoll_wait`` with no timeout: no spinning, ~0 CPU.
* Large socket buffers (:data:`DEFAULT_SOCKBUF_BYTES`, forced past ``net.core.rmem_max`` with
  ``SO_RCVBUFFORCE`` as root) absorb bursts while the process is descheduled on a busy machine.
* Checksum/segmentation offloads must be off on the veths (:func:`disable_offloads`): a packet
  socket sees a locally generated frame before its checksum is filled in or before it is
  segmented, and forwarding it as is breaks TCP (measured: TCP stalls). The emulator warns once
  when it sees such frames.

Performance (pure Python is enough; measured with ``benchmarks/linkemu_bench.py`` on the 2-core
build machine while other jobs loaded it, three runs): one bulk TCP flow through one link gets
407-670 Mbit/s with the emulator at 60-97 % of a core (two thirds of it kernel time), above the
>= 200 Mbit/s the testbed needs. Added RTT at idle (two passes, delay 0): median 0.17-0.20 ms,
p99 0.27-3.5 ms (the larger figure when the machine was busy). RTT at 2 x 10 ms: min 20.1 ms,
median 20.2-20.3 ms; at 2 x 0.5 ms: median 1.14-1.20 ms. Idle CPU: 0.00 %. When the emulator is
the bottleneck (unshaped TCP above ~500 Mbit/s) frames queue in its socket buffer: RTT at
2 x 5 ms rose to a median of 16.5-19.7 ms; with the sender shaped to 200 Mbit/s by HTB (as in
the testbed) it was 13.0-13.4 ms, mostly HTB's own queue (emulator lateness ~0.2 ms).

On SIGTERM/SIGINT the process writes its statistics as JSON (:class:`LinkStats`) to
``--stats-file`` (and stdout) and exits 0.
"""

from __future__ import annotations

import argparse
import ctypes
import errno
import functools
import json
import os
import random
import secrets
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

# --- Linux constants (linux/if_packet.h, asm-generic/socket.h, linux/timerfd.h) --------------
ETH_P_ALL = 0x0003
SOL_PACKET = 263
PACKET_ADD_MEMBERSHIP = 1
PACKET_MR_PROMISC = 1
PACKET_AUXDATA = 8
PACKET_STATISTICS = 6
PACKET_IGNORE_OUTGOING = 23
PACKET_OUTGOING = 4
TP_STATUS_CSUMNOTREADY = 1 << 3
TP_STATUS_VLAN_VALID = 1 << 4
TP_STATUS_VLAN_TPID_VALID = 1 << 6
SO_SNDBUFFORCE = 32
SO_RCVBUFFORCE = 33
SO_TIMESTAMPNS = 35  # == SCM_TIMESTAMPNS; the "old" 64-bit layout: struct timespec {long; long}
CLOCK_MONOTONIC = 1
TFD_TIMER_ABSTIME = 1
TFD_NONBLOCK = os.O_NONBLOCK
TFD_CLOEXEC = os.O_CLOEXEC

#: Frames read from one socket before the loop looks at due frames and the other socket again
#: (64 x ~5 us per frame: due frames wait at most ~0.3 ms behind a burst).
RX_BATCH = 64
#: Receive buffer per frame: the largest veth MTU (64 KiB) plus an Ethernet header.
RX_BUFSIZE = 65536 + 14
#: Room for PACKET_AUXDATA (20 bytes) and SCM_TIMESTAMPNS (16 bytes) control messages.
ANC_BUFSIZE = socket.CMSG_SPACE(20) + socket.CMSG_SPACE(16) + 16
#: Default SO_RCVBUF/SO_SNDBUF request in bytes, forced past ``net.core.[rw]mem_max``. The kernel
#: doubles it and charges each frame's skb truesize (~2.3 KiB for a full-size frame): ~900 frames,
#: ~20 ms at 500 Mbit/s, enough to ride out the emulator being descheduled on a busy machine
#: without drops. It is also the standing queue TCP builds when the emulator itself is the
#: bottleneck (CPU-bound, above ~500 Mbit/s here): measured mean ping RTT at 2 x 5 ms under such
#: overload, 13.5 / 21.6 / 25 / 32 ms for 256 KiB / 1 MiB / 2 MiB / 4 MiB (one run each; 256 KiB
#: and 1 MiB lost ~7 % of the pings, i.e. TCP filled the buffer either way).
DEFAULT_SOCKBUF_BYTES = 1024 * 1024
#: Default nice value of the emulator process. netem runs in softirq context, ahead of every
#: process; a negative nice keeps this replacement from waiting behind CPU-bound processes
#: (measured on the 2-core build machine at load 2: idle p99 RTT 4.1 ms at nice 0, 0.3-0.7 ms at -10).
DEFAULT_NICE = -10
#: Default FIFO limit per direction, in frames (netem's default ``limit`` is 1000 packets; this is
#: larger so that long delays at high rates are not capped: 20000 frames = 240 ms at 1 Gbit/s).
DEFAULT_QUEUE_LIMIT = 20000
#: A kernel timestamp older than this (seconds) is not trusted; the read time is used instead.
MAX_TIMESTAMP_AGE_S = 1.0
#: How often (seconds) the CLOCK_REALTIME -> CLOCK_MONOTONIC offset is re-measured.
CLOCK_OFFSET_REFRESH_S = 0.5

_AUXDATA = struct.Struct("=IIIHHHH")  # struct tpacket_auxdata
_TIMESPEC = struct.Struct("@ll")  # struct timespec (the "old" layout SO_TIMESTAMPNS delivers)
_VLAN_TAG = struct.Struct("!HH")
_PACKET_MREQ = struct.Struct("=iHH8s")  # struct packet_mreq
_TPACKET_STATS = struct.Struct("=II")  # struct tpacket_stats {tp_packets; tp_drops}


class LinkEmuError(RuntimeError):
    """The link emulator (or one of its helpers) cannot run: bad interface, missing tool, no root."""


# --- helpers used by the testbed --------------------------------------------------------------

def _run(cmd: Sequence[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(cmd), capture_output=True, text=True, check=False)


@functools.lru_cache(maxsize=1)
def netem_available() -> bool:
    """Whether this kernel can attach a ``netem`` qdisc (cached for the process's lifetime).

    The probe creates a throwaway network namespace ``tbprobe-<pid>-<random>`` holding a dummy
    interface ``d0`` (a veth pair ``d0``/``d1`` if the dummy driver is missing), runs
    ``tc qdisc add dev d0 root netem delay 1ms`` in it, and always deletes the namespace. Nothing
    in other namespaces is touched. A loaded ``sch_netem`` module short-cuts the probe.

    Returns:
        True if the qdisc could be added, False if the kernel refuses it (e.g. "Specified qdisc
        kind is unknown").

    Raises:
        LinkEmuError: the probe itself cannot run (not root, ``ip``/``tc`` missing, namespaces
            unavailable), so the answer would be a guess.
    """
    if Path("/sys/module/sch_netem").exists():
        return True
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            raise LinkEmuError(f"cannot probe for netem: '{tool}' not found (install iproute2)")
    ns = f"tbprobe-{os.getpid()}-{secrets.token_hex(3)}"
    made = _run(["ip", "netns", "add", ns])
    if made.returncode != 0:
        raise LinkEmuError(f"cannot probe for netem: 'ip netns add {ns}' failed (root needed): "
                           f"{made.stderr.strip()}")
    try:
        link = _run(["ip", "-n", ns, "link", "add", "d0", "type", "dummy"])
        if link.returncode != 0:
            link = _run(["ip", "-n", ns, "link", "add", "d0", "type", "veth", "peer", "name", "d1"])
        if link.returncode != 0:
            raise LinkEmuError(f"cannot probe for netem: no dummy or veth interface in {ns}: "
                               f"{link.stderr.strip()}")
        tc = _run(["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", "d0", "root",
                   "netem", "delay", "1ms"])
        return tc.returncode == 0
    finally:
        _run(["ip", "netns", "del", ns])


#: Offloads switched off by :func:`disable_offloads` (ethtool -K names).
OFFLOAD_FEATURES: tuple[str, ...] = ("rx", "tx", "sg", "tso", "gso", "gro")


def disable_offloads(ifname: str, netns: str | int | None = None) -> None:
    """Switch off checksum and segmentation offloads on ``ifname`` with ``ethtool -K``.

    Needed on every veth a link emulator touches (see the module docstring).

    Args:
        ifname: interface name.
        netns: ``None`` for the current namespace, a ``str`` for a named namespace
            (``ip netns exec NAME``), or an ``int`` pid whose namespace to enter
            (``nsenter -t PID -n``, e.g. a Mininet node's shell).

    Raises:
        LinkEmuError: ``ethtool`` (or ``nsenter``/``ip``) is not installed, or ethtool failed
            (the message carries its stderr).
    """
    cmd = ["ethtool", "-K", ifname]
    for feature in OFFLOAD_FEATURES:
        cmd += [feature, "off"]
    if shutil.which("ethtool") is None:
        raise LinkEmuError("ethtool not found: install it (apt-get install ethtool); the link emulator "
                           "needs offloads off on its veths")
    if isinstance(netns, str):
        cmd = ["ip", "netns", "exec", netns, *cmd]
    elif isinstance(netns, int):
        cmd = ["nsenter", "-t", str(netns), "-n", *cmd]
    try:
        res = _run(cmd)
    except FileNotFoundError as exc:
        raise LinkEmuError(f"cannot run {cmd[0]}: {exc}") from None
    if res.returncode != 0:
        where = f" in namespace {netns}" if netns is not None else ""
        raise LinkEmuError(f"'{' '.join(cmd)}' failed{where}: {(res.stderr or res.stdout).strip()}")


# --- timerfd through ctypes (os.timerfd_* only exists from Python 3.13) ---------------------------

class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


class _TimerFd:
    """A one-shot CLOCK_MONOTONIC timerfd armed at absolute times (seconds, ``time.monotonic``)."""

    def __init__(self) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        self._settime = libc.timerfd_settime
        self._settime.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.POINTER(_Itimerspec),
                                  ctypes.c_void_p]
        fd = libc.timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC)
        if fd < 0:
            raise OSError(ctypes.get_errno(), "timerfd_create failed")
        self.fd: int = fd
        self._spec = _Itimerspec()
        self._ref = ctypes.byref(self._spec)

    def arm(self, when: float) -> None:
        """Fire at monotonic time ``when`` (seconds); a time in the past fires at once."""
        sec = int(when)
        nsec = int((when - sec) * 1e9) or 1  # it_value == 0 would disarm
        self._spec.it_value.tv_sec = sec
        self._spec.it_value.tv_nsec = nsec
        if self._settime(self.fd, TFD_TIMER_ABSTIME, self._ref, None) != 0:
            raise OSError(ctypes.get_errno(), "timerfd_settime failed")

    def clear(self) -> None:
        """Consume an expiry so that the fd is no longer readable."""
        try:
            os.read(self.fd, 8)
        except BlockingIOError:
            pass

    def close(self) -> None:
        os.close(self.fd)


# --- the emulator -------------------------------------------------------------------------------

@dataclass
class LinkConfig:
    """Parameters of one emulated link (the same in both directions).

    Attributes:
        if_a, if_b: the two interfaces (in the current namespace).
        delay_ms: one-way delay in milliseconds.
        jitter_ms: uniform jitter in milliseconds: each frame's delay is drawn from
            ``[delay - jitter, delay + jitter]`` (clamped at 0, as netem's default distribution),
            then raised if needed so that frames stay in order.
        loss_pct: independent (Bernoulli) loss probability per frame and direction, percent.
        seed: seed of the per-direction random generators (loss and jitter); ``None`` draws one,
            which is reported in the stats.
        sockbuf_bytes: SO_RCVBUF/SO_SNDBUF request in bytes.
        queue_limit: frames held per direction; beyond it frames are dropped (``overflow_*``).
    """

    if_a: str
    if_b: str
    delay_ms: float
    jitter_ms: float = 0.0
    loss_pct: float = 0.0
    seed: int | None = None
    sockbuf_bytes: int = DEFAULT_SOCKBUF_BYTES
    queue_limit: int = DEFAULT_QUEUE_LIMIT

    def validate(self) -> None:
        """Check the parameters.

        Raises:
            LinkEmuError: a negative delay/jitter, loss outside [0, 100], the same interface
                twice, a queue limit below 1 or socket buffers below 64 KiB.
        """
        if self.delay_ms < 0 or self.jitter_ms < 0:
            raise LinkEmuError(f"delay_ms and jitter_ms must be >= 0 (got {self.delay_ms}, {self.jitter_ms})")
        if not 0.0 <= self.loss_pct <= 100.0:
            raise LinkEmuError(f"loss_pct must be within [0, 100] (got {self.loss_pct})")
        if self.if_a == self.if_b:
            raise LinkEmuError(f"--if-a and --if-b are the same interface ({self.if_a})")
        if self.queue_limit < 1 or self.sockbuf_bytes < 65536:
            raise LinkEmuError("queue_limit must be >= 1 and sockbuf_bytes >= 65536")


@dataclass
class _Direction:
    """One direction: frames read from ``rx`` leave through ``tx`` after the delay."""

    name: str
    rx: socket.socket
    tx: socket.socket
    rng: random.Random
    queue: deque[tuple[float, bytes]] = field(default_factory=deque)
    last_due: float = 0.0
    frames: int = 0
    bytes: int = 0
    lost: int = 0
    overflow: int = 0
    send_errors: int = 0
    truncated: int = 0
    ts_fallbacks: int = 0
    kernel_drops: int = 0
    blocked: bool = False  # tx returned EAGAIN: wait for EPOLLOUT


@dataclass
class LinkStats:
    """Counters written on exit. Frames/bytes count what was *delivered* (sent out)."""

    frames_ab: int
    frames_ba: int
    bytes_ab: int
    bytes_ba: int
    lost_ab: int
    lost_ba: int
    max_lateness_us: float
    mean_lateness_us: float
    overflow_ab: int = 0
    overflow_ba: int = 0
    send_errors_ab: int = 0
    send_errors_ba: int = 0
    kernel_drops_ab: int = 0
    kernel_drops_ba: int = 0
    truncated: int = 0
    rx_time_fallbacks: int = 0
    queued_at_exit: int = 0
    delay_ms: float = 0.0
    jitter_ms: float = 0.0
    loss_pct: float = 0.0
    seed: int = 0
    runtime_s: float = 0.0


def _open_packet_socket(ifname: str, sockbuf: int) -> socket.socket:
    """A non-blocking packet socket receiving every frame of ``ifname`` (see the module docstring).

    Raises:
        LinkEmuError: no such interface, or no permission for raw sockets.
    """
    try:
        ifindex = socket.if_nametoindex(ifname)
    except OSError:
        raise LinkEmuError(f"no interface named {ifname!r} in this network namespace") from None
    try:
        # protocol 0: nothing is received until bind() names the interface and ETH_P_ALL
        sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
    except PermissionError:
        raise LinkEmuError("raw AF_PACKET sockets need root (CAP_NET_RAW)") from None
    for force, plain in ((SO_RCVBUFFORCE, socket.SO_RCVBUF), (SO_SNDBUFFORCE, socket.SO_SNDBUF)):
        try:
            sock.setsockopt(socket.SOL_SOCKET, force, sockbuf)
        except OSError:  # no CAP_NET_ADMIN: capped by net.core.[rw]mem_max
            sock.setsockopt(socket.SOL_SOCKET, plain, sockbuf)
    try:
        sock.setsockopt(SOL_PACKET, PACKET_IGNORE_OUTGOING, 1)
    except OSError:  # kernel < 4.20: the pkttype check below still filters them
        pass
    sock.setsockopt(SOL_PACKET, PACKET_AUXDATA, 1)
    sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    sock.setsockopt(SOL_PACKET, PACKET_ADD_MEMBERSHIP,
                    _PACKET_MREQ.pack(ifindex, PACKET_MR_PROMISC, 0, b""))
    sock.bind((ifname, ETH_P_ALL))  # Python converts the protocol to network byte order
    sock.setblocking(False)
    return sock


class LinkEmulator:
    """Forwards frames between ``cfg.if_a`` and ``cfg.if_b`` after the configured delay.

    Call :meth:`run` (blocks until :meth:`stop`, SIGTERM or SIGINT), then :meth:`stats`.

    Raises (from the constructor):
        LinkEmuError: bad parameters, an interface is missing, or no root.
    """

    def __init__(self, cfg: LinkConfig) -> None:
        cfg.validate()
        self.cfg = cfg
        self.seed = cfg.seed if cfg.seed is not None else secrets.randbits(32)
        self._delay = cfg.delay_ms / 1000.0
        self._jitter = cfg.jitter_ms / 1000.0
        self._loss = cfg.loss_pct / 100.0
        sa = _open_packet_socket(cfg.if_a, cfg.sockbuf_bytes)
        try:
            sb = _open_packet_socket(cfg.if_b, cfg.sockbuf_bytes)
        except BaseException:
            sa.close()
            raise
        self._socks = (sa, sb)
        self._ifindex = {cfg.if_a: socket.if_nametoindex(cfg.if_a), cfg.if_b: socket.if_nametoindex(cfg.if_b)}
        # String seeds are hashed with SHA-512 by random.seed: stable across runs and versions.
        self._ab = _Direction("ab", sa, sb, random.Random(f"linkemu:{self.seed}:ab"))
        self._ba = _Direction("ba", sb, sa, random.Random(f"linkemu:{self.seed}:ba"))
        self._by_rx = {sa.fileno(): self._ab, sb.fileno(): self._ba}
        self._by_tx = {sb.fileno(): self._ab, sa.fileno(): self._ba}
        self._timer = _TimerFd()
        self._ep = select.epoll()
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._stopping = False
        self._late_sum = 0.0
        self._late_n = 0
        self._late_max = 0.0
        self._warned: set[str] = set()
        self._started = time.monotonic()
        self._clock_offset = 0.0
        self._offset_at = 0.0
        self.fatal: str | None = None

    # -- control --
    def stop(self) -> None:
        """Ask the loop to finish (safe from a signal handler)."""
        self._stopping = True
        try:
            os.write(self._wake_w, b"x")
        except OSError:
            pass

    def install_signal_handlers(self) -> None:
        """SIGTERM and SIGINT stop the loop (and then the caller writes stats)."""
        signal.set_wakeup_fd(self._wake_w, warn_on_full_buffer=False)
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda _s, _f: self.stop())

    def close(self) -> None:
        for s in self._socks:
            s.close()
        self._timer.close()
        self._ep.close()
        os.close(self._wake_r)
        os.close(self._wake_w)

    def _warn(self, key: str, msg: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            print(f"linkemu: warning: {msg}", file=sys.stderr, flush=True)

    # -- receive --
    def _refresh_clock_offset(self, now: float) -> None:
        a = time.monotonic()
        rt = time.time()
        b = time.monotonic()
        self._clock_offset = rt - (a + b) / 2.0
        self._offset_at = now

    def _drain(self, d: _Direction) -> None:
        """Read up to RX_BATCH frames from ``d.rx`` into ``d.queue``."""
        recvmsg = d.rx.recvmsg
        queue = d.queue
        rng = d.rng
        loss, delay, jitter = self._loss, self._delay, self._jitter
        limit = self.cfg.queue_limit
        now = time.monotonic()
        if now - self._offset_at > CLOCK_OFFSET_REFRESH_S:
            self._refresh_clock_offset(now)
        offset = self._clock_offset
        oldest = now - MAX_TIMESTAMP_AGE_S
        for _ in range(RX_BATCH):
            try:
                data, anc, flags, addr = recvmsg(RX_BUFSIZE, ANC_BUFSIZE)
            except BlockingIOError:
                return
            except OSError as exc:
                self._rx_error(d, exc)
                return
            if addr[2] == PACKET_OUTGOING:
                continue
            if flags & socket.MSG_TRUNC:
                d.truncated += 1
                continue
            ts = 0.0
            for _level, ctype, cdata in anc:
                if ctype == SO_TIMESTAMPNS:
                    sec, nsec = _TIMESPEC.unpack_from(cdata)
                    ts = sec + nsec * 1e-9 - offset
                elif ctype == PACKET_AUXDATA:
                    status, _len, _snap, _mac, _net, tci, tpid = _AUXDATA.unpack_from(cdata)
                    if status & TP_STATUS_VLAN_VALID:
                        if not status & TP_STATUS_VLAN_TPID_VALID:
                            tpid = 0x8100
                        data = data[:12] + _VLAN_TAG.pack(tpid, tci) + data[12:]
                    if status & TP_STATUS_CSUMNOTREADY:
                        self._warn("csum", f"frames with unfinished checksums on {d.rx.getsockname()[0]}: "
                                   "switch offloads off on the veths (disable_offloads); TCP will stall")
            if ts > now:  # arrived while this batch was being read
                now = time.monotonic()
            if oldest < ts <= now:
                rx_time = ts
            else:
                rx_time = now
                d.ts_fallbacks += 1
            if loss and rng.random() < loss:
                d.lost += 1
                continue
            if jitter:
                due = rx_time + max(0.0, delay + rng.uniform(-jitter, jitter))
            else:
                due = rx_time + delay
            if due < d.last_due:
                due = d.last_due
            if len(queue) >= limit:
                d.overflow += 1
                continue
            d.last_due = due
            queue.append((due, data))

    def _rx_error(self, d: _Direction, exc: OSError) -> None:
        """A pending socket error: the interface went down (keep going) or was deleted (stop).

        The kernel reports both as ENETDOWN (packet(7) notifier), so existence is checked.
        """
        name = self.cfg.if_a if d is self._ab else self.cfg.if_b
        try:
            alive = socket.if_nametoindex(name) == self._ifindex[name]
        except OSError:
            alive = False
        if not alive or exc.errno in (errno.ENODEV, errno.ENXIO):
            self.fatal = f"interface {name} disappeared"
            self.stop()
        else:
            self._warn(f"rx{exc.errno}", f"receive error on {name}: {exc}")

    # -- send --
    def _flush(self, d: _Direction, now: float) -> None:
        """Send every frame of ``d`` that is due at ``now``."""
        queue = d.queue
        send = d.tx.send
        late_sum = 0.0
        late_max = self._late_max
        n = 0
        nbytes = 0
        while queue and queue[0][0] <= now:
            due, frame = queue.popleft()
            try:
                send(frame)
            except BlockingIOError:
                queue.appendleft((due, frame))
                self._block(d)
                break
            except OSError as exc:  # ENOBUFS (peer backlog full), ENETDOWN, EMSGSIZE: frame lost
                d.send_errors += 1
                if exc.errno == errno.EMSGSIZE:
                    self._warn("msgsize", "frame larger than the MTU (offloads on? use disable_offloads)")
                elif exc.errno in (errno.ENODEV, errno.ENXIO):
                    self.fatal = f"interface {d.tx.getsockname()[0]} disappeared"
                    self.stop()
                    break
                continue
            late = now - due
            late_sum += late
            if late > late_max:
                late_max = late
            n += 1
            nbytes += len(frame)
        d.frames += n
        d.bytes += nbytes
        self._late_sum += late_sum
        self._late_n += n
        self._late_max = late_max

    # -- loop --
    def _block(self, d: _Direction) -> None:
        """``d.tx`` is full (EAGAIN): watch it for EPOLLOUT (it stays registered for EPOLLIN)."""
        d.blocked = True
        self._ep.modify(d.tx.fileno(), select.EPOLLIN | select.EPOLLOUT)

    def _unblock(self, d: _Direction) -> None:
        d.blocked = False
        self._ep.modify(d.tx.fileno(), select.EPOLLIN)

    def run(self) -> None:
        """Forward frames until stopped. Returns normally on stop (see :attr:`fatal`)."""
        ab, ba = self._ab, self._ba
        timer = self._timer
        ep = self._ep
        for s in self._socks:
            ep.register(s.fileno(), select.EPOLLIN)
        ep.register(timer.fd, select.EPOLLIN)
        ep.register(self._wake_r, select.EPOLLIN)
        by_rx, by_tx, tfd, wfd = self._by_rx, self._by_tx, timer.fd, self._wake_r
        readable = select.EPOLLIN | select.EPOLLERR | select.EPOLLHUP
        armed: float | None = None
        monotonic = time.monotonic
        poll = ep.poll
        while not self._stopping:
            now = monotonic()
            nxt: float | None = None
            for d in (ab, ba):
                if d.queue and not d.blocked:
                    self._flush(d, now)
                    if d.queue and not d.blocked:
                        head = d.queue[0][0]
                        if nxt is None or head < nxt:
                            nxt = head
            if nxt is not None and nxt != armed:
                timer.arm(nxt)
                armed = nxt
            for fd, ev in poll():
                d = by_rx.get(fd)
                if d is not None:
                    if ev & select.EPOLLOUT:
                        self._unblock(by_tx[fd])
                    if ev & readable:
                        self._drain(d)
                elif fd == tfd:
                    timer.clear()
                    armed = None
                elif fd == wfd:
                    try:
                        os.read(wfd, 512)
                    except BlockingIOError:
                        pass

    def _collect_kernel_drops(self) -> None:
        """Add the kernel's receive-queue drops (socket buffer full) to the counters.

        ``PACKET_STATISTICS`` resets the kernel counters on every read, hence the accumulation.
        """
        for d in (self._ab, self._ba):
            try:
                raw = d.rx.getsockopt(SOL_PACKET, PACKET_STATISTICS, _TPACKET_STATS.size)
            except OSError:
                continue
            d.kernel_drops += _TPACKET_STATS.unpack(raw)[1]

    def stats(self) -> LinkStats:
        """Counters so far (lateness = send time minus due time, in microseconds).

        ``frames_*``/``bytes_*`` count frames delivered; ``lost_*`` frames dropped by the loss
        model; ``overflow_*`` frames dropped because the FIFO held ``queue_limit`` frames;
        ``kernel_drops_*`` frames the kernel dropped because the receive buffer was full (the
        emulator could not keep up); ``send_errors_*`` frames the kernel refused to send.
        """
        self._collect_kernel_drops()
        ab, ba = self._ab, self._ba
        return LinkStats(
            frames_ab=ab.frames, frames_ba=ba.frames, bytes_ab=ab.bytes, bytes_ba=ba.bytes,
            lost_ab=ab.lost, lost_ba=ba.lost,
            max_lateness_us=round(self._late_max * 1e6, 1),
            mean_lateness_us=round(self._late_sum / self._late_n * 1e6, 1) if self._late_n else 0.0,
            overflow_ab=ab.overflow, overflow_ba=ba.overflow,
            send_errors_ab=ab.send_errors, send_errors_ba=ba.send_errors,
            kernel_drops_ab=ab.kernel_drops, kernel_drops_ba=ba.kernel_drops,
            truncated=ab.truncated + ba.truncated, rx_time_fallbacks=ab.ts_fallbacks + ba.ts_fallbacks,
            queued_at_exit=len(ab.queue) + len(ba.queue),
            delay_ms=self.cfg.delay_ms, jitter_ms=self.cfg.jitter_ms, loss_pct=self.cfg.loss_pct,
            seed=self.seed, runtime_s=round(time.monotonic() - self._started, 3))


def write_stats(stats: LinkStats, path: Path | None) -> None:
    """Write ``stats`` as JSON to ``path`` atomically (parent directories are created)."""
    text = json.dumps(stats.__dict__, indent=1)
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text + "\n")
    os.replace(tmp, path)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m testbed.emulation.linkemu",
                                description="Forward frames between two interfaces after a delay "
                                            "(user-space netem replacement, both directions).")
    p.add_argument("--if-a", required=True, help="first interface (e.g. l1-eth0)")
    p.add_argument("--if-b", required=True, help="second interface (e.g. l1-eth1)")
    p.add_argument("--delay-ms", type=float, required=True, help="one-way delay, milliseconds")
    p.add_argument("--jitter-ms", type=float, default=0.0,
                   help="uniform jitter +/- this many milliseconds (order is kept)")
    p.add_argument("--loss-pct", type=float, default=0.0, help="random loss per frame and direction, percent")
    p.add_argument("--seed", type=int, default=None, help="seed for loss/jitter (default: random, reported)")
    p.add_argument("--stats-file", type=Path, default=None, help="write stats JSON here on exit")
    p.add_argument("--sockbuf-bytes", type=int, default=DEFAULT_SOCKBUF_BYTES,
                   help=f"SO_RCVBUF/SO_SNDBUF request, bytes (default {DEFAULT_SOCKBUF_BYTES})")
    p.add_argument("--nice", type=int, default=DEFAULT_NICE,
                   help=f"scheduling nice value to set (default {DEFAULT_NICE}; needs root if < 0)")
    p.add_argument("--queue-limit", type=int, default=DEFAULT_QUEUE_LIMIT,
                   help=f"frames held per direction before dropping (default {DEFAULT_QUEUE_LIMIT})")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point. Returns 0 after SIGTERM/SIGINT, 1 if an interface disappeared, 2 on bad setup."""
    args = _parser().parse_args(argv)
    cfg = LinkConfig(if_a=args.if_a, if_b=args.if_b, delay_ms=args.delay_ms, jitter_ms=args.jitter_ms,
                     loss_pct=args.loss_pct, seed=args.seed, sockbuf_bytes=args.sockbuf_bytes,
                     queue_limit=args.queue_limit)
    try:
        emu = LinkEmulator(cfg)
    except LinkEmuError as exc:
        print(f"linkemu: error: {exc}", file=sys.stderr)
        return 2
    emu.install_signal_handlers()
    try:
        os.setpriority(os.PRIO_PROCESS, 0, args.nice)
    except OSError as exc:
        print(f"linkemu: warning: cannot set nice {args.nice}: {exc}", file=sys.stderr)
    print(f"linkemu ready: {cfg.if_a}<->{cfg.if_b} delay={cfg.delay_ms}ms jitter={cfg.jitter_ms}ms "
          f"loss={cfg.loss_pct}% seed={emu.seed}", flush=True)
    try:
        emu.run()
    finally:
        stats = emu.stats()
        write_stats(stats, args.stats_file)
        print(json.dumps(stats.__dict__), flush=True)
        emu.close()
    if emu.fatal:
        print(f"linkemu: error: {emu.fatal}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
