"""User-space link emulator: forwards Ethernet frames between pairs of interfaces after a delay,
through a FIFO shaper, with loss, and takes changes at run time over a control socket.

Used where the kernel has no ``netem`` qdisc (see ``environment.md``: the build/CI machines). A
delayed link ``s1 <-> s2`` is built as ``s1-ethX <-> l7-eth0 | l7-eth1 <-> s2-ethY``, ``l7`` being a
namespace of its own; a process of this module forwards *every* frame (LLDP, ARP, IP, VLAN-tagged
or not) unchanged from one interface to the other, in both directions. One process serves one
link (``--if-a/--if-b``) or many (``--links FILE``: one epoll loop and one timer for all of them;
each link's sockets are opened inside its own namespace, ``netns``, with ``setns(2)``)::

    python -m testbed.emu.linkemu --if-a l7-eth0 --if-b l7-eth1 --delay-ms 10 [--rate-mbps 100] \\
        [--jitter-ms 1] [--loss-pct 0.5] [--seed 7] [--control /run/.../emu.sock] [--stats-file F]
    python -m testbed.emu.linkemu --links links.json --control /run/.../emu.sock --stats-dir D

Units: delays in milliseconds (``*_ms``), rates in Mbit/s (10^6 bit/s), loss in percent, socket
buffers in bytes, lateness in microseconds (``*_us``).

Per direction a frame goes through, in order (the link model of :mod:`testbed.model.network`):

1. **the shaper** (``rate_mbps``; none when unset): a FIFO served at the rate, ``len(frame) x 8 / rate``
   per frame (Ethernet header included, no preamble/FCS, as HTB counts). A frame that finds
   ``shaper_queue`` frames waiting for the shaper is dropped (tail drop, ``shaper_drops_*``); the
   default, 1000 frames, is a veth's ``txqueuelen``, the FIFO HTB would use;
2. **loss**: independent (Bernoulli) drop with ``loss_pct`` after the shaper (a lost frame used
   its transmission time, as on a wire);
3. **the delay line**: sent ``delay`` (+ jitter) after its transmission ends, never before the frame
   ahead of it (``due = max(due, previous due)``: frames are **never reordered**, unlike netem with
   jitter or a lowered delay).

**Run-time changes** (``--control``: a ``SOCK_SEQPACKET`` Unix socket, one JSON object per message,
see :class:`LinkControl`) take effect for the frames that arrive after the change; frames already
in the link keep the times they were given, so a change loses nothing in flight. The exceptions
are what the change itself means: ``up: false`` drops the frames in flight (``dropped_down_*``)
and sets both interfaces administratively down, so the switches see their ports lose carrier
(OpenFlow port status); ``up: true`` brings them back. A lowered delay cannot overtake frames in
flight, so the first frames after it wait for the last frame sent before it.

Design (and where each choice comes from):

* Two ``AF_PACKET``/``SOCK_RAW`` sockets per link bound with ``ETH_P_ALL`` to its two interfaces
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
* One single-threaded ``epoll`` loop for every link; one FIFO (``deque``) per direction; one heap
  of the directions' next due times and one ``timerfd`` (nanosecond ``hrtimer``, no timer slack;
  ``epoll_wait``'s timeout has only millisecond resolution) armed at the earliest. At idle the
  process blocks in ``epoll_wait`` with no timeout: no spinning, ~0 CPU. Sockets are drained in
  batches of :data:`RX_BATCH` frames.
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
median 20.2-20.3 ms; at 2 x 0.5 ms: median 1.14-1.20 ms. Idle CPU: 0.00 %. Above what it can
forward (unshaped TCP above ~500 Mbit/s) frames queue in its socket buffer: RTT at 2 x 5 ms rose
to a median of 16.5-19.7 ms; shaped below that rate, the queue is the shaper's.

On SIGTERM/SIGINT the process writes its statistics as JSON (:class:`LinkStats`) to ``--stats-file``
(one link) or to ``--stats-dir/<name>.json`` per link, prints them, and exits 0.

Why one module: this is one real-time process (``python -m testbed.emu.linkemu``, under SCHED_FIFO)
whose hot loop (receive, shape, delay, send; the timer and the control socket in the same epoll
loop) must stay in one place, read top to bottom: its per-frame path is the code the figures above
measure, and the run starts one interpreter per emulator process, so every module it imports is
paid at every bring-up. Its parts that other modules use (the control
client :class:`LinkControl`, :func:`netem_available`) are small and live beside the loop they talk to.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import errno
import fcntl
import functools
import heapq
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
from dataclasses import asdict, dataclass, field
from pathlib import Path

from testbed.core.errors import RunFailure
from testbed.emu.control import ControlClient, ControlServer

# --- Linux constants (linux/if_packet.h, asm-generic/socket.h, linux/timerfd.h, linux/sockios.h) --
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
SIOCGIFFLAGS = 0x8913
SIOCSIFFLAGS = 0x8914
SIOCGIFINDEX = 0x8933
IFF_UP = 0x1
CLONE_NEWNET = 0x40000000

#: Frames read from one socket before the loop looks at due frames and the other sockets again
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
#: Default delay-line limit per direction, in frames (netem's default ``limit`` is 1000 packets;
#: this is larger so that long delays at high rates are not capped: 20000 frames = 240 ms at 1 Gbit/s).
DEFAULT_QUEUE_LIMIT = 20000
#: Default shaper FIFO per direction, frames: a veth's default ``txqueuelen`` (the FIFO behind HTB,
#: and :data:`testbed.model.network.DEFAULT_QUEUE_PACKETS`).
DEFAULT_SHAPER_QUEUE = 1000
#: A kernel timestamp older than this (seconds) is not trusted; the read time is used instead.
MAX_TIMESTAMP_AGE_S = 1.0
#: How often (seconds) the CLOCK_REALTIME -> CLOCK_MONOTONIC offset is re-measured.
CLOCK_OFFSET_REFRESH_S = 0.5

_AUXDATA = struct.Struct("=IIIHHHH")  # struct tpacket_auxdata
_TIMESPEC = struct.Struct("@ll")  # struct timespec (the "old" layout SO_TIMESTAMPNS delivers)
_VLAN_TAG = struct.Struct("!HH")
_PACKET_MREQ = struct.Struct("=iHH8s")  # struct packet_mreq
_TPACKET_STATS = struct.Struct("=II")  # struct tpacket_stats {tp_packets; tp_drops}
_IFREQ_FLAGS = struct.Struct("16sH14x")  # struct ifreq with ifr_flags
_IFREQ_INDEX = struct.Struct("16si20x")  # struct ifreq with ifr_ifindex


class LinkEmuError(RunFailure):
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
        queue_limit: frames held per direction in the delay line; beyond it frames are dropped
            (``overflow_*``).
        rate_mbps: the shaper's rate per direction, Mbit/s; ``None``: not shaped here.
        shaper_queue: frames waiting for the shaper per direction before tail drop.
        name: the link's name in control messages and stats (default ``IF_A-IF_B``).
        up: whether the link starts up.
        netns: the network namespace the two interfaces live in (a path such as
            ``/proc/PID/ns/net``), None for the process's own.
    """

    if_a: str
    if_b: str
    delay_ms: float
    jitter_ms: float = 0.0
    loss_pct: float = 0.0
    seed: int | None = None
    sockbuf_bytes: int = DEFAULT_SOCKBUF_BYTES
    queue_limit: int = DEFAULT_QUEUE_LIMIT
    rate_mbps: float | None = None
    shaper_queue: int = DEFAULT_SHAPER_QUEUE
    name: str = ""
    up: bool = True
    netns: str | None = None

    def __post_init__(self) -> None:
        self.name = self.name or f"{self.if_a}-{self.if_b}"

    def validate(self) -> None:
        """Check the parameters.

        Raises:
            LinkEmuError: a negative delay/jitter, loss outside [0, 100], the same interface
                twice, a rate <= 0, a queue limit below 1 or socket buffers below 64 KiB.
        """
        check_params(self.delay_ms, self.jitter_ms, self.loss_pct, self.rate_mbps)
        if self.if_a == self.if_b:
            raise LinkEmuError(f"--if-a and --if-b are the same interface ({self.if_a})")
        if self.queue_limit < 1 or self.shaper_queue < 1 or self.sockbuf_bytes < 65536:
            raise LinkEmuError("queue_limit and shaper_queue must be >= 1 and sockbuf_bytes >= 65536")


