#!/usr/bin/env python3
"""CPU time a server spends per query, against the model call alone: what a cluster's CFS quota pays.

    sudo .venv/bin/python benchmarks/server_cpu_bench.py [--variants hand_full,face_dual,mobilenet_v2_100] [-n 300]

One LiteRT server per variant (``benchmarks/server_bench.start_server``: 1 worker, 1 thread, on
127.0.0.1, no CPU limit), queries one at a time with the family's real request bodies (JPEG
frames in base64). Per query: the server process's CPU time (user + system, from
``/proc/<pid>/stat``, over the whole run of ``n`` queries, divided by ``n``), the model call's
wall time (T3 - T2, p50 and mean) and the part before it (T2 - T1: request parsing, base64 and JPEG
decoding, queue hand-off). The CFS quota of a cluster is spent by all of the CPU time, while the
profiles (``models/profiles``) and the simulator's CPU model (``testbed/model/cpu.py``) charge
only the model call: the ratio CPU per query / model call mean is the factor the quota really
pays. Root is not needed (no cgroup), only the built zoo. Timings on the shared machine are noisy;
the CPU time per query much less so.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))
from server_bench import ZOO, start_server, stop_server  # noqa: E402

from testbed.inference import zoo  # noqa: E402

CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """User + system CPU time of ``pid`` (all threads), s."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def measure(variant: str, n: int, tmp: Path) -> dict[str, float]:
    """One server for ``variant``: ``n`` sequential queries after 20 warm-up ones."""
    manifest = json.loads((ZOO / "manifest.json").read_text())
    family = manifest["variants"][variant]["family"]
    bodies, _ = zoo.request_bodies(ZOO, family)
    proc, port, dirs = start_server("litert", [variant], tmp, use_cgroup=False)
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)

        def query(i: int) -> tuple[float, float]:
            conn.request("POST", f"/v1/models/{variant}:predict", bodies[i % len(bodies)],
                         {"Content-Type": "application/json"})
            resp = conn.getresponse()
            resp.read()
            if resp.status != 200:
                raise SystemExit(f"{variant}: HTTP {resp.status}")
            t1, t2, t3 = (int(resp.getheader(f"X-Testbed-T{k}")) for k in (1, 2, 3))
            return (t3 - t2) / 1e6, (t2 - t1) / 1e6

        for i in range(20):
            query(i)
        time.sleep(0.5)  # the stats writer and anything else of the start settle
        c0 = cpu_s(proc.pid)
        model, pre = zip(*(query(i) for i in range(n)), strict=True)
        c1 = cpu_s(proc.pid)
        conn.close()
    finally:
        stop_server(proc, dirs)
    per_query = (c1 - c0) / n * 1e3
    return {"variant": variant, "queries": n, "cpu_per_query_ms": round(per_query, 2),
            "model_p50_ms": round(float(np.median(model)), 2), "model_mean_ms": round(float(np.mean(model)), 2),
            "before_model_p50_ms": round(float(np.median(pre)), 2),
            "cpu_over_model": round(per_query / float(np.mean(model)), 2),
            "request_bytes_mean": int(np.mean([len(b) for b in bodies]))}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--variants", default="hand_full,face_dual,mobilenet_v2_100")
    ap.add_argument("-n", type=int, default=300, help="timed queries per variant")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    print(f"load average {os.getloadavg()[0]:.2f}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    rows = []
    with tempfile.TemporaryDirectory(prefix="server-cpu-") as tmp:
        for v in [x.strip() for x in args.variants.split(",") if x.strip()]:
            rows.append(measure(v, args.n, Path(tmp)))
            print(json.dumps(rows[-1]), flush=True)
    from testbed.util import markdown_table

    print(markdown_table(rows, list(rows[0])))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
