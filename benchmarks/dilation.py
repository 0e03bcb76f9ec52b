"""Time dilation, validated: the emulation at k against the simulator, dilation where the host keeps
up, the load ceiling in emulated q/s, and a model call's service time under the nested CPU limit.

Run from the repository root (root; every emulation under the shared lock: ``flock /tmp/emu.lock``):

``python -m benchmarks.dilation service [--model mobilenet_v2_035] [--cores 0.5] [--ks 1,2,4]``
    the service-time distribution in emulated time (wall / k) of a model's calls back to back at
    ``cores`` under dilation k, through the server's scheduler (nested caps at one core or more,
    the server's padding below: :func:`testbed.plan.dilation.nested_cpu`): p50, p95, mean, the
    two-sample Kolmogorov-Smirnov statistic against k = 1 and against the model's profile at
    ``cores`` (``models/profiles``: the undilated reference) (no emulation, no lock).
``python -m benchmarks.dilation validate [EXPERIMENT ...] [--k auto|K[,K...]] [--duration 20s]``
    each experiment (default: ``experiments/default.yaml`` and the 9 ``scenario-*.yaml``) emulated
    at each k (``auto``: :func:`testbed.emu.autodilate.choose`) and simulated on the same seed: success
    ratio, e2e p50 and network excess p50 of each, and the emulation's wall time.
``python -m benchmarks.dilation light [--ks 1,4] [--duration 20s]``
    a light experiment (the triangle, 4 q/s per source) at each k: success ratio with its 95 %
    Wilson interval and e2e p50 with its 95 % order-statistic interval.
``python -m benchmarks.dilation ceiling [--ks 1,2,4,auto] [--rates 50,100,200,400,800,1200]``
    the triangle's load ceiling in emulated q/s at MTU 1500 (both sources, ``rate_qps`` per source
    = rate / 2, ``duration`` 10 s emulated, clusters of 2 cores and 2 workers: ``CEILING_CLUSTERS``):
    the highest rate whose network excess p50 stays under 2 ms with no query dropped; and the
    wall time each run took.

Every subcommand appends its rows to ``--out`` (default ``runs/dilation``) as ``<subcommand>.csv``
and prints a Markdown table. Emulated figures depend on this machine's load (2 shared cores): each
table compares rows measured in the same invocation.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parent.parent
SCENARIOS = sorted(str(p) for p in (REPO / "experiments").glob("scenario-*.yaml"))
DEFAULT = str(REPO / "experiments" / "default.yaml")
TRIANGLE = REPO / "experiments" / "triangle.yaml"
#: The ceiling's clusters: the triangle's, with 2 cores and 2 workers each (the network, not the
#: clusters' CPU, is what the ceiling measures).
CEILING_CLUSTERS = [
    {"name": "edgeb", "site": "B", "tier": "far_edge", "cpu_cores": 2.0, "workers": 2, "queue_limit": 64,
     "models": ["digits_small"]},
    {"name": "edgec", "site": "C", "tier": "near_edge", "cpu_cores": 2.0, "workers": 2, "queue_limit": 64,
     "models": ["digits_small", "digits_large"]}]
#: The network excess p50 (ms) under which a load counts as carried (the issue's bound).
CEILING_EXCESS_MS = 2.0


def _table(df: pd.DataFrame) -> str:
    cols = list(df.columns)
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for row in df.itertuples(index=False):
        lines.append("| " + " | ".join("" if v is None or (isinstance(v, float) and math.isnan(v)) else
                                       f"{v:.4g}" if isinstance(v, float) else str(v) for v in row) + " |")
    return "\n".join(lines)


def _save(out: Path, name: str, rows: list[dict]) -> pd.DataFrame:
    out.mkdir(parents=True, exist_ok=True)
    df = pd.DataFrame(rows)
    path = out / f"{name}.csv"
    df.to_csv(path, mode="a", header=not path.exists(), index=False)
    print(_table(df))
    print(f"(appended to {path})")
    return df


# ----------------------------------------------------------------------------- service

#: The measuring child: the model loaded as the server loads it, its calls made back to back
#: through the server's own :class:`testbed.serve.scheduler.Scheduler` (``cpu_pad`` as the plan
#: gives a cluster), after READY / GO; prints each call's t3 - t2 (ms, wall clock).
SERVICE_CHILD = """
import json, sys, threading, time
from pathlib import Path
from testbed.plan import zoo
from testbed.serve.scheduler import Job, Scheduler
from testbed.serve.zoo import load_model
zoo_dir, name, runtime, threads, pad, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), \
    float(sys.argv[5]), int(sys.argv[6])
