#!/usr/bin/env python3
"""One cluster's real server under its CFS quota and open-loop load, against the simulator's model
of that cluster fed the same arrivals: which stage (reading, queueing, the call, writing) the model
gets wrong, and by how much the host's speed alone explains.

    flock /tmp/emu.lock .venv/bin/python benchmarks/quota_server_bench.py \
        [--experiment experiments/scenario-degradation.yaml] [--cluster fedc] [--duration 20] [--k 1] \
        [--rate-scale 1.0] [--seed 1] [--out DIR]

Method:

1. The load: the experiment simulated with its seed; the queries its simulation sends to
   ``--cluster`` give the rate (q/s) and the models' mix (``--rate-scale`` multiplies the rate).
   Arrivals: Poisson at that rate for ``--duration`` s of emulated time, each query's model drawn
   from the mix (``--seed``).
2. The server: ``python -m testbed.serve.server`` with the cluster's settings (models, runtimes,
   workers, threads, queue limit, discipline), in a cgroup of the cluster's share
   (:func:`testbed.core.cgroups.create_limited_group`; under ``--k`` > 1 the dilated period, and
   below one core the server's padding, as the emulation runs it: :func:`testbed.plan.dilation.cpu_pad`),
   on 127.0.0.1. The client (outside the cgroup, one connection per query in flight, aiohttp as the
   sources) sends each query at its arrival time x k with the family's real request bodies and keeps
   the server's stamps (T1, T1h, T2, T3, T3h) of each answer; times are brought back to emulated
   time (/ k). CPU: each of the server's threads' run time (``/proc/PID/task/TID/schedstat``,
   ns) over the load: the event loop's thread (request handling) and the others (model calls),
   per query; the cgroup's throttling counters (``cpu.stat``).
3. The model: the simulator's :class:`testbed.sim.clusters.Cluster` fed the measured arrival
   instants (T1, emulated) and models, twice: with the plan's figures (``profile``), and with the
   model calls' and the handling's CPU scaled to what the server spent per query in this run
   (``speed-matched``: calls x the measured call CPU / the profile's mean of the same calls,
   handling = the measured event loop CPU per query), which takes the host's speed out.

Prints one Markdown table (emulated, profile, speed-matched): answered q/s, 503s, and p50 / p95
(ms, emulated time) of read (T1h - T1), queueing (T2 - T1h), inference (T3 - T2), write
(T3h - T3); the load average before and after. ``--out`` keeps the queries (``measured.csv``) and
the table (``summary.json``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from testbed.core.util import markdown_table  # noqa: E402

#: The client's wait for an answer beyond the last arrival (s, wall).
TAIL_S = 10.0


def cluster_load(plan, cluster: str, seed: int) -> tuple[float, dict[str, float]]:
    """(rate q/s, model -> share) of the queries the experiment's simulation sends to ``cluster``.

    Raises:
        SystemExit: the simulation sends it nothing.
    """
    sys.path.insert(0, str(REPO / "benchmarks"))
    from cpu_model_bench import _simulate

    df = _simulate(plan, seed, plan.experiment.duration_s)
    at = df[df.cluster == cluster]
    if at.empty:
        raise SystemExit(f"--cluster {cluster}: the experiment's simulation sends it no query")
    return len(at) / plan.experiment.duration_s, (at.model.value_counts() / len(at)).to_dict()


def arrivals(rate: float, mix: dict[str, float], duration_s: float, seed: int) -> tuple[np.ndarray, list[str]]:
    """Poisson arrival instants (s) over ``duration_s`` and each one's model."""
    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.exponential(1.0 / rate, int(rate * duration_s * 2) + 10))
    t = t[t < duration_s]
    names = list(mix)
    return t, [names[i] for i in rng.choice(len(names), size=len(t), p=[mix[n] for n in names])]


