#!/usr/bin/env python3
"""The CPU-share model (testbed/model/cpu.py) next to measured service times, at low and high load.

    .venv/bin/python benchmarks/cpu_model_bench.py [--variants a,b] [--shares 0.25,0.5] [--emulation RUN ...]

Part 1, the profiles: every ``validation`` row of ``models/profiles/<variant>.json`` (LiteRT, batch 1)
is a measurement in a process held to a fractional share by a CFS quota, either ``isolated``
(each call 100 ms after the previous one ended: low load) or ``back_to_back`` (high load). The
model's prediction replays the same protocol (30 warm-up calls back to back, then the timed
calls; the CFS period's phase drawn at random, 20 phases) through :class:`CfsQuota` with the
variant's unthrottled ``cpu_time`` samples (1 core, back to back), once as the simulator applies
it today (``cfs``) and once with the cold-call rule (``cfs+cold``: a call starting at least
``COLD_AFTER_S`` after the cgroup's previous call ended runs ``cold_factor`` x longer, the factor
fitted per variant on the OTHER share's isolated row, so that each prediction is out of sample).

Part 2, the emulation (``--emulation RUN_DIR ...``): per (cluster, model), the inference time
t3 - t2 of every answered query of an emulated run next to the same experiment simulated with the
same seed, split into queries that found the server idle (``queue_len_at_arrival`` = 0: low
load) and the others (high load). Two simulations of the run's experiment, planned now: ``calls
only`` (the profiles' bare model calls, as the simulator was before request handling was
modelled), ``full`` (request handling, the in-server call and cold calls; :func:`emulation_rows`)
and ``full x host`` (the same with every CPU time scaled by the run's own host-speed check,
``host_speed.json``: the machine as it was during the run).

Prints Markdown tables; the machine's 1-minute load average is printed first (timings of the
profiles are whatever the profiler measured; see each row's ``loadavg_1min``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from testbed.core.util import markdown_table  # noqa: E402
from testbed.model.cpu import COLD_AFTER_S, CfsQuota  # noqa: E402
from testbed.plan import profiles  # noqa: E402

PROFILES = REPO / "models" / "profiles"
VARIANTS = ("face_short", "face_full", "face_dual", "hand_lite", "hand_full", "hand_palm", "mobilenet_v2_100",
            "efficientnet_b0", "resnet50")
WARMUP, PHASES, GAP_S = 30, 20, 0.1


def replay(samples_ms: np.ndarray, cores: float, load: str, n: int, cold_factor: float, seed: int) -> np.ndarray:
    """Per-call times (ms) the model predicts for the profiler's protocol (module docstring)."""
    rng = np.random.default_rng(seed)
    out: list[float] = []
    for _ in range(PHASES):
        q = CfsQuota(cores, 1, 1, cold_factor=cold_factor)
        t = float(rng.uniform(0, q.period))
        for _ in range(WARMUP):
            t = q.run(t, float(rng.choice(samples_ms)) / 1e3)
        for _ in range(n):
            if load == "isolated":
                t += GAP_S
            start = t
            t = q.run(t, float(rng.choice(samples_ms)) / 1e3)
            out.append((t - start) * 1e3)
    return np.asarray(out)


def _validation(prof: dict, share: float, load: str) -> dict | None:
    for r in profiles.measurements(prof):
        if (r.get("runtime"), r.get("role"), float(r["cpu_cores"]), int(r["batch"]), r.get("load")) == \
                ("litert", "validation", share, 1, load):
            return r
    return None


def cold_factor_of(prof: dict, warm_p50: float, share: float) -> float:
    """Median isolated call / median warm unthrottled call at ``share``: the cold-call factor the
    isolated row gives (only calls shorter than the share's quota, which no throttle stretched)."""
    row = _validation(prof, share, "isolated")
    if row is None:
        return 1.0
    quota_ms = share * 100.0
    fit = [s for s in row["samples_ms"] if s < quota_ms]
    return max(1.0, float(np.median(fit)) / warm_p50) if fit else 1.0