manifest = zoo.load_manifest(zoo_dir)
model = load_model(Path(zoo_dir), name, runtime, manifest, threads=threads)
x = zoo.load_payloads(zoo_dir, manifest["variants"][name]["family"])[0]
model.warm_up(x, calls=20, batch=1)
cpu = []
class Timed:  # the model, its calls' CPU time (worker thread) noted
    runtime = model.runtime
    def predict(self, xb):
        t = time.thread_time()
        try:
            return model.predict(xb)
        finally:
            cpu.append((time.thread_time() - t) * 1e3)
sched = Scheduler({name: Timed()}, cpu_pad=pad)
sched.start()  # its worker thread exists before READY: the caps find it
print("READY", flush=True)
sys.stdin.readline()
out = []
for i in range(n):
    done = threading.Event()
    job = Job(model=name, x=x[i % len(x)][None], done=lambda j, d=done: d.set())
    sched.submit(job)
    done.wait()
    out.append((job.t3 - job.t2) / 1e6)
sched.stop()
print("RESULT " + json.dumps({"wall_ms": out, "cpu_ms": cpu}), flush=True)
"""


def _service_samples(model: str, cores: float, k: float, samples: int) -> tuple[list[float], list[float]]:
    """Per-call times (ms, emulated: wall / k) and CPU times (ms) of ``model`` back to back at
    ``cores`` under dilation k: nested per-thread caps at one core or more, the server's padding below
    (:func:`testbed.plan.dilation.nested_cpu`), inside the cluster's quota per k x its period."""
    from testbed.core import cgroups
    from testbed.core.clock import EmulatedClock
    from testbed.model.cpu import threads_per_call
    from testbed.plan.dilation import nested_cpu
    from testbed.serve.handling import default_runtime
    from testbed.serve.zoo import load_manifest

    zoo = REPO / "models" / "zoo"
    runtime = default_runtime(load_manifest(zoo), model)
    pad = 0.0 if k == 1 or nested_cpu(cores) else k - 1
    cmd = [sys.executable, "-c", SERVICE_CHILD, str(zoo), model, runtime, str(threads_per_call(cores, 1)), repr(pad),
           str(samples)]
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}, cwd=str(REPO))
    dirs = []
    try:
        if proc.stdout.readline().strip() != "READY":
            raise RuntimeError(proc.stderr.read()[-2000:])
        dirs = cgroups.create_limited_group(f"testbed-dilationbench-{os.getpid()}-{k:g}".replace(".", "p"), cores,
                                            2048, time_dilation=k)
        cgroups.add_process(dirs, proc.pid)
        if nested_cpu(cores):
            cgroups.cap_threads(dirs, proc.pid, k)
        out, err = proc.communicate("GO\n", timeout=3600)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        cgroups.remove_thread_groups(dirs)
        for d in dirs:
            d.rmdir()
    got = json.loads(next(ln for ln in out.splitlines() if ln.startswith("RESULT "))[len("RESULT "):])
    return [EmulatedClock(k).emulated(v) for v in got["wall_ms"]], got["cpu_ms"]


def _profile_row(model: str, cores: float) -> dict:
    """The model's profiled back-to-back batch-1 row at ``cores`` (``models/profiles/<model>.json``:
    the undilated reference, measured by ``testbed profile``), or {}."""
    try:
        doc = json.loads((REPO / "models" / "profiles" / f"{model}.json").read_text())
    except (OSError, ValueError):
        return {}
    return next((r for r in doc.get("measurements", []) if float(r.get("cpu_cores", -1)) == cores
                 and r.get("load") == "back_to_back" and int(r.get("batch", r.get("batch_size", 1))) == 1
                 and r.get("runtime", doc.get("runtime")) in (None, "litert")), {})


