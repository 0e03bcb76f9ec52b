"""Interface set-up in-process, without a process per interface: link up, offloads off, IPv6 off,
in any network namespace (named by the pid of a process in it, e.g. a Mininet node's shell).

Running ``ip link set X up``, ``sysctl`` and ``ethtool -K X ...`` for every interface would take,
on Abilene (28 switch-link veths through the link emulator's namespace, 4 host links), about 90
processes and 0.3-0.4 s on the 2-core machine. The same kernel calls made here take a few
milliseconds: per namespace, one thread enters it (``setns(2)`` changes the calling
thread's network namespace only), opens a socket there, and makes the ioctls that ``ip`` and
``ethtool`` make:

* ``SIOCGIFFLAGS`` / ``SIOCSIFFLAGS`` with ``IFF_UP`` (``ip link set X up``);
* ``ETHTOOL_SFEATURES`` clearing the features that ``ethtool -K X rx off tx off sg off tso off
  gso off gro off`` (:data:`testbed.emu.mininet_network.OFFLOAD_OFF`) clears: those whose names match
  ethtool's own patterns for these words (:data:`OFFLOAD_PATTERNS`, from ethtool's
  ``off_flag_def``), found in the kernel's feature names (``ETH_SS_FEATURES``). By name, not by
  the legacy per-flag ioctls: on kernel 6.18 ``ETHTOOL_STSO`` leaves ``tx-tcp-accecn-segmentation``
  on, which ``ethtool -K tso off`` clears. The features are read back (``ETHTOOL_GFEATURES``): one
  still active is an error;
* ``/proc/sys/net/ipv6/conf/<X>/disable_ipv6`` = 1, opened from inside the namespace (the
  ``net`` sysctls are those of the opening thread's namespace).

:func:`read_features` reads an interface's active features by name (the tests compare it with
``ethtool -k``).
"""

from __future__ import annotations

import ctypes
import fcntl
import fnmatch
import functools
import os
import socket
import struct
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import TypeVar

from testbed.core.errors import TestbedError

T = TypeVar("T")

CLONE_NEWNET = 0x40000000
SIOCGIFFLAGS = 0x8913
SIOCSIFFLAGS = 0x8914
SIOCGIFMTU = 0x8921
SIOCETHTOOL = 0x8946
IFF_UP = 0x1
ETHTOOL_GSTRINGS = 0x1B
ETHTOOL_GSSET_INFO = 0x37
ETHTOOL_GFEATURES = 0x3A
ETHTOOL_SFEATURES = 0x3B
ETH_SS_FEATURES = 4
ETH_GSTRING_LEN = 32
#: ethtool's word -> the kernel feature names it stands for (ethtool's ``off_flag_def`` patterns).
OFFLOAD_PATTERNS = {"rx": "rx-checksum", "tx": "tx-checksum-*", "sg": "tx-scatter-gather*",
                    "tso": "tx-tcp*-segmentation", "gso": "tx-generic-segmentation", "gro": "rx-gro"}
#: What :data:`testbed.emu.mininet_network.OFFLOAD_OFF` switches off.
OFFLOADS_OFF = ("rx", "tx", "sg", "tso", "gso", "gro")
_IFREQ = 40  # sizeof(struct ifreq) on 64-bit Linux

_libc = ctypes.CDLL(None, use_errno=True)


class NetdevError(TestbedError, OSError):
    """An interface call failed (the message names the interface, namespace and call)."""


def _ifreq(name: str, tail: bytes) -> bytearray:
    buf = bytearray(_IFREQ)
    raw = name.encode()
    if len(raw) > 15:
        raise NetdevError(f"interface name {name!r} is longer than 15 bytes")
    buf[:len(raw)] = raw
    buf[16:16 + len(tail)] = tail
    return buf


def _ethtool(sock: socket.socket, name: str, payload: bytes) -> bytes:
    """One ``SIOCETHTOOL`` ioctl on ``name`` with ``payload`` (a struct starting with its command);
    the struct as the kernel left it."""
    buf = ctypes.create_string_buffer(payload, len(payload))
    fcntl.ioctl(sock.fileno(), SIOCETHTOOL, _ifreq(name, struct.pack("P", ctypes.addressof(buf))))
    return buf.raw


