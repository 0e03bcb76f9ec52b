"""Post-bring-up self-check: measured RTT of every source -> cluster path against the configured one.

Expected RTT = 2 x the sum of one-way delays along the path the controller actually installed
(system-model.md), host links included. A path passes when
``|median measured - expected| <= tol_ms + tol_pct/100 x expected + per_switch_ms x switches on the path``.
"""

from __future__ import annotations

import re
import statistics
import subprocess
from dataclasses import dataclass

_TIME = re.compile(r"time=([\d.]+) ms")


@dataclass
class RttResult:
    """One path's check. Times in ms; ``samples`` are the individual ping RTTs."""

    source: str
    cluster: str
    dpids: list[int]
    expected_ms: float
    samples: list[float]
    tolerance_ms: float

    @property
    def median_ms(self) -> float:
        return statistics.median(self.samples) if self.samples else float("nan")

    @property
    def error_ms(self) -> float:
        return self.median_ms - self.expected_ms

    @property
    def ok(self) -> bool:
        return bool(self.samples) and abs(self.error_ms) <= self.tolerance_ms


def parse_ping(output: str) -> list[float]:
    """RTTs in ms from iputils ``ping`` output (one ``time=X ms`` per reply)."""
    return [float(m) for m in _TIME.findall(output)]


def check_rtts(emu, plan, path_of, count: int, tol_ms: float, tol_pct: float,
               per_switch_ms: float = 0.0) -> list[RttResult]:
    """Ping every cluster from every source (in parallel per pair) and compare with the expected RTT.

    Args:
        emu: the started :class:`~testbed.emulation.network.Emulation`.
        plan: its plan.
        path_of: ``(src_mac, dst_mac) -> (dpids, one_way_ms)`` from the controller.
        count: pings per pair (after one warm-up ping that resolves ARP).
        tol_ms, tol_pct, per_switch_ms: tolerance, absolute (ms) plus relative (% of expected) plus
            per switch on the controller's path (ms).

    Returns:
        One :class:`RttResult` per (source, cluster) pair.
    """
    pairs = [(s, c) for s in plan.sources for c in plan.clusters]
    warm = [emu.node(s.name).popen(["ping", "-c", "2", "-i", "0.2", "-W", "2", c.ip],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for s, c in pairs]
    for p in warm:
        p.wait()
    procs = [emu.node(s.name).popen(["ping", "-n", "-c", str(count), "-i", "0.2", "-W", "2", c.ip],
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for s, c in pairs]
    results = []
    for (s, c), p in zip(pairs, procs, strict=True):
        out, _ = p.communicate()
        dpids, one_way = path_of(s.mac, c.mac)
        expected = 2.0 * one_way
        results.append(RttResult(s.name, c.name, dpids, expected, parse_ping(out),
                                 tol_ms + tol_pct / 100.0 * expected + per_switch_ms * len(dpids)))
    return results