def check_params(delay_ms: float | None = None, jitter_ms: float | None = None, loss_pct: float | None = None,
                 rate_mbps: float | None = None) -> None:
    """Check link parameters (None: not given).

    Raises:
        LinkEmuError: a negative or non-finite delay/jitter, loss outside [0, 100], a rate <= 0.
    """
    for what, v in (("delay_ms", delay_ms), ("jitter_ms", jitter_ms)):
        if v is not None and not 0.0 <= v < float("inf"):
            raise LinkEmuError(f"{what} must be finite and >= 0 (got {v})")
    if loss_pct is not None and not 0.0 <= loss_pct <= 100.0:
        raise LinkEmuError(f"loss_pct must be within [0, 100] (got {loss_pct})")
    if rate_mbps is not None and not 0.0 < rate_mbps < float("inf"):
        raise LinkEmuError(f"rate_mbps must be > 0 (got {rate_mbps}); null means not shaped")


@dataclass(eq=False)
class _Direction:
    """One direction: frames read from ``rx`` leave through ``tx`` after shaper, loss and delay."""

    name: str
    link: _Link
    rx: socket.socket
    tx: socket.socket
    rng: random.Random
    queue: deque[tuple[float, bytes]] = field(default_factory=deque)
    backlog: deque[float] = field(default_factory=deque)  # transmission end times of frames in the shaper
    free_at: float = 0.0  # when the shaper finishes the last frame it holds (monotonic s)
    last_due: float = 0.0
    scheduled: bool = False  # an entry for this direction is in the timer heap
    frames: int = 0
    bytes: int = 0
    lost: int = 0
    overflow: int = 0
    shaper_drops: int = 0
    dropped_down: int = 0
    send_errors: int = 0
    truncated: int = 0
    ts_fallbacks: int = 0
    kernel_drops: int = 0
    late_sum: float = 0.0  # sum over delivered frames of (send time - due time), s
    late_max: float = 0.0  # the largest of them, s
    blocked: bool = False  # tx returned EAGAIN: wait for EPOLLOUT

    def clear(self) -> int:
        """Drop every frame in the link (it went down); returns how many."""
        n = len(self.queue)
        self.queue.clear()
        self.backlog.clear()
        self.free_at = self.last_due = 0.0
        self.dropped_down += n
        return n


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
    shaper_drops_ab: int = 0
    shaper_drops_ba: int = 0
    dropped_down_ab: int = 0
    dropped_down_ba: int = 0
    truncated: int = 0
    rx_time_fallbacks: int = 0
    queued_at_exit: int = 0
    delay_ms: float = 0.0
    jitter_ms: float = 0.0
    loss_pct: float = 0.0
    rate_mbps: float | None = None
    up: bool = True
    changes: int = 0
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
    with contextlib.suppress(OSError):  # kernel < 4.20: the pkttype check below still filters them
        sock.setsockopt(SOL_PACKET, PACKET_IGNORE_OUTGOING, 1)
    sock.setsockopt(SOL_PACKET, PACKET_AUXDATA, 1)
    sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    sock.setsockopt(SOL_PACKET, PACKET_ADD_MEMBERSHIP,
                    _PACKET_MREQ.pack(ifindex, PACKET_MR_PROMISC, 0, b""))
    sock.bind((ifname, ETH_P_ALL))  # Python converts the protocol to network byte order
    sock.setblocking(False)
    return sock


