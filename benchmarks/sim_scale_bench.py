"""The simulator at ISP size: simulated q/s, peak memory, and cost against the number of queries.

Run (one size per child process, so each peak RSS is its own)::

    nice -n 19 .venv/bin/python benchmarks/sim_scale_bench.py                    # 1,000 nodes, 10^6 queries
    nice -n 19 .venv/bin/python benchmarks/sim_scale_bench.py --queries 125000,250000,500000,1000000
    nice -n 19 .venv/bin/python benchmarks/sim_scale_bench.py --profile 200000   # cProfile, top 25 by own time

Scenario: a Gabriel graph of ``--nodes`` nodes (default 1,000; topohub ships Gabriel graphs up to
500 nodes, so the graph is generated here the way topohub's generator places its points: uniform in
a square of side sqrt(n x 10^4) units, no two points closer than 25 units; an edge p-q iff no
other point lies in the circle of diameter pq (Gabriel and Sokal 1969), found among the Delaunay
edges, which contain every Gabriel edge). One unit = 1 km, one-way delay 0.005 ms/km, never below
0.1 ms, 100 Mbit/s links (the topology is written as our YAML with explicit delays). ``--clusters``
edge clusters (default 100: 0.5 core, 2 workers, digits_small + digits_large) on evenly spaced
nodes plus the cloud (20 ms off node 0), ``--sources`` sources (default 50), two applications
(60 ms / 0.9 and 150 ms / 0.97, Poisson 200 + 100 q/s per source), policy ``--policy``
(default ``closest``; ``min_latency`` is load-aware: the dispatcher rebuilds its options after
every query it sends), report interval 500 ms. The simulated time is chosen so that the expected number of queries is
``--queries``.

Measured per size: setup (plan + Simulator construction), simulation wall time (``run_until``,
queries created in [0, T) and then resolved) and CPU time of the process over it (less disturbed
by other jobs on a shared machine), simulated q/s = queries / wall time (and / CPU time),
peak RSS of the child (``resource.getrusage`` ``ru_maxrss``, KiB -> MiB) and RSS after setup.
``--queries`` with several sizes also fits wall = a + b x queries (least squares) and prints R^2,
the per-query cost, and the per-query memory (peak RSS minus setup RSS, divided by queries).
Modes: ``--mode counters`` (``record=False, track_resolved=False``: what sweeps of counters pay,
as benchmarks/sim_bench.py) or ``--mode resolved`` (``track_resolved=True``, the ASET
environment's mode). Timings are wall-clock on a shared 2-core machine.
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
SQUARE_PER_NODE = 10_000.0  # topohub's Gabriel generator: side = sqrt(n x 10^4)
EXCLUSION = 25.0  # topohub's Gabriel generator: minimum distance between two points
MS_PER_KM = 0.005
RATES_QPS = (200.0, 100.0)  # per source: application fast, application hq


def gabriel_graph(n: int, seed: int = 0) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """Points (n x 2, planar units) and the edges (i < j) of their Gabriel graph.

    Points: uniform in a square of side sqrt(n x 10^4), rejecting any closer than 25 units to one
    already placed (topohub's generator). Edges: the Delaunay edges p-q with no third point
    strictly inside the circle of diameter pq.
    """
    from scipy.spatial import Delaunay, cKDTree

    rng = np.random.default_rng(seed)
    side = math.sqrt(n * SQUARE_PER_NODE)
    pts: list[np.ndarray] = []
    tree_pts = np.empty((0, 2))
    while len(pts) < n:
        p = rng.random(2) * side
        if tree_pts.size and np.min(np.sum((tree_pts - p) ** 2, axis=1)) < EXCLUSION ** 2:
            continue
        pts.append(p)
        tree_pts = np.vstack([tree_pts, p])
    pos = np.array(pts)
    tri = Delaunay(pos)
    cand = {tuple(sorted((int(s[i]), int(s[j])))) for s in tri.simplices for i, j in ((0, 1), (1, 2), (0, 2))}
    tree = cKDTree(pos)
    edges = []
    for a, b in sorted(cand):
        mid, r = (pos[a] + pos[b]) / 2, np.linalg.norm(pos[a] - pos[b]) / 2
        inside = [k for k in tree.query_ball_point(mid, r * (1 - 1e-9)) if k not in (a, b)]
        if not inside:
            edges.append((a, b))
    return pos, edges


def write_topology(path: Path, pos: np.ndarray, edges: list[tuple[int, int]]) -> Path:
    """Our YAML topology: nodes R0..R(n-1), links with the delay of their length (1 unit = 1 km)."""
    import yaml

    links = [{"a": f"R{a}", "b": f"R{b}",
              "delay_ms": round(max(0.1, float(np.linalg.norm(pos[a] - pos[b])) * MS_PER_KM), 4)}
             for a, b in edges]
    path.write_text(yaml.safe_dump({"name": f"gabriel{len(pos)}", "nodes": [{"id": f"R{i}"} for i in range(len(pos))],
                                    "links": links}, sort_keys=False))
    return path


def experiment(topo: Path, n_nodes: int, n_clusters: int, n_sources: int, duration_s: float,
               policy: str = "closest") -> dict:
    """The experiment (as the dict an experiment file would hold)."""
    cl_step, src_step = n_nodes // n_clusters, n_nodes // n_sources
    return {
        "name": f"scale{n_nodes}", "duration": f"{duration_s:.3f}s", "policy": policy,
        "report_interval": "500ms",
        "topology": {"source": str(topo), "bandwidth": "100Mbit/s"},
        "cloud": {"attach_to": "R0", "delay": "20ms"},
        "clusters": [{"name": f"edge{i}", "site": f"R{i * cl_step + cl_step // 2}",
                      "tier": "far_edge" if i % 2 else "near_edge", "cpu_cores": 0.5, "workers": 2,
                      "queue_limit": 64, "models": ["digits_small", "digits_large"]} for i in range(n_clusters)]
        + [{"name": "cloud", "site": "cloud", "tier": "cloud", "cpu_cores": 1.0, "workers": 8, "queue_limit": 256,
            "models": ["digits_small", "digits_large"]}],
        "sources": [{"name": f"src{i}", "site": f"R{i * src_step}"} for i in range(n_sources)],
        "applications": [{"name": "fast", "deadline": "60ms", "min_accuracy": 0.9},
                         {"name": "hq", "deadline": "150ms", "min_accuracy": 0.97}],
        "workload": [{"application": "fast", "rate_qps": RATES_QPS[0]},
                     {"application": "hq", "rate_qps": RATES_QPS[1]}],
        "simulation": {"request_bytes": 2000}}


def rss_mib() -> float:
    """Current RSS of this process, MiB (/proc/self/statm, resident pages)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def one_size(args: argparse.Namespace, queries: int, topo: Path, profile: bool = False) -> dict:
    """Build and run one simulation of ``queries`` expected queries in this process; its figures."""
    from testbed.plan.build import build_plan
    from testbed.sim import Simulator
    from testbed.spec.experiment import Experiment

    # whole ms, rounded down: the plan refuses an expected count over its bound of 10^6 queries per run
    duration = math.floor(queries / (args.sources * sum(RATES_QPS)) * 1000) / 1000
    t = time.perf_counter()
    exp = experiment(topo, args.nodes, args.clusters, args.sources, duration, args.policy)
    plan = build_plan(Experiment.model_validate(exp), base_dir=topo.parent)
    sim = Simulator(plan, seed=1, track_resolved=args.mode == "resolved")
    setup_s, setup_rss = time.perf_counter() - t, rss_mib()
    end = duration + 0.15 + 0.2  # largest deadline + the grace: every query resolved
    sim.arrivals_end = duration
    prof = None
    if profile:
        import cProfile

        prof = cProfile.Profile()
        prof.enable()
    t, cpu = time.perf_counter(), time.process_time()
    sim.run_until(end)
    if args.mode == "resolved":
        sim.drain_resolved()
    wall, cpu = time.perf_counter() - t, time.process_time() - cpu
    if prof is not None:
        import pstats

        prof.disable()
        pstats.Stats(prof, stream=sys.stderr).sort_stats("tottime").print_stats(25)
    n = sim.dispatched
    return {"queries": n, "simulated_s": round(duration, 3), "setup_s": round(setup_s, 2), "wall_s": round(wall, 3),
            "cpu_s": round(cpu, 3), "sim_qps": round(n / wall), "sim_qps_cpu": round(n / cpu),
            "setup_rss_mib": round(setup_rss, 1),
            "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
            "served": sum(c.served for c in sim.clusters), "switches": len(plan.switches), "links": len(plan.links),
            "clusters": len(plan.clusters), "sources": len(plan.sources), "mode": args.mode, "policy": args.policy}


def fit(rows: list[dict]) -> str:
    """wall and CPU time = a + b x queries by least squares, with R^2; memory per query."""
    x = np.array([r["queries"] for r in rows], float)
    out = []
    for col in ("wall_s", "cpu_s"):
        y = np.array([r[col] for r in rows], float)
        b, a = np.polyfit(x, y, 1)
        r2 = 1 - np.sum((y - (a + b * x)) ** 2) / np.sum((y - y.mean()) ** 2)
        out.append(f"{col[:-2]} = {a:.3f} s + {b * 1e6:.2f} us x queries (R^2 = {r2:.4f})")
    mem = [(r["peak_rss_mib"] - r["setup_rss_mib"]) * 2**20 / r["queries"] for r in rows]
    return "; ".join(out) + f"; per-query memory above setup: {', '.join(f'{m:.0f}' for m in mem)} B"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--clusters", type=int, default=100)
    ap.add_argument("--sources", type=int, default=50)
    ap.add_argument("--queries", default="1000000", help="comma-separated expected query counts, one child each")
    ap.add_argument("--mode", choices=("counters", "resolved"), default="counters")
    ap.add_argument("--policy", default="closest", help="every source's policy (min_latency: load-aware)")
    ap.add_argument("--graph-seed", type=int, default=0)
    ap.add_argument("--profile", type=int, default=0, help="cProfile one run of this many queries, in this process")
    ap.add_argument("--child", help=argparse.SUPPRESS)  # internal: topology path of a child run
    a = ap.parse_args()
    if a.child:
        print(json.dumps(one_size(a, int(a.queries), Path(a.child))))
        return
    with tempfile.TemporaryDirectory(prefix="sim-scale-") as tmp:
        t = time.perf_counter()
        pos, edges = gabriel_graph(a.nodes, a.graph_seed)
        topo = write_topology(Path(tmp) / f"gabriel{a.nodes}.yaml", pos, edges)
        print(f"Gabriel graph: {a.nodes} nodes, {len(edges)} links, generated in {time.perf_counter() - t:.1f} s")
        if a.profile:
            print(json.dumps(one_size(a, a.profile, topo, profile=True)))
            return
        rows = []
        for q in [int(x) for x in a.queries.split(",")]:
            cmd = [sys.executable, __file__, "--child", str(topo), "--queries", str(q), "--nodes", str(a.nodes),
                   "--clusters", str(a.clusters), "--sources", str(a.sources), "--mode", a.mode, "--policy", a.policy]
            out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout
            rows.append(json.loads(out.strip().splitlines()[-1]))
            print(json.dumps(rows[-1]), flush=True)
        if len(rows) > 2:
            print(fit(rows))


if __name__ == "__main__":
    main()
