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
same seed (``plan.json`` of the run), split into queries that found the server idle
(``queue_len_at_arrival`` = 0: low load) and the others (high load).

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
from testbed.inference import profiles  # noqa: E402
from testbed.model.cpu import COLD_AFTER_S, CfsQuota  # noqa: E402
from testbed.util import markdown_table  # noqa: E402

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


def emulation_rows(run_dirs: list[Path]) -> list[dict]:
    """Part 2: emulated vs simulated inference time t3 - t2 per (cluster, model, load)."""
    import pandas as pd

    from testbed.plan import Plan
    from testbed.sim import Simulator

    rows = []
    for run in run_dirs:
        plan = Plan.model_validate_json((run / "plan.json").read_text())
        emu = pd.read_parquet(run / "records.parquet") if (run / "records.parquet").is_file() \
            else pd.read_csv(run / "records.csv")
        info = json.loads((run / "run.json").read_text())
        sim = Simulator(plan, seed=int(info.get("seed", plan.experiment.seed)), record=True)
        sim.run_until(float(info.get("duration_s", plan.experiment.duration_s)) + 3.0)
        simr = pd.DataFrame(sim.records())
        for df in (emu, simr):
            df["svc_ms"] = (df["t3_ns"] - df["t2_ns"]) / 1e6
            df["idle"] = df["queue_len_at_arrival"].fillna(0) == 0
        for (c, m), g in emu.dropna(subset=["svc_ms"]).groupby(["cluster", "model"]):
            s = simr.dropna(subset=["svc_ms"])
            s = s[(s.cluster == c) & (s.model == m)]
            for idle, label in ((True, "low (idle at arrival)"), (False, "high (queue at arrival)")):
                ge, gs = g[g.idle == idle].svc_ms.to_numpy(), s[s.idle == idle].svc_ms.to_numpy()
                if len(ge) < 5 or len(gs) < 5:
                    continue
                rows.append({"run": run.name, "cluster": c, "model": m, "load": label,
                             "n emu/sim": f"{len(ge)}/{len(gs)}",
                             "emulated mean/p50/p95": _fmt(ge), "simulated mean/p50/p95": _fmt(gs),
                             "mean ratio": f"{ge.mean() / gs.mean():.2f}"})
    return rows


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
        print("## Emulation: inference time t3 - t2 per (cluster, model), emulated vs simulated (same plan, seed)\n")
        print(markdown_table(emulation_rows(args.emulation)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
