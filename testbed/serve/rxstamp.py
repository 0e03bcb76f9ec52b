"""When a request's last byte reached the server's host: the kernel's receive timestamp of it.

On a cluster whose CPU quota is throttled, the server's event loop may read a request long after
it arrived: the bytes wait in the socket's receive queue while the process waits for its quota.
``t1`` is the arrival, not the read, so that this wait is the server's (``handling_ms``), not the
network's. How it is measured (Linux, documented in Documentation/networking/timestamping.rst):

* ``SO_TIMESTAMPNS`` on the listening socket (accepted sockets inherit it): the kernel stamps each
  received packet (``skb->tstamp``, ``CLOCK_REALTIME``, the clock of ``time.time_ns()`` that every
  emulated host shares) when the cluster's network device hands it to the stack, in softirq
  context, which the server's CFS quota does not throttle;
* the accepted socket's reads go through :class:`StampedSocket`, which reads with ``recvmsg`` and
  keeps the ``SCM_TIMESTAMPNS`` control message: for TCP, the timestamp of the last packet whose
  data that read returned (``tcp_recvmsg``, ``tcp_update_recv_tstamps``). After the server has
  read a request's whole body, the latest read's timestamp is the arrival of its last byte.

Resolution: 1 ns (the stamp is a ``ktime`` in ns); accuracy: the time from the frame's arrival at
the cluster's network interface to its stamp in the receive path (microseconds). Not used:
``TCP_INFO``'s ``tcpi_last_data_recv``, in ms and in jiffies (4 ms at ``CONFIG_HZ=250``, this
kernel's; 1-10 ms on others).

The hook: asyncio's selector transport reads its socket with ``self._sock.recv`` (CPython 3.11
``selector_events._SelectorSocketTransport``); :class:`StampingProtocol` replaces that attribute
by a :class:`StampedSocket` when a connection is made, before the first read. A transport that has
no such socket (another event loop) is refused with :class:`RuntimeError` at the first connection:
the server then cannot say when requests arrived, and says so.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import weakref
from typing import Any

#: ``SO_TIMESTAMPNS`` (``SO_TIMESTAMPNS_OLD``, include/uapi/asm-generic/socket.h: 35; Python's socket
#: module does not name it); its control message type ``SCM_TIMESTAMPNS`` has the same value.
SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)
SCM_TIMESTAMPNS = SO_TIMESTAMPNS
#: Room for one ``struct timespec`` (two 64-bit fields) control message.
_ANC_BYTES = socket.CMSG_SPACE(16)
_TIMESPEC = struct.Struct("qq")


def enable(sock: socket.socket) -> None:
    """Ask the kernel to stamp what ``sock`` receives (set on a listening socket: inherited by the
    sockets it accepts, so that even a connection's first packets are stamped).

    Raises:
        OSError: the kernel refuses the option.
    """
    sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)


class StampedSocket:
    """A socket whose ``recv`` keeps the kernel's receive timestamp of the last byte it returned
    (:attr:`last_rx_ns`, ns since the epoch; None until a read brought one). Everything else is the
    wrapped socket's. ``unstamped``: reads that returned data without a timestamp (none expected
    once :func:`enable` was set on the listening socket)."""

    __slots__ = ("_sock", "last_rx_ns", "unstamped", "__weakref__")

    def __init__(self, sock: socket.socket):
        self._sock = sock
        self.last_rx_ns: int | None = None
        self.unstamped = 0

    def recv(self, n: int, flags: int = 0) -> bytes:
        data, anc, _, _ = self._sock.recvmsg(n, _ANC_BYTES, flags)
        if data:
            self._keep(anc)
        return data

    def recv_into(self, buf: Any, n: int = 0, flags: int = 0) -> int:
        got, anc, _, _ = self._sock.recvmsg_into([memoryview(buf)[:n] if n else buf], _ANC_BYTES, flags)
        if got:
            self._keep(anc)
        return got

    def _keep(self, anc: list[tuple[int, int, bytes]]) -> None:
        for level, kind, raw in anc:
            if level == socket.SOL_SOCKET and kind == SCM_TIMESTAMPNS and len(raw) >= _TIMESPEC.size:
                sec, ns = _TIMESPEC.unpack_from(raw)
                self.last_rx_ns = sec * 1_000_000_000 + ns
                return
        self.unstamped += 1

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)


class StampingProtocol(asyncio.Protocol):
    """An asyncio protocol that puts a :class:`StampedSocket` under its transport, then hands every
    call to ``inner`` (the aiohttp request handler of the connection). ``stamps`` maps each
    transport to its socket (weakly: a closed connection drops out)."""

    def __init__(self, inner: asyncio.Protocol, stamps: weakref.WeakKeyDictionary):
        self._inner, self._stamps = inner, stamps

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        raw = getattr(transport, "_sock", None)
        if not isinstance(raw, socket.socket):
            transport.close()
            raise RuntimeError(f"the event loop's transport {type(transport).__name__} has no socket to read with "
                               "recvmsg: the server cannot time request arrivals (it needs asyncio's selector loop)")
        stamped = StampedSocket(raw)
        transport._sock = stamped  # noqa: SLF001 - the read hook (module doc)
        self._stamps[transport] = stamped
        self._inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self._inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()


__all__ = ["SCM_TIMESTAMPNS", "SO_TIMESTAMPNS", "StampedSocket", "StampingProtocol", "enable"]
