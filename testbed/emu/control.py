"""Control channel of the emulation's daemons (link emulator, probe daemon): a Unix
``SOCK_SEQPACKET`` socket, one JSON object per message, one JSON reply per message.

A filesystem socket (not an abstract one: those are per network namespace) reaches a daemon in
any namespace of the machine. Only the standard library is imported (the daemons start fast).
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import socket
from collections.abc import Callable
from pathlib import Path

#: Largest message, bytes (sample lists of a probe daemon can be large).
MESSAGE_BYTES = 4 * 1024 * 1024
#: A Unix socket path holds at most this many bytes.
MAX_PATH_BYTES = 107


def listen(path: Path) -> socket.socket:
    """A non-blocking socket listening at ``path`` (an old one is replaced; mode 0600).

    Raises:
        OSError: the path is too long or cannot be bound (the message names it).
    """
    if len(os.fsencode(path)) > MAX_PATH_BYTES:
        raise OSError(f"control socket path {path} is longer than {MAX_PATH_BYTES} bytes")
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
    try:
        s.bind(str(path))
        os.chmod(path, 0o600)
        s.listen(16)
    except OSError as exc:
        s.close()
        raise OSError(f"cannot listen on control socket {path}: {exc}") from None
    s.setblocking(False)
    return s


def recv_or_drop(ep: select.epoll, conns: dict[int, socket.socket], fd: int, size: int) -> bytes | None:
    """Read from connection ``fd``; on end of stream or error, unregister, forget and close it.

    Returns:
        The bytes read, ``b""`` when the connection was closed, None when nothing was ready.
    """
    conn = conns[fd]
    try:
        data = conn.recv(size)
    except BlockingIOError:
        return None
    except OSError:
        data = b""
    if not data:
        with contextlib.suppress(OSError, ValueError):
            ep.unregister(fd)
        del conns[fd]
        conn.close()
    return data


class ControlServer:
    """The daemon side: the listening socket and its connections in the daemon's epoll set.

    Args:
        path: where to listen. ep: the daemon's epoll. handle: message dict -> reply dict (must
            not raise).
    """

    def __init__(self, path: Path, ep: select.epoll, handle: Callable[[dict], dict]):
        self.sock = listen(path)
        self.path, self.ep, self.handle = path, ep, handle
        self.clients: dict[int, socket.socket] = {}
        ep.register(self.sock.fileno(), select.EPOLLIN)

    def owns(self, fd: int) -> bool:
        return fd == self.sock.fileno() or fd in self.clients

    def serve(self, fd: int) -> None:
        """Accept a connection, or answer the message waiting on ``fd``."""
        if fd == self.sock.fileno():
            with contextlib.suppress(BlockingIOError):
                conn, _ = self.sock.accept()
                conn.setblocking(False)
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, MESSAGE_BYTES)
                self.clients[conn.fileno()] = conn
                self.ep.register(conn.fileno(), select.EPOLLIN)
            return
        data = recv_or_drop(self.ep, self.clients, fd, MESSAGE_BYTES)
        if not data:
            return
        try:
            msg = json.loads(data)
            reply = self.handle(msg) if isinstance(msg, dict) else {"ok": False, "error": "not a JSON object"}
        except ValueError as exc:
            reply = {"ok": False, "error": f"bad JSON: {exc}"}
        with contextlib.suppress(OSError):
            self.clients[fd].send(json.dumps(reply).encode())

    def close(self) -> None:
        for c in self.clients.values():
            c.close()
        self.sock.close()
        with contextlib.suppress(OSError):
            os.unlink(self.path)


class ControlClient:
    """The caller's side: one connection, one reply per request.

    Args:
        path: the daemon's socket. timeout_s: per request. error: the exception raised on failure
            (the daemon's own error class).
    """

    def __init__(self, path: str | Path, timeout_s: float = 5.0, error: type[Exception] = OSError):
        self.path, self.timeout_s, self.error = str(path), timeout_s, error
        self._sock: socket.socket | None = None

    def call(self, msg: dict) -> dict:
        """Send ``msg``; its reply, which has ``ok`` true.

        Raises:
            self.error: the daemon cannot be reached, closed the connection, timed out, or
                answered ``ok: false`` (its error is quoted).
        """
        if self._sock is None:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
            s.settimeout(self.timeout_s)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, MESSAGE_BYTES)
            try:
                s.connect(self.path)
            except OSError as exc:
                s.close()
                raise self.error(f"control socket {self.path}: {exc}") from None
            self._sock = s
        try:
            self._sock.send(json.dumps(msg).encode())
            data = self._sock.recv(MESSAGE_BYTES)
        except OSError as exc:
            self.close()
            raise self.error(f"control socket {self.path}: {exc}") from None
        if not data:
            self.close()
            raise self.error(f"the daemon at {self.path} closed the control connection")
        reply = json.loads(data)
        if not reply.get("ok"):
            raise self.error(f"the daemon at {self.path} refused {msg.get('op')}: {reply.get('error')}")
        return reply

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
