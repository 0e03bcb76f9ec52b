#!/usr/bin/env python3
"""CPU time a server spends per query, against the model call alone: what a cluster's CFS quota pays.

    .venv/bin/python benchmarks/server_cpu_bench.py [--variants hand_full,face_dual,mobilenet_v2_100] [-n 300]

The measurement is :func:`testbed.serve.handling.measure_one` (one real LiteRT server per
variant, 1 worker, 1 thread, on 127.0.0.1, no CPU limit; queries one at a time with the family's
real request bodies; CPU time per query of the event-loop thread and of the others), printed next
to the bare call measured just before (and the profile's, ``models/profiles``, unthrottled, back
to back): the ratio (request handling + the call as the server makes it) / bare call is the
factor the quota really pays against what a model charging only the profiled calls assumes. It does not write
``models/profiles/handling.json`` (``python -m testbed.serve.handling`` does). Root is not
needed (no cgroup), only the built zoo.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from testbed.core.util import markdown_table  # noqa: E402
from testbed.plan import profiles  # noqa: E402
from testbed.serve import handling  # noqa: E402

ZOO, PROFILES = REPO / "models" / "zoo", REPO / "models" / "profiles"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--variants", default="hand_full,face_dual,mobilenet_v2_100")
    ap.add_argument("-n", type=int, default=300, help="timed back-to-back queries per variant")
    args = ap.parse_args(argv)
    print(f"load average {os.getloadavg()[0]:.2f}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    rows = []
    with tempfile.TemporaryDirectory(prefix="server-cpu-") as tmp:
        for v in [x.strip() for x in args.variants.split(",") if x.strip()]:
            r = handling.measure_one(ZOO, v, args.n, Path(tmp))
            bare = r["bare_call_cpu_ms"]
            prof = float(profiles.cpu_time(PROFILES, v, r["runtime"], 1, 1).samples_ms.mean())
            per_query = r["handling_ms"] + r["call_cpu_ms"]
            rows.append({"variant": v, "profile's call (wall) ms": f"{prof:.2f}", "bare call CPU ms": f"{bare:.2f}",
                         "event loop CPU ms": f"{r['handling_ms']:.2f}", "call CPU ms": f"{r['call_cpu_ms']:.2f}",
                         "call wall ms": f"{r['call_wall_ms']:.2f}",
                         "CPU per query / bare call": f"{per_query / bare:.2f}",
                         "request bytes": r["request_bytes_mean"]})
            print(rows[-1], flush=True)
    print(markdown_table(rows, list(rows[0])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