def thread_cpu_ns(pid: int) -> dict[int, int]:
    """Run time (ns) of each thread of ``pid`` (``schedstat``'s first field)."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            out[int(tid)] = int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[0])
        except OSError:
            pass
    return out


async def drive(port: int, t_s: np.ndarray, models: list[str], bodies: dict[str, list[bytes]], k: float,
                deadline_ms: dict[str, float]) -> list[dict]:
    """Send each query at ``t_s`` x k (wall) after a common start; return one row per query."""
    import aiohttp

    rows: list[dict] = [{} for _ in t_s]
    conn = aiohttp.TCPConnector(limit=0, keepalive_timeout=60)
    async with aiohttp.ClientSession(connector=conn) as session:
        start = time.monotonic() + 0.5
        start_ns = time.time_ns() + 500_000_000

        async def one(i: int) -> None:
            await asyncio.sleep(max(0.0, start + t_s[i] * k - time.monotonic()))
            m = models[i]
            sent = time.time_ns()
            dl = sent + int(deadline_ms[m] * k * 1e6)
            try:
                async with session.post(f"http://127.0.0.1:{port}/v1/models/{m}:predict",
                                        data=bodies[m][i % len(bodies[m])],
                                        headers={"Content-Type": "application/json", "X-Testbed-Deadline-Ns": str(dl)},
                                        timeout=aiohttp.ClientTimeout(total=60)) as resp:
                    await resp.read()
                    h = resp.headers
                    rows[i] = {"model": m, "status": resp.status, "sent": sent, "recv": time.time_ns(),
                               **{c: int(h[f"X-Testbed-{c}"]) if f"X-Testbed-{c}" in h else None
                                  for c in ("T1", "T1h", "T2", "T3", "T3h")},
                               "qlen": int(h.get("X-Testbed-Queue-Len", -1))}
            except (TimeoutError, aiohttp.ClientError) as exc:
                rows[i] = {"model": m, "status": -1, "sent": sent, "error": str(exc)}

        await asyncio.gather(*(one(i) for i in range(len(t_s))))
    for r in rows:
        r["start_ns"] = start_ns
    return rows


def run_server(plan, cluster: str, k: float, tmp: Path, t_s, models, seed: int) -> tuple[list[dict], dict]:
    """Bring the cluster's server up in its cgroup, drive it, return (rows, cpu figures)."""
    from testbed.core import cgroups
    from testbed.core.util import poll_until, stop_processes
    from testbed.plan import zoo
    from testbed.plan.boundaries import ServerConfig
    from testbed.plan.dilation import dilate, with_time_dilation
    from testbed.serve.launch import server_command

    spec = plan.cluster_spec(cluster)
    zoo_dir = plan.zoo_dir
    manifest = zoo.load_manifest(zoo_dir)
    ready = tmp / "ready.json"
    cfg = ServerConfig.from_plan(dilate(with_time_dilation(plan, k)), cluster, 0).model_copy(
        update={"host": "127.0.0.1", "ready_file": str(ready)})
    pad = cfg.cpu_pad
    (tmp / "server.json").write_text(cfg.model_dump_json())
    dirs = cgroups.create_limited_group(f"quota-bench-{os.getpid()}", spec.cpu_cores, 2048, time_dilation=k)
    log = open(tmp / "server.log", "w")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(server_command(tmp / "server.json"), stdout=log, stderr=subprocess.STDOUT)
    try:
        cgroups.add_process(dirs, proc.pid)
        poll_until(ready.is_file, 300.0, "the inference server", 0.1, proc=proc)
        port = json.loads(ready.read_text())["port"]
        fam = {m: manifest["variants"][m]["family"] for m in set(models)}
        bodies = {m: zoo.request_bodies(zoo_dir, fam[m])[0] for m in fam}
        app_of = {m: next(a for a in plan.experiment.applications if a.family == fam[m]) for m in fam}
        deadline = {m: app_of[m].deadline_ms for m in fam}
        time.sleep(1.0)
        c0, s0 = thread_cpu_ns(proc.pid), cgroups.cpu_stat(dirs)
        rows = asyncio.run(drive(port, t_s, models, bodies, k, deadline))
        c1, s1 = thread_cpu_ns(proc.pid), cgroups.cpu_stat(dirs)
    finally:
        stop_processes([proc])
        log.close()
        cgroups.remove_groups(dirs)
    loop = (c1.get(proc.pid, 0) - c0.get(proc.pid, 0)) / 1e6
    others = sum(v - c0.get(t, 0) for t, v in c1.items() if t != proc.pid) / 1e6
    cpu = {"loop_cpu_ms": round(loop, 1), "other_cpu_ms": round(others, 1), "pad": pad,
           "throttled_periods": s1.get("throttled_periods", 0) - s0.get("throttled_periods", 0),
           "periods": s1.get("periods", 0) - s0.get("periods", 0),
           "throttled_s": round(s1.get("throttled_s", 0) - s0.get("throttled_s", 0), 3)}
    return rows, cpu


