"""Lateness is counted per link: one emulator process serves up to 64 links, and the summary
prints one row per link (it used to print the process's figure on every row)."""

from __future__ import annotations

import random
import socket
from collections import deque

from testbed.emu import linkemu


def _direction(name: str, due_s: list[float]) -> tuple[linkemu._Direction, socket.socket]:
    tx, peer = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    d = linkemu._Direction(name=name, link=None, rx=tx, tx=tx, rng=random.Random(0))  # type: ignore[arg-type]
    d.queue = deque((t, b"x" * 60) for t in due_s)
    return d, peer


def test_flush_counts_lateness_on_the_direction_that_sent() -> None:
    busy, p1 = _direction("busy", [1.000, 1.002, 1.004])
    idle, p2 = _direction("idle", [])
    emu = object.__new__(linkemu.LinkEmulator)  # _flush touches only the direction when nothing fails
    linkemu.LinkEmulator._flush(emu, busy, now=1.010)
    linkemu.LinkEmulator._flush(emu, idle, now=1.010)
    assert busy.frames == 3 and len(p1.recv(100)) == 60
    assert abs(busy.late_max - 0.010) < 1e-12
    assert abs(busy.late_sum - (0.010 + 0.008 + 0.006)) < 1e-12
    assert idle.frames == 0 and idle.late_max == 0.0 and idle.late_sum == 0.0
    for s in (busy.tx, p1, idle.tx, p2):
        s.close()