def set_admin_up(sock: socket.socket, ifname: str, up: bool) -> None:
    """Set ``ifname`` administratively up or down (``ip link set ... up|down``) in the namespace of
    ``sock`` (any socket created there)."""
    req = _IFREQ_FLAGS.pack(ifname.encode(), 0)
    flags = _IFREQ_FLAGS.unpack(fcntl.ioctl(sock, SIOCGIFFLAGS, req))[1]
    flags = flags | IFF_UP if up else flags & ~IFF_UP
    fcntl.ioctl(sock, SIOCSIFFLAGS, _IFREQ_FLAGS.pack(ifname.encode(), flags))


def ifindex_in(sock: socket.socket, ifname: str) -> int | None:
    """``ifname``'s index in the namespace of ``sock``; None if there is no such interface."""
    try:
        return _IFREQ_INDEX.unpack(fcntl.ioctl(sock, SIOCGIFINDEX, _IFREQ_INDEX.pack(ifname.encode(), 0)))[1]
    except OSError:
        return None


@contextlib.contextmanager
def in_netns(path: str | None):
    """Run the block inside the network namespace at ``path`` (``setns(2)``; None: stay), then
    return to the process's own; sockets created inside stay in that namespace.

    Raises:
        LinkEmuError: the namespace cannot be entered (no such file, not root).
    """
    if path is None:
        yield
        return
    libc = ctypes.CDLL(None, use_errno=True)
    own = os.open("/proc/self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        os.close(own)
        raise LinkEmuError(f"network namespace {path}: {exc}") from None
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            raise LinkEmuError(f"setns({path}): {os.strerror(ctypes.get_errno())}")
        try:
            yield
        finally:
            if libc.setns(own, CLONE_NEWNET) != 0:
                raise LinkEmuError(f"cannot return to the own network namespace: {os.strerror(ctypes.get_errno())}")
    finally:
        os.close(fd)
        os.close(own)


class _Link:
    """One emulated link: its two directions and the parameters in force."""

    def __init__(self, cfg: LinkConfig, seed: int):
        self.cfg = cfg
        self.name = cfg.name
        self.seed = seed
        self.delay = cfg.delay_ms / 1000.0
        self.jitter = cfg.jitter_ms / 1000.0
        self.loss = cfg.loss_pct / 100.0
        self.byte_time = 8.0 / (cfg.rate_mbps * 1e6) if cfg.rate_mbps else 0.0  # s per byte
        self.up = cfg.up
        self.changes = 0
        with in_netns(cfg.netns):
            self.ctl = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)  # ioctls in the link's namespace
            sa = sb = None
            try:
                sa = _open_packet_socket(cfg.if_a, cfg.sockbuf_bytes)
                sb = _open_packet_socket(cfg.if_b, cfg.sockbuf_bytes)
            except BaseException:
                for x in (sa, sb, self.ctl):
                    if x is not None:
                        x.close()
                raise
        self.socks = (sa, sb)
        self.ifindex = {cfg.if_a: ifindex_in(self.ctl, cfg.if_a), cfg.if_b: ifindex_in(self.ctl, cfg.if_b)}
        # String seeds are hashed with SHA-512 by random.seed: stable across runs and versions.
        self.ab = _Direction("ab", self, sa, sb, random.Random(f"linkemu:{seed}:ab"))
        self.ba = _Direction("ba", self, sb, sa, random.Random(f"linkemu:{seed}:ba"))

    def params(self) -> dict:
        """The parameters in force (the units of :class:`LinkConfig`)."""
        return {"name": self.name, "delay_ms": self.delay * 1e3, "jitter_ms": self.jitter * 1e3,
                "loss_pct": self.loss * 100.0, "rate_mbps": self.cfg.rate_mbps, "up": self.up}

    def set(self, msg: dict) -> None:
        """Apply a control message's parameters (the keys of :meth:`params`, any subset).

        Raises:
            LinkEmuError: a bad value (nothing is changed then).
        """
        unknown = set(msg) - {"op", "link", "delay_ms", "jitter_ms", "loss_pct", "rate_mbps", "up"}
        if unknown:
            raise LinkEmuError(f"unknown key(s) {sorted(unknown)}")
        get = msg.get
        check_params(get("delay_ms"), get("jitter_ms"), get("loss_pct"), get("rate_mbps"))
        if "up" in msg and not isinstance(msg["up"], bool):
            raise LinkEmuError(f"'up' must be true or false (got {msg['up']!r})")
        if get("delay_ms") is not None:
            self.delay = float(msg["delay_ms"]) / 1000.0
        if get("jitter_ms") is not None:
            self.jitter = float(msg["jitter_ms"]) / 1000.0
        if get("loss_pct") is not None:
            self.loss = float(msg["loss_pct"]) / 100.0
        if "rate_mbps" in msg:
            self.cfg.rate_mbps = None if msg["rate_mbps"] is None else float(msg["rate_mbps"])
            self.byte_time = 8.0 / (self.cfg.rate_mbps * 1e6) if self.cfg.rate_mbps else 0.0
        if "up" in msg and msg["up"] != self.up:
            self.set_up(msg["up"])
        self.changes += 1

    def set_up(self, up: bool) -> None:
        """Down: both interfaces down first (nothing new enters), then what is in flight is dropped.
        Up: both interfaces up."""
        self.up = up
        for ifname in (self.cfg.if_a, self.cfg.if_b):
            set_admin_up(self.ctl, ifname, up)
        if not up:
            self.ab.clear()
            self.ba.clear()

    def close(self) -> None:
        for s in (*self.socks, self.ctl):
            s.close()