def replay(figures: dict, spec, t1_s: list[float], models: list[str], call_scale: float = 1.0,
           handling_ms: float | None = None, seed: int = 0) -> dict[str, np.ndarray]:
    """The simulator's cluster fed arrivals ``t1_s`` (s) of ``models``: per query t1h, t2, t3, t3h
    (s, NaN when refused) and status."""
    from testbed.model import queue as mq
    from testbed.sim.clusters import BatchSamplers, Cluster, ServiceSampler
    from testbed.sim.columns import Queries

    names = sorted(figures)
    idx = {m: i for i, m in enumerate(names)}
    figs = {}
    for m in names:
        f = figures[m]
        upd = {"samples_ms": [x * call_scale for x in f.samples_ms]}
        if handling_ms is not None:
            share = f.answer_ms / f.handling_ms if f.handling_ms else 0.0
            upd.update(handling_ms=handling_ms, answer_ms=handling_ms * share)
        figs[idx[m]] = f.model_copy(update=upd)
    rng = np.random.default_rng(seed)
    samplers = {i: ServiceSampler.bootstrap(f, np.random.default_rng(rng.integers(1 << 32))) for i, f in figs.items()}
    q = Queries()
    n = len(t1_s)
    for col in ("cl", "model", "t1", "t1h", "dl", "back", "t2", "t3", "t3h", "t4", "status", "qlen", "batch"):
        setattr(q, col, [None] * n)
    q.cl = [0] * n
    q.back = [0.0] * n
    q.dl = [float("inf")] * n
    q.model = [idx[m] for m in models]
    q.t1 = list(t1_s)
    queue = mq.ServerQueue(spec.workers, spec.queue_limit, spec.discipline)
    cl = Cluster(q, None, 0, "cluster", "edge", queue, figs, samplers, BatchSamplers([seed], figs))
    cl.add([(t, i, q.model[i], float("inf")) for i, t in enumerate(t1_s)])
    cl.advance(float("inf"))
    nan = float("nan")
    return {c: np.array([nan if v is None else v for v in getattr(q, c)], dtype=float)
            for c in ("t1", "t1h", "t2", "t3", "t3h")} | {"status": np.array([s or 200 for s in q.status])}