def cmd_service(a: argparse.Namespace) -> int:
    from scipy.stats import ks_2samp

    ks = [float(x) for x in a.ks.split(",")]
    got, cpus = {}, {}
    t_all = time.monotonic()
    for k in ks:
        t = time.monotonic()
        wall, cpu = _service_samples(a.model, a.cores, k, a.samples)
        got[k], cpus[k] = np.asarray(wall), np.asarray(cpu)
        print(f"k = {k:g}: {len(got[k])} calls in {time.monotonic() - t:.1f} s", flush=True)
    ref = got[ks[0]]
    prof = _profile_row(a.model, a.cores)
    rows = []
    for k in ks:
        x = got[k]
        ks_stat = ks_2samp(ref, x)
        rows.append({"model": a.model, "cores": a.cores, "k": k, "calls": len(x),
                     "p50_ms": float(np.percentile(x, 50)), "p95_ms": float(np.percentile(x, 95)),
                     "mean_ms": float(x.mean()), "cpu_p50_ms": float(np.percentile(cpus[k], 50)),
                     "cpu_mean_ms": float(cpus[k].mean()),
                     "p50_vs_k1": float(np.percentile(x, 50) / np.percentile(ref, 50)),
                     "mean_vs_k1": float(x.mean() / ref.mean()), "ks_stat": float(ks_stat.statistic),
                     "ks_p": float(ks_stat.pvalue),
                     "ks_vs_profile": float(ks_2samp(prof["samples_ms"], x).statistic) if prof else None,
                     "profile_p50_ms": prof.get("p50_ms"),
                     "profile_p95_ms": prof.get("p95_ms"), "profile_mean_ms": prof.get("mean_ms")})
    _save(Path(a.out), "service", rows)
    print(f"wall {time.monotonic() - t_all:.1f} s")
    return 0


# ----------------------------------------------------------------------------- emulation helpers

def _plan(path: str | Path, k: float | None, overrides: dict | None = None):
    """The experiment's plan with dilation k (None: as configured) and top-level overrides."""
    from testbed.plan.build import build_plan
    from testbed.plan.dilation import with_time_dilation
    from testbed.spec.experiment import load_experiment

    exp = load_experiment(path)
    if overrides:
        exp = type(exp).model_validate({**exp.model_dump(), **overrides})
    plan = build_plan(exp, base_dir=Path(path).parent)
    return with_time_dilation(plan, k) if k is not None else plan


def _k_of(a_k: str, plan) -> float:
    if a_k == "auto":
        from rich.console import Console

        from testbed.emu.autodilate import choose

        return choose(plan, Console()).k
    return float(a_k)


def _figures(s: dict) -> dict:
    return {"success": s.get("success_ratio"), "e2e_p50_ms": (s.get("e2e_ms") or {}).get("p50"),
            "excess_p50_ms": (s.get("network_excess_ms") or {}).get("p50"), "queries": s.get("queries")}


def _emulate(plan, out: Path, duration: float) -> tuple[dict, float, Path]:
    from testbed.results.runs import run_emulation

    out.mkdir(parents=True, exist_ok=True)
    before = set(out.iterdir())
    t = time.monotonic()
    code = run_emulation(plan, runs_dir=out, duration_s=duration)
    wall = time.monotonic() - t
    run_dir = next(iter(set(out.iterdir()) - before))
    s = json.loads((run_dir / "summary.json").read_text()) if (run_dir / "summary.json").exists() else {}
    s["exit_code"] = code
    return s, wall, run_dir


def _simulate(plan, out: Path, duration: float) -> dict:
    from testbed.results.runs import run_simulation

    _, s = run_simulation(plan, runs_dir=out, duration_s=duration, quiet=True)
    return s


# ----------------------------------------------------------------------------- validate

def cmd_validate(a: argparse.Namespace) -> int:
    from testbed.spec.units import parse_duration_s

    duration = parse_duration_s(a.duration, item="--duration")
    rows = []
    for path, k_text in ((p, k) for p in a.experiments or [DEFAULT, *SCENARIOS] for k in a.k.split(",")):
        plan = _plan(path, None)
        k = _k_of(k_text, plan)
        plan = _plan(path, k)
        s_emu, wall, run_dir = _emulate(plan, Path(a.out) / "validate-emu", duration)
        s_sim = _simulate(plan, Path(a.out) / "validate-sim", duration)
        e, m = _figures(s_emu), _figures(s_sim)
        rows.append({"experiment": Path(path).stem, "k": k, "exit": s_emu["exit_code"], "queries": e["queries"],
                     "success_emu": e["success"], "success_sim": m["success"],
                     "d_success_pts": None if e["success"] is None else 100 * (e["success"] - m["success"]),
                     "e2e_p50_emu": e["e2e_p50_ms"], "e2e_p50_sim": m["e2e_p50_ms"],
                     "excess_p50_emu": e["excess_p50_ms"], "excess_p50_sim": m["excess_p50_ms"],
                     "wall_s": round(wall, 1), "run_dir": run_dir.name})
        print(rows[-1], flush=True)
    _save(Path(a.out), "validate", rows)
    return 0


# ----------------------------------------------------------------------------- light

