#!/usr/bin/env python3
"""What a CFS quota write grants: a CPU-bound process under a quota rewritten during its run.

    sudo .venv/bin/python benchmarks/cfs_writes_bench.py [--seconds 8] [--repeats 2]
    sudo .venv/bin/python benchmarks/cfs_writes_bench.py --ks 10,25,35 --cores 0.25 --ways none --slice-us 1000

A process of two spinning threads runs in a cgroup v1 ``cpu`` group of 0.1 core per 100 ms,
stretched to a period of 0.2 s (k = 2) and of 1 s (k = 10: a 10 ms quota per 1 s), while the same
quota is written again about every 1.5 s, in four ways:

- ``none``: never (the kernel's own enforcement);
- ``anywhere``: :func:`testbed.core.cgroups.set_cpu_quota` at once, wherever the period stands;
- ``aligned``: :class:`testbed.core.cgroups.PeriodAligned`, as the run's quota follower writes
  (the write waits for the period's start);
- ``aligned, busy thread``: the same beside a thread of this process that spins in Python (the
  wait is then late by up to the thread switch interval, 5 ms).

Prints a Markdown table of the CPU the process took over what its quota allows (1.00 = exact),
one column per period, the mean over ``--repeats``. Root and cgroup v1. The machine's 1-minute
load average is printed first: a busy machine only lowers the ratios (the process gets less CPU).

``--ks``, ``--cores`` and ``--ways`` choose the dilations, the group's share (cores) and the ways;
``--slice-us N`` sets the kernel's ``sched_cfs_bandwidth_slice_us`` (the runtime a CPU takes from a
group's quota at a time; 5000 by default, Documentation/scheduler/sched-bwc.rst) to N for the
measurement and restores it after.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

from testbed.core import cgroups

SLICE_FILE = Path("/proc/sys/kernel/sched_cfs_bandwidth_slice_us")

SPIN = textwrap.dedent("""
    import sys, threading, time
    print("READY", flush=True)
    sys.stdin.readline()
    cpu0, end = time.process_time(), time.monotonic() + float(sys.argv[1])
    def spin():
        while time.monotonic() < end:
            pass
    ts = [threading.Thread(target=spin) for _ in range(int(sys.argv[2]))]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    print(time.process_time() - cpu0, flush=True)
""")
CORES = 0.1
WAYS = ("none", "anywhere", "aligned", "aligned, busy thread")


def _busy(stop: threading.Event) -> None:
    x = 0
    while not stop.is_set():
        x += 1


def measure(way: str, k: float, seconds: float, every_s: float = 1.5, threads: int = 2,
            cores: float = CORES) -> float:
    """The CPU a process of ``threads`` spinning threads took over its quota's allowance (1.0 =
    exact), in a group of ``cores`` at dilation ``k`` for ``seconds``, its quota written
    ``way`` (one of :data:`WAYS`) every ``every_s``."""
    dirs = cgroups.create_limited_group(f"testbed-bench-writes-{os.getpid()}", cores, 256, time_dilation=k)
    period_s = cgroups.dilated_period_us(k) / 1e6
    writer = cgroups.PeriodAligned(dirs, period_s)
    stop = threading.Event()
    if "busy" in way:
        threading.Thread(target=_busy, args=(stop,), daemon=True).start()
    p = subprocess.Popen([sys.executable, "-c", SPIN, str(seconds), str(threads)], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
    try:
        p.stdout.readline()
        cgroups.add_process(dirs, p.pid)
        p.stdin.write("go\n")
        p.stdin.flush()
        while p.poll() is None:
            time.sleep(every_s)
            if way == "anywhere":
                cgroups.set_cpu_quota(dirs, cores)
            elif way != "none":
                writer.set_cpu_quota(cores)
        cpu_s = float(p.stdout.read())
    finally:
        stop.set()
        if p.poll() is None:
            p.kill()
            p.wait()
        cgroups.remove_groups(dirs)
    return cpu_s / (seconds * cgroups.dilated_quota_us(cores, k) / 1e6 / period_s)


def _table(ks: list[float], ways: list[str], cores: float, seconds: float, repeats: int) -> None:
    print("| quota written | " + " | ".join(f"period {cgroups.dilated_period_us(k) / 1e6:g} s (k = {k:g})"
                                           for k in ks) + " |")
    print("|---|" + "---|" * len(ks))
    for way in ways:
        cells = [sum(measure(way, k, seconds, cores=cores) for _ in range(repeats)) / repeats for k in ks]
        print(f"| {way} | " + " | ".join(f"{c:.2f}" for c in cells) + " |", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=8.0, help="each process's run (s)")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--ks", default="2,10", help="dilations, comma-separated (default 2,10)")
    ap.add_argument("--cores", type=float, default=CORES, help=f"the group's share (default {CORES})")
    ap.add_argument("--ways", default=",".join(WAYS), help="comma-separated, of: " + ", ".join(WAYS))
    ap.add_argument("--slice-us", type=int, default=None, help="sched_cfs_bandwidth_slice_us during the run")
    a = ap.parse_args(argv)
    ks = [float(x) for x in a.ks.split(",")]
    ways = [w.strip() for w in a.ways.split(",")]
    bad = [w for w in ways if w not in WAYS]
    if bad:
        ap.error(f"unknown way(s) {bad}; known: {', '.join(WAYS)}")
    print(f"load average (1 min) before: {os.getloadavg()[0]:.2f}")
    before = SLICE_FILE.read_text().strip()
    try:
        if a.slice_us is not None:
            SLICE_FILE.write_text(str(a.slice_us))
        print(f"sched_cfs_bandwidth_slice_us {a.slice_us or before}, group of {a.cores:g} cores")
        _table(ks, ways, a.cores, a.seconds, a.repeats)
    finally:
        if a.slice_us is not None:
            SLICE_FILE.write_text(before)
    return 0


if __name__ == "__main__":
    sys.exit(main())