class LinkEmulator:
    """Forwards frames of every link in ``links`` (see the module docstring).

    Call :meth:`run` (blocks until :meth:`stop`, SIGTERM or SIGINT), then :meth:`stats`.

    Args:
        links: one :class:`LinkConfig` per link (a single config is accepted too).
        control_path: where to listen for control messages (a Unix ``SOCK_SEQPACKET`` socket,
            replaced if it exists), or None.

    Raises (from the constructor):
        LinkEmuError: bad parameters, an interface is missing, a link name is given twice, or no root.
    """

    def __init__(self, links: LinkConfig | Sequence[LinkConfig], control_path: str | Path | None = None) -> None:
        cfgs = [links] if isinstance(links, LinkConfig) else list(links)
        if not cfgs:
            raise LinkEmuError("no link to emulate")
        for c in cfgs:
            c.validate()
        names = [c.name for c in cfgs]
        if len(set(names)) != len(names):
            raise LinkEmuError(f"link names given twice: {sorted({n for n in names if names.count(n) > 1})}")
        self.cfg = cfgs[0]  # the single link's config (kept for callers of the one-link form)
        self.links: dict[str, _Link] = {}
        try:
            for c in cfgs:
                self.links[c.name] = _Link(c, c.seed if c.seed is not None else secrets.randbits(32))
        except BaseException:
            for lk in self.links.values():
                lk.close()
            raise
        self.seed = next(iter(self.links.values())).seed
        self._by_rx: dict[int, _Direction] = {}
        self._by_tx: dict[int, _Direction] = {}
        for lk in self.links.values():
            for d in (lk.ab, lk.ba):
                self._by_rx[d.rx.fileno()] = d
                self._by_tx[d.tx.fileno()] = d
        self._heap: list[tuple[float, int, _Direction]] = []
        self._tick = 0  # heap tie-breaker
        self._timer = _TimerFd()
        self._ep = select.epoll()
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._control: ControlServer | None = None
        if control_path is not None:
            try:
                self._control = ControlServer(Path(control_path), self._ep, self.handle)
            except OSError as exc:
                raise LinkEmuError(str(exc)) from None
        self._stopping = False
        self._warned: set[str] = set()
        self._started = time.monotonic()
        self._clock_offset = 0.0
        self._offset_at = 0.0
        self.fatal: str | None = None

    # -- control --
    def stop(self) -> None:
        """Ask the loop to finish (safe from a signal handler)."""
        self._stopping = True
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"x")

    def install_signal_handlers(self) -> None:
        """SIGTERM and SIGINT stop the loop (and then the caller writes stats)."""
        signal.set_wakeup_fd(self._wake_w, warn_on_full_buffer=False)
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda _s, _f: self.stop())

    def close(self) -> None:
        for lk in self.links.values():
            lk.close()
        if self._control is not None:
            self._control.close()
        self._timer.close()
        self._ep.close()
        os.close(self._wake_r)
        os.close(self._wake_w)

    def _warn(self, key: str, msg: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            print(f"linkemu: warning: {msg}", file=sys.stderr, flush=True)

    def handle(self, msg: dict) -> dict:
        """Answer one control message (see :class:`LinkControl`); never raises."""
        try:
            op = msg.get("op")
            name = msg.get("link")
            if name is None and len(self.links) == 1:
                name = next(iter(self.links))
            if op == "ping":
                return {"ok": True, "t": time.time(), "links": sorted(self.links)}
            if op == "stats":
                return {"ok": True, "t": time.time(), "stats": {n: asdict(s) for n, s in self.stats_by_link().items()}}
            if name not in self.links:
                raise LinkEmuError(f"unknown link {name!r}; known: {', '.join(sorted(self.links))}")
            lk = self.links[name]
            if op == "set":
                before = lk.params()
                lk.set(msg)
                return {"ok": True, "t_applied": time.time(), "before": before, "params": lk.params()}
            if op == "get":
                return {"ok": True, "t": time.time(), "params": lk.params()}
            raise LinkEmuError(f"unknown op {op!r} (ping, get, set, stats)")
        except (LinkEmuError, OSError, TypeError, ValueError, AttributeError) as exc:
            return {"ok": False, "error": str(exc)}

    # -- receive --
    def _refresh_clock_offset(self, now: float) -> None:
        a = time.monotonic()
        rt = time.time()
        b = time.monotonic()
        self._clock_offset = rt - (a + b) / 2.0
        self._offset_at = now

    def _drain(self, d: _Direction) -> None:
        """Read up to RX_BATCH frames from ``d.rx`` into ``d.queue`` (shaper, loss, delay line)."""
        recvmsg = d.rx.recvmsg
        queue, backlog = d.queue, d.backlog
        lk = d.link
        rng = d.rng
        loss, delay, jitter, byte_time = lk.loss, lk.delay, lk.jitter, lk.byte_time
        limit, shaper_limit = lk.cfg.queue_limit, lk.cfg.shaper_queue
        was_empty = not queue
        now = time.monotonic()
        if now - self._offset_at > CLOCK_OFFSET_REFRESH_S:
            self._refresh_clock_offset(now)
        offset = self._clock_offset
        oldest = now - MAX_TIMESTAMP_AGE_S
        for _ in range(RX_BATCH):
            try:
                data, anc, flags, addr = recvmsg(RX_BUFSIZE, ANC_BUFSIZE)
            except BlockingIOError:
                break
            except OSError as exc:
                self._rx_error(d, exc)
                break
            if addr[2] == PACKET_OUTGOING:
                continue
            if flags & socket.MSG_TRUNC:
                d.truncated += 1
                continue
            if not lk.up:  # read before the interface went down: lost with the link
                d.dropped_down += 1
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
            sent = rx_time
            if byte_time:  # the shaper: a FIFO served at the rate
                while backlog and backlog[0] <= rx_time:
                    backlog.popleft()
                if len(backlog) >= shaper_limit:
                    d.shaper_drops += 1
                    continue
                sent = (d.free_at if d.free_at > rx_time else rx_time) + len(data) * byte_time
                d.free_at = sent
                backlog.append(sent)
            if loss and rng.random() < loss:
                d.lost += 1
                continue
            if jitter:
                due = sent + max(0.0, delay + rng.uniform(-jitter, jitter))
            else:
                due = sent + delay
            if due < d.last_due:
                due = d.last_due
            if len(queue) >= limit:
                d.overflow += 1
                continue
            d.last_due = due
            queue.append((due, data))
        if was_empty and queue and not d.scheduled and not d.blocked:
            self._schedule(d)

    def _schedule(self, d: _Direction) -> None:
        self._tick += 1
        d.scheduled = True
        heapq.heappush(self._heap, (d.queue[0][0], self._tick, d))

    def _rx_error(self, d: _Direction, exc: OSError) -> None:
        """A pending socket error: the interface went down (keep going) or was deleted (stop).

        The kernel reports both as ENETDOWN (packet(7) notifier), so existence is checked.
        """
        lk = d.link
        name = lk.cfg.if_a if d is lk.ab else lk.cfg.if_b
        alive = ifindex_in(lk.ctl, name) == lk.ifindex[name]
        if not alive or exc.errno in (errno.ENODEV, errno.ENXIO):
            self.fatal = f"interface {name} disappeared"
            self.stop()
        elif lk.up:  # set down by us: expected
            self._warn(f"rx{exc.errno}", f"receive error on {name}: {exc}")

    # -- send --
    def _flush(self, d: _Direction, now: float) -> None:
        """Send every frame of ``d`` that is due at ``now``."""
        queue = d.queue
        send = d.tx.send
        late_sum = 0.0
        late_max = d.late_max
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
        d.late_sum += late_sum
        d.late_max = late_max

    # -- loop --
    def _block(self, d: _Direction) -> None:
        """``d.tx`` is full (EAGAIN): watch it for EPOLLOUT (it stays registered for EPOLLIN)."""
        d.blocked = True
        self._ep.modify(d.tx.fileno(), select.EPOLLIN | select.EPOLLOUT)

    def _unblock(self, d: _Direction) -> None:
        d.blocked = False
        self._ep.modify(d.tx.fileno(), select.EPOLLIN)
        if d.queue and not d.scheduled:
            self._schedule(d)

    def _due(self, now: float) -> float | None:
        """Flush every direction whose head is due; the next due time (None: nothing queued)."""
        heap = self._heap
        while heap and heap[0][0] <= now:
            _, _, d = heapq.heappop(heap)
            d.scheduled = False
            if d.blocked or not d.queue:
                continue
            self._flush(d, now)
            if d.queue and not d.blocked:
                self._schedule(d)
        return heap[0][0] if heap else None

    def run(self) -> None:
        """Forward frames until stopped. Returns normally on stop (see :attr:`fatal`)."""
        timer, ep = self._timer, self._ep
        for fd in self._by_rx:
            ep.register(fd, select.EPOLLIN)
        ep.register(timer.fd, select.EPOLLIN)
        ep.register(self._wake_r, select.EPOLLIN)
        by_rx, by_tx, tfd, wfd = self._by_rx, self._by_tx, timer.fd, self._wake_r
        readable = select.EPOLLIN | select.EPOLLERR | select.EPOLLHUP
        armed: float | None = None
        monotonic = time.monotonic
        poll = ep.poll
        while not self._stopping:
            nxt = self._due(monotonic())
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
                    with contextlib.suppress(BlockingIOError):
                        os.read(wfd, 512)
                elif self._control is not None:
                    self._control.serve(fd)

    def _collect_kernel_drops(self) -> None:
        """Add the kernel's receive-queue drops (socket buffer full) to the counters.

        ``PACKET_STATISTICS`` resets the kernel counters on every read, hence the accumulation.
        """
        for lk in self.links.values():
            for d in (lk.ab, lk.ba):
                try:
                    raw = d.rx.getsockopt(SOL_PACKET, PACKET_STATISTICS, _TPACKET_STATS.size)
                except OSError:
                    continue
                d.kernel_drops += _TPACKET_STATS.unpack(raw)[1]

    def stats_by_link(self) -> dict[str, LinkStats]:
        """Counters so far per link name (lateness = send time minus due time, in microseconds,
        over the frames the link delivered in both directions).

        ``frames_*``/``bytes_*`` count frames delivered; ``lost_*`` frames dropped by the loss
        model; ``shaper_drops_*`` frames that found the shaper's FIFO full; ``overflow_*`` frames
        dropped because the delay line held ``queue_limit`` frames; ``dropped_down_*`` frames lost
        because the link went down; ``kernel_drops_*`` frames the kernel dropped because the
        receive buffer was full (the emulator could not keep up); ``send_errors_*`` frames the
        kernel refused to send.
        """
        self._collect_kernel_drops()
        out = {}
        for name, lk in self.links.items():
            ab, ba = lk.ab, lk.ba
            p = lk.params()
            n = ab.frames + ba.frames
            late_max = round(max(ab.late_max, ba.late_max) * 1e6, 1)
            late_mean = round((ab.late_sum + ba.late_sum) / n * 1e6, 1) if n else 0.0
            out[name] = LinkStats(
                frames_ab=ab.frames, frames_ba=ba.frames, bytes_ab=ab.bytes, bytes_ba=ba.bytes,
                lost_ab=ab.lost, lost_ba=ba.lost, max_lateness_us=late_max, mean_lateness_us=late_mean,
                overflow_ab=ab.overflow, overflow_ba=ba.overflow,
                send_errors_ab=ab.send_errors, send_errors_ba=ba.send_errors,
                kernel_drops_ab=ab.kernel_drops, kernel_drops_ba=ba.kernel_drops,
                shaper_drops_ab=ab.shaper_drops, shaper_drops_ba=ba.shaper_drops,
                dropped_down_ab=ab.dropped_down, dropped_down_ba=ba.dropped_down,
                truncated=ab.truncated + ba.truncated, rx_time_fallbacks=ab.ts_fallbacks + ba.ts_fallbacks,
                queued_at_exit=len(ab.queue) + len(ba.queue),
                delay_ms=p["delay_ms"], jitter_ms=p["jitter_ms"], loss_pct=p["loss_pct"], rate_mbps=p["rate_mbps"],
                up=lk.up, changes=lk.changes, seed=lk.seed, runtime_s=round(time.monotonic() - self._started, 3))
        return out

    def stats(self) -> LinkStats:
        """Counters so far of the first (or only) link (see :meth:`stats_by_link`)."""
        return next(iter(self.stats_by_link().values()))


class LinkControl(ControlClient):
    """Client of an emulator's control socket (:mod:`testbed.emu.control`).

    Messages: ``{"op": "set", "link": NAME, "delay_ms": .., "jitter_ms": .., "loss_pct": ..,
    "rate_mbps": .. (null: unshaped), "up": true|false}`` (any subset; ``link`` may be left out when
    the process serves one link) -> ``{"ok": true, "t_applied": unix s, "before": {...},
    "params": {...}}``; ``{"op": "get", "link": NAME}`` -> ``{"ok", "t", "params"}``;
    ``{"op": "stats"}`` -> ``{"ok", "t", "stats": {name: LinkStats fields}}``; ``{"op": "ping"}``.

    Raises:
        LinkEmuError: (from :meth:`request`) the emulator cannot be reached, times out, or
            answers ``ok: false`` (its error message is quoted).
    """

    def __init__(self, path: str | Path, timeout_s: float = 5.0) -> None:
        super().__init__(path, timeout_s, LinkEmuError)

    def request(self, msg: dict) -> dict:
        """Send ``msg``, return the reply (``ok`` true)."""
        return self.call(msg)

    def set(self, link: str | None = None, **params) -> dict:
        """``op: set`` for ``link`` with ``params`` (see the class doc)."""
        msg = {"op": "set", **params}
        if link is not None:
            msg["link"] = link
        return self.request(msg)


def write_stats(stats: LinkStats, path: Path | None) -> None:
    """Write one link's ``stats`` as JSON to ``path`` atomically (parent directories are created)."""
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(asdict(stats), indent=1) + "\n")
    os.replace(tmp, path)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m testbed.emu.linkemu",
                                description="Forward frames between pairs of interfaces after a shaper, loss and a "
                                            "delay (user-space netem replacement, both directions).")
    p.add_argument("--if-a", help="first interface (e.g. L1a)")
    p.add_argument("--if-b", help="second interface (e.g. L1b)")
    p.add_argument("--delay-ms", type=float, help="one-way delay, milliseconds")
    p.add_argument("--links", type=Path, default=None,
                   help="JSON list of links (LinkConfig fields) served by this one process, instead of --if-a/-b")
    p.add_argument("--rate-mbps", type=float, default=None, help="shaper rate per direction, Mbit/s (default: none)")
    p.add_argument("--shaper-queue", type=int, default=DEFAULT_SHAPER_QUEUE,
                   help=f"frames waiting for the shaper before tail drop (default {DEFAULT_SHAPER_QUEUE})")
    p.add_argument("--jitter-ms", type=float, default=0.0,
                   help="uniform jitter +/- this many milliseconds (order is kept)")
    p.add_argument("--loss-pct", type=float, default=0.0, help="random loss per frame and direction, percent")
    p.add_argument("--seed", type=int, default=None, help="seed for loss/jitter (default: random, reported)")
    p.add_argument("--control", type=Path, default=None, help="Unix socket for run-time changes (LinkControl)")
    p.add_argument("--stats-file", type=Path, default=None, help="write stats JSON here on exit (one link)")
    p.add_argument("--stats-dir", type=Path, default=None, help="write <link name>.json stats here on exit")
    p.add_argument("--sockbuf-bytes", type=int, default=DEFAULT_SOCKBUF_BYTES,
                   help=f"SO_RCVBUF/SO_SNDBUF request, bytes (default {DEFAULT_SOCKBUF_BYTES})")
    p.add_argument("--nice", type=int, default=DEFAULT_NICE,
                   help=f"scheduling nice value to set (default {DEFAULT_NICE}; needs root if < 0)")
    p.add_argument("--rt-priority", type=int, default=0,
                   help="run under SCHED_FIFO at this priority (1-99; 0: not, use --nice)")
    p.add_argument("--queue-limit", type=int, default=DEFAULT_QUEUE_LIMIT,
                   help=f"frames held per direction in the delay line (default {DEFAULT_QUEUE_LIMIT})")
    return p


