#!/usr/bin/env python3
"""What a CFS quota write grants: a CPU-bound process under a quota rewritten during its run.

    sudo .venv/bin/python benchmarks/cfs_writes_bench.py [--seconds 8] [--repeats 2]

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
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import textwrap
import threading
import time

from testbed.core import cgroups

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


def measure(way: str, k: float, seconds: float, every_s: float = 1.5, threads: int = 2) -> float:
    """The CPU a process of ``threads`` spinning threads took over its quota's allowance (1.0 =
    exact), in a group of :data:`CORES` at dilation ``k`` for ``seconds``, its quota written
    ``way`` (one of :data:`WAYS`) every ``every_s``."""
    dirs = cgroups.create_limited_group(f"testbed-bench-writes-{os.getpid()}", CORES, 256, time_dilation=k)
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
                cgroups.set_cpu_quota(dirs, CORES)
            elif way != "none":
                writer.set_cpu_quota(CORES)
        cpu_s = float(p.stdout.read())
    finally:
        stop.set()
        if p.poll() is None:
            p.kill()
            p.wait()
        cgroups.remove_groups(dirs)
    return cpu_s / (seconds * cgroups.dilated_quota_us(CORES, k) / 1e6 / period_s)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=8.0, help="each process's run (s)")
    ap.add_argument("--repeats", type=int, default=2)
    a = ap.parse_args(argv)
    print(f"load average (1 min) before: {os.getloadavg()[0]:.2f}")
    ks = (2.0, 10.0)
    print("| quota written | " + " | ".join(f"period {cgroups.dilated_period_us(k) / 1e6:g} s" for k in ks) + " |")
    print("|---|" + "---|" * len(ks))
    for way in WAYS:
        cells = [sum(measure(way, k, a.seconds) for _ in range(a.repeats)) / a.repeats for k in ks]
        print(f"| {way} | " + " | ".join(f"{c:.2f}" for c in cells) + " |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