def stage_row(label: str, d: dict[str, np.ndarray], duration_s: float) -> dict:
    """Answered q/s, 503s and p50 / p95 of each stage (ms)."""
    ok = (d["status"] == 200) & np.isfinite(d["t3h"])
    row = {"engine": label, "answered q/s": round(ok.sum() / duration_s, 2), "503": int((d["status"] == 503).sum())}
    for name, a, b in (("read", "t1", "t1h"), ("queueing", "t1h", "t2"), ("inference", "t2", "t3"),
                       ("write", "t3", "t3h")):
        x = (d[b][ok] - d[a][ok]) * 1e3
        row[f"{name} p50"] = round(float(np.median(x)), 2)
        row[f"{name} p95"] = round(float(np.percentile(x, 95)), 2)
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--experiment", default=str(REPO / "experiments" / "scenario-degradation.yaml"))
    ap.add_argument("--cluster", default="fedc")
    ap.add_argument("--duration", type=float, default=20.0, help="emulated seconds of load")
    ap.add_argument("--k", type=float, default=1.0, help="time dilation of the server (as the emulation's)")
    ap.add_argument("--rate-scale", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args(argv)
    from testbed.plan.build import build_plan
    from testbed.spec.experiment import load_experiment

    plan = build_plan(load_experiment(a.experiment), base_dir=Path(a.experiment).parent)
    rate, mix = cluster_load(plan, a.cluster, plan.experiment.seed)
    rate *= a.rate_scale
    t_s, models = arrivals(rate, mix, a.duration, a.seed)
    load0 = os.getloadavg()[0]
    print(f"load average {load0:.2f}; {a.cluster}: {rate:.2f} q/s, mix "
          + ", ".join(f"{m} {p:.2f}" for m, p in mix.items()) + f"; {len(t_s)} queries, k = {a.k:g}", flush=True)
    with tempfile.TemporaryDirectory(prefix="quota-bench-") as tmp:
        rows, cpu = run_server(plan, a.cluster, a.k, Path(tmp), t_s, models, a.seed)
    bad = [r for r in rows if r.get("status", -1) not in (200, 503)]
    if bad:
        print(f"{len(bad)} queries failed, e.g. {bad[0]}")
    good = [r for r in rows if r.get("T1") is not None]
    base = min(r["T1"] for r in good)
    k = a.k

    def em(v):  # ns on the wall clock -> s of emulated time since the first arrival
        return float("nan") if v is None else (v - base) / 1e9 / k

    meas = {c: np.array([em(r.get(c.upper() if len(c) == 2 else c[:2].upper() + c[2:])) for r in good])
            for c in ("t1", "t1h", "t2", "t3", "t3h")}
    meas["status"] = np.array([r["status"] for r in good])
    answered = int((meas["status"] == 200).sum())
    spec = plan.queue(a.cluster)
    figures = plan.services[a.cluster]
    gm = [r["model"] for r in good]
    prof_call = sum(figures[m].wall_mean_ms for m, s in zip(gm, meas["status"], strict=True) if s == 200)
    call_scale = cpu["other_cpu_ms"] / prof_call if prof_call else 1.0
    loop_per_q = cpu["loop_cpu_ms"] / len(good)
    t1 = list(meas["t1"])
    table = [stage_row("emulated", meas, a.duration),
             stage_row("model, profile", replay(figures, spec, t1, gm), a.duration),
             stage_row(f"model, speed-matched (calls x {call_scale:.2f}, handling {loop_per_q:.2f} ms)",
                       replay(figures, spec, t1, gm, call_scale, loop_per_q), a.duration)]
    prof_h = np.mean([figures[m].handling_ms for m in gm])
    print(f"CPU per query (ms): event loop {loop_per_q:.2f} (profile {prof_h:.2f}); model calls "
          f"{cpu['other_cpu_ms'] / max(answered, 1):.2f} per answered query "
          f"(profile {prof_call / max(answered, 1):.2f}); "
          f"throttled {cpu['throttled_periods']} of {cpu['periods']} periods, {cpu['throttled_s']} s; "
          f"load average now {os.getloadavg()[0]:.2f}")
    print(markdown_table(table))
    if a.out:
        import pandas as pd

        a.out.mkdir(parents=True, exist_ok=True)
        pd.DataFrame(rows).to_csv(a.out / "measured.csv", index=False)
        (a.out / "summary.json").write_text(json.dumps({"args": {k2: str(v) for k2, v in vars(a).items()},
                                                        "rate": rate, "mix": mix, "cpu": cpu, "table": table,
                                                        "load_before": load0}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