def _configs(args: argparse.Namespace) -> list[LinkConfig]:
    """The links of the command line.

    Raises:
        LinkEmuError: neither or both forms given, or an unreadable links file.
    """
    if args.links is not None:
        if args.if_a or args.if_b:
            raise LinkEmuError("give --links or --if-a/--if-b, not both")
        try:
            rows = json.loads(args.links.read_text())
            return [LinkConfig(**{"sockbuf_bytes": args.sockbuf_bytes, "queue_limit": args.queue_limit,
                                  "shaper_queue": args.shaper_queue, **row}) for row in rows]
        except (OSError, ValueError, TypeError) as exc:
            raise LinkEmuError(f"cannot read links file {args.links}: {exc}") from None
    if not args.if_a or not args.if_b or args.delay_ms is None:
        raise LinkEmuError("--if-a, --if-b and --delay-ms are required (or --links FILE)")
    return [LinkConfig(if_a=args.if_a, if_b=args.if_b, delay_ms=args.delay_ms, jitter_ms=args.jitter_ms,
                       loss_pct=args.loss_pct, seed=args.seed, sockbuf_bytes=args.sockbuf_bytes,
                       queue_limit=args.queue_limit, rate_mbps=args.rate_mbps, shaper_queue=args.shaper_queue)]


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point. Returns 0 after SIGTERM/SIGINT, 1 if an interface disappeared, 2 on bad setup."""
    args = _parser().parse_args(argv)
    try:
        cfgs = _configs(args)
        emu = LinkEmulator(cfgs, args.control)
    except LinkEmuError as exc:
        print(f"linkemu: error: {exc}", file=sys.stderr)
        return 2
    emu.install_signal_handlers()
    try:
        os.setpriority(os.PRIO_PROCESS, 0, args.nice)
        if args.rt_priority:
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(args.rt_priority))
    except OSError as exc:
        print(f"linkemu: warning: cannot set nice {args.nice} / SCHED_FIFO {args.rt_priority}: {exc}",
              file=sys.stderr)
    if len(cfgs) == 1:
        c = cfgs[0]
        print(f"linkemu ready: {c.if_a}<->{c.if_b} delay={c.delay_ms}ms jitter={c.jitter_ms}ms "
              f"loss={c.loss_pct}% rate={c.rate_mbps or '-'}Mbit/s seed={emu.seed}", flush=True)
    else:
        print(f"linkemu ready: {len(cfgs)} links", flush=True)
    try:
        emu.run()
    finally:
        by_link = emu.stats_by_link()
        if len(cfgs) == 1:
            write_stats(next(iter(by_link.values())), args.stats_file)
        for name, st in by_link.items():
            if args.stats_dir is not None:
                write_stats(st, args.stats_dir / f"{name}.json")
            print(json.dumps(asdict(st) if len(cfgs) == 1 else {name: asdict(st)}), flush=True)
        emu.close()
    if emu.fatal:
        print(f"linkemu: error: {emu.fatal}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
