"""A sweep on Ray against the local process pool: wall time, and the same results.

Run: ``nice -n 19 .venv/bin/python benchmarks/sweep_bench.py [--duration 120s] [--seeds 2] [--policies ...]``

The same sweep (default: every ``experiments/scenario-*.yaml`` -- nine since Dec 2; the figures of
docs/scale-out.md were taken with the first six, ``--experiments
experiments/scenario-{low,capacity,bursty,hotspot,degradation,failure}.yaml`` -- x closest,
least_loaded, min_latency, random x seeds 1..2, each run 120 simulated s: 48 cells with six) three
ways, each into a fresh folder:

1. ``process``: :func:`testbed.results.sweep_runner.sweep` with the process pool, ``--jobs`` workers (default 2);
2. ``ray embedded``: ``backend="ray"``, the embedded local Ray with ``--jobs`` CPUs (``ray.init()``);
3. ``ray cluster``: a local two-node cluster (``ray.cluster_utils.Cluster``: head + one worker,
   ``--jobs`` // 2 CPUs each, every service on 127.0.0.1), the sweep with ``ray_address``.

Printed per way: wall time of the sweep call (Ray's start included for the embedded one, the
cluster's start timed apart), and whether ``table.csv`` and ``runs.parquet`` (less the ``wall_s``
column) equal the process pool's exactly. Wall-clock on a shared 2-core machine: say what ran beside it.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parent.parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--experiments", nargs="+",
                    default=sorted(str(p) for p in (REPO / "experiments").glob("scenario-*.yaml")))
    ap.add_argument("--policies", default="closest,least_loaded,min_latency,random")
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--duration", default="120s")
    ap.add_argument("--jobs", type=int, default=2)
    a = ap.parse_args()
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # loopback only (testbed.core.distributed)
    from rich.console import Console

    from testbed.results.sweep_runner import sweep
    from testbed.spec.units import parse_duration_s

    pols = a.policies.split(",")
    seeds = list(range(1, a.seeds + 1))
    dur = parse_duration_s(a.duration, item="--duration")
    quiet = Console(quiet=True)
    cells = len(a.experiments) * len(pols) * len(seeds)
    print(f"{cells} cells: {len(a.experiments)} experiments x {len(pols)} policies x {len(seeds)} seeds, "
          f"{dur:g} simulated s each, {a.jobs} CPUs")
    with tempfile.TemporaryDirectory(prefix="sweep-bench-") as tmp:
        out = {}

        def timed(name: str, **kw) -> None:
            t = time.perf_counter()
            sweep(a.experiments, pols, seeds, Path(tmp) / name, duration_s=dur, console=quiet, **kw)
            out[name] = time.perf_counter() - t

        timed("process", jobs=a.jobs)
        timed("ray embedded", jobs=a.jobs, backend="ray")
        from ray.cluster_utils import Cluster

        t = time.perf_counter()
        c = Cluster(initialize_head=True, head_node_args={"num_cpus": max(1, a.jobs // 2), "include_dashboard": False})
        c.add_node(num_cpus=max(1, a.jobs - a.jobs // 2))
        c.wait_for_nodes()
        start = time.perf_counter() - t
        try:
            timed("ray cluster", ray_address=c.address)
        finally:
            c.shutdown()
        ref_t = pd.read_csv(Path(tmp) / "process" / "table.csv")
        ref_r = pd.read_parquet(Path(tmp) / "process" / "runs.parquet").drop(columns="wall_s")
        for name, wall in out.items():
            d = Path(tmp) / name
            same_t = ref_t.equals(pd.read_csv(d / "table.csv"))
            same_r = ref_r.equals(pd.read_parquet(d / "runs.parquet").drop(columns="wall_s"))
            extra = f" (+ {start:.1f} s to start the 2-node cluster)" if name == "ray cluster" else ""
            print(f"{name:13s} {wall:7.1f} s{extra}; {cells / wall:5.2f} cells/s; table identical: {same_t}; "
                  f"runs identical: {same_r}")


if __name__ == "__main__":
    main()