def _wilson(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95 % Wilson score interval of a binomial proportion (Wilson 1927)."""
    if n == 0:
        return (math.nan, math.nan)
    p = successes / n
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return c - h, c + h


def _median_ci(x: np.ndarray, z: float = 1.96) -> tuple[float, float]:
    """95 % distribution-free interval of the median: order statistics n/2 -/+ z sqrt(n)/2
    (the binomial's normal approximation; e.g. Conover, Practical Nonparametric Statistics, 3.2)."""
    x = np.sort(x)
    n = len(x)
    if n < 6:
        return (math.nan, math.nan)
    lo = max(0, int(math.floor(n / 2 - z * math.sqrt(n) / 2)))
    hi = min(n - 1, int(math.ceil(n / 2 + z * math.sqrt(n) / 2)))
    return float(x[lo]), float(x[hi])


def cmd_light(a: argparse.Namespace) -> int:
    from testbed.spec.units import parse_duration_s

    duration = parse_duration_s(a.duration, item="--duration")
    rows = []
    for k in (float(x) for x in a.ks.split(",")):
        s, wall, run_dir = _emulate(_plan(TRIANGLE, k), Path(a.out) / "light", duration)
        df = pd.read_csv(run_dir / "records.csv")
        ok = int((df["outcome"] == "success").sum())
        answered = df[(df["http_status"] == 200) & df["e2e_ms"].notna()]["e2e_ms"].to_numpy()
        lo, hi = _wilson(ok, len(df))
        elo, ehi = _median_ci(answered)
        rows.append({"k": k, "exit": s["exit_code"], "queries": len(df), "success": ok / len(df) if len(df) else None,
                     "success_ci": f"{lo:.3f}-{hi:.3f}", "e2e_p50_ms": float(np.median(answered)),
                     "e2e_p50_ci": f"{elo:.2f}-{ehi:.2f}",
                     "excess_p50_ms": (s.get("network_excess_ms") or {}).get("p50"), "wall_s": round(wall, 1),
                     "run_dir": run_dir.name})
        print(rows[-1], flush=True)
    _save(Path(a.out), "light", rows)
    return 0


# ----------------------------------------------------------------------------- ceiling

def cmd_ceiling(a: argparse.Namespace) -> int:
    rows = []
    for k_text in a.ks.split(","):
        for rate in (float(r) for r in a.rates.split(",")):
            over = {"workload": [{"application": "digits", "sources": "all", "rate_qps": rate / 2}],
                    "duration_s": a.duration_s, "clusters": CEILING_CLUSTERS}
            plan = _plan(TRIANGLE, None, over)
            k = _k_of(k_text, plan)
            s, wall, run_dir = _emulate(_plan(TRIANGLE, k, over), Path(a.out) / "ceiling", a.duration_s)
            f = _figures(s)
            full = (s.get("failures") or {}).get("dropped", 0)
            carried = f["excess_p50_ms"] is not None and f["excess_p50_ms"] < CEILING_EXCESS_MS and not full
            rows.append({"k_asked": k_text, "k": k, "rate_qps": rate, "exit": s["exit_code"], "queries": f["queries"],
                         "answered_qps": s.get("throughput_qps"), "success": f["success"],
                         "excess_p50_ms": f["excess_p50_ms"], "dropped": full, "carried": carried,
                         "wall_s": round(wall, 1), "run_dir": run_dir.name})
            print(rows[-1], flush=True)
            if not carried:
                break  # the ceiling at this k is the previous rate
    _save(Path(a.out), "ceiling", rows)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(REPO / "runs" / "dilation"))
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("service")
    p.add_argument("--model", default="mobilenet_v2_035")
    p.add_argument("--cores", type=float, default=0.5)
    p.add_argument("--ks", default="1,2,4")
    p.add_argument("--samples", type=int, default=200)
    p.set_defaults(func=cmd_service)
    p = sub.add_parser("validate")
    p.add_argument("experiments", nargs="*")
    p.add_argument("--k", default="auto")
    p.add_argument("--duration", default="20s")
    p.set_defaults(func=cmd_validate)
    p = sub.add_parser("light")
    p.add_argument("--ks", default="1,4")
    p.add_argument("--duration", default="20s")
    p.set_defaults(func=cmd_light)
    p = sub.add_parser("ceiling")
    p.add_argument("--ks", default="1,2,4,auto")
    p.add_argument("--rates", default="50,100,200,400,800,1200")
    p.add_argument("--duration-s", type=float, default=10.0)
    p.set_defaults(func=cmd_ceiling)
    a = ap.parse_args(argv)
    return a.func(a)


if __name__ == "__main__":
    sys.exit(main())
