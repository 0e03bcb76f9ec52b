"""Time dilation, validated: the emulation at k against the simulator, dilation where the host keeps
up, the load ceiling in emulated q/s, and a model call's service time under the nested CPU limit.

Run from the repository root (root; every emulation under the shared lock: ``flock /tmp/emu.lock``):

``python -m benchmarks.dilation service [--model mobilenet_v2_035] [--cores 0.5] [--ks 1,2,4]``
    the service-time distribution in emulated time (wall / k) of a model's calls back to back at
    ``cores`` under dilation k, through the server's scheduler (nested caps at one core or more,
    the server's padding below: :func:`testbed.plan.dilation.nested_cpu`): p50, p95, mean, the
    two-sample Kolmogorov-Smirnov statistic against k = 1 and against the model's profile at
    ``cores`` (``models/profiles``: the undilated reference) (no emulation, no lock).
``python -m benchmarks.dilation validate [EXPERIMENT ...] [--k auto|K[,K...]] [--duration 20s] [--hogs 0,2]``
    the validation matrix: each experiment (default: ``experiments/default.yaml``, the 9
    ``scenario-*.yaml`` and the 3 held-out ``generated/held-out/gen-heldout-{1,2,3}.yaml``) emulated
    at each k (default ``auto``: chosen from measured warm-ups, :mod:`testbed.emu.autodilate`) under
    each condition of ``--hogs`` (``0``: as the machine is; ``2``: beside two ``python3 -c "while True:
    pass"``, not niced, started before that condition's rows and stopped after), and simulated on the
    same seed at the speeds the emulated run recorded (``testbed compare``'s twin). Each row: k and
    how long choosing it took, the emulation's wall time, success, e2e p50 / p95 and the per-stage
    medians (dispatch, network, handling, queueing, inference; answered queries) of both engines,
    the run's own "too small a k" check, and the targets judged (:data:`TARGETS`: success within 3
    points, e2e p50 and p95 within 10 %, every stage's median within 1 ms or 10 %). Writes
    ``validate.json`` (rows, targets, the command), ``validate.csv`` and
    ``validate.md`` under ``--out`` (replaced, not appended); each row also has the host's load average
    before it (``load_before``; the machine may be shared). ``--lock /tmp/emu.lock`` takes the lock per
    row (hogs inside it) instead of around the whole matrix; ``--result NAME`` also writes
    ``benchmarks/results/NAME.json`` (docs/results.md); ``--no-row-after HH:MM`` starts no row after
    that UTC time.
``python -m benchmarks.dilation light [--ks 1,4] [--duration 20s]``
    a light experiment (the triangle, 4 q/s per source) at each k: success ratio with its 95 %
    Wilson interval and e2e p50 with its 95 % order-statistic interval.
``python -m benchmarks.dilation ceiling [--ks 1,2,4,auto] [--rates 50,100,200,400,800,1200] [--hogs N] [--result NAME]``
    the triangle's load ceiling in emulated q/s at MTU 1500 (both sources, ``rate_qps`` per source
    = rate / 2, ``duration`` 10 s emulated, clusters of 2 cores and 2 workers: ``CEILING_CLUSTERS``):
    the highest rate whose network excess p50 stays under 2 ms with no query dropped; and the
    wall time each run took.

The other subcommands append their rows to ``--out`` (default ``runs/dilation``) as
``<subcommand>.csv`` and print a Markdown table. Emulated figures depend on this machine's load (2 shared cores): each
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
HELD_OUT = [str(REPO / "experiments" / "generated" / "held-out" / f"gen-heldout-{i}.yaml") for i in (1, 2, 3)]
#: The validation's targets (issue: one experiment, one answer on any host): success within 3
#: points; e2e p50 and p95 within 10 %; every stage's median within 1 ms or 10 %; the network
#: excess p50 (network time over the path's expected RTT) within 2 ms of the simulator's.
TARGETS = {"success_points": 3.0, "e2e_pct": 10.0, "stage_ms": 1.0, "stage_pct": 10.0, "excess_ms": 2.0}
#: The per-query stages (records' columns, ms) whose medians are compared.
STAGES = ("dispatch", "network", "handling", "queueing", "inference")
#: A CPU hog (``--hogs``): not niced, so it competes with the emulation.
HOG = "while True: pass"
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
from testbed.serve.loaders import load_model
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
    from testbed.serve.loaders import load_manifest

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


def _k_of(a_k: str, plan):
    """``auto`` or a number, as ``with_time_dilation`` takes it (auto is chosen by the run)."""
    return "auto" if a_k == "auto" else float(a_k)


class Hogs:
    """``n`` CPU hogs (``python3 -c "while True: pass"``, not niced) while inside; stopped on exit."""

    def __init__(self, n: int):
        self.n, self.procs = n, []

    def __enter__(self) -> Hogs:
        self.procs = [subprocess.Popen([sys.executable, "-c", HOG]) for _ in range(self.n)]
        if self.procs:
            print(f"{self.n} CPU hog(s) started: pids {', '.join(str(p.pid) for p in self.procs)}", flush=True)
        return self

    def __exit__(self, *exc) -> None:
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def _figures(s: dict) -> dict:
    return {"success": s.get("success_ratio"), "e2e_p50_ms": (s.get("e2e_ms") or {}).get("p50"),
            "excess_p50_ms": (s.get("network_excess_ms") or {}).get("p50"), "queries": s.get("queries")}


def _emulate(plan, out: Path, duration: float) -> tuple[dict, float, Path]:
    """Emulate ``plan`` (auto: k chosen by the run) under ``out``: (summary with ``exit_code``, ``k``
    and ``auto_s``, the wall time of the run alone, its run directory)."""
    from testbed.results.runs import run_emulation

    out.mkdir(parents=True, exist_ok=True)
    before = set(out.iterdir())
    t = time.monotonic()
    code = run_emulation(plan, runs_dir=out, duration_s=duration)
    wall = time.monotonic() - t
    new = [p for p in set(out.iterdir()) - before if (p / "run.json").exists()]
    if not new:
        return {"exit_code": code}, wall, out
    run_dir = new[0]
    s = json.loads((run_dir / "summary.json").read_text()) if (run_dir / "summary.json").exists() else {}
    rec = json.loads((run_dir / "run.json").read_text())
    auto = rec.get("time_dilation_auto") or {}
    s.update(exit_code=code, k=rec.get("time_dilation"), auto_s=auto.get("wall_s"))
    return s, wall - float(auto.get("wall_s") or 0.0), run_dir


def _twin_plan(plan, run_dir: Path | None):
    """The simulator's plan for the emulated run in ``run_dir``: at the speeds that run recorded
    (:func:`testbed.plan.speeds.apply_speeds`, as ``testbed compare``'s twin), else as planned."""
    from testbed.plan.speeds import apply_speeds, read_speeds

    return apply_speeds(plan, read_speeds(run_dir) if run_dir is not None else None)


def _simulate(plan, out: Path, duration: float) -> dict:
    from testbed.results.runs import run_simulation

    run_dir, s = run_simulation(plan, runs_dir=out, duration_s=duration, quiet=True)
    s["_run_dir"] = str(run_dir)
    return s


# ----------------------------------------------------------------------------- validate

def _stage_medians(run_dir: Path) -> dict[str, float | None]:
    """Median (ms) of each stage of :data:`STAGES` and e2e p50 / p95 over the answered queries."""
    from testbed.results.figures import answered
    from testbed.results.record_files import read_records

    path = run_dir / "records.parquet"
    df = answered(read_records(path if path.exists() else run_dir / "records.csv")) if (
        path.exists() or (run_dir / "records.csv").exists()) else pd.DataFrame()
    out: dict[str, float | None] = {}
    for st in STAGES:
        col = pd.to_numeric(df[f"{st}_ms"], errors="coerce").dropna() if f"{st}_ms" in df else pd.Series(dtype=float)
        out[st] = None if col.empty else float(col.median())
    e2e = pd.to_numeric(df["e2e_ms"], errors="coerce").dropna() if "e2e_ms" in df else pd.Series(dtype=float)
    out["e2e_p50"] = None if e2e.empty else float(e2e.quantile(0.5))
    out["e2e_p95"] = None if e2e.empty else float(e2e.quantile(0.95))
    return out


def _pct(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else 100.0 * (a - b) / b


def judge_row(emu: dict, sim: dict, success_emu: float | None, success_sim: float | None,
              excess_emu: float | None = None, excess_sim: float | None = None) -> dict:
    """The targets (:data:`TARGETS`) judged on one row: per figure its difference and whether it
    is within (None: not measured in both engines), and ``all_ok``. ``excess_*``: the network
    excess p50 (ms) of each engine's summary."""
    row: dict = {}
    dx = None if excess_emu is None or excess_sim is None else excess_emu - excess_sim
    row["d_excess_p50_ms"] = dx
    row["excess_ok"] = None if dx is None else abs(dx) <= TARGETS["excess_ms"]
    d = None if success_emu is None or success_sim is None else 100 * (success_emu - success_sim)
    row["d_success_pts"] = d
    row["success_ok"] = None if d is None else abs(d) <= TARGETS["success_points"]
    for q in ("e2e_p50", "e2e_p95"):
        p = _pct(emu.get(q), sim.get(q))
        row[f"d_{q}_pct"] = p
        row[f"{q}_ok"] = None if p is None else abs(p) <= TARGETS["e2e_pct"]
    for st in STAGES:
        a, b = emu.get(st), sim.get(st)
        diff = None if a is None or b is None else a - b
        row[f"d_{st}_ms"] = diff
        row[f"{st}_ok"] = None if diff is None else (abs(diff) <= TARGETS["stage_ms"]
                                                     or abs(diff) <= TARGETS["stage_pct"] / 100 * abs(b))
    judged = [v for k, v in row.items() if k.endswith("_ok")]
    row["all_ok"] = bool(judged) and all(v is not False for v in judged) and any(v is not None for v in judged)
    return row


def _excess_p50(s: dict) -> float | None:
    return (s.get("network_excess_ms") or {}).get("p50")


def _validate_row(path: str, k_text: str, hogs: int, duration: float, out: Path) -> dict:
    from testbed.plan.dilation import with_time_dilation

    plan = _plan(path, None)
    emu_plan = with_time_dilation(plan, _k_of(k_text, plan))
    s_emu, wall, run_dir = _emulate(emu_plan, out / "validate-emu", duration)
    s_sim = _simulate(_twin_plan(with_time_dilation(plan, 1.0), run_dir), out / "validate-sim", duration)
    sim_dir = Path(s_sim.pop("_run_dir"))
    e = _stage_medians(run_dir) if s_emu.get("queries") else {}
    m = _stage_medians(sim_dir)
    check = s_emu.get("dilation_check") or {}
    row = {"experiment": Path(path).stem, "hogs": hogs, "k_asked": k_text, "k": s_emu.get("k"),
           "auto_s": s_emu.get("auto_s"), "wall_s": round(wall, 1), "exit": s_emu["exit_code"],
           "queries": s_emu.get("queries"), "success_emu": s_emu.get("success_ratio"),
           "success_sim": s_sim.get("success_ratio"), "excess_p50_emu": _excess_p50(s_emu),
           "excess_p50_sim": _excess_p50(s_sim),
           **{f"{q}_{eng}": fig.get(q) for eng, fig in (("emu", e), ("sim", m)) for q in ("e2e_p50", "e2e_p95")},
           **{f"{st}_{eng}": fig.get(st) for eng, fig in (("emu", e), ("sim", m)) for st in STAGES},
           "k_too_small": check.get("too_small"), "run_dir": str(run_dir), "sim_dir": str(sim_dir)}
    row.update(judge_row(e, m, s_emu.get("success_ratio"), s_sim.get("success_ratio"), _excess_p50(s_emu),
                         _excess_p50(s_sim)))
    return row


#: The Markdown table's columns (the JSON and CSV have every field).
MD_COLUMNS = ["experiment", "hogs", "load_before", "k", "auto_s", "wall_s", "exit", "queries", "success_emu",
              "success_sim", "d_success_pts", "e2e_p50_emu", "e2e_p50_sim", "e2e_p95_emu", "e2e_p95_sim",
              "excess_p50_emu", "excess_p50_sim",
              *[f"d_{st}_ms" for st in STAGES], "k_too_small", "all_ok"]


def _write_validation(out: Path, rows: list[dict], argv: list[str]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    doc = {"command": "python -m benchmarks.dilation " + " ".join(argv), "targets": TARGETS, "stages": STAGES,
           "rows": rows}
    (out / "validate.json").write_text(json.dumps(doc, indent=1, default=str))
    df = pd.DataFrame(rows)
    df.to_csv(out / "validate.csv", index=False)
    md = _table(df[[c for c in MD_COLUMNS if c in df]]) if not df.empty else "(no rows)"
    ok = int(df["all_ok"].sum()) if "all_ok" in df else 0
    (out / "validate.md").write_text(
        f"# Validation matrix\n\n`{doc['command']}`\n\nTargets: success within {TARGETS['success_points']:g} "
        f"points, e2e p50 and p95 within {TARGETS['e2e_pct']:g} %, every stage's median within "
        f"{TARGETS['stage_ms']:g} ms or {TARGETS['stage_pct']:g} % (d_<stage>_ms: emulated - simulated median), "
        f"network excess p50 within {TARGETS['excess_ms']:g} ms. load_before: the host's 1-minute load average "
        f"before the row (other jobs on the shared machine). "
        f"{ok} of {len(rows)} rows meet every target.\n\n{md}\n")


class Lock:
    """The shared emulation lock (``flock`` on ``path``) while inside; nothing when ``path`` is None.
    ``waited_s``: how long it took to get it."""

    def __init__(self, path: str | None):
        self.path, self.fd, self.waited_s = path, None, 0.0

    def __enter__(self) -> Lock:
        if self.path:
            import fcntl

            t = time.monotonic()
            self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
            fcntl.flock(self.fd, fcntl.LOCK_EX)
            self.waited_s = time.monotonic() - t
        return self

    def __exit__(self, *exc) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing the descriptor releases the flock
            self.fd = None


def _validate_cell(path: str, k_text: str, hogs: int, duration: float, out: Path, lock: str | None) -> dict:
    """One row of the matrix: under the lock (when given) the hogs, then the row; the host's load
    average before the hogs start and after the row (before they stop)."""
    with Lock(lock) as held:
        load_before = os.getloadavg()[0]
        t = time.monotonic()
        with Hogs(hogs):
            try:
                row = _validate_row(path, k_text, hogs, duration, out)
            except Exception as exc:  # noqa: BLE001 - a row that fails is a row, not the end of the matrix
                row = {"experiment": Path(path).stem, "hogs": hogs, "k_asked": k_text,
                       "error": f"{type(exc).__name__}: {exc}", "all_ok": False}
            load_after = os.getloadavg()[0]
        row.update(load_before=round(load_before, 2), load_after=round(load_after, 2),
                   lock_wait_s=round(held.waited_s, 1), row_wall_s=round(time.monotonic() - t, 1),
                   at_utc=time.strftime("%H:%M", time.gmtime()))
    return row


def cmd_validate(a: argparse.Namespace) -> int:
    from testbed.spec.units import parse_duration_s

    duration = parse_duration_s(a.duration, item="--duration")
    out = Path(a.out)
    rows = []
    conditions = [int(h) for h in a.hogs.split(",")]
    stop_at = _next_utc(a.no_row_after) if a.no_row_after else None
    # each experiment under every condition before the next experiment: a matrix cut short still pairs them
    for path, k_text in ((p, k) for p in a.experiments or [DEFAULT, *SCENARIOS, *HELD_OUT] for k in a.k.split(",")):
        for hogs in conditions:
            if stop_at is not None and time.time() >= stop_at:
                print(f"{a.no_row_after} UTC passed: no further row ({Path(path).stem}, hogs {hogs} and after)")
                break
            rows.append(_validate_cell(path, k_text, hogs, duration, out, a.lock))
            print(json.dumps(rows[-1], default=str), flush=True)
            _write_validation(out, rows, sys.argv[1:])
            if a.result:
                _validation_result(a.result, rows, sys.argv[1:])
    print((out / "validate.md").read_text() if rows else "(no rows)")
    return 0


def _next_utc(hh_mm: str) -> float:
    """The next instant (epoch s) at which the UTC clock reads ``hh_mm`` (``HH:MM``).

    Raises:
        ValueError: not ``HH:MM``.
    """
    import datetime as dt

    t = dt.datetime.strptime(hh_mm, "%H:%M").time()
    now = dt.datetime.now(dt.UTC)
    at = now.replace(hour=t.hour, minute=t.minute, second=0, microsecond=0)
    return (at if at > now else at + dt.timedelta(days=1)).timestamp()


#: The validation's columns on docs/results.md (:func:`_validation_result`).
RESULT_COLUMNS = ["experiment", "hogs", "load_before", "k", "auto_s", "wall_s", "exit", "success_emu", "success_sim",
                  "d_success_pts", "e2e_p50_emu", "e2e_p50_sim", "d_e2e_p50_pct", "excess_p50_emu", "excess_p50_sim",
                  "d_network_ms", "d_handling_ms", "d_queueing_ms", "d_inference_ms", "all_ok"]


def _validation_result(name: str, rows: list[dict], argv: list[str]) -> Path:
    """The matrix as a results source file (:func:`benchmarks.resultfile.write_result`), the
    targets judged in its summary."""
    from benchmarks.resultfile import write_result

    def cell(v):
        return None if v is None or (isinstance(v, float) and math.isnan(v)) else (
            round(v, 3) if isinstance(v, float) else v)

    def met(key: str) -> str:
        judged = [r for r in rows if r.get(key) is not None]
        return f"{sum(bool(r[key]) for r in judged)}/{len(judged)}"

    ok = sum(bool(r.get("all_ok")) for r in rows)
    summary = (f"{len(rows)} rows: success within {TARGETS['success_points']:g} points in {met('success_ok')}, "
               f"e2e p50 within {TARGETS['e2e_pct']:g} % in {met('e2e_p50_ok')}, network excess p50 within "
               f"{TARGETS['excess_ms']:g} ms in {met('excess_ok')}; every target in {ok}/{len(rows)}.")
    errors = [f"{r['experiment']} (hogs {r['hogs']}): {r['error']}" for r in rows if r.get("error")]
    notes = ["Shared 2-core machine: other helpers' jobs ran beside every row (load_before: the 1-minute load "
             "average before the row's hogs started); 'hogs 0' is the machine as it was, not a quiet host.",
             "d_*: emulated - simulated (points, %, ms medians of answered queries); the simulator runs the same "
             "plan and seed at k = 1, at the speeds the emulated run recorded (its models' residual factors; the "
             "factors themselves with emulation.speed: host).", *errors]
    return write_result(name, "Time dilation: the validation matrix (emulation at auto k against the simulator)",
                        "python -m benchmarks.dilation " + " ".join(argv),
                        [{"caption": "one row per experiment and condition (hogs: un-niced CPU hogs beside the run)",
                          "columns": RESULT_COLUMNS, "rows": [[cell(r.get(c)) for c in RESULT_COLUMNS] for r in rows]}],
                        summary=summary, notes=notes)


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
    with Hogs(a.hogs):
        return _ceiling(a)


def _ceiling(a: argparse.Namespace) -> int:
    rows = []
    for k_text in a.ks.split(","):
        for rate in (float(r) for r in a.rates.split(",")):
            over = {"workload": [{"application": "digits", "sources": "all", "rate_qps": rate / 2}],
                    "duration_s": a.duration_s, "clusters": CEILING_CLUSTERS}
            plan = _plan(TRIANGLE, None, over)
            load_before = os.getloadavg()[0]
            k = _k_of(k_text, plan)
            s, wall, run_dir = _emulate(_plan(TRIANGLE, k, over), Path(a.out) / "ceiling", a.duration_s)
            f = _figures(s)
            full = (s.get("failures") or {}).get("dropped", 0)
            carried = f["excess_p50_ms"] is not None and f["excess_p50_ms"] < CEILING_EXCESS_MS and not full
            k = s.get("k", k)
            rows.append({"k_asked": k_text, "k": k, "auto_s": s.get("auto_s"), "rate_qps": rate,
                         "load_before": round(load_before, 2),
                         "exit": s["exit_code"], "queries": f["queries"],
                         "answered_qps": s.get("throughput_qps"), "success": f["success"],
                         "excess_p50_ms": f["excess_p50_ms"], "dropped": full, "carried": carried,
                         "wall_s": round(wall, 1), "run_dir": run_dir.name})
            print(rows[-1], flush=True)
            if not carried:
                break  # the ceiling at this k is the previous rate
    _save(Path(a.out), "ceiling", rows)
    if a.result:
        print(f"wrote {_ceiling_result(a.result, rows, a.hogs, sys.argv[1:])}")
    return 0


#: The ceiling's columns on docs/results.md (:func:`_ceiling_result`).
CEILING_COLUMNS = ["k_asked", "k", "auto_s", "rate_qps", "load_before", "exit", "queries", "answered_qps", "success",
                   "excess_p50_ms", "dropped", "carried", "wall_s"]
#: Issue 38's target: at least this many emulated q/s carried (network excess p50 < :data:`CEILING_EXCESS_MS`).
CEILING_TARGET_QPS = 1000.0


def _ceiling_result(name: str, rows: list[dict], hogs: int, argv: list[str], out_dir: Path | None = None) -> Path:
    """The ceiling's rows as a results source file (in ``out_dir``, default the results folder), the
    target judged in its summary."""
    from benchmarks.resultfile import RESULTS_DIR, write_result

    best = max((r for r in rows if r["carried"]), key=lambda r: r["rate_qps"], default=None)
    met = best is not None and best["rate_qps"] >= CEILING_TARGET_QPS
    summary = (f"Target >= {CEILING_TARGET_QPS:,.0f} emulated q/s with a network excess p50 under "
               f"{CEILING_EXCESS_MS:g} ms: {'met' if met else 'MISSED'}; "
               + (f"the highest rate carried was {best['rate_qps']:,.0f} q/s at k = {best['k']:g}."
                  if best else "no rate was carried."))
    notes = [f"The triangle at MTU 1500, clusters of 2 cores and 2 workers, {rows[0]['queries'] if rows else 0} "
             f"queries in the first row; a rate is carried when the excess p50 stays under {CEILING_EXCESS_MS:g} ms "
             f"with nothing dropped; each k stops at its first rate not carried. CPU hogs beside the runs: {hogs}; "
             "load_before: the 1-minute load average before each row."]
    return write_result(name, "Time dilation: the load ceiling in emulated q/s",
                        "python -m benchmarks.dilation " + " ".join(argv),
                        [{"caption": "one row per k and rate", "columns": CEILING_COLUMNS,
                          "rows": [[r.get(c) for c in CEILING_COLUMNS] for r in rows]}],
                        summary=summary, notes=notes, out_dir=out_dir or RESULTS_DIR)


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
    p.add_argument("--hogs", default="0", help="conditions, comma-separated: CPU hogs beside the runs (e.g. 0,2)")
    p.add_argument("--lock", default=None, help="take this flock (e.g. /tmp/emu.lock) per row, hogs inside it, "
                   "so that other jobs can emulate between rows (instead of flock around the whole command)")
    p.add_argument("--no-row-after", default=None, metavar="HH:MM",
                   help="start no row after the next time the UTC clock reads HH:MM")
    p.add_argument("--result", default=None, help="also write benchmarks/results/<RESULT>.json (docs/results.md)")
    p.set_defaults(func=cmd_validate)
    p = sub.add_parser("light")
    p.add_argument("--ks", default="1,4")
    p.add_argument("--duration", default="20s")
    p.set_defaults(func=cmd_light)
    p = sub.add_parser("ceiling")
    p.add_argument("--ks", default="1,2,4,auto")
    p.add_argument("--rates", default="50,100,200,400,800,1200")
    p.add_argument("--duration-s", type=float, default=10.0)
    p.add_argument("--hogs", type=int, default=0)
    p.add_argument("--result", default=None, help="also write benchmarks/results/<RESULT>.json (docs/results.md)")
    p.set_defaults(func=cmd_ceiling)
    a = ap.parse_args(argv)
    return a.func(a)


if __name__ == "__main__":
    sys.exit(main())