def profile_rows(variants: list[str], shares: list[float]) -> list[dict]:
    """Part 1: one row per (variant, share, load) with measured and predicted mean / p50 / p95."""
    rows = []
    for v in variants:
        prof = json.loads((PROFILES / f"{v}.json").read_text())
        ct = profiles.cpu_time(PROFILES, v, "litert")
        warm = np.asarray(ct.samples_ms, dtype=float)
        for share in shares:
            other = [s for s in shares if s != share]
            f = cold_factor_of(prof, float(np.median(warm)), other[0]) if other else 1.0
            for load in ("isolated", "back_to_back"):
                m = _validation(prof, share, load)
                if m is None:
                    continue
                meas = np.asarray(m["samples_ms"], dtype=float)
                plain = replay(warm, share, load, len(meas), 1.0, 1)
                cold = replay(warm, share, load, len(meas), f, 1)
                row = {"variant": v, "share": share, "load": "low (isolated)" if load == "isolated" else "high (b2b)",
                       "measured mean/p50/p95": _fmt(meas), "cfs": _fmt(plain), "cfs+cold": _fmt(cold),
                       "cold factor": f"{f:.2f}", "mean ratio cfs": f"{meas.mean() / plain.mean():.2f}",
                       "mean ratio cfs+cold": f"{meas.mean() / cold.mean():.2f}",
                       "loadavg": "/".join(f"{x:g}" for x in m.get("loadavg_1min", []))}
                rows.append(row)
    return rows


def _fmt(x: np.ndarray) -> str:
    return f"{x.mean():.1f} / {np.percentile(x, 50):.1f} / {np.percentile(x, 95):.1f}"


def _simulate(plan, seed: int, duration_s: float):
    import pandas as pd

    from testbed.model.records import GRACE_MS
    from testbed.sim import Simulator

    sim = Simulator(plan, seed=seed, record=True)
    sim.arrivals_end = duration_s  # the run's query set: created during the load only, as testbed simulate
    sim.run_until(duration_s + max(a.deadline_ms for a in plan.experiment.applications) / 1e3 + GRACE_MS / 1e3)
    return pd.DataFrame(sim.records())


def _times(df):
    df = df.copy()
    df["svc_ms"] = (df["t3_ns"] - df["t2_ns"]) / 1e6
    df["wait_ms"] = (df["t2_ns"] - df["t1_ns"]) / 1e6
    df["idle"] = df["queue_len_at_arrival"].fillna(0) == 0
    return df


class CallsOnly:
    """A catalog as the plan was before request handling was modelled: the profiles' bare calls,
    no handling, no cold calls (the ``calls only`` simulation)."""

    def __init__(self, inner):
        self.inner = inner

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def samples(self, name: str, runtime: str, threads: int):
        from dataclasses import replace

        s = self.inner.samples(name, runtime, threads)
        f = s.server_factor
        return replace(s, samples_ms=[x / f for x in s.samples_ms], batch_mean_ms={b: m / f for b, m in
                                                                                   s.batch_mean_ms.items()},
                       handling_ms=0.0, cold_factor=1.0, server_factor=1.0)


class HostScaled(CallsOnly):
    """The full model with every CPU time (calls and handling) x ``ratio``: the run's host-speed
    check (``host_speed.json``) says how much slower the machine ran a bare call than its profile."""

    def __init__(self, inner, ratio: float):
        super().__init__(inner)
        self.ratio = ratio

    def samples(self, name: str, runtime: str, threads: int):
        from dataclasses import replace

        s, r = self.inner.samples(name, runtime, threads), self.ratio
        return replace(s, samples_ms=[x * r for x in s.samples_ms], batch_mean_ms={b: m * r for b, m in
                                                                                   s.batch_mean_ms.items()},
                       handling_ms=s.handling_ms * r)