@functools.lru_cache(maxsize=1)
def feature_names() -> tuple[str, ...]:
    """The kernel's netdev feature names by bit (``ETH_SS_FEATURES``; the same for every device),
    asked of the loopback interface."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        info = _ethtool(sock, "lo", struct.pack("IIQI", ETHTOOL_GSSET_INFO, 0, 1 << ETH_SS_FEATURES, 0))
        count = struct.unpack_from("I", info, 16)[0]
        raw = _ethtool(sock, "lo", struct.pack("III", ETHTOOL_GSTRINGS, ETH_SS_FEATURES, count)
                       + bytes(count * ETH_GSTRING_LEN))
    return tuple(raw[12 + i * ETH_GSTRING_LEN:12 + (i + 1) * ETH_GSTRING_LEN].split(b"\0", 1)[0].decode()
                 for i in range(count))


def offload_bits(words: Iterable[str] = OFFLOADS_OFF) -> list[int]:
    """Feature bits that ``ethtool -K X <word> off`` clears, for each of ``words``."""
    pats = [OFFLOAD_PATTERNS[w] for w in words]
    return [i for i, n in enumerate(feature_names()) if n and any(fnmatch.fnmatchcase(n, p) for p in pats)]


def _blocks(n_bits: int) -> int:
    return (n_bits + 31) // 32


def _active_features(sock: socket.socket, name: str) -> list[int]:
    n = _blocks(len(feature_names()))
    raw = _ethtool(sock, name, struct.pack("II", ETHTOOL_GFEATURES, n) + bytes(16 * n))
    active = [struct.unpack_from("IIII", raw, 8 + 16 * b)[2] for b in range(n)]
    return [b * 32 + i for b in range(n) for i in range(32) if active[b] >> i & 1]


def _clear_features(sock: socket.socket, name: str, bits: list[int]) -> None:
    n = _blocks(len(feature_names()))
    valid = [0] * n
    for bit in bits:
        valid[bit // 32] |= 1 << (bit % 32)
    _ethtool(sock, name, struct.pack("II", ETHTOOL_SFEATURES, n)
             + b"".join(struct.pack("II", v, 0) for v in valid))
    left = sorted(set(bits) & set(_active_features(sock, name)))
    if left:
        names = feature_names()
        raise NetdevError(f"still on after switching them off: {', '.join(names[b] for b in left)}")


def _set_up(sock: socket.socket, name: str) -> None:
    buf = _ifreq(name, b"")
    fcntl.ioctl(sock.fileno(), SIOCGIFFLAGS, buf)
    flags = struct.unpack_from("H", buf, 16)[0]
    if not flags & IFF_UP:
        struct.pack_into("H", buf, 16, flags | IFF_UP)
        fcntl.ioctl(sock.fileno(), SIOCSIFFLAGS, buf)


def _mtu(sock: socket.socket, name: str) -> int:
    buf = _ifreq(name, b"")
    fcntl.ioctl(sock.fileno(), SIOCGIFMTU, buf)
    return struct.unpack_from("i", buf, 16)[0]


def in_netns(pid: int | None, fn: Callable[[], T]) -> T:
    """``fn()`` run in the network namespace of process ``pid`` (None: this process's own), on a
    thread of its own that enters the namespace and ends with ``fn``; its result or exception."""
    if pid is None:
        return fn()
    out: dict[str, object] = {}

    def body() -> None:
        try:
            fd = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY)
            try:
                if _libc.setns(fd, CLONE_NEWNET) != 0:
                    err = ctypes.get_errno()
                    raise NetdevError(err, f"setns into the network namespace of pid {pid}: {os.strerror(err)}")
            finally:
                os.close(fd)
            out["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
            out["error"] = exc

    t = threading.Thread(target=body, name=f"netns-{pid}")
    t.start()
    t.join()
    if "error" in out:
        raise out["error"]  # type: ignore[misc]
    return out["value"]  # type: ignore[return-value]


def configure(pid: int | None, interfaces: Iterable[str], up: bool = True, offloads_off: bool = True,
              ipv6_off: bool = True, namespace_ipv6_off: bool = False, mtu: int | None = None) -> None:
    """IPv6 off, offloads off (:data:`OFFLOADS_OFF`, checked), then up, for each of ``interfaces``
    in the namespace of ``pid`` (module doc); with ``namespace_ipv6_off`` first
    ``net.ipv6.conf.{all,default}.disable_ipv6`` there (never pass it for the root namespace).
    With ``mtu`` (bytes), each interface's MTU is read back (``SIOCGIFMTU``) and must be that.

    Raises:
        NetdevError: a call failed (which interface, which call, the kernel's reason).
    """
    names = list(interfaces)
    bits = offload_bits() if offloads_off else []

    def work() -> None:
        if namespace_ipv6_off:
            for conf in ("all", "default"):
                _write_sysctl(f"/proc/sys/net/ipv6/conf/{conf}/disable_ipv6")
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            for name in names:
                step = "disable_ipv6"
                try:
                    if ipv6_off:
                        _write_sysctl(f"/proc/sys/net/ipv6/conf/{name}/disable_ipv6")
                    step = "offloads off"
                    if bits:
                        _clear_features(sock, name, bits)
                    step = "up"
                    if up:
                        _set_up(sock, name)
                    step = "MTU"
                    if mtu is not None and (got := _mtu(sock, name)) != mtu:
                        raise NetdevError(f"reads {got} bytes, not the {mtu} it was created with")
                except OSError as exc:
                    raise NetdevError(exc.errno, f"interface {name} (namespace of pid {pid or 'self'}): {step}: "
                                                 f"{exc.strerror or exc}") from None

    in_netns(pid, work)


def configure_many(per_namespace: Mapping[int | None, Iterable[str]], **kwargs) -> None:
    """:func:`configure` for every ``pid -> interfaces`` (same keyword arguments)."""
    for pid, names in per_namespace.items():
        configure(pid, names, **kwargs)


def _write_sysctl(path: str) -> None:
    try:
        with open(path, "w") as f:
            f.write("1")
    except FileNotFoundError:  # IPv6 not built into this kernel: nothing to switch off
        if os.path.exists("/proc/sys/net/ipv6"):
            raise


def read_features(pid: int | None, name: str) -> set[str]:
    """The names of the features active on interface ``name`` in the namespace of ``pid``."""
    def work() -> set[str]:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            names = feature_names()
            return {names[b] for b in _active_features(sock, name)}

    return in_netns(pid, work)


__all__ = ["OFFLOADS_OFF", "NetdevError", "configure", "configure_many", "feature_names", "in_netns",
           "offload_bits", "read_features"]