def emulation_rows(run_dirs: list[Path]) -> tuple[list[dict], list[dict]]:
    """Part 2: per (cluster, model, load) the emulated inference time t3 - t2 and server wait
    t2 - t1 next to two simulations of the run's experiment and seed: ``calls only``
    (:class:`CallsOnly`) and ``full`` (request handling, the in-server call and cold calls,
    :mod:`testbed.serve.handling`). Also one row per run of success ratios."""
    import pandas as pd

    from testbed.plan.build import build_plan
    from testbed.plan.catalog import ZooCatalog
    from testbed.spec.experiment import Experiment

    rows, runs = [], []
    for run in run_dirs:
        if not (run / "plan.json").is_file() or not (run / "run.json").is_file():
            raise SystemExit(f"--emulation {run}: not a run directory (no plan.json / run.json)")
        if json.loads((run / "run.json").read_text()).get("mode") != "emulation":
            raise SystemExit(f"--emulation {run}: not an emulated run (run.json mode is not 'emulation')")
        doc = json.loads((run / "plan.json").read_text())
        exp, base = Experiment.model_validate(doc["experiment"]), Path(doc["base_dir"])
        zoo_cat = ZooCatalog(doc["zoo_dir"], doc["profiles_dir"])
        new = build_plan(exp, base_dir=base, catalog=zoo_cat)
        old = build_plan(exp, base_dir=base, catalog=CallsOnly(zoo_cat))
        hs = json.loads((run / "host_speed.json").read_text()) if (run / "host_speed.json").is_file() else {}
        ratio = float(hs["ratio"]) if hs.get("ratio") else None  # None: not measured (older run, small zoo)
        emu = pd.read_parquet(run / "records.parquet") if (run / "records.parquet").is_file() \
            else pd.read_csv(run / "records.csv")
        info = json.loads((run / "run.json").read_text())
        seed, dur = int(info.get("seed", old.experiment.seed)), float(info.get("duration_s", old.experiment.duration_s))
        sims = {"calls only": _times(_simulate(old, seed, dur)), "full": _times(_simulate(new, seed, dur))}
        if ratio is not None:
            host = build_plan(exp, base_dir=base, catalog=HostScaled(zoo_cat, ratio))
            sims["full x host"] = _times(_simulate(host, seed, dur))
        emu = _times(emu)
        runs.append({"run": run.name, "queries emu": len(emu), "queries sim": len(sims["full"]),
                     "host speed ratio": "n/a" if ratio is None else f"{ratio:.2f}",
                     "success emulated": f"{(emu.outcome == 'success').mean():.3f}",
                     **{f"success sim {k}": f"{(v.outcome == 'success').mean():.3f}" for k, v in sims.items()}})
        for (c, m), g in emu.dropna(subset=["svc_ms"]).groupby(["cluster", "model"]):
            for idle, label in ((True, "low (idle at arrival)"), (False, "high (queue at arrival)")):
                ge = g[g.idle == idle]
                got = {k: v.dropna(subset=["svc_ms"]) for k, v in sims.items()}
                got = {k: v[(v.cluster == c) & (v.model == m) & (v.idle == idle)] for k, v in got.items()}
                if len(ge) < 5 or min(len(v) for v in got.values()) < 5:
                    continue
                row = {"run": run.name, "cluster": c, "model": m, "load": label,
                       "n emu/sim": f"{len(ge)}/{len(got['full'])}", "t3-t2 emulated": _fmt(ge.svc_ms.to_numpy())}
                for k, v in got.items():
                    row[f"t3-t2 {k}"] = _fmt(v.svc_ms.to_numpy())
                row["t2-t1 emulated / full"] = f"{ge.wait_ms.mean():.1f} / {got['full'].wait_ms.mean():.1f}"
                row["mean ratio emu/full"] = f"{ge.svc_ms.mean() / got['full'].svc_ms.mean():.2f}"
                row["mean ratio emu/full x host"] = (f"{ge.svc_ms.mean() / got['full x host'].svc_ms.mean():.2f}"
                                                     if "full x host" in got else "n/a")
                row["mean ratio emu/calls only"] = f"{ge.svc_ms.mean() / got['calls only'].svc_ms.mean():.2f}"
                rows.append(row)
    return rows, runs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--shares", default="0.25,0.5")
    ap.add_argument("--emulation", nargs="*", type=Path, default=[], help="emulated run directories")
    args = ap.parse_args(argv)
    print(f"load average (1 min) now: {os.getloadavg()[0]:.2f}; cold-call threshold {COLD_AFTER_S * 1e3:g} ms\n")
    rows = profile_rows(args.variants.split(","), [float(s) for s in args.shares.split(",")])
    print("## Profiles: measured (validation rows) vs the CPU-share model, ms (mean / p50 / p95)\n")
    print(markdown_table(rows))
    if args.emulation:
        rows, runs = emulation_rows(args.emulation)
        print("## Emulation: success ratio, emulated vs simulated (same experiment, seed)\n")
        print(markdown_table(runs))
        print("\n## Emulation: inference time t3 - t2 per (cluster, model), ms (mean / p50 / p95), "
              "emulated vs simulated\n")
        print(markdown_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
